"""With bash and run_script disabled, no other tool runs a program the repository or the model names.

Every attack goes through ExecuteTool on the real gRPC server (bash and run_script disabled by
Initialize) against real git repositories, ruff, shfmt, shellcheck and prettier. Each payload
leaves a marker outside the workspace if it runs; the marker must never appear. Each git attack
is then replayed with the plain git CLI, which must leave the marker: the attack is real.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from a3s_agent.proto import code_agent_pb2 as pb
from a3s_agent.tools.process import find_binary

from ..conftest import LiveServer

pytestmark = pytest.mark.security

GIT = shutil.which("git") or "git"
OLD = 946684800  # 2000-01-01: an mtime that makes git look at a file's content, through its filters


@pytest.fixture
async def server(
    live: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[LiveServer]:
    """The in-process server with bash and run_script disabled, and a home of its own."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    await live.stub.Initialize(
        pb.InitializeRequest(
            config=pb.AgentConfig(tools=pb.ToolsConfig(disabled_tools=["bash", "run_script"]))
        )
    )
    yield live


async def execute(server: LiveServer, tool: str, **arguments: object) -> pb.ToolResult:
    reply = await server.stub.ExecuteTool(
        pb.ExecuteToolRequest(tool_name=tool, arguments=json.dumps(arguments))
    )
    return reply.result


# Plain git, as a person runs it, with only the repository's own configuration.
PLAIN_GIT_ENV = {
    "PATH": os.environ["PATH"],
    "HOME": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "PAGER": "cat",  # the default pager, which core.pager and pager.<command> override
    "LC_ALL": "C",
}


def git(cwd: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [GIT, *args], cwd=cwd, env=PLAIN_GIT_ENV, input=stdin, check=True, capture_output=True, text=True,
        timeout=30,
    ).stdout  # fmt: skip


def plain_git_on_a_terminal(repo: Path, args: list[str]) -> None:
    """Run git with stdout on a terminal (so it pages); its outcome does not matter."""
    leader, follower = os.openpty()
    try:
        subprocess.run(
            [GIT, *args], cwd=repo, env=PLAIN_GIT_ENV, stdin=subprocess.DEVNULL, stdout=follower,
            stderr=subprocess.DEVNULL, timeout=30, check=False,
        )  # fmt: skip
    finally:
        os.close(follower)
        os.close(leader)


