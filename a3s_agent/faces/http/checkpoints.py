"""Checkpoints, rewind, restore, diff and fork on the HTTP face (app/checkpoints.py):

    GET  /sessions/{id}/checkpoints   {"checkpoints": [checkpoint...]}, oldest first
    POST /sessions/{id}/rewind        {"checkpoint": N, "conversation_only"?: bool, "force"?: bool}
                                      → {"checkpoint", "messages", "files", "overwritten", "undo_checkpoint"}
    POST /sessions/{id}/restore       {"checkpoint": N, "force"?: bool} (the files only)
                                      → {"checkpoint", "files", "overwritten", "undo_checkpoint"}
    GET  /sessions/{id}/diff          ?from=N[&to=M][&path=P...] (no `to`: against the workspace now)
                                      → {"from", "to" (null: now), "files": [...], "diff": "<unified diff>"}
    POST /sessions/{id}/fork          {"checkpoint"?: N, "copy_workspace"?: bool, "workspace"?: str}
                                      (no checkpoint: the whole history, the files as they are now)
                                      → 201 {"session_id", "workspace", "messages", "forked_from"}

A checkpoint is `{"checkpoint": seq, "kind", "created_at" (ms), "user_message", "messages",
"files_changed": [file...], "files_skipped": [{"path", "size"}], "changed_outside": [path...]}`;
a file is `{"path", "status" (added, modified, deleted, type_changed), "added", "removed",
"binary"}`. Bodies are closed objects: an unknown field or a wrong type is 400 naming it. Errors
are the face's usual JSON errors (a run going, or files someone else changed: 409
FAILED_PRECONDITION; an unknown checkpoint: 404).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from ...app import Application
from ...app.checkpoints import CheckpointRecord, Restored
from ...base.errors import InvalidArgument
from .body import closed_object, json_body, json_text
from .errors import unary_call

Handler = Callable[[web.Request], Awaitable[web.Response]]


class CheckpointRoutes:
    def __init__(self, app: Application) -> None:
        self._app = app

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/sessions/{id}/checkpoints", self._call("ListCheckpoints", self.list)),
            web.post("/sessions/{id}/rewind", self._call("Rewind", self.rewind)),
            web.post("/sessions/{id}/restore", self._call("RestoreFiles", self.restore)),
            web.get("/sessions/{id}/diff", self._call("DiffCheckpoints", self.diff)),
            web.post("/sessions/{id}/fork", self._call("ForkSession", self.fork)),
        ]

    @staticmethod
    def _call(name: str, work: Callable[[web.Request, str], Awaitable[web.Response]]) -> Handler:
        async def handle(request: web.Request) -> web.Response:
            session_id = request.match_info["id"]
            return await unary_call(name, session_id, work(request, session_id))

        return handle

    async def list(self, request: web.Request, session_id: str) -> web.Response:
        if request.query:
            raise InvalidArgument(
                f"GET .../checkpoints takes no parameters (got {', '.join(sorted(request.query))})"
            )
        records = await self._app.checkpoints.of_session(session_id)
        return _json({"checkpoints": [_checkpoint(r) for r in records]})

    async def rewind(self, request: web.Request, session_id: str) -> web.Response:
        body = closed_object(
            await json_body(request), {"checkpoint": int, "conversation_only": bool, "force": bool}
        )
        done = await self._app.checkpoints.rewind(
            session_id,
            _required(body, "checkpoint"),
            conversation_only=body.get("conversation_only", False),
            force=body.get("force", False),
        )
        return _json({**_restored(body["checkpoint"], done.restored), "messages": done.messages})

    async def restore(self, request: web.Request, session_id: str) -> web.Response:
        body = closed_object(await json_body(request), {"checkpoint": int, "force": bool})
        done = await self._app.checkpoints.restore_files(
            session_id, _required(body, "checkpoint"), force=body.get("force", False)
        )
        return _json(_restored(body["checkpoint"], done))

    async def diff(self, request: web.Request, session_id: str) -> web.Response:
        unknown = sorted(set(request.query) - {"from", "to", "path"})
        if unknown:
            raise InvalidArgument(f"GET .../diff takes ?from=&to=&path= (unknown: {', '.join(unknown)})")
        if "from" not in request.query:
            raise InvalidArgument("from is required: the checkpoint to compare from")
        start = _seq(request.query["from"], "from")
        end = _seq(request.query["to"], "to") if "to" in request.query else None
        found = await self._app.checkpoints.diff(session_id, start, end, request.query.getall("path", []))
        return _json(
            {"from": start, "to": end, "files": [c.as_json() for c in found.changes], "diff": found.patch}
        )

    async def fork(self, request: web.Request, session_id: str) -> web.Response:
        body = closed_object(
            await json_body(request), {"checkpoint": int, "copy_workspace": bool, "workspace": str}
        )
        view = await self._app.checkpoints.fork(
            session_id,
            body.get("checkpoint"),
            copy_workspace=body.get("copy_workspace", False),
            workspace=body.get("workspace", ""),
        )
        forked = view.session
        reply = {
            "session_id": forked.id,
            "workspace": forked.config.workspace,
            "messages": forked.message_count,
            "forked_from": {"session_id": session_id, "checkpoint": body.get("checkpoint")},
        }
        return _json(reply, 201, {"Location": f"/sessions/{forked.id}"})


def _json(value: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(value, status=status, headers=headers, dumps=json_text)


def _required(body: Mapping[str, Any], name: str) -> int:
    if name not in body:
        raise InvalidArgument(f"{name} is required: the checkpoint's seq (GET .../checkpoints lists them)")
    value: int = body[name]
    return value


def _seq(text: str, name: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise InvalidArgument(f"{name} must be a checkpoint's seq (a whole number), not {text[:50]!r}")
    return int(text)


def _checkpoint(record: CheckpointRecord) -> dict[str, Any]:
    return {
        "checkpoint": record.seq,
        "kind": record.kind,
        "created_at": record.created_at,
        "user_message": record.user_message,
        "messages": record.message_count,
        "files_changed": record.changed,
        "files_skipped": record.skipped,
        "changed_outside": record.outside,
    }


def _restored(checkpoint: int, done: Restored) -> dict[str, Any]:
    return {
        "checkpoint": checkpoint,
        "files": [c.as_json() for c in done.changes],
        "overwritten": done.overwritten,
        "undo_checkpoint": done.before.seq if done.before is not None else None,
    }
