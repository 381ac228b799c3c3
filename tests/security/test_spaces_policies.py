"""Agent Spaces policies that hold, attacked through /v1/spaces and `a3s-agent ops`.

Blocked paths reached through symlinks and hard links, command rules dodged with wrappers,
quoting, flags and substitutions, an env that makes bash run other code, too many runs, and a
shell operation on a server whose operator disabled bash.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from a3s_agent.config import SandboxSettings
from a3s_agent.proto import code_agent_pb2 as pb

from ..conftest import ServerProcess
from ..test_spaces import until_exists
from ..test_spaces_http import SpacesServer, serving, spaces_server

pytestmark = pytest.mark.security

SECRET = "KEY=top-secret"


def ops(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


async def space_in(http: aiohttp.ClientSession, workspace: Path, policy: Any = "standard") -> str:
    async with http.post("/v1/spaces", json={"workspace": str(workspace), "policy": policy}) as reply:
        assert reply.status == 201, await reply.text()
        return (await reply.json())["spaceId"]


async def run(http: aiohttp.ClientSession, space: str, *operations: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"/v1/spaces/{space}/runs", json=ops(*operations)) as reply:
        assert reply.status == 200, await reply.text()
        return await reply.json()


def secrets_workspace(root: Path) -> Path:
    """A workspace with files the presets block: .env, a private key, .git."""
    root.mkdir(exist_ok=True)
    (root / ".env").write_text(SECRET)
    (root / "id_rsa").write_text("PRIVATE KEY")
    (root / "server.pem").write_text("PRIVATE PEM")
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]")
    (root / "plain.txt").write_text("plain")
    return root


# --- 1. blocked paths are decided on the file reached, not the spelling ---------------------------


async def test_symlinks_and_hard_links_to_blocked_files_are_blocked(workspace: Path, tmp_path: Path) -> None:
    root = secrets_workspace(workspace)
    (root / "notes.txt").symlink_to(".env")
    (root / "key.txt").symlink_to("id_rsa")
    (root / "cert.txt").symlink_to(root / "server.pem")  # absolute target
    (root / "g").symlink_to(".git")
    (root / "later").symlink_to(".env.local")  # dangling: a write would create .env.local
    os.link(root / ".env", root / "copy.txt")
    os.link(root / "id_rsa", root / "backup.txt")
    (root / "sub").mkdir()
    os.link(root / ".git" / "config", root / "sub" / "gitconfig")
    (root / "alias.txt").symlink_to("plain.txt")  # controls: ordinary files stay reachable
    os.link(root / "plain.txt", root / "twin.txt")
    async with serving(root, tmp_path / "data") as http:
        space = await space_in(http, root)
        attacks: list[dict[str, Any]] = [
            {"type": "readFile", "path": "notes.txt"},
            {"type": "readFile", "path": "key.txt"},
            {"type": "readFile", "path": "cert.txt"},
            {"type": "readFile", "path": "g/config"},
            {"type": "readFile", "path": "copy.txt"},
            {"type": "readFile", "path": "backup.txt", "encoding": "base64"},
            {"type": "readFile", "path": "sub/gitconfig"},
            {"type": "editFile", "path": "notes.txt", "edits": [{"oldContent": "KEY", "newContent": "X"}]},
            {"type": "editFile", "path": "copy.txt", "edits": [{"oldContent": "KEY", "newContent": "X"}]},
            {"type": "createFile", "path": "notes.txt", "content": "KEY=mine", "overwrite": True},
            {"type": "createFile", "path": "g/hooks/pre-commit", "content": "#!/bin/sh\necho owned"},
            {"type": "createFile", "path": "later", "content": "KEY=planted"},
            {"type": "deleteFile", "path": "g/config"},
            {"type": "deleteFile", "path": "copy.txt"},
        ]
        result = await run(http, space, *attacks)
        controls = await run(
            http, space, {"type": "readFile", "path": "alias.txt"}, {"type": "readFile", "path": "twin.txt"}
        )
    for attack, event in zip(attacks, result["events"], strict=True):
        assert event["type"] == "policyDenied", (attack, event)
    assert "it leads to '.env'" in result["events"][0]["reason"]
    assert "it leads to '.git/config'" in result["events"][3]["reason"]
    assert [event["content"] for event in controls["events"]] == ["plain", "plain"]
    assert (root / ".env").read_text() == SECRET and (root / "copy.txt").read_text() == SECRET
    assert (root / ".git" / "config").read_text() == "[core]"
    assert not (root / ".git" / "hooks" / "pre-commit").exists() and not (root / ".env.local").exists()


async def test_a_restrictive_space_reads_no_secret_through_a_link(workspace: Path, tmp_path: Path) -> None:
    root = secrets_workspace(workspace)
    (root / "readme.md").symlink_to(".env")
    os.link(root / "server.pem", root / "data.bin")
    async with serving(root, tmp_path / "data") as http:
        space = await space_in(http, root, "restrictive")
        result = await run(
            http,
            space,
            {"type": "readFile", "path": "readme.md"},
            {"type": "readFile", "path": "data.bin"},
            {"type": "readFile", "path": "plain.txt"},
        )
    denied_link, denied_hard_link, plain = result["events"]
    assert denied_link["type"] == denied_hard_link["type"] == "policyDenied"
    assert plain["content"] == "plain"


async def test_an_approval_does_not_let_a_swapped_in_symlink_through(workspace: Path, tmp_path: Path) -> None:
    root = secrets_workspace(workspace)
    (root / "docs").mkdir()
    (root / "docs" / "a.txt").write_text("docs")
    async with serving(root, tmp_path / "data") as http:
        space = await space_in(http, root, {"preset": "standard", "ask": ["Read(docs/**)"]})
        paused = await run(http, space, {"type": "readFile", "id": "r", "path": "docs/a.txt"})
        assert paused["status"] == "awaiting_approval"
        (root / "docs" / "a.txt").unlink()
        (root / "docs" / "a.txt").symlink_to("../.env")
        approval = {"approval": {"operationId": "r", "decision": "approved"}}
        async with http.post(f"/v1/spaces/{space}/runs/{paused['runId']}/resume", json=approval) as reply:
            resumed = await reply.json()
    assert [event["type"] for event in resumed["events"]] == ["policyDenied"]
    assert SECRET not in json.dumps(resumed)


def test_ops_blocks_a_symlink_to_a_secret(tmp_path: Path) -> None:
    root = secrets_workspace(tmp_path / "ws")
    (root / "notes.txt").symlink_to(".env")
    (tmp_path / "ops.json").write_text(json.dumps(ops({"type": "readFile", "path": "notes.txt"})))
    result = subprocess.run(
        [sys.executable, "-m", "a3s_agent", "ops", str(tmp_path / "ops.json"), "--workspace", str(root)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr  # a denied operation did not succeed
    assert json.loads(result.stdout)["events"][0]["type"] == "policyDenied"
    assert "top-secret" not in result.stdout


# --- 2. command rules hold on the parsed command ----------------------------------------------------

DENY_VICTIM = {"deny": ["Bash(rm -rf victim:*)"]}  # no preset: nothing else is denied or asked
EVASIONS = [
    "rm -fr victim",
    "rm -Rf victim",
    "rm -r -f victim",
    "rm --recursive --force victim",
    "rm --rec --fo victim",
    "rm -rf -- victim",
    "rm -rf ./victim/",
    "/bin/rm -rf victim",
    "'r''m' -rf victim",
    "\\rm -rf victim",
    "r\\m -rf victim",
    "env -i A=1 rm -rf victim",
    "env -u HOME -- rm -rf victim",
    "command rm -rf victim",
    "exec rm -rf victim",
    "nohup rm -rf victim",
    "time rm -rf victim",
    "time -p rm -rf victim",
    "nice -n 5 rm -rf victim",
    "timeout 20 rm -rf victim",
    "echo victim | xargs rm -rf victim",
    "true && rm -rf victim",
    "false || rm -rf victim",
    "echo hi; rm -rf victim",
    "echo hi\nrm -rf victim",
    "(rm -rf victim)",
    "{ rm -rf victim; }",
    "if true; then rm -rf victim; fi",
    "for i in 1; do rm -rf victim; done",
    "wipe() { rm -rf victim; }; wipe",
    "echo $(rm -rf victim)",
    'echo "$(rm -rf victim)"',
    "echo `rm -rf victim`",
    "x=$(rm -rf victim)",
    "cat <(rm -rf victim)",
    "echo hi > >(rm -rf victim)",
    "bash -c 'rm -rf victim'",
    'sh -ec "rm -rf victim"',
    "eval 'rm -rf victim'",
    "find . -maxdepth 0 -exec rm -rf victim ';'",
    "rm -rf victim &",
    "! rm -rf victim",
]


@pytest.mark.parametrize("command", EVASIONS)
async def test_a_deny_rule_holds_against_every_spelling(
    workspace: Path, tmp_path: Path, command: str
) -> None:
    (workspace / "victim").mkdir()
    (workspace / "victim" / "f").write_text("x")
    async with serving(workspace, tmp_path / "data") as http:
        space = await space_in(http, workspace, DENY_VICTIM)
        result = await run(http, space, {"type": "shell", "command": command})
    assert result["events"][0]["type"] == "policyDenied", result["events"][0]
    assert "rm -rf victim" in result["events"][0]["reason"]
    assert (workspace / "victim" / "f").exists()


async def test_the_deny_rule_lets_other_commands_run(workspace: Path, tmp_path: Path) -> None:
    """The control: the same policy runs what its rule does not name, so the attacks above are real."""
    for name in ("victim", "other"):
        (workspace / name).mkdir()
    async with serving(workspace, tmp_path / "data") as http:
        space = await space_in(http, workspace, DENY_VICTIM)
        result = await run(
            http,
            space,
            {"type": "shell", "command": "rm -rf other"},
            {"type": "shell", "command": "rm -r victim"},
        )
    assert [event["success"] for event in result["events"]] == [True, True]
    assert not (workspace / "other").exists() and not (workspace / "victim").exists()


@pytest.mark.parametrize(
    "command",
    [
        "command sudo true",
        'echo "$(sudo true)"',
        "env FOO=1 /usr/bin/curl http://127.0.0.1:9",
        "ls | xargs wget",
        "cat <(ssh host)",
        "bash -c 'chmod 777 .'",
        "nohup chown -R nobody .",
    ],
)
async def test_standard_presets_rules_see_through_wrappers(
    workspace: Path, tmp_path: Path, command: str
) -> None:
    async with serving(workspace, tmp_path / "data") as http:
        space = await space_in(http, workspace)
        result = await run(http, space, {"type": "shell", "command": command})
    assert result["events"][0]["type"] == "policyDenied", result["events"][0]


UNPARSABLE = [
    "case x in x) touch made;; esac",
    "[[ -d . ]] && touch made",
    "echo ${x:-$(touch made)}",
    "cat <<EOF\n$(touch made)\nEOF",
    'c="touch made"; eval "$c"',
    'c="touch made"; bash -c "$c"',
    "echo $((1 + 1)) && touch made",
    "env -S 'touch made'",
]


@pytest.mark.parametrize("command", UNPARSABLE)
async def test_commands_the_parser_cannot_check(workspace: Path, tmp_path: Path, command: str) -> None:
    """Denied by an allow-list policy (as restrictive would), paused for approval by standard, run
    by permissive."""
    async with serving(workspace, tmp_path / "data") as http:
        allow_list = {"preset": "permissive", "allow": ["Bash(touch:*)"], "defaultDecision": "deny"}
        strict = await space_in(http, workspace, {"allow": ["Bash(*)"], "defaultDecision": "deny"})
        standard = await space_in(http, workspace, "standard")
        permissive = await space_in(http, workspace, "permissive")
        refused = await run(http, strict, {"type": "shell", "command": command})
        assert refused["events"][0]["type"] == "policyDenied"
        assert "cannot be checked" in refused["events"][0]["reason"]
        paused = await run(http, standard, {"type": "shell", "command": command})
        assert paused["status"] == "awaiting_approval"
        assert paused["events"][0]["details"]["policy"] == "shell.unparsedCommand"
        assert not (workspace / "made").exists()
        kept = await run(
            http, await space_in(http, workspace, allow_list), {"type": "shell", "command": command}
        )
        assert kept["events"][0]["type"] == "policyDenied"  # an allow list is not fooled either
        ran = await run(http, permissive, {"type": "shell", "command": command})
    assert ran["events"][0]["type"] == "shell" and (workspace / "made").exists()


ALLOW_LIST = {"allow": ["Bash(echo:*)", "Bash(ls:*)", "Bash(git status:*)"], "defaultDecision": "deny"}
OUTSIDE_THE_LIST = [
    "echo hi; touch pwned",
    "echo $(touch pwned)",
    "ls `touch pwned`",
    "ls | xargs touch pwned",
    "nohup touch pwned",
    "env touch pwned",
    "PATH=.:$PATH ls",
    "export PATH=.; ls",
    "LD_PRELOAD=./evil.so ls",
    "env LD_PRELOAD=./evil.so ls",
    "bash -c 'touch pwned'",
    "eval touch pwned",
    "$(echo touch) pwned",
    "ech* pwned",
    "git -c core.pager='touch pwned' status",
    "ls; ./ls",
    "ls() { touch pwned; }; ls",
]


@pytest.mark.parametrize("command", OUTSIDE_THE_LIST)
async def test_an_allow_list_is_a_guarantee(workspace: Path, tmp_path: Path, command: str) -> None:
    fake = workspace / "ls"
    fake.write_text("#!/bin/sh\ntouch pwned\n")
    fake.chmod(0o755)
    async with serving(workspace, tmp_path / "data") as http:
        space = await space_in(http, workspace, ALLOW_LIST)
        result = await run(http, space, {"type": "shell", "command": command})
        allowed = await run(http, space, {"type": "shell", "command": "echo ok && ls -a | ls"})
    assert result["events"][0]["type"] == "policyDenied", result["events"][0]
    assert not (workspace / "pwned").exists()
    assert allowed["events"][0]["success"] is True and allowed["events"][0]["stdout"]


WRITES_OUTSIDE_THE_LIST = [
    "echo pwned > {outside}",
    "echo pwned >> {outside}",
    "echo pwned >| {outside}",
    "echo pwned &> {outside}",
    "echo pwned 2>&1 1<> {outside}",
    "echo pwned | tee -a {outside}",
    "nohup echo pwned > {outside}",
    "echo pwned > notes.txt",  # in the workspace, where no rule allows writing either
    "cd out && echo pwned > ../notes.txt",  # relative to a directory known when it runs
]


@pytest.mark.parametrize("command", WRITES_OUTSIDE_THE_LIST)
async def test_an_allow_rule_for_a_program_does_not_cover_where_it_writes(
    workspace: Path, tmp_path: Path, command: str
) -> None:
    outside, elsewhere = tmp_path / "pwned", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / "out").mkdir()
    policy = {
        "allow": ["Bash(echo:*)", "Bash(tee:*)", "Bash(cd:*)", "Write(out/**)", f"Write({elsewhere}/**)"],
        "defaultDecision": "deny",
    }
    allowed = ["echo ok > out/a.txt", f"echo ok | tee {elsewhere}/b.txt", "echo ok >/dev/null 2>&1"]
    sandbox = SandboxSettings(write=(elsewhere,))  # the operator lets commands write there too
    async with serving(workspace, tmp_path / "data", sandbox) as http:
        space = await space_in(http, workspace, policy)
        result = await run(http, space, {"type": "shell", "command": command.format(outside=outside)})
        controls = await run(http, space, *({"type": "shell", "command": c} for c in allowed))
    event = result["events"][0]
    assert event["type"] == "policyDenied" and "writes" in event["reason"], event
    assert not outside.exists() and not (workspace / "notes.txt").exists()
    assert [event["success"] for event in controls["events"]] == [True, True, True]
    assert (workspace / "out" / "a.txt").read_text() == (elsewhere / "b.txt").read_text() == "ok\n"


async def test_a_redirection_does_not_reach_a_blocked_path(workspace: Path, tmp_path: Path) -> None:
    root = secrets_workspace(workspace)
    async with serving(root, tmp_path / "data") as http:
        space = await space_in(http, root)
        result = await run(
            http,
            space,
            {"type": "shell", "command": "echo KEY=planted > .env"},
            {"type": "shell", "command": "echo '[core] hooksPath=x' | tee -a .git/config"},
        )
    assert [event["type"] for event in result["events"]] == ["policyDenied", "policyDenied"]
    assert "Path '.env' is blocked" in result["events"][0]["reason"]
    assert (root / ".env").read_text() == SECRET and (root / ".git" / "config").read_text() == "[core]"


# --- 3. the shell operation's env ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["BASH_ENV", "ENV", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PROMPT_COMMAND",
                                  "PATH", "SHELLOPTS", "PS4", "BASH_FUNC_echo%%"])  # fmt: skip
async def test_env_may_not_make_bash_run_other_code(workspace: Path, tmp_path: Path, name: str) -> None:
    async with serving(workspace, tmp_path / "data") as http:
        for policy in ("standard", "restrictive"):
            space = await space_in(http, workspace, policy)
            result = await run(http, space, {"type": "shell", "command": "echo hi", "env": {name: "x"}})
            event = result["events"][0]
            assert event["type"] == "policyDenied" and name in event["reason"], event


async def test_bash_env_would_run_a_script_and_is_refused(workspace: Path, tmp_path: Path) -> None:
    (workspace / "hook.sh").write_text("touch hooked\n")
    attack = {"type": "shell", "command": "true", "env": {"BASH_ENV": str(workspace / "hook.sh")}}
    async with serving(workspace, tmp_path / "data") as http:
        refused = await run(http, await space_in(http, workspace, "standard"), attack)
        assert refused["events"][0]["type"] == "policyDenied" and not (workspace / "hooked").exists()
        ran = await run(http, await space_in(http, workspace, "permissive"), attack)
    assert ran["events"][0]["success"] is True and (workspace / "hooked").exists()  # the attack is real


async def test_the_shell_sees_none_of_the_servers_secrets(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-server-secret")
    monkeypatch.setenv("A3S_AUTH_TOKEN", "server-token")
    monkeypatch.setenv("DATABASE_URL", "postgres://server:pw@db/x")
    async with serving(workspace, tmp_path / "data") as http:
        space = await space_in(http, workspace)
        result = await run(http, space, {"type": "shell", "command": "env", "env": {"MINE": "visible"}})
    stdout = result["events"][0]["stdout"]
    assert "MINE=visible" in stdout
    for leaked in ("sk-server-secret", "server-token", "postgres://"):
        assert leaked not in stdout


# --- 4. a cap on concurrent runs ----------------------------------------------------------------------


async def test_runs_beyond_the_cap_are_refused_with_429(workspace: Path, tmp_path: Path) -> None:
    async with spaces_server(workspace, tmp_path / "data", max_runs=2) as served:
        http = served.http
        space = await space_in(http, workspace)
        slow = [
            asyncio.create_task(run(http, space, {"type": "shell", "command": f"touch started{n}; sleep 60"}))
            for n in (1, 2)
        ]
        for n in (1, 2):
            await until_exists(workspace / f"started{n}")
        async with http.post(
            f"/v1/spaces/{space}/runs", json=ops({"type": "message", "content": "x"})
        ) as reply:
            assert reply.status == 429
            error = (await reply.json())["error"]
        assert error["code"] == "RESOURCE_EXHAUSTED" and "2 Agent Spaces runs" in error["message"]
        await _cancel_running(served, space)
        done = await asyncio.wait_for(asyncio.gather(*slow), 30)
        assert [result["status"] for result in done] == ["cancelled", "cancelled"]
        after = await run(http, space, {"type": "message", "content": "a slot is free again"})
    assert after["status"] == "completed"


async def test_spaces_beyond_the_cap_are_refused_with_429(workspace: Path, tmp_path: Path) -> None:
    """`a3s-agent serve` with A3S_MAX_SPACES=3: of eight spaces asked for at once three are made,
    the rest refused with 429 naming the setting; the count is the store's, so a restart on the
    same data dir still refuses, and the spaces made still run."""

    async def create(http: aiohttp.ClientSession) -> tuple[int, dict[str, Any]]:
        async with http.post("/v1/spaces", json={"policy": "standard"}) as reply:
            return reply.status, await reply.json()

    kept: list[str] = []
    for attempt in range(2):
        server = ServerProcess(workspace, tmp_path / "data", env={"A3S_MAX_SPACES": "3"})
        await asyncio.to_thread(server.start)
        try:
            async with aiohttp.ClientSession(f"http://127.0.0.1:{server.http_port}") as http:
                made = await asyncio.gather(*(create(http) for _ in range(8 if attempt == 0 else 1)))
                refused = [body["error"] for status, body in made if status == 429]
                spaces = [body["spaceId"] for status, body in made if status == 201]
                assert len(spaces) == (3 if attempt == 0 else 0) and len(refused) == len(made) - len(spaces)
                assert (
                    refused[0]["code"] == "RESOURCE_EXHAUSTED" and "A3S_MAX_SPACES" in refused[0]["message"]
                )
                kept = kept or spaces
                ran = await run(http, kept[0], {"type": "message", "content": "still here"})
                assert ran["status"] == "completed"
        finally:
            server.stop()


async def _cancel_running(served: SpacesServer, space: str) -> None:
    """Cancel every run of `space` still running, found in the store the server keeps."""
    data = served.live.runtime.settings.resolved_data_dir / "spaces.db"
    with sqlite3.connect(data) as db:
        runs = [row[0] for row in db.execute("SELECT id FROM runs WHERE space_id = ?", (space,))]
    for run_id in runs:
        async with served.http.post(f"/v1/spaces/{space}/runs/{run_id}/cancel", json={}) as reply:
            assert reply.status in (200, 409)


# --- 5. bash disabled by the operator ---------------------------------------------------------------


async def test_a_disabled_bash_cannot_run_through_agent_spaces(workspace: Path, tmp_path: Path) -> None:
    async with spaces_server(workspace, tmp_path / "data") as served:
        stub = served.live.stub
        tools = pb.ToolsConfig(disabled_tools=["bash"])
        await stub.Initialize(pb.InitializeRequest(config=pb.AgentConfig(tools=tools)))
        space = await space_in(served.http, workspace, "permissive")
        refused = await run(served.http, space, {"type": "shell", "command": "touch made"})
        event = refused["events"][0]
        assert event["type"] == "policyDenied" and "bash tool is disabled" in event["reason"]
        assert not (workspace / "made").exists()
        await stub.Initialize(pb.InitializeRequest())
        ran = await run(served.http, space, {"type": "shell", "command": "touch made"})
    assert ran["events"][0]["success"] is True and (workspace / "made").exists()
