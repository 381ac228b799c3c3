"""The official A3S TypeScript SDK's live tests, examples and methods against our server, through
tools/ts_sdk_check.py. Skipped without npm or the SDK checkout (CI has neither checkout):
give it with A3S_TS_SDK=<git directory of A3S-Lab/TypeScript-SDK>. How the check judges an
example is tested without either, on stand-in examples against the real server."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "ts_sdk_check.py"
CHECKOUT = Path(os.environ.get("A3S_TS_SDK", "/work/.mirror/A3S-Lab+TypeScript-SDK/repo"))


@pytest.mark.slow  # installs the SDK from npm once per commit, then runs ~25 node processes
def test_the_typescript_sdk_works_except_for_groups_we_do_not_serve() -> None:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    if not (CHECKOUT / "HEAD").exists() and not (CHECKOUT / ".git").exists():
        pytest.skip(f"no TypeScript SDK checkout at {CHECKOUT} (set A3S_TS_SDK)")
    done = subprocess.run(
        [sys.executable, str(TOOL), "--sdk", str(CHECKOUT)], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "direct: generate " in done.stdout and "live: " in done.stdout, done.stdout


@functools.cache
def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ts_sdk_check", TOOL)
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_an_unimplemented_answer_is_never_expected_now_that_every_rpc_is_served() -> None:
    tool = _tool()
    delegation = "Error: 12 UNIMPLEMENTED: Delegate: not served"
    assert tool.failure_reason(delegation) == (delegation.removeprefix("Error: 12 "), False)
    assert tool.failure_reason("12 UNIMPLEMENTED: Method not found!") == (
        "UNIMPLEMENTED: Method not found!",
        False,
    )
    assert tool.failure_reason("12 UNIMPLEMENTED: GetTodos: not served") == (
        "UNIMPLEMENTED: GetTodos: not served",
        False,
    )
    role = "3 INVALID_ARGUMENT: messages[0].role must be ROLE_USER"
    assert tool.failure_reason(role) == ("INVALID_ARGUMENT: messages[0].role must be ROLE_USER", False)
    placeholder = "INVALID_ARGUMENT: workspace '/path/to/project' does not exist"
    assert tool.failure_reason(placeholder, "lsp-example")[1] is False  # the check points it elsewhere
    no_rust = "14 UNAVAILABLE: language server rust-analyzer exited with code 1; it last wrote: error:"
    no_rust += " Unknown binary 'rust-analyzer' in official toolchain 'stable-x86_64-unknown-linux-gnu'."
    assert tool.failure_reason(no_rust, "lsp-example")[1] is True
    assert tool.failure_reason(no_rust, "simple-test")[1] is False


def test_the_lsp_example_runs_pointed_at_a_real_cargo_project(tmp_path: Path) -> None:
    tool = _tool()
    example = tmp_path / "examples" / "lsp-example.ts"
    example.parent.mkdir()
    example.write_text(
        "await client.initialize('/path/to/project');\nlspHover('/path/to/project/src/main.rs', 10, 5)\n"
    )
    served = tool.Served("127.0.0.1:1", tmp_path / "check" / "workspace", [], None, None)
    with tool.run_path(example, served) as runnable:
        assert runnable.parent == example.parent and runnable != example
        project = tmp_path / "check" / "rust-project"
        assert (
            runnable.read_text().count(f"'{project}") == 2 and "/path/to/project" not in runnable.read_text()
        )
        assert len((project / "src" / "main.rs").read_text().splitlines()) > 20
        assert (project / "Cargo.toml").exists()
    assert not runnable.exists() and example.exists()
    other = tmp_path / "examples" / "simple-test.ts"
    other.write_text("await client.initialize('/tmp/ws');\n")
    with tool.run_path(other, served) as runnable:
        assert runnable == other


def test_the_fake_model_answers_structured_requests_with_valid_json_and_calls_one_tool_per_prompt() -> None:
    tool = _tool()
    schema = {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "level": {"enum": ["low", "high"]},
            "score": {"type": ["number", "null"]},
        },
        "required": ["title", "tags", "level", "score"],
    }
    reply = tool.answer({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    jsonschema.validate(json.loads(reply.content), schema)
    tools = [{"type": "function", "function": {"name": "list_files"}}]
    asked = tool.answer({"tools": tools, "messages": [{"role": "user", "content": "hi"}]})
    assert [c.name for c in asked.tool_calls] == ["list_files"]
    after = [{"role": "user", "content": "hi"}, {"role": "assistant"}, {"role": "tool", "content": "a.txt"}]
    assert tool.answer({"tools": tools, "messages": after}).content


CLIENT = """import os, grpc
from a3s_agent.proto import code_agent_pb2 as pb, code_agent_pb2_grpc as pb_grpc
stub = pb_grpc.CodeAgentServiceStub(grpc.insecure_channel(os.environ["A3S_ADDRESS"]))
"""
EXAMPLES = {
    # Catches its own error, prints it and exits 0, as most of the SDK's examples do.
    "caught": CLIENT
    + "stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)\n"
    + "import sys; print(\"Error: TypeError: Cannot read properties of undefined (reading 'x')\", file=sys.stderr)\n",
    # Calls the server, which answers OK.
    "served": CLIENT + "stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)\n",
    # Calls the server, swallows the NOT_FOUND and exits 0 with nothing on stderr.
    "swallowed": CLIENT
    + "try:\n    stub.GetSession(pb.GetSessionRequest(session_id='no-such-session'), timeout=10)\n"
    + "except grpc.RpcError:\n    pass\n",
    # Says it passed and exits 0, but never called the server.
    "silent": "print('All tests passed!')\n",
}


def test_an_example_passes_only_on_the_servers_evidence(tmp_path: Path) -> None:
    """Examples run by a stand-in for tsx against the real server, as the check runs the SDK's:
    exit 0 is not enough; a pass needs no error reported and calls the server answered OK."""
    tool = _tool()
    examples = tmp_path / "sdk" / "typescript" / "examples"
    tsx = examples / "node_modules" / ".bin" / "tsx"
    tsx.parent.mkdir(parents=True)
    tsx.write_text(f'#!/bin/sh\nexec {sys.executable} "$1"\n')
    tsx.chmod(0o755)
    (examples / "src").mkdir()
    for name, source in EXAMPLES.items():
        (examples / "src" / f"{name}.py").write_text(source)
    with tool.serving(tmp_path) as served:
        env = tool.node_env(examples.parent, served.address)
        rows = {
            name: tool.example(examples / "src" / f"{name}.py", examples.parent, served, env, 60)
            for name in EXAMPLES
        }
    assert [name for name, row in rows.items() if row.ok] == ["served"], rows
    assert rows["caught"].reason.startswith("Error: TypeError: Cannot read") and not rows["caught"].expected
    assert rows["swallowed"].reason == "it exited 0, but the server answered GetSession with NOT_FOUND"
    assert rows["silent"].reason == "the server got no call from it"
