"""The official A3S TypeScript SDK (GitHub A3S-Lab/TypeScript-SDK) against our server.

Exports the SDK checkout (a git directory, bare or not: `--sdk PATH`, env A3S_TS_SDK) at its HEAD
into ~/.cache/a3s-agent/ts-sdk-<commit>/sdk/typescript, installs and builds it there once per
commit, starts `a3s-agent serve` and the fake OpenAI-compatible LLM (a3s_agent/testing/fake_llm.py) on
free ports, and runs the SDK's live test file (vitest), every example and a direct check of the SDK's
methods (tools/ts_sdk/direct_check.mjs). Prints one row per test, example and check; exits 0 when
every failure has a cause outside our server (the example's own), 1 otherwise, and 2
when npm or the checkout is missing (nothing was run).

An example passes on evidence, not on its exit code (most catch their own errors, print them and
exit 0): it exits 0, reports no error (nothing on stderr but node's own warnings, no gRPC status),
and the server's log holds at least one call of its, every one answered OK. The server logs one
line per call; a call the check makes before and after each example (GetSession of a session
that does not exist, named for the example) marks which lines are the example's.

The SDK's files are not edited. Examples that hard-code the SDK's default "localhost:4088" are
pointed at our server by tools/ts_sdk/redirect.cjs, preloaded into node; the config directory the
examples and the live test read (`<sdk>/../../.a3s/config.json`) is written per run, naming the fake
LLM as the default provider. Session workspaces under /tmp are what the examples use, so the
server's workspace root is /tmp.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from a3s_agent.proto import code_agent_later_pb2 as later  # noqa: E402
from a3s_agent.proto import code_agent_later_pb2_grpc as later_grpc  # noqa: E402
from a3s_agent.proto import code_agent_pb2 as pb  # noqa: E402
from a3s_agent.proto import code_agent_pb2_grpc as pb_grpc  # noqa: E402
from a3s_agent.testing.fake_llm import FakeLLM, Reply, text, tool_call  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402

DEFAULT_SDK = Path("/work/.mirror/A3S-Lab+TypeScript-SDK/repo")
CACHE = Path.home() / ".cache" / "a3s-agent"
HERE = Path(__file__).resolve().parent / "ts_sdk"
MODEL = "fake-model"
SKILL = "remotion-best-practices"
SKIPPED = 2

# Later-only RPCs we do not serve: they answer UNIMPLEMENTED "<RPC>: ... group ... is not served".

# Failures whose cause is the SDK's example itself, not our server: (example, output pattern, reason);
# an example of None matches every example.
NOT_OURS = [
    (
        None,
        re.compile(r"Cannot find module '[^']*/src(/index\.js)?'|Directory import '[^']*/examples/src'"),
        "the example imports CodeAgentClient from ../src, which this SDK commit does not have",
    ),
    (
        None,
        re.compile(r"messages\.map is not a function"),
        "the example passes {messages: [...]} where the SDK's generate takes the array",
    ),
    (
        "permission-policy",
        re.compile(r"reading 'length'"),
        "the example reads policy.rules, a field the SDK's PermissionPolicy does not have (deny/allow/ask)",
    ),
    (
        None,
        re.compile(r"RangeError: Invalid time value"),
        "the example gives new Date() the int64 createdAt, which the SDK decodes as a string (longs: String)",
    ),
    (
        "lsp-example",
        re.compile(r"rust-analyzer.{0,80}not installed|Unknown binary 'rust-analyzer'"),
        "the example asks for Rust; rust-analyzer is not installed here (rustup cannot fetch it)",
    ),
    (
        "provider-config",
        re.compile(r"reading 'length'"),
        "the example reads getProvider(...).models where getProvider answers {provider: {...}}, as the"
        " proto's GetProviderResponse has it (and its updateProvider(name, {...}) passes two arguments to"
        " the SDK's one-argument method)",
    ),
    (
        "context-management",
        re.compile(r"reading 'toString'"),
        "the example reads usage.totalTokens where getContextUsage answers {usage: {totalTokens...}}",
    ),
]

CALL = re.compile(r"a3s_agent\.rpc: rpc (\S+) session=\S+ status=(\w+)")
"""The server's line for each call it answered (faces/status.py `log_call`)."""
NODE_WARNING = re.compile(r"^\(node:\d+\) \w*Warning: |^\(Use `node --trace-")
"""Lines node itself writes to stderr that say nothing about the example's calls."""

