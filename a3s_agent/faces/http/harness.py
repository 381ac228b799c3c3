"""The A3S headless harness protocol on the HTTP face (a3s.code.agent.v1; the spec's sections 1-9):

    POST /v1/agent/commands      start | cancel | recover | steer (ours) → 200 command receipt
    POST /v1/agent/events:page   a page of a run's events → 200 event page
    POST /v1/agent/changes       the run's git_unified_diff_v1 change set (425 pending, 422 none)

(/health/ready and /health/live are probes.py's, with the protocol's bodies.) Bodies are at most
128 KiB of `application/json` or `application/*+json`; every failure is the protocol's error
document (`{"schema": "a3s.code.agent-error.v1", "error": {"code", "message"}}`, the message fixed
by status), including the server's refusals while it starts or stops (503 harness_closed). What
differs from A3S's harness: our bearer token guards these routes when one is set (401 in our own
error shape), and the operator's flags take the place of the release manifest.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ...app.harness import Harness
from ...app.harness_types import HarnessRefusal
from ...base.errors import AgentError
from .body import json_text
from .errors import CallError
from .harness_documents import change_set_json, error_document, page_json, receipt_json
from .harness_schema import MAX_BODY_BYTES, Refused, change_set_request, command, load, page_request

log = logging.getLogger(__name__)

COMMANDS_PATH = "/v1/agent/commands"
PAGE_PATH = "/v1/agent/events:page"
CHANGES_PATH = "/v1/agent/changes"
HARNESS_PATHS = frozenset({COMMANDS_PATH, PAGE_PATH, CHANGES_PATH})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _document(reason: str) -> web.Response:
    status, body = error_document(reason)
    return web.json_response(body, status=status, dumps=json_text)


def _is_json(request: web.Request) -> bool:
    kind = request.content_type if "Content-Type" in request.headers else ""
    main, _, sub = kind.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


async def _body(request: web.Request) -> Any:
    """The JSON document of the body: invalid_json for a wrong content type, a body over
    MAX_BODY_BYTES (read no further) or anything that is not one JSON document."""
    if not _is_json(request) or (request.content_length or 0) > MAX_BODY_BYTES:
        raise Refused("invalid_json")
    raw = bytearray()
    while chunk := await request.content.readany():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise Refused("invalid_json")
    return load(bytes(raw))


@web.middleware
async def harness_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """For the protocol's paths, the server's own refusals as its error documents: a request
    refused while the server starts or stops (503 harness_closed). A missing token stays our 401,
    and the guard's refusals (foreign Host or Origin) stay ours."""
    if request.path not in HARNESS_PATHS:
        return await handler(request)
    try:
        return await handler(request)
    except CallError as exc:
        if exc.code == "UNAVAILABLE":
            return _document("harness_closed")
        raise


class HarnessApi:
    """The protocol's three routes over one Harness."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(COMMANDS_PATH, self.commands),
            web.post(PAGE_PATH, self.events_page),
            web.post(CHANGES_PATH, self.changes),
        ]

    async def _answer(
        self, request: web.Request, serve: Callable[[Any], Awaitable[dict[str, Any]]]
    ) -> web.Response:
        try:
            return web.json_response(await serve(await _body(request)), dumps=json_text)
        except Refused as exc:
            return _document(exc.code)
        except HarnessRefusal as exc:
            return _document(exc.reason)
        except AgentError as exc:  # a failure inside the agent: the protocol's 500, without details
            log.warning("A3S harness %s failed: %s", request.path, exc)
            return _document("INTERNAL_ERROR")

    async def commands(self, request: web.Request) -> web.Response:
        async def serve(body: Any) -> dict[str, Any]:
            given = command(body)
            return receipt_json(given, await self._harness.command(given))

        return await self._answer(request, serve)

    async def events_page(self, request: web.Request) -> web.Response:
        async def serve(body: Any) -> dict[str, Any]:
            identity, after, limit = page_request(body)
            return page_json(identity, after, await self._harness.page(identity, after, limit))

        return await self._answer(request, serve)

    async def changes(self, request: web.Request) -> web.Response:
        async def serve(body: Any) -> dict[str, Any]:
            identity = change_set_request(body)
            return change_set_json(identity, await self._harness.changes(identity))

        return await self._answer(request, serve)
