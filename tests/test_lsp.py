"""The LSP group (a3s-string-dialect.md 4.8) over a real grpc.aio channel with the later dialect's
stubs, against real language servers: basedpyright (a test dependency) for Python,
typescript-language-server where npm installed it, and tests/lsp_fixture.py as a server the
operator configures by command (and one that misbehaves). Then what the model's tools take from
a running server: the errors after an edit, and code navigation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from a3s_agent.config import SandboxSettings, Settings
from a3s_agent.proto import code_agent_later_pb2 as later
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc
from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.testing.fake_llm import FakeLLM, text, tool_call
from a3s_agent.tools.lsp import client

from .conftest import LiveServer, agent_settings, alive, eventually, initialize, running, user

FIXTURE = Path(__file__).with_name("lsp_fixture.py")

A_PY = """\
def greet(name: str) -> str:
    return "hi " + name


class Greeter:
    def greet(self) -> str:
        return greet("you")
"""
B_PY = """\
from a import greet

message: int = greet("bob")


def other() -> int:
    greet = 5
    return greet
"""


def python_workspace(workspace: Path) -> Path:
    (workspace / "a.py").write_text(A_PY)
    (workspace / "b.py").write_text(B_PY)
    return workspace


@pytest.fixture
async def served(workspace: Path, tmp_path: Path) -> AsyncIterator[tuple[LiveServer, Any]]:
    async with running(agent_settings(python_workspace(workspace), tmp_path / "data")) as live:
        yield live, later_grpc.CodeAgentServiceStub(live.channel)


async def status_of(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def position(found: Any) -> tuple[int, int, int, int]:
    return (found.start.line, found.start.character, found.end.line, found.end.character)


# --- the RPCs against basedpyright ---------------------------------------------------------------


async def test_python_is_served_by_basedpyright_for_hover_definition_references_symbols(
    served: tuple[LiveServer, Any], workspace: Path
) -> None:
    live, stub = served
    capabilities = await live.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert "lsp" in capabilities.features

    started = await stub.StartLspServer(
        later.StartLspServerRequest(language="python", root_uri=workspace.as_uri())
    )
    assert started.success and started.server_info.running
    assert (started.server_info.language, started.server_info.name) == ("python", "basedpyright")
    assert started.server_info.version  # what the server said it is
    listed = await stub.ListLspServers(later.ListLspServersRequest())
    assert [(s.language, s.name, s.running) for s in listed.servers] == [("python", "basedpyright", True)]

    b_py = str(workspace / "b.py")
    # `greet` in line 2 (0-based), columns 15 to 20
    hover = await stub.LspHover(later.LspHoverRequest(file_path=b_py, line=2, column=16))
    assert hover.found and "def greet(name: str) -> str" in hover.content
    assert position(hover.range) == (2, 15, 2, 20)

    definition = await stub.LspDefinition(later.LspDefinitionRequest(file_path="b.py", line=2, column=16))
    assert [(d.uri, position(d.range)) for d in definition.locations] == [
        ((workspace / "a.py").as_uri(), (0, 4, 0, 9))
    ]

    with_declaration = await stub.LspReferences(
        later.LspReferencesRequest(file_path=b_py, line=2, column=16, include_declaration=True)
    )
    found = sorted((Path(r.uri).name, r.range.start.line) for r in with_declaration.locations)
    # the def, its use in the method, the import and the call; not the local `greet = 5`
    assert found == [("a.py", 0), ("a.py", 6), ("b.py", 0), ("b.py", 2)]
    without = await stub.LspReferences(
        later.LspReferencesRequest(file_path=b_py, line=2, column=16, include_declaration=False)
    )
    # (what the server counts as the declaration here is its own choice: one location fewer)
    assert {(Path(r.uri).name, r.range.start.line) for r in without.locations} < set(found)

    async def found_class() -> Any:  # a server just started may not have found the files yet
        found = await stub.LspSymbols(later.LspSymbolsRequest(query="Greeter"))
        return found if found.symbols else None

    symbols = await eventually(found_class, "basedpyright knows the workspace's symbols", within_s=30)
    assert [(s.name, s.kind) for s in symbols.symbols] == [("Greeter", "class")]
    assert symbols.symbols[0].location.uri == (workspace / "a.py").as_uri()
    assert symbols.symbols[0].location.range.start.line == 4
    methods = await stub.LspSymbols(later.LspSymbolsRequest(query="greet", limit=1))
    assert len(methods.symbols) == 1

    assert (await stub.StopLspServer(later.StopLspServerRequest(language="python"))).success
    assert list((await stub.ListLspServers(later.ListLspServersRequest())).servers) == []
    assert not (await stub.StopLspServer(later.StopLspServerRequest(language="python"))).success


async def test_diagnostics_follow_the_files_current_content(
    served: tuple[LiveServer, Any], workspace: Path
) -> None:
    _, stub = served
    # No StartLspServer: asking about a Python file starts its server.
    first = await stub.LspDiagnostics(later.LspDiagnosticsRequest(file_path="b.py"))
    errors = [d for d in first.diagnostics if d.severity == "error"]
    assert [(d.range.start.line, d.source, d.code) for d in errors] == [
        (2, "basedpyright", "reportAssignmentType")
    ]
    assert '"str" is not assignable to declared type "int"' in errors[0].message
    assert errors[0].uri == (workspace / "b.py").as_uri()
    assert {d.severity for d in first.diagnostics} <= {"error", "warning", "info", "hint"}

    (workspace / "b.py").write_text(B_PY.replace("message: int", "message: str"))
    fixed = await stub.LspDiagnostics(later.LspDiagnosticsRequest(file_path=str(workspace / "b.py")))
    assert [d for d in fixed.diagnostics if d.severity == "error"] == []

    (workspace / "b.py").write_text(
        B_PY.replace('greet("bob")', "greet(3)").replace("message: int", "message: str")
    )
    everything = await stub.LspDiagnostics(later.LspDiagnosticsRequest())  # no file: all it has open
    errors = [d for d in everything.diagnostics if d.severity == "error"]
    assert [(Path(d.uri).name, d.code) for d in errors] == [("b.py", "reportArgumentType")]

    listed = await stub.ListLspServers(later.ListLspServersRequest())
    assert [(s.language, s.running) for s in listed.servers] == [("python", True)]


async def test_bad_positions_paths_and_languages_are_refused_by_name(
    served: tuple[LiveServer, Any], workspace: Path, tmp_path: Path
) -> None:
    _, stub = served
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("password = 'x'\n")
    (workspace / "link.py").symlink_to(outside / "secret.py")

    async def hover_error(file_path: str, line: int = 0, column: int = 0) -> grpc.aio.AioRpcError:
        return await status_of(
            stub.LspHover(later.LspHoverRequest(file_path=file_path, line=line, column=column))
        )

    nothing_runs = await status_of(stub.LspSymbols(later.LspSymbolsRequest(query="greet")))
    assert nothing_runs.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "StartLspServer" in (nothing_runs.details() or "")
    for bad, words in [
        (await hover_error(str(outside / "secret.py")), "outside the workspace"),
        (await hover_error("../outside/secret.py"), "outside the workspace"),
        (await hover_error("link.py"), "outside the workspace"),
        (await hover_error((outside / "secret.py").as_uri()), "outside the workspace"),
        (await hover_error(""), "file_path is required"),
        (await hover_error("https://example.com/a.py"), "must be a file:// URI"),
    ]:
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT, bad.details()
        assert words in (bad.details() or ""), bad.details()

    for request, words in [
        (later.StartLspServerRequest(language="python", root_uri=outside.as_uri()), "root_uri"),
        (later.StartLspServerRequest(language="python", root_uri=str(workspace / "nowhere")), "root_uri"),
        (later.StartLspServerRequest(language=""), "language is required"),
    ]:
        bad = await status_of(stub.StartLspServer(request))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT, bad.details()
        assert words in (bad.details() or ""), bad.details()

    unknown = await status_of(stub.StartLspServer(later.StartLspServerRequest(language="cobol")))
    assert unknown.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no language server is known for 'cobol'" in (unknown.details() or "")
    (workspace / "notes.xyz").write_text("x\n")
    no_kind = await hover_error("notes.xyz")
    assert no_kind.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--lsp-server LANGUAGE:.xyz=COMMAND" in (no_kind.details() or "")
    # none of these started a server
    assert list((await stub.ListLspServers(later.ListLspServersRequest())).servers) == []

    # a position (or file) is checked against the file, by the server of its language
    for bad, words in [
        (await hover_error("b.py", line=40), "line 40 is past the end of b.py"),
        (await hover_error("b.py", line=2, column=200), "column 200 is past the end of line 2 of b.py"),
        (await hover_error("missing.py"), "file_path 'missing.py'"),
    ]:
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT, bad.details()
        assert words in (bad.details() or ""), bad.details()


async def test_a_language_whose_server_is_not_installed_names_what_to_install(
    workspace: Path, tmp_path: Path
) -> None:
    settings = replace(
        agent_settings(workspace, tmp_path / "data"), lsp_servers=["python=no-such-langserver --stdio"]
    )
    (workspace / "a.py").write_text("x = 1\n")
    async with running(settings) as live:
        stub = later_grpc.CodeAgentServiceStub(live.channel)
        for call in (
            stub.StartLspServer(later.StartLspServerRequest(language="python")),
            stub.LspHover(later.LspHoverRequest(file_path="a.py")),
        ):
            missing = await status_of(call)
            assert missing.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "no-such-langserver --stdio" in (missing.details() or "")
            assert "not installed" in (missing.details() or "")


TS_SERVER_CACHE = Path.home() / ".cache" / "a3s-agent" / "typescript-language-server"


@pytest.fixture(scope="session")
def typescript_language_server() -> Path:
    """The directory of `typescript-language-server`: where PATH has it, else installed from npm
    once into ~/.cache (the test skips only without npm)."""
    found = shutil.which("typescript-language-server")
    if found:
        return Path(found).parent
    if shutil.which("npm") is None:
        pytest.skip("typescript-language-server is not installed and there is no npm to install it")
    bin_dir = TS_SERVER_CACHE / "node_modules" / ".bin"
    if not (bin_dir / "typescript-language-server").exists():
        install = subprocess.run(
            ["npm", "install", "--prefix", str(TS_SERVER_CACHE), "--no-audit", "--no-fund",
             "typescript-language-server@4", "typescript@5"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert install.returncode == 0, install.stdout + install.stderr
    return bin_dir


async def test_typescript_is_served_by_typescript_language_server(
    workspace: Path, tmp_path: Path, typescript_language_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{typescript_language_server}{os.pathsep}{os.environ['PATH']}")
    settings = replace(  # the sandbox hides homes: an install under one is made readable
        agent_settings(workspace, tmp_path / "data"), sandbox=SandboxSettings(read=(TS_SERVER_CACHE,))
    )
    (workspace / "a.ts").write_text(
        "export function greet(name: string): string {\n  return 'hi ' + name;\n}\n"
    )
    (workspace / "b.ts").write_text(
        "import { greet } from './a';\nconst n: number = greet('x');\nconsole.log(n);\n"
    )
    async with running(settings) as live:
        stub = later_grpc.CodeAgentServiceStub(live.channel)
        started = await stub.StartLspServer(later.StartLspServerRequest(language="javascript"))
        assert (started.server_info.language, started.server_info.name) == (
            "typescript",
            "typescript-language-server",
        )
        definition = await stub.LspDefinition(later.LspDefinitionRequest(file_path="b.ts", line=1, column=20))
        assert [Path(d.uri).name for d in definition.locations] in (["a.ts"], ["b.ts"])
        diagnostics = await stub.LspDiagnostics(later.LspDiagnosticsRequest(file_path="b.ts"))
        errors = [(d.range.start.line, d.source) for d in diagnostics.diagnostics if d.severity == "error"]
        assert errors == [(1, "typescript")]
        (workspace / "b.ts").write_text(
            "import { greet } from './a';\nconst n: string = greet('x');\nconsole.log(n);\n"
        )
        diagnostics = await stub.LspDiagnostics(later.LspDiagnosticsRequest(file_path="b.ts"))
        assert [d for d in diagnostics.diagnostics if d.severity == "error"] == []


# --- a server the operator configures, contained and sandboxed; one that misbehaves ---------------


def fixture_settings(workspace: Path, tmp_path: Path, mode: str, probe: Path) -> Settings:
    command = f"{sys.executable} {FIXTURE} {mode} {probe}"
    sandbox = SandboxSettings(read=(FIXTURE.parent,))
    return replace(
        agent_settings(workspace, tmp_path / "data"), lsp_servers=[f"fixture:.fx={command}"], sandbox=sandbox
    )


async def test_an_operator_configured_server_runs_sandboxed_and_stops_at_shutdown(
    workspace: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("hunter2")
    (workspace / "a.fx").write_text("first version\nsecond line\n")
    async with running(fixture_settings(workspace, tmp_path, "ok", secret)) as live:
        stub = later_grpc.CodeAgentServiceStub(live.channel)
        hover = await stub.LspHover(later.LspHoverRequest(file_path="a.fx", line=1, column=3))
        assert hover.found and "fixture hover at 1:3 of 'second line'" in hover.content
        assert "cannot read" in hover.content and "hunter2" not in hover.content  # the sandbox hides it
        listed = await stub.ListLspServers(later.ListLspServersRequest())
        assert [(s.language, s.name, s.version) for s in listed.servers] == [("fixture", "fixture-ls", "1.0")]

        # A server that does not say which version it saw: its diagnostics after the change.
        first = await stub.LspDiagnostics(later.LspDiagnosticsRequest(file_path="a.fx"))
        assert [d.message for d in first.diagnostics] == ["first line: first version"]
        (workspace / "a.fx").write_text("changed\n")
        changed = await stub.LspDiagnostics(later.LspDiagnosticsRequest(file_path="a.fx"))
        assert [(d.message, d.code, d.severity) for d in changed.diagnostics] == [
            ("first line: changed", "7", "error")
        ]
        pids = fixture_pids()  # (with the sandbox's own processes around it)
        assert pids
    assert not any(alive(pid) for pid in pids)  # the server's stop ended it


def fixture_pids() -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if str(FIXTURE).encode() in words and alive(int(cmdline.parent.name)):
            found.append(int(cmdline.parent.name))
    return found


async def test_an_idle_server_is_stopped(workspace: Path, tmp_path: Path) -> None:
    (workspace / "a.fx").write_text("x\n")
    settings = replace(fixture_settings(workspace, tmp_path, "ok", tmp_path), lsp_idle_s=0.5)
    async with running(settings) as live:
        stub = later_grpc.CodeAgentServiceStub(live.channel)
        await stub.StartLspServer(later.StartLspServerRequest(language="fixture"))
        pids = fixture_pids()
        assert pids

        async def stopped() -> bool:
            return not (await stub.ListLspServers(later.ListLspServersRequest())).servers

        await eventually(stopped, "the idle language server stopped", within_s=20)
        await eventually(lambda: not any(alive(pid) for pid in pids), "its processes gone")
        # asked again, it starts again
        hover = await stub.LspHover(later.LspHoverRequest(file_path="a.fx"))
        assert hover.found


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("silent", "did not answer textDocument/hover within 0.5 s"),
        ("flood", "over the 33554432 bytes allowed"),
        ("crash", "exited with code 3; it last wrote: fixture-ls: hover is more than I can take"),
    ],
)
async def test_a_misbehaving_server_gives_unavailable_in_bounded_time(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, words: str
) -> None:
    monkeypatch.setattr(client, "REQUEST_TIMEOUT_S", 0.5)
    (workspace / "a.fx").write_text("x\n")
    async with running(fixture_settings(workspace, tmp_path, mode, tmp_path)) as live:
        stub = later_grpc.CodeAgentServiceStub(live.channel)
        failed = await status_of(stub.LspHover(later.LspHoverRequest(file_path="a.fx")))
        assert failed.code() == grpc.StatusCode.UNAVAILABLE
        assert words in (failed.details() or ""), failed.details()
        if mode != "silent":  # a dead server is started again on the next request
            assert not (await stub.ListLspServers(later.ListLspServersRequest())).servers[0].running


async def test_a_noisy_server_is_answered_within_bounds(workspace: Path, tmp_path: Path) -> None:
    (workspace / "a.fx").write_text("x\n")
    async with running(fixture_settings(workspace, tmp_path, "noisy", tmp_path)) as live:
        stub = later_grpc.CodeAgentServiceStub(live.channel)
        one = await stub.LspDiagnostics(later.LspDiagnosticsRequest(file_path="a.fx"))
        assert [d.message for d in one.diagnostics] == ["first line: x"]
        everything = await stub.LspDiagnostics(later.LspDiagnosticsRequest())
        assert len(everything.diagnostics) == 1000  # of the 5,001 it reported


# --- the model's tools ------------------------------------------------------------------------------


async def execute(live: LiveServer, tool: str, **arguments: object) -> pb.ToolResult:
    reply = await live.stub.ExecuteTool(
        pb.ExecuteToolRequest(tool_name=tool, arguments=json.dumps(arguments))
    )
    return reply.result


async def test_an_edit_reports_the_errors_the_running_server_finds(
    served: tuple[LiveServer, Any], workspace: Path
) -> None:
    live, stub = served
    before = await execute(live, "edit_file", path="a.py", old_string="hi ", new_string="hello ")
    assert before.success and "error" not in before.output  # no server runs: the edit alone
    await stub.StartLspServer(later.StartLspServerRequest(language="python"))

    broken = await execute(live, "edit_file", path="a.py", old_string='greet("you")', new_string="greet(42)")
    assert broken.success
    assert "basedpyright reports 1 error(s) in a.py now:" in broken.output
    assert 'a.py:7:22: Argument of type "Literal[42]" cannot be assigned' in broken.output
    assert broken.metadata["lsp_errors"] == "1"

    fixed = await execute(live, "write_file", path="a.py", content=A_PY, overwrite=True)
    assert "basedpyright reports no errors in a.py." in fixed.output
    assert fixed.metadata["lsp_errors"] == "0"
    other = await execute(live, "write_file", path="notes.txt", content="x")
    assert "lsp_errors" not in other.metadata  # no server for text files


async def test_the_model_sees_the_errors_of_its_edit(workspace: Path, tmp_path: Path) -> None:
    python_workspace(workspace)
    edit = {"path": "b.py", "old_string": 'greet("bob")', "new_string": "greet(b=1)"}
    async with FakeLLM(tool_call("edit_file", edit), text("done")) as fake:
        async with running(agent_settings(workspace, tmp_path / "data")) as live:
            await initialize(live, fake)
            stub = later_grpc.CodeAgentServiceStub(live.channel)
            await stub.StartLspServer(later.StartLspServerRequest(language="python"))
            session = (await live.stub.CreateSession(pb.CreateSessionRequest())).session_id
            await live.stub.Generate(pb.GenerateRequest(session_id=session, messages=[user("fix it")]))
        result = next(m for m in fake.requests[1].messages if m["role"] == "tool")["content"]
    assert "basedpyright reports" in result and 'No parameter named "b"' in result


async def test_code_navigation_asks_the_running_server(
    served: tuple[LiveServer, Any], workspace: Path
) -> None:
    live, stub = served
    parsed = await execute(live, "find_references", symbol="greet")
    assert "b.py:7:5: greet = 5" in parsed.output  # tree-sitter: a same-named local counts
    assert "language_server" not in parsed.metadata

    await stub.StartLspServer(later.StartLspServerRequest(language="python"))

    async def indexed() -> bool:  # a server just started may not have found the files yet
        found = await stub.LspSymbols(later.LspSymbolsRequest(query="greet"))
        return len(found.symbols) > 0

    await eventually(indexed, "basedpyright knows the workspace's symbols", within_s=30)
    asked = await execute(live, "find_references", symbol="greet")
    assert asked.metadata["language_server"] == "basedpyright"
    # the uses of every definition named so (the local's too), but not the definitions themselves
    assert asked.output.splitlines() == [
        'a.py:7:16: return greet("you")',
        "b.py:1:15: from a import greet",
        'b.py:3:16: message: int = greet("bob")',
        "b.py:8:12: return greet",
    ]
    definition = await execute(live, "find_definition", symbol="Greeter", path="a.py")
    assert definition.metadata["language_server"] == "basedpyright"
    assert definition.output == "a.py:5: class: class Greeter:"