def write(path: Path, text: str, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


# --- a hostile repository -------------------------------------------------------------------


@dataclass
class Hostile:
    """The workspace as a git repository whose files try to make git run payloads."""

    repo: Path
    payloads: Path
    markers: Path
    first: str = ""
    planted: list[str] = field(default_factory=list)

    def payload(self, name: str, *, passthrough: bool = True) -> str:
        """An executable leaving the marker `name`; it passes stdin through, as a filter or pager
        does, or (for a transport, which would wait for an answer) fails at once."""
        self.planted.append(name)
        marker = shlex.quote(str(self.markers / name))
        then = "cat" if passthrough else "exit 1"
        return str(write(self.payloads / name, f"#!/bin/sh\ntouch {marker}\n{then}\n", 0o755))

    def config(self, text: str) -> None:
        with (self.repo / ".git" / "config").open("a") as config:
            config.write(text)

    def attributes(self, line: str, directory: Path | None = None) -> None:
        with ((directory or self.repo) / ".gitattributes").open("a") as attributes:
            attributes.write(line + "\n")

    def touched(self) -> list[str]:
        return sorted(path.name for path in self.markers.iterdir())


@pytest.fixture
def hostile(workspace: Path, tmp_path: Path) -> Hostile:
    """Two commits, a staged change, an unstaged same-size change and an untracked file."""
    repo = workspace
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Ada Lovelace")
    git(repo, "config", "user.email", "ada@example.com")
    write(repo / "a.txt", "one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "first")
    first = git(repo, "rev-parse", "HEAD").strip()
    write(repo / "a.txt", "two\n")
    write(repo / "b.txt", "bee\n")
    git(repo, "add", "a.txt", "b.txt")
    git(repo, "commit", "-q", "-m", "second")
    write(repo / "b.txt", "bee, staged\n")
    git(repo, "add", "b.txt")
    unstaged = write(repo / "a.txt", "owt\n")
    os.utime(unstaged, (OLD, OLD))
    write(repo / "new.txt", "new\n")
    (tmp_path / "markers").mkdir()
    (tmp_path / "payloads").mkdir()
    return Hostile(repo, tmp_path / "payloads", tmp_path / "markers", first)


# Each attack plants its payloads; `control` is what plain git runs to set them off.


def fsmonitor(h: Hostile) -> list[list[str]]:
    h.config(f"[core]\n\tfsmonitor = {h.payload('fsmonitor')}\n")
    return [["status"]]


def hooks(h: Hostile) -> list[list[str]]:
    for name in ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-index-change",
                 "reference-transaction"):  # fmt: skip
        shutil.copy(h.payload(f"hook-{name}"), h.repo / ".git" / "hooks" / name)
    return [["add", "-A"], ["commit", "-q", "-m", "plain"]]


def hooks_path(h: Hostile) -> list[list[str]]:
    for name in ("pre-commit", "post-commit"):
        shutil.copy(h.payload(f"hooks-path-{name}"), write(h.repo / "githooks" / name, ""))
    h.config("[core]\n\thooksPath = githooks\n")
    return [["commit", "-q", "-a", "-m", "plain"]]


def filter_clean(h: Hostile) -> list[list[str]]:
    h.config(f'[filter "evil"]\n\tclean = {h.payload("filter-clean")}\n\trequired = true\n')
    h.attributes("*.txt filter=evil")
    return [["add", "-A"]]


def filter_process(h: Hostile) -> list[list[str]]:
    h.config(f'[filter "Evil.Twin"]\n\tprocess = {h.payload("filter-process")}\n')
    h.attributes("*.txt filter=Evil.Twin")
    return [["add", "-A"]]


def textconv(h: Hostile) -> list[list[str]]:
    h.config(f'[diff "evil"]\n\ttextconv = {h.payload("textconv")}\n')
    h.attributes("*.txt diff=evil")
    return [["diff"]]


def diff_command(h: Hostile) -> list[list[str]]:
    h.config(f'[diff "evil"]\n\tcommand = {h.payload("diff-command")}\n')
    h.attributes("*.txt diff=evil")
    return [["diff"]]


def external_diff(h: Hostile) -> list[list[str]]:
    h.config(f"[diff]\n\texternal = {h.payload('external-diff')}\n")
    return [["diff"]]


def pager(h: Hostile) -> list[list[str]]:
    h.config(f"[core]\n\tpager = {h.payload('pager-core')}\n[pager]\n\tlog = {h.payload('pager-log')}\n")
    return [["log"], ["show"]]


def editors(h: Hostile) -> list[list[str]]:
    h.config(
        f"[core]\n\teditor = {h.payload('editor')}\n[sequence]\n\teditor = {h.payload('sequence-editor')}\n"
    )
    return [["commit", "--allow-empty"], ["stash", "--include-untracked"], ["rebase", "-i", "HEAD~1"]]


def gpg_sign(h: Hostile) -> list[list[str]]:
    h.config(f"[commit]\n\tgpgSign = true\n[gpg]\n\tprogram = {h.payload('gpg-sign')}\n")
    return [["commit", "-q", "-a", "-m", "plain"]]


def show_signature(h: Hostile) -> list[list[str]]:
    """A commit carrying a signature: with log.showSignature git runs gpg.program to check it."""
    tree = git(h.repo, "rev-parse", "HEAD^{tree}").strip()
    parent = git(h.repo, "rev-parse", "HEAD").strip()
    signature = "-----BEGIN PGP SIGNATURE-----\n \n abc\n -----END PGP SIGNATURE-----"
    raw = (f"tree {tree}\nparent {parent}\nauthor A <a@b> 1 +0000\ncommitter A <a@b> 1 +0000\n"
           f"gpgsig {signature}\n\nsigned\n")  # fmt: skip
    signed = git(h.repo, "hash-object", "-t", "commit", "-w", "--stdin", stdin=raw).strip()
    git(h.repo, "update-ref", "HEAD", signed)
    h.config(f"[log]\n\tshowSignature = true\n[gpg]\n\tprogram = {h.payload('show-signature')}\n")
    return [["log"]]


def _partial_clone(h: Hostile, remote: str) -> None:
    """Make the first commit's a.txt a missing object of a partial clone: reading it fetches."""
    blob = git(h.repo, "rev-parse", f"{h.first}:a.txt").strip()
    (h.repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    h.config(
        "[core]\n\trepositoryformatversion = 1\n[extensions]\n\tpartialClone = origin\n"
        f'[remote "origin"]\n\turl = {remote}\n\tpromisor = true\n[protocol "ext"]\n\tallow = always\n'
    )


def lazy_fetch_ext(h: Hostile) -> list[list[str]]:
    _partial_clone(h, f"ext::{h.payload('lazy-fetch-ext', passthrough=False)}")
    return [["diff", h.first]]


def lazy_fetch_ssh(h: Hostile) -> list[list[str]]:
    _partial_clone(h, "ssh://git.example.invalid/repo")
    h.config(f"[core]\n\tsshCommand = {h.payload('lazy-fetch-ssh', passthrough=False)}\n")
    return [["diff", h.first]]


def include(h: Hostile) -> list[list[str]]:
    write(h.repo / "shared.gitconfig", f"[core]\n\tfsmonitor = {h.payload('include')}\n")
    h.config("[include]\n\tpath = ../shared.gitconfig\n")
    return [["status"]]


def include_if(h: Hostile) -> list[list[str]]:
    write(h.repo / "conditional.gitconfig", f'[filter "cond"]\n\tclean = {h.payload("include-if")}\n')
    h.config(f'[includeIf "gitdir:{h.repo}/"]\n\tpath = ../conditional.gitconfig\n')
    h.attributes("*.txt filter=cond")
    return [["add", "-A"]]


def worktree_config(h: Hostile) -> list[list[str]]:
    h.config("[core]\n\trepositoryformatversion = 1\n[extensions]\n\tworktreeConfig = true\n")
    write(h.repo / ".git" / "config.worktree", f"[core]\n\tfsmonitor = {h.payload('worktree-config')}\n")
    return [["status"]]


def _submodule(h: Hostile) -> tuple[Path, Path]:
    """A submodule `sm` with a same-size change to s.txt; its directory and its git directory."""
    upstream = h.repo.parent / "upstream"
    upstream.mkdir()
    git(upstream, "init", "-q", "-b", "main")
    write(upstream / "s.txt", "sub\n")
    git(upstream, "add", "s.txt")
    git(upstream, "-c", "user.name=U", "-c", "user.email=u@example.com", "commit", "-q", "-m", "s")
    git(h.repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(upstream), "sm")
    git(h.repo, "commit", "-q", "-m", "add sm", "--", ".gitmodules", "sm")
    changed = write(h.repo / "sm" / "s.txt", "bus\n")
    os.utime(changed, (OLD, OLD))
    return h.repo / "sm", h.repo / ".git" / "modules" / "sm"


def submodule_filter(h: Hostile) -> list[list[str]]:
    work, gitdir = _submodule(h)
    with (gitdir / "config").open("a") as config:
        config.write(f'[filter "sub"]\n\tclean = {h.payload("submodule-filter")}\n')
    h.attributes("*.txt filter=sub", work)
    return [["status"]]


def submodule_fsmonitor(h: Hostile) -> list[list[str]]:
    _, gitdir = _submodule(h)
    with (gitdir / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {h.payload('submodule-fsmonitor')}\n")
    return [["status"]]


GIT_ATTACKS: dict[str, Callable[[Hostile], list[list[str]]]] = {
    "core.fsmonitor": fsmonitor,
    ".git/hooks": hooks,
    "core.hooksPath": hooks_path,
    "filter.clean": filter_clean,
    "filter.process": filter_process,
    "diff.textconv": textconv,
    "diff.command": diff_command,
    "diff.external": external_diff,
    "core.pager and pager.log": pager,
    "core.editor and sequence.editor": editors,
    "commit.gpgSign": gpg_sign,
    "log.showSignature": show_signature,
    "partial clone over ext::": lazy_fetch_ext,
    "partial clone over core.sshCommand": lazy_fetch_ssh,
    "include.path": include,
    "includeIf": include_if,
    "config.worktree": worktree_config,
    "submodule filter": submodule_filter,
    "submodule fsmonitor": submodule_fsmonitor,
}


async def every_git_tool(server: LiveServer, h: Hostile) -> dict[str, pb.ToolResult]:
    calls: list[tuple[str, str, dict[str, object]]] = [
        ("status", "git_status", {}),
        ("diff", "git_diff", {}),
        ("diff staged", "git_diff", {"staged": True}),
        ("diff first", "git_diff", {"ref": h.first}),
        ("log", "git_log", {}),
        ("commit paths", "git_commit", {"message": "by the tool", "paths": ["new.txt"]}),
        ("commit all", "git_commit", {"message": "by the tool, all", "all": True}),
        ("commit everything", "git_commit", {"message": "by the tool, the lot", "paths": ["."]}),
    ]
    return {label: await execute(server, tool, **arguments) for label, tool, arguments in calls}


@pytest.mark.parametrize("attack", GIT_ATTACKS.values(), ids=GIT_ATTACKS.keys())
async def test_git_tools_run_nothing_the_repository_configures(
    server: LiveServer, hostile: Hostile, attack: Callable[[Hostile], list[list[str]]]
) -> None:
    control = attack(hostile)

    results = await every_git_tool(server, hostile)

    assert hostile.touched() == []
    assert results["status"].success, results["status"].error
    assert results["commit paths"].success, results["commit paths"].error
    # The same repository sets the payloads off when plain git runs there.
    write(hostile.repo / "a.txt", "xyz\n")
    for args in control:
        plain_git_on_a_terminal(hostile.repo, args)
    assert hostile.touched() == sorted(set(hostile.planted))


async def test_config_based_hooks_are_refused(server: LiveServer, hostile: Hostile) -> None:
    """hook.<name>.command (git 2.5x) would run on its event whatever core.hooksPath says."""
    command = hostile.payload("config-hook")
    hostile.config(f'[hook "audit"]\n\tcommand = {command}\n\tevent = pre-commit\n')
    results = await every_git_tool(server, hostile)
    assert hostile.touched() == []
    for result in results.values():
        assert not result.success and "hook.audit.command" in result.error


async def test_a_filter_name_git_cannot_override_is_refused(server: LiveServer, hostile: Hostile) -> None:
    hostile.config(f'[filter "a=b"]\n\tclean = {hostile.payload("odd-filter")}\n')
    hostile.attributes("*.txt filter=a=b")
    result = await execute(server, "git_status")
    assert not result.success and "'a=b'" in result.error
    assert hostile.touched() == []


async def test_the_operators_identity_is_kept_though_global_config_is_not_read(
    server: LiveServer, hostile: Hostile, tmp_path: Path
) -> None:
    write(tmp_path / "home" / ".gitconfig", "[user]\n\tname = Op Erator\n\temail = op@example.com\n")
    git(hostile.repo, "config", "--unset", "user.name")
    git(hostile.repo, "config", "--unset", "user.email")
    result = await execute(server, "git_commit", message="m", paths=["new.txt"])
    assert result.success, result.error
    assert git(hostile.repo, "log", "-1", "--format=%an <%ae>").strip() == "Op Erator <op@example.com>"


# --- formatters and linters -----------------------------------------------------------------


def passwd_extend(path: Path) -> Path:
    """A ruff configuration extending /etc/passwd: ruff quotes the file in its parse error."""
    return write(path, 'extend = "/etc/passwd"\n')


async def test_ruff_reads_no_configuration_above_the_workspace(
    server: LiveServer, workspace: Path, tmp_path: Path
) -> None:
    passwd_extend(tmp_path / "ruff.toml")
    write(workspace / "app.py", "import os\nx=1\n")
    plain = subprocess.run(
        [find_binary("ruff") or "ruff", "check", "--no-cache", "app.py"],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "root:" in plain.stderr  # what ruff does on its own

    lint = await execute(server, "lint_code", path="app.py")
    fmt = await execute(server, "format_code", path="app.py", check=True)

    assert lint.success and "F401" in lint.output, lint.error
    assert fmt.success and "+x = 1" in fmt.output, fmt.error


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pyproject.toml", '[tool.ruff]\nextend = "../outside.toml"\n'),
        ("ruff.toml", 'extend = "/etc/passwd"\n'),
        ("ruff.toml", 'extend = "~/ruff.toml"\n'),
        (".ruff.toml", 'extend = "${HOME}/ruff.toml"\n'),
    ],
)
async def test_ruff_configuration_extending_outside_the_workspace_is_refused(
    server: LiveServer, workspace: Path, tmp_path: Path, name: str, text: str
) -> None:
    write(tmp_path / "outside.toml", "[lint]\nselect = []\n")
    write(workspace / name, text)
    write(workspace / "app.py", "import os\n")
    for tool, arguments in (("lint_code", {"path": "app.py"}), ("format_code", {"path": "app.py"})):
        result = await execute(server, tool, **arguments)
        assert not result.success
        assert f"ruff configuration {name}" in result.error and "extend" in result.error
        assert "root:" not in result.error


async def test_ruff_follows_extend_inside_the_workspace_and_refuses_a_chain_leading_out(
    server: LiveServer, workspace: Path
) -> None:
    write(workspace / "base.toml", '[lint]\nselect = ["E701"]\n')
    write(workspace / "pkg" / "ruff.toml", 'extend = "../base.toml"\n')
    write(workspace / "pkg" / "mod.py", "import os\nif True: pass\n")
    result = await execute(server, "lint_code", path="pkg/mod.py")
    assert result.success, result.error
    assert [d.split()[1] for d in result.output.splitlines()[:-1]] == ["E701"]  # only base.toml's rule

    passwd_extend(workspace / "base.toml")
    result = await execute(server, "lint_code", path="pkg")
    assert not result.success and "base.toml" in result.error and "root:" not in result.error


async def test_shellcheck_reads_only_the_workspace_rc(
    server: LiveServer, workspace: Path, tmp_path: Path
) -> None:
    write(tmp_path / ".shellcheckrc", "disable=SC2086\n")
    write(workspace / "bin" / "go.sh", "#!/bin/sh\necho $1\n")
    result = await execute(server, "lint_code", path="bin/go.sh")
    assert result.success and "SC2086" in result.output  # the rc above the workspace is not read

    write(workspace / ".shellcheckrc", "disable=SC2086\n")
    result = await execute(server, "lint_code", path="bin/go.sh")
    assert result.success and "SC2086" not in result.output

    write(workspace / "bin" / ".shellcheckrc", "enable=all  external-sources=true\n")
    result = await execute(server, "lint_code", path="bin/go.sh")
    assert not result.success and "bin/.shellcheckrc" in result.error and "external-sources" in result.error


async def test_shfmt_reads_only_the_workspaces_editorconfig(
    server: LiveServer, workspace: Path, tmp_path: Path
) -> None:
    write(tmp_path / ".editorconfig", "[*]\nindent_style = space\nindent_size = 8\n")
    script = write(workspace / "sub" / "run.sh", "if true;then\necho hi\nfi\n")
    result = await execute(server, "format_code", path="sub/run.sh")
    assert result.success, result.error
    assert script.read_text() == "if true; then\n\techo hi\nfi\n"

    write(workspace / "sub" / ".editorconfig", "[*.sh]\nindent_style = space\nindent_size = 3\n")
    result = await execute(server, "format_code", path="sub/run.sh")
    assert result.success, result.error
    assert script.read_text() == "if true; then\n   echo hi\nfi\n"


needs_prettier = pytest.mark.skipif(find_binary("prettier") is None, reason="prettier is not installed")


def js_payload(directory: Path, marker: Path) -> Path:
    return write(
        directory / "evil.cjs",
        f"require('fs').writeFileSync({json.dumps(str(marker))}, 'x');\nmodule.exports = {{}};\n",
    )


@needs_prettier
@pytest.mark.parametrize(
    ("name", "text"),
    [
        (".prettierrc", '{"plugins": ["./evil.cjs"]}'),
        (".prettierrc.yaml", "overrides:\n  - files: '*.js'\n    options:\n      plugins: ['./evil.cjs']\n"),
        (".prettierrc.cjs", "require('./evil.cjs');\nmodule.exports = {};\n"),
        ("prettier.config.mjs", "import './evil.cjs';\nexport default {};\n"),
        ("package.json", '{"name": "x", "prettier": "./evil.cjs"}'),
        (".prettierrc.json", '"./evil.cjs"'),
    ],
)
async def test_prettier_configuration_that_runs_javascript_is_refused(
    server: LiveServer, workspace: Path, tmp_path: Path, name: str, text: str
) -> None:
    marker = tmp_path / "prettier-ran"
    js_payload(workspace, marker)
    write(workspace / name, text)
    write(workspace / "app.js", "let x=1\n")
    plain = subprocess.run(
        [find_binary("prettier") or "prettier", "app.js"],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert marker.exists(), plain.stderr  # what prettier does on its own
    marker.unlink()

    result = await execute(server, "format_code", path="app.js")

    assert not result.success and f"prettier configuration {name}" in result.error
    assert not marker.exists()


@needs_prettier
async def test_prettier_reads_only_the_workspaces_configuration(
    server: LiveServer, workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "prettier-ran"
    js_payload(tmp_path, marker)
    write(tmp_path / ".prettierrc", '{"plugins": ["./evil.cjs"], "tabWidth": 8}')
    source = write(workspace / "src" / "app.js", "function f(){return 1}\n")
    result = await execute(server, "format_code", path="src/app.js")
    assert result.success, result.error
    assert source.read_text() == "function f() {\n  return 1;\n}\n" and not marker.exists()

    write(workspace / "package.json", '{"name": "x", "prettier": {"tabWidth": 4, "semi": false}}')
    result = await execute(server, "format_code", path="src/app.js")
    assert result.success, result.error
    assert source.read_text() == "function f() {\n    return 1\n}\n" and not marker.exists()


# --- every tool, with bash and run_script disabled ------------------------------------------


async def test_no_tool_runs_a_command_the_model_writes(
    server: LiveServer, hostile: Hostile, tmp_path: Path
) -> None:
    """The model has only the remaining tools: it writes configuration with the file tools and calls
    the tools that read it, and passes option-like arguments to the ones that run binaries."""
    marker = tmp_path / "markers" / "model"
    touch = f"touch {marker}"
    for tool in ("bash", "run_script"):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await execute(server, tool, command=touch)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND

    config = (hostile.repo / ".git" / "config").read_text()
    hostile_config = (
        f"[core]\n\tfsmonitor = {touch}\n\tpager = {touch}\n\teditor = {touch}\n"
        f'[filter "m"]\n\tclean = {touch}\n\tprocess = {touch}\n\trequired = true\n'
        f'[diff "m"]\n\ttextconv = {touch}\n\tcommand = {touch}\n[diff]\n\texternal = {touch}\n'
        f"[gpg]\n\tprogram = {touch}\n[commit]\n\tgpgSign = true\n[include]\n\tpath = ../more.gitconfig\n"
    )
    writes = [
        (".git/config", config + hostile_config),
        ("more.gitconfig", f"[core]\n\tsshCommand = {touch}\n[credential]\n\thelper = !{touch}\n"),
        (".gitattributes", "* filter=m diff=m\n"),
        (".git/hooks/pre-commit", f"#!/bin/sh\n{touch}\n"),
        (".git/hooks/post-index-change", f"#!/bin/sh\n{touch}\n"),
        ("pyproject.toml", '[tool.ruff]\nextend = "/etc/passwd"\n'),
        (".prettierrc", '{"plugins": ["./plugin.cjs"]}'),
        ("plugin.cjs", f"require('child_process').execSync({json.dumps(touch)});\n"),
        (".shellcheckrc", "external-sources=true\n"),
        (".ripgreprc", f"--pre={marker}\n"),
        ("script.sh", "#!/bin/sh\necho $1\n"),
        ("app.js", "let x=1\n"),
        ("app.py", "import os\n"),
    ]
    for path, content in writes:
        written = await execute(server, "write_file", path=path, content=content)
        if not written.success:  # a hostile repository ships the file all the same
            write(hostile.repo / path, content)
    calls: list[tuple[str, dict[str, object]]] = [
        ("git_status", {}),
        ("git_diff", {}),
        ("git_diff", {"staged": True, "ref": hostile.first}),
        ("git_log", {}),
        ("git_commit", {"message": "m", "paths": ["new.txt", "app.py"]}),
        ("git_commit", {"message": "m", "all": True}),
        ("format_code", {"path": "app.py"}),
        ("format_code", {"path": "app.js"}),
        ("format_code", {"path": "script.sh"}),
        ("format_code", {"content": "x=1", "language": "python"}),
        ("lint_code", {"path": "."}),
        ("lint_code", {"path": "script.sh"}),
        ("grep", {"pattern": f"--pre={marker}", "path": "."}),
        ("grep", {"pattern": "x", "glob": f"--pre={marker}"}),
        ("grep", {"pattern": "x", "path": f"--pre={marker}"}),
        ("find_definition", {"symbol": f"--pre={marker}"}),
        ("find_references", {"symbol": "x", "path": f"--pre={marker}"}),
        ("search_files", {"pattern": f"--exec={touch}"}),
        ("list_files", {"path": "."}),
        ("read_file", {"path": ".git/config"}),
    ]
    for tool, arguments in calls:
        try:
            await execute(server, tool, **arguments)
        except grpc.aio.AioRpcError as err:  # an argument the tool's schema refuses
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (tool, err.details())
        assert not marker.exists(), (tool, arguments)
    plain_git_on_a_terminal(hostile.repo, ["status"])
    assert marker.exists()  # the configuration written is live