STATUS = re.compile(
    r"\b(?:\d+ )?(CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|"
    r"PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|UNIMPLEMENTED|"
    r"INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED): ?(.*)"
)


@dataclass
class Row:
    name: str
    ok: bool
    reason: str = ""
    expected: bool = False  # a failure whose cause is not our server
    output: str = ""


# --- the fake model's answers ---------------------------------------------------------------


def instance(schema: Any) -> Any:
    """A small value that validates against a JSON Schema (enough for the SDK's examples)."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return instance(schema[key][0])
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties", {})
        return {name: instance(props[name]) for name in props}
    if kind == "array":
        return [instance(schema.get("items", {})) for _ in range(max(1, schema.get("minItems", 1)))]
    simple = {"string": "example", "integer": 1, "number": 1, "boolean": True, "null": None}
    return simple.get(kind, "example")


PLANNING_ANSWERS: dict[str, Any] = {
    "execution_plan": {
        "goal": "Do what was asked",
        "complexity": "medium",
        "required_tools": ["read_file", "edit_file"],
        "steps": [
            {
                "id": "step-1",
                "description": "Read the code involved",
                "tool": "read_file",
                "dependencies": [],
            },
            {
                "id": "step-2",
                "description": "Make the change",
                "tool": "edit_file",
                "dependencies": ["step-1"],
            },
        ],
    },
    "goal_check": {"achieved": True, "progress": 1, "remaining_criteria": []},
}
"""The planning group's answers (by the schema's name), which must hold together beyond their
schemas (steps that depend on earlier ones, a judgement that agrees with itself): more than
`instance` writes."""


def answer(body: dict[str, Any]) -> Reply:
    """JSON for structured output; otherwise one harmless tool call per prompt, then text."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        named = fmt.get("json_schema", {})
        if named.get("name") in PLANNING_ANSWERS:
            return text(json.dumps(PLANNING_ANSWERS[named["name"]]))
        return text(json.dumps(instance(named.get("schema", {}))))
    messages = body.get("messages") or []
    last = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
    if body.get("tools") and last == "user":
        return tool_call("list_files", {"path": "."})
    return text("Done: the fake model looked at the workspace.")


# --- the SDK checkout, installed once per commit ---------------------------------------------


def run(argv: list[str], cwd: Path) -> str:
    """The command's output; its error output in the exception when it fails."""
    done = subprocess.run(argv, cwd=cwd, text=True, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} (in {cwd}) failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One run at a time per cache directory (the config file there is per run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def install(checkout: Path, root: Path) -> Path:
    """Export the checkout's HEAD under `root`, `npm ci`, build, and install the examples."""
    sdk = root / "sdk" / "typescript"
    marker = root / ".installed"
    if marker.exists():
        return sdk
    shutil.rmtree(sdk, ignore_errors=True)
    sdk.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(checkout), "archive", "HEAD"], check=True, stdout=subprocess.PIPE
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(sdk, filter="data")
    npm = ["npm", "--no-audit", "--no-fund"]
    run([*npm, "ci" if (sdk / "package-lock.json").exists() else "install"], sdk)
    run([*npm, "run", "build"], sdk)
    if (sdk / "examples" / "package.json").exists():
        run([*npm, "install"], sdk / "examples")
    marker.write_text("ok\n")
    return sdk


# --- running the SDK's tests, examples and the direct check ---------------------------------


def failure_reason(output: str, example: str = "") -> tuple[str, bool]:
    """The example's own cause or the first gRPC status line, and whether the failure is expected."""
    for name, pattern, reason in NOT_OURS:
        if name in (None, example) and pattern.search(output):
            return reason, True
    match = STATUS.search(output)
    if match:
        status, message = match.group(1), match.group(2).strip()
        return f"{status}: {message}"[:160], False  # every RPC is served: UNIMPLEMENTED is never expected
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|fail|✗|❌", line, re.I)]
    return ((errors or lines or ["no output"])[0])[:160], False


