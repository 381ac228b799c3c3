"""A small language server over stdio for the tests, as an operator configures one by command
(`--lsp-server fixture:.fx=python tests/lsp_fixture.py MODE [PATH]`), standard library only.

It answers initialize (serverInfo fixture-ls 1.0), hover (what it read: the hovered line's text,
and whether it could read PATH, a file outside its workspace), shutdown and exit; after didOpen and
didChange it publishes, without a version, one diagnostic quoting the file's first line (`noisy`:
and 5,000 more about other files). MODE changes how it misbehaves on hover: `ok` answers, `silent`
never does, `flood` announces a message of a gigabyte, `crash` writes to stderr and exits 3.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
PROBE = sys.argv[2] if len(sys.argv) > 2 else ""
documents: dict[str, str] = {}


def read() -> dict[str, Any] | None:
    length = 0
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode().partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    message: dict[str, Any] = json.loads(sys.stdin.buffer.read(length))
    return message


def send(message: dict[str, Any]) -> None:
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    sys.stdout.buffer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    sys.stdout.buffer.flush()


def publish(uri: str) -> None:
    first = documents[uri].split("\n", 1)[0]
    diagnostic = {
        "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": len(first)}},
        "severity": 1,
        "message": f"first line: {first}",
        "source": "fixture-ls",
        "code": 7,
    }
    send({"method": "textDocument/publishDiagnostics", "params": {"uri": uri, "diagnostics": [diagnostic]}})
    if MODE == "noisy":  # 5,000 diagnostics of files it was not asked about
        for number in range(50):
            many = [{**diagnostic, "message": f"noise {i}"} for i in range(100)]
            params = {"uri": f"{uri}.{number}.fx", "diagnostics": many}
            send({"method": "textDocument/publishDiagnostics", "params": params})


def probe() -> str:
    try:
        return f"read {PROBE}: {Path(PROBE).read_text().strip()}"
    except OSError as exc:
        return f"cannot read {PROBE}: {exc.strerror}"


def hover(message: dict[str, Any]) -> None:
    if MODE == "silent":
        return
    if MODE == "flood":
        sys.stdout.buffer.write(b"Content-Length: 1000000000\r\n\r\n{")
        sys.stdout.buffer.flush()
        return
    if MODE == "crash":
        print("fixture-ls: hover is more than I can take", file=sys.stderr, flush=True)
        sys.exit(3)
    params = message["params"]
    uri, position = params["textDocument"]["uri"], params["position"]
    line = documents[uri].split("\n")[position["line"]]
    value = f"fixture hover at {position['line']}:{position['character']} of {line!r}; {probe()}"
    send({"id": message["id"], "result": {"contents": {"kind": "markdown", "value": value}}})


def main() -> None:
    while (message := read()) is not None:
        method = message.get("method")
        params = message.get("params") or {}
        if method == "initialize":
            capabilities = {"hoverProvider": True, "textDocumentSync": 1}
            info = {"name": "fixture-ls", "version": "1.0"}
            send({"id": message["id"], "result": {"capabilities": capabilities, "serverInfo": info}})
        elif method == "textDocument/didOpen":
            documents[params["textDocument"]["uri"]] = params["textDocument"]["text"]
            publish(params["textDocument"]["uri"])
        elif method == "textDocument/didChange":
            documents[params["textDocument"]["uri"]] = params["contentChanges"][-1]["text"]
            publish(params["textDocument"]["uri"])
        elif method == "textDocument/hover":
            hover(message)
        elif method == "shutdown":
            send({"id": message["id"], "result": None})
        elif method == "exit":
            return
        elif "id" in message:
            send({"id": message["id"], "error": {"code": -32601, "message": f"{method} not served"}})


if __name__ == "__main__":
    main()