def node_env(sdk: Path, address: str) -> dict[str, str]:
    options = f"{os.environ.get('NODE_OPTIONS', '')} --require {HERE / 'redirect.cjs'}".strip()
    return {**os.environ, "A3S_ADDRESS": address, "A3S_TS_SDK_DIR": str(sdk), "NODE_OPTIONS": options}


def live_tests(sdk: Path, env: dict[str, str], timeout_s: float) -> list[Row]:
    """ts/__tests__/new-features.test.ts under vitest, one row per test case."""
    report = sdk / ".vitest-report.json"
    report.unlink(missing_ok=True)
    argv = ["node_modules/.bin/vitest", "run", "ts/__tests__/new-features.test.ts", "--reporter=json",
            f"--outputFile={report}"]  # fmt: skip
    try:
        done = subprocess.run(argv, cwd=sdk, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [Row("live: new-features.test.ts", False, f"timed out after {timeout_s:g} s")]
    if not report.exists():
        return [Row("live: new-features.test.ts", False, failure_reason(done.stdout + done.stderr)[0])]
    rows = []
    for result in json.loads(report.read_text())["testResults"]:
        for case in result["assertionResults"]:
            ok = case["status"] == "passed"
            reason, expected = ("", False) if ok else failure_reason("\n".join(case["failureMessages"]))
            rows.append(Row(f"live: {case['title']}", ok, reason, expected))
    return rows


def examples(sdk: Path) -> list[Path]:
    return [*sorted((sdk / "examples" / "src").glob("*.ts")), sdk / "examples" / "lsp-example.ts"]


PLACEHOLDER_WORKSPACE = "/path/to/project"
"""Where lsp-example's Rust project would be; run_path points it at a real one."""
RUST_MAIN = "\n".join(
    ["fn greet(name: &str) -> String {", '    format!("hi {name}")', "}", "", "fn main() {"]
    + [f'    let v{i} = greet("n{i}");' for i in range(20)]
    + ['    println!("{v0}{v19}");', "}", ""]
)
"""Long enough for the positions the example asks about (lines 10, 15 and 20)."""


@contextlib.contextmanager
def run_path(path: Path, served: Served) -> Iterator[Path]:
    """The example to run: itself, or for lsp-example a copy beside it (so that its imports resolve)
    pointed at a real Cargo project instead of its placeholder, removed afterwards."""
    source = path.read_text()
    if PLACEHOLDER_WORKSPACE not in source:
        yield path
        return
    project = served.workspace.parent / "rust-project"
    (project / "src").mkdir(parents=True, exist_ok=True)
    (project / "Cargo.toml").write_text('[package]\nname = "demo"\nversion = "0.1.0"\nedition = "2021"\n')
    (project / "src" / "main.rs").write_text(RUST_MAIN)
    pointed = path.with_name(f"{path.stem}.pointed.ts")
    pointed.write_text(source.replace(PLACEHOLDER_WORKSPACE, str(project)))
    try:
        yield pointed
    finally:
        pointed.unlink()


def example(path: Path, sdk: Path, served: Served, env: dict[str, str], timeout_s: float) -> Row:
    """Run one example with tsx; answer any prompt with "y". Passes on exit 0 with no error
    reported and the server's evidence: calls made, each answered OK."""
    name = f"example: {path.relative_to(sdk / 'examples')}"
    tsx = sdk / "examples" / "node_modules" / ".bin" / "tsx"
    start = served.mark(f"before-{path.stem}") + 1
    try:
        with run_path(path, served) as runnable:
            done = subprocess.run(
                [str(tsx), str(runnable)], cwd=sdk / "examples", env=env, input="y\n" * 50,
                capture_output=True, text=True, timeout=timeout_s,
            )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        output = "".join(_text(part) for part in (exc.stdout, exc.stderr))
        reason, expected = failure_reason(output, path.stem)
        if not expected and not STATUS.search(output):  # it got through, but something kept it alive
            last = [line for line in _text(exc.stdout).splitlines() if line.strip()][-1:] or ["(none)"]
            reason = f"printed its last line {last[0].strip()[:60]!r} but did not exit"
        return Row(name, False, f"timed out after {timeout_s:g} s; {reason}", expected, output)
    output = done.stdout + done.stderr
    calls = CALL.findall("".join(served.log[start : served.mark(f"after-{path.stem}")]))
    if done.returncode != 0 or STATUS.search(output) or reported_error(done.stderr):
        reason, expected = failure_reason(output, path.stem)
        return Row(name, False, reason, expected, output)
    return calls_row(name, calls, output)


def reported_error(stderr: str) -> bool:
    """Whether the example wrote anything to stderr but node's own warnings (the examples print
    the errors they catch there, then exit 0)."""
    return any(line.strip() and not NODE_WARNING.match(line) for line in stderr.splitlines())


def calls_row(name: str, calls: list[tuple[str, str]], output: str) -> Row:
    """The row of an example that exited 0 reporting no error, by the calls the server answered."""
    if not calls:
        return Row(name, False, "the server got no call from it", False, output)
    refused = [(rpc, status) for rpc, status in calls if status != "OK"]
    if not refused:
        return Row(name, True)
    rpc, status = refused[0]
    return Row(name, False, f"it exited 0, but the server answered {rpc} with {status}", False, output)


def _text(part: str | bytes | None) -> str:
    return part.decode(errors="replace") if isinstance(part, bytes) else part or ""


def direct(sdk: Path, env: dict[str, str], workspace: Path, timeout_s: float) -> list[Row]:
    argv = ["node", str(HERE / "direct_check.mjs")]
    env = {**env, "A3S_CHECK_WORKSPACE": str(workspace)}
    try:
        done = subprocess.run(argv, cwd=sdk, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [Row("direct", False, f"timed out after {timeout_s:g} s")]
    rows = []
    for line in done.stdout.splitlines():
        if line.startswith("CHECK "):
            item = json.loads(line[6:])
            reason, expected = failure_reason(item["reason"]) if not item["ok"] else ("", False)
            rows.append(Row(f"direct: {item['name']}", item["ok"], reason, expected))
    return rows or [Row("direct", False, failure_reason(done.stdout + done.stderr)[0])]


def write_config(root: Path, address: str, fake_url: str) -> None:
    """The config the examples and the live test read: the fake LLM as the default provider, and as
    the Kimi model kimi-test looks for."""
    models = [{"id": name, "apiKey": "sk-fake", "baseUrl": fake_url} for name in (MODEL, "kimi-k2.5")]
    provider = {"name": "openai", "apiKey": "sk-fake", "baseUrl": fake_url, "models": models}
    config = {"address": address, "defaultProvider": "openai", "defaultModel": MODEL, "providers": [provider]}
    (root / ".a3s").mkdir(exist_ok=True)
    (root / ".a3s" / "config.json").write_text(json.dumps(config, indent=2))


def write_skill(skills: Path) -> None:
    """The skill skill-management loads by name (installed on the example author's machine)."""
    (skills / SKILL).mkdir(parents=True)
    (skills / SKILL / "SKILL.md").write_text(
        f"---\nname: {SKILL}\ndescription: Stand-in for the skill the SDK example loads.\n---\n"
        "Answer questions about Remotion briefly.\n"
    )


@dataclass
class Served:
    address: str
    workspace: Path
    log: list[str]  # the server's output, drained so that its pipe never fills
    stub: pb_grpc.CodeAgentServiceStub
    later: later_grpc.CodeAgentServiceStub

    def forget_providers(self, timeout_s: float = 15.0) -> None:
        """Remove the provider entries an example added, and the default model with them: they are
        the server's, and provider-config's default would serve every later example's sessions."""
        for info in self.later.ListProviders(later.ListProvidersRequest(), timeout=timeout_s).providers:
            self.later.RemoveProvider(later.RemoveProviderRequest(name=info.name), timeout=timeout_s)

    def mark(self, label: str, timeout_s: float = 15.0) -> int:
        """Ask for the session `ts-sdk-check-<label>` (none exists) and wait for the call's line in
        the log; its index. Every call answered before this one is logged above it."""
        line = f"rpc GetSession session=ts-sdk-check-{label} status=NOT_FOUND"
        with contextlib.suppress(grpc.RpcError):
            self.stub.GetSession(pb.GetSessionRequest(session_id=f"ts-sdk-check-{label}"), timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((i for i in range(len(self.log) - 1, -1, -1) if line in self.log[i]), None)
            if found is not None:
                return found
            time.sleep(0.05)
        raise SystemExit(f"the server's log never showed the mark {label!r}: is it logging at INFO?")


@contextlib.contextmanager
def serving(root: Path) -> Iterator[Served]:
    """The fake LLM, our server (a subprocess) on free ports, and the config naming them."""
    with contextlib.ExitStack() as stack:
        fake = stack.enter_context(FakeLLM(fallback=answer))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="a3s-ts-sdk-", dir="/tmp")))
        (tmp / "workspace").mkdir()
        write_skill(tmp / "skills")
        env = {"A3S_LLM_PROVIDER": "openai", "A3S_LLM_MODEL": MODEL, "A3S_LLM_BASE_URL": fake.base_url,
               "A3S_LLM_API_KEY": "sk-fake", "A3S_WORKSPACE_ROOT": "/tmp", "A3S_LOG_LEVEL": "INFO",
               "A3S_SKILL_DIRS": str(tmp / "skills")}  # fmt: skip
        server = ServerProcess(tmp / "workspace", tmp / "data", env=env).start()
        stack.callback(server.stop)
        assert server.proc is not None and server.proc.stdout is not None
        channel = stack.enter_context(server.channel())
        stubs = pb_grpc.CodeAgentServiceStub(channel), later_grpc.CodeAgentServiceStub(channel)
        served = Served(server.address, tmp / "workspace", [], *stubs)
        threading.Thread(target=served.log.extend, args=(server.proc.stdout,), daemon=True).start()
        write_config(root, server.address, fake.base_url)
        yield served


def check(checkout: Path, timeout_s: float, only: str) -> tuple[list[Row], list[str]]:
    """Rows for the live tests, the examples and the direct check, and the server's output."""
    commit = run(["git", "-C", str(checkout), "rev-parse", "HEAD"], checkout).strip()
    print(f"SDK {commit[:12]} ({checkout}), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", flush=True)
    root = CACHE / f"ts-sdk-{commit[:12]}"
    with locked(CACHE / f"ts-sdk-{commit[:12]}.lock"):
        sdk = install(checkout, root)
        with serving(root) as served:
            env = node_env(sdk, served.address)
            rows = live_tests(sdk, env, timeout_s * 5) if only in "live" else []
            for path in examples(sdk):
                if only in path.name:
                    rows.append(example(path, sdk, served, env, timeout_s))
                    served.forget_providers()
            if only in "direct":
                rows += direct(sdk, env, served.workspace, timeout_s * 3)  # last: it ends with Shutdown
    return rows, served.log


def table(rows: list[Row]) -> str:
    width = max([len(r.name) for r in rows] or [4])
    lines = [f"{'name'.ljust(width)}  result  reason", f"{'-' * width}  ------  ------"]
    for r in rows:
        result = "pass" if r.ok else ("fail*" if r.expected else "FAIL")
        lines.append(f"{r.name.ljust(width)}  {result.ljust(6)}  {r.reason}".rstrip())
    passed = sum(r.ok for r in rows)
    expected = sum(not r.ok and r.expected for r in rows)
    lines.append(
        f"\n{passed} passed, {expected} failed as expected (fail*: a cause outside "
        f"our server), {len(rows) - passed - expected} failed (FAIL)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdk", type=Path, default=Path(os.environ.get("A3S_TS_SDK", DEFAULT_SDK)),
                        help="the SDK's git directory, bare or not (env A3S_TS_SDK; default %(default)s)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per example (default 30)")
    parser.add_argument("--only", default="", help="run only the examples whose file name contains this, "
                        "'live' for the live tests, 'direct' for the direct check")  # fmt: skip
    parser.add_argument("--show-output", action="store_true", help="print the output of failed examples")
    args = parser.parse_args(argv)
    if shutil.which("npm") is None or shutil.which("node") is None:
        print("skipped: npm/node not found")
        return SKIPPED
    if not (args.sdk / "HEAD").exists() and not (args.sdk / ".git").exists():
        print(f"skipped: no SDK checkout at {args.sdk} (give --sdk or A3S_TS_SDK)")
        return SKIPPED
    rows, log = check(args.sdk, args.timeout, args.only)
    if args.show_output:
        for row in rows:
            print(f"--- {row.name}\n{row.output[-3000:]}" if row.output else "", end="")
        print("--- the server's output\n" + "".join(log[-50:]))
    print(table(rows))
    return 0 if all(r.ok or r.expected for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
