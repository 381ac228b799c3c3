"""The RPC table: every CodeAgentService RPC (schema.METHODS) as its request's plain form
(codec.decode) converted (convert.py), one call into the application layer, and the reply's plain
form encoded (codec.encode), as faces/grpc/service.py does for protobuf. The later dialect's own
RPCs (later_schema.METHODS) come the same way from later.py, in that dialect's messages (codec.LATER).

A call's `a3s-*` metadata (faces/call_metadata.py) comes in and goes out as CallMetadata: app.py
fills it from the request's headers of those names and answers a unary call's reply pairs as
response headers; a WebSocket call has none but the cursor (`after_seq`, ws.py) of a stream that
resumes. StreamGenerate and SubscribeEvents are resumable: `Method.cursor` reads the seq of
each of their replies (for the SSE `id:`).

A streaming handler calls `started` once its call has started, before it waits for anything a
later call could cause: SubscribeEvents once its subscription is in place, StreamGenerate once the
generation has begun (or the run it resumes is found), StreamGenerateStructured at the
generation's first event. ws.py starts a socket's next request then.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ...app import Application
from ...app.lifecycle import InitializeRequest
from ...app.sessions import SessionView
from ...app.types import StructuredDone, TextEvent
from ...base.errors import InvalidArgument
from ...base.models import DEFAULT_PROVIDER, Message
from .. import agent_service as service
from .. import call_metadata
from ..call_metadata import Metadata, Pairs
from . import convert
from .codec import BOX, LATER, Codec, CodecError
from .convert import Given, Plain, number
from .errors import CallError, stream_call, unary_call
from .later import HANDLERS as LATER_HANDLERS
from .later_schema import METHODS as LATER_RPCS
from .rpc_table import Handler as Plainly
from .rpc_table import Started, StreamHandler
from .schema import METHODS as RPCS
from .schema import Method as Rpc


@dataclass
class CallMetadata:
    """A call's `a3s-*` metadata: `given` with the request, `reply` for the reply."""

    given: Metadata = field(default_factory=dict)
    reply: Pairs = field(default_factory=list)


Unary = Callable[[Application, Given, CallMetadata], Awaitable[Plain]]
Streaming = Callable[[Application, Given, CallMetadata, Started], AsyncIterator[Plain]]
Cursor = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Method:
    name: str
    """As in the proto: `StreamGenerate`."""
    request: str
    """The message names of the request and the reply."""
    reply: str
    streaming: bool
    _unary: Unary | None = None
    _streaming: Streaming | None = None
    cursor: Cursor | None = None
    """A resumable stream's: the seq of a reply (its JSON)."""
    codec: Codec = BOX
    """The dialect's messages: the Box-era proto's, or the later one's for its own RPCs."""

    async def call(
        self, app: Application, request: Given, metadata: CallMetadata | None = None
    ) -> dict[str, Any]:
        """A unary RPC: the reply's JSON (and `metadata.reply`), or CallError with the status the
        gRPC face would send."""
        reply = self._reply(app, request, metadata or CallMetadata())
        return await unary_call(self.name, _session_of(request), reply)

    def stream(
        self,
        app: Application,
        request: Given,
        metadata: CallMetadata | None = None,
        started: Started = lambda: None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The replies' JSON of a server-streaming RPC; a failure is CallError, as in `call`;
        `started` is called once the call has started (see the module's docstring).

        Drive it from one task throughout, as grpc.aio does: a structured generation runs in its
        caller's task, and Cancel cancels that task."""
        replies = self._replies(app, request, metadata or CallMetadata(), started)
        return stream_call(self.name, _session_of(request), replies)

    async def _reply(self, app: Application, request: Given, metadata: CallMetadata) -> dict[str, Any]:
        assert self._unary is not None
        return self.codec.encode(self.reply, await self._unary(app, request, metadata))

    async def _replies(
        self, app: Application, request: Given, metadata: CallMetadata, started: Started
    ) -> AsyncIterator[dict[str, Any]]:
        assert self._streaming is not None
        async for reply in self._streaming(app, request, metadata, started):
            yield self.codec.encode(self.reply, reply)


def _session_of(request: Given) -> str:
    return request.get("session_id") or ""


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def find_method(name: object) -> Method:
    """The RPC named `name`, in CamelCase (`StreamGenerate`) or snake_case (`stream_generate`)."""
    if not isinstance(name, str) or not name:
        raise CallError("INVALID_ARGUMENT", "method must be a non-empty string naming an RPC")
    method = _BY_NAME.get(name)
    if method is None:
        raise CallError(
            "UNIMPLEMENTED", f"unknown method {name!r}", {"methods": sorted(_snake(n) for n in METHODS)}
        )
    return method


def parse(method: Method, params: object, **fields: str) -> Plain:
    """`params` (a JSON object) as the request of `method`; `fields` (path parameters) set fields too."""
    try:
        request = method.codec.decode(method.request, params)
    except CodecError as exc:
        raise CallError("INVALID_ARGUMENT", str(exc)) from None
    for name, value in fields.items():
        given = request[name]
        if given and given != value:
            raise CallError(
                "INVALID_ARGUMENT", f"{name} {given!r} in the body differs from {value!r} in the path"
            )
        request[name] = value
    return request


# --- the handlers: plain request in, plain reply (or replies) out ------------------------------

_UNARY: dict[str, Unary] = {}
_STREAMING: dict[str, Streaming] = {}
_CURSORS: dict[str, Cursor] = {}


def _rpc(name: str) -> Callable[[Plainly], Plainly]:
    """A handler that reads no call metadata."""

    def register(handler: Plainly) -> Plainly:
        _UNARY[name] = _without_metadata(handler)
        return handler

    return register


def _without_metadata(handler: Plainly) -> Unary:
    async def unary(app: Application, request: Given, metadata: CallMetadata) -> Plain:
        return await handler(app, request)

    return unary


def _rpc_with_metadata(name: str) -> Callable[[Unary], Unary]:
    def register(handler: Unary) -> Unary:
        _UNARY[name] = handler
        return handler

    return register


def _streams(name: str, cursor: Cursor | None = None) -> Callable[[Streaming], Streaming]:
    """A streaming handler; a resumable one's `cursor` reads the seq of a reply."""

    def register(handler: Streaming) -> Streaming:
        _STREAMING[name] = handler
        if cursor is not None:
            _CURSORS[name] = cursor
        return handler

    return register


async def _messages(app: Application, messages: Sequence[Given], field: str) -> list[Message]:
    """Checked and converted on a worker thread: for megabytes that takes a while."""
    if not messages:
        return []
    return await asyncio.to_thread(convert.messages_from, messages, field, app.max_request_messages)


def _session(view: SessionView) -> Plain:
    return convert.session(view.session, view.usage)


# lifecycle


@_rpc("HealthCheck")
async def _health_check(app: Application, request: Given) -> Plain:
    health = app.lifecycle.health()
    status = "STATUS_UNHEALTHY" if health.shutting_down else "STATUS_HEALTHY"
    return {
        "status": number("HealthCheckResponse.Status", status),
        "message": service.health_message(health),
        "details": service.health_details(health),
    }


@_rpc("GetCapabilities")
async def _get_capabilities(app: Application, request: Given) -> Plain:
    await app.tools.ready(None)  # the server's own MCP servers' tools are listed too
    capabilities = app.lifecycle.capabilities()
    limits = capabilities.limits
    return {
        "info": convert.info(capabilities.info),
        "features": service.features(capabilities),
        "tools": [convert.tool_capability(t) for t in capabilities.tools],
        "models": [
            {
                "provider": m.provider or DEFAULT_PROVIDER,
                "model": m.model,
                "features": service.MODEL_FEATURES,
            }
            for m in capabilities.models
        ],
        "limits": {
            "max_context_tokens": limits.max_context_tokens,
            "max_concurrent_sessions": limits.max_concurrent_sessions,
            "max_tools_per_request": limits.max_tools_per_request,
        },
        "metadata": {
            "store": capabilities.store,
            "protocols": service.PROTOCOLS,
            **service.sandbox_details(capabilities.sandbox),
        },
    }


@_rpc("Initialize")
async def _initialize(app: Application, request: Given) -> Plain:
    config = convert.given(request["config"], "AgentConfig")
    log = config["log"]
    level = convert.LOG_LEVELS.get(log["level"]) if log is not None else None
    if log is not None and level is None:
        raise InvalidArgument("config.log.level must be LEVEL_DEBUG, LEVEL_INFO, LEVEL_WARN or LEVEL_ERROR")
    tools = convert.given(config["tools"], "ToolsConfig")
    initialized = await app.lifecycle.initialize(
        InitializeRequest(
            workspace=request["workspace"],
            llm=convert.llm_from(config["llm"]) if config["llm"] is not None else None,
            enabled_tools=list(tools["enabled_tools"]),
            disabled_tools=list(tools["disabled_tools"]),
            tool_config=dict(tools["tool_config"]),
            log_level=level or "",
            env=dict(request["env"]),
            custom=dict(config["custom"]),
        )
    )
    return {
        "success": True,
        "message": initialized.message,
        "info": convert.info(app.lifecycle.info),
    }


@_rpc("Shutdown")
async def _shutdown(app: Application, request: Given) -> Plain:
    app.lifecycle.request_shutdown()
    return {"success": True, "message": "shutting down"}


# sessions


@_rpc_with_metadata("CreateSession")
async def _create_session(app: Application, request: Given, metadata: CallMetadata) -> Plain:
    fork = call_metadata.fork_request(metadata.given)
    if fork is not None:  # a fork of a session at a checkpoint (call_metadata.py)
        if request["initial_context"]:
            raise InvalidArgument("initial_context: a fork's history is its session's, up to the checkpoint")
        workspace = convert.session_config_from(request["config"]).workspace
        view = await app.checkpoints.fork(
            fork.session_id, fork.checkpoint, copy_workspace=fork.copy_workspace, workspace=workspace
        )
        metadata.reply = call_metadata.session_metadata(view)
        return {"session_id": view.session.id, "session": _session(view)}
    given = call_metadata.config_metadata(metadata.given)
    view = await app.sessions.create(
        request["session_id"],
        convert.session_config_from(request["config"]),
        await _messages(app, request["initial_context"], "initial_context"),
        given.compaction,
        given.token_budget,
        given.mcp_servers,
        given.memory,
    )
    metadata.reply = call_metadata.session_metadata(view)
    return {"session_id": view.session.id, "session": _session(view)}


@_rpc("DestroySession")
async def _destroy_session(app: Application, request: Given) -> Plain:
    await app.sessions.destroy(request["session_id"])
    return {"success": True}


@_rpc_with_metadata("ListSessions")
async def _list_sessions(app: Application, request: Given, metadata: CallMetadata) -> Plain:
    """A page of sessions, without reading any history (see the gRPC face's ListSessions)."""
    size, after = call_metadata.requested_page(metadata.given)
    page = await app.sessions.page(after, size)
    metadata.reply = call_metadata.next_page(page.next_after)
    return {"sessions": [convert.session(s, None) for s in page.sessions]}


@_rpc_with_metadata("GetSession")
async def _get_session(app: Application, request: Given, metadata: CallMetadata) -> Plain:
    view = await app.sessions.get(request["session_id"])
    metadata.reply = call_metadata.session_metadata(view)
    return {"session": _session(view)}


@_rpc_with_metadata("ConfigureSession")
async def _configure_session(app: Application, request: Given, metadata: CallMetadata) -> Plain:
    given = call_metadata.config_metadata(metadata.given)
    view = await app.sessions.configure(
        request["session_id"],
        convert.session_config_from(request["config"]),
        replace_all=given.replace_all,
        compaction=given.compaction,
        token_budget=given.token_budget,
        mcp_servers=given.mcp_servers,
        memory=given.memory,
    )
    metadata.reply = call_metadata.session_metadata(view)
    return {"session": _session(view)}


# context


@_rpc("GetContextUsage")
async def _get_context_usage(app: Application, request: Given) -> Plain:
    return {"usage": convert.context_usage(await app.context.usage(request["session_id"]))}


@_rpc("CompactContext")
async def _compact_context(app: Application, request: Given) -> Plain:
    result = await app.context.compact(request["session_id"])
    return {
        "success": True,
        "before": convert.context_usage(result.before),
        "after": convert.context_usage(result.after),
    }


@_rpc_with_metadata("ClearContext")
async def _clear_context(app: Application, request: Given, metadata: CallMetadata) -> Plain:
    rewind = call_metadata.rewind_request(metadata.given)
    if rewind is None:
        await app.context.clear(request["session_id"])
    else:  # back to before a checkpoint (call_metadata.py)
        done = await app.checkpoints.rewind(
            request["session_id"],
            rewind.checkpoint,
            conversation_only=rewind.conversation_only,
            force=rewind.force,
        )
        metadata.reply = call_metadata.rewound_metadata(done)
    return {"success": True}


# generation


@_rpc("Generate")
async def _generate(app: Application, request: Given) -> Plain:
    options = convert.options_from(request)
    messages = await _messages(app, request["messages"], "messages")
    generation = await app.generation.generate(request["session_id"], messages, options)
    return convert.generate_response(request["session_id"], generation, options.return_intermediate_steps)


@_streams("StreamGenerate", lambda chunk: chunk["metadata"][call_metadata.SEQ])
async def _stream_generate(
    app: Application, request: Given, metadata: CallMetadata, started: Started
) -> AsyncIterator[Plain]:
    """As the gRPC face's StreamGenerate: it runs on if the client goes away; resumes from a cursor."""
    session_id = request["session_id"]
    after = call_metadata.after_seq(metadata.given)
    options = convert.options_from(request)
    messages = [] if after is not None else await _messages(app, request["messages"], "messages")
    chunks = await app.generation.follow(session_id, messages, options, after)
    started()
    async for event, seq in chunks:
        yield convert.chunk(session_id, event, options.return_intermediate_steps, seq)


@_rpc("GenerateStructured")
async def _generate_structured(app: Application, request: Given) -> Plain:
    messages = await _messages(app, request["messages"], "messages")
    done = await app.generation.generate_structured(
        request["session_id"], messages, convert.options_from(request), request["schema"]
    )
    return {
        "session_id": request["session_id"],
        "data": done.data,
        "usage": convert.usage(done.usage),
        "metadata": service.structured_metadata(done),
    }


@_streams("StreamGenerateStructured")
async def _stream_generate_structured(
    app: Application, request: Given, metadata: CallMetadata, started: Started
) -> AsyncIterator[Plain]:
    session_id = request["session_id"]
    messages = await _messages(app, request["messages"], "messages")
    events = app.generation.stream_structured(
        session_id, messages, convert.options_from(request), request["schema"]
    )
    async for event in events:
        started()
        if isinstance(event, TextEvent):
            yield {"session_id": session_id, "data": event.text}
        elif isinstance(event, StructuredDone):
            yield {"session_id": session_id, "data": event.data, "done": True}


# tools


@_rpc("ExecuteTool")
async def _execute_tool(app: Application, request: Given) -> Plain:
    result = await app.tools.execute(request["session_id"], request["tool_name"], request["arguments"])
    return {"result": convert.tool_result(result)}


@_rpc("ExecuteToolBatch")
async def _execute_tool_batch(app: Application, request: Given) -> Plain:
    calls = [convert.tool_call_from(c) for c in request["tool_calls"]]
    results = await app.tools.execute_batch(request["session_id"], calls)
    return {"results": [convert.tool_result(r) for r in results]}


@_rpc("ListTools")
async def _list_tools(app: Application, request: Given) -> Plain:
    await app.tools.ready(request["session_id"] or None)
    return {"tools": [convert.tool(t) for t in app.tools.available(request["session_id"] or None)]}


@_rpc("RegisterTool")
async def _register_tool(app: Application, request: Given) -> Plain:
    tool = convert.given(request["tool"], "Tool")
    await app.tools.register(
        request["session_id"],
        tool["name"],
        tool["description"],
        tool["parameters_schema"],
        list(tool["tags"]),
    )
    return {"success": True}


# skills


@_rpc("LoadSkill")
async def _load_skill(app: Application, request: Given) -> Plain:
    names = await app.skills.load(request["session_id"], request["skill_name"], request["skill_content"])
    return {"success": True, "tool_names": names}


@_rpc("UnloadSkill")
async def _unload_skill(app: Application, request: Given) -> Plain:
    removed = await app.skills.unload(request["session_id"], request["skill_name"])
    return {"success": True, "removed_tools": removed}


@_rpc("ListSkills")
async def _list_skills(app: Application, request: Given) -> Plain:
    listing = await app.skills.listing(request["session_id"] or None)
    return {
        "skills": [
            {
                "name": entry.skill.name,
                "description": entry.skill.description,
                "tools": entry.skill.tool_names,
                "metadata": entry.metadata,
            }
            for entry in listing
        ]
    }


# events and control


@_streams("SubscribeEvents", lambda event: event["data"][call_metadata.SEQ])
async def _subscribe_events(
    app: Application, request: Given, metadata: CallMetadata, started: Started
) -> AsyncIterator[Plain]:
    session_id = request["session_id"] or None
    after = call_metadata.events_after(metadata.given, session_id)
    feed = await app.events.open(session_id, request["event_types"], after)
    started()
    try:
        async for event in feed:
            yield convert.event(event)
    finally:
        feed.close()


@_rpc("Cancel")
async def _cancel(app: Application, request: Given) -> Plain:
    return {"success": await app.control.cancel(request["session_id"], request["operation_id"])}


@_rpc("Pause")
async def _pause(app: Application, request: Given) -> Plain:
    await app.control.pause(request["session_id"])
    return {"success": True}


@_rpc("Resume")
async def _resume(app: Application, request: Given) -> Plain:
    await app.control.resume(request["session_id"])
    return {"success": True}


@_rpc("ConfirmToolExecution")
async def _confirm_tool_execution(app: Application, request: Given) -> Plain:
    error = await service.answered_in_band(
        app.control.confirm(
            request["session_id"], request["tool_id"], request["approved"], request["reason"] or ""
        )
    )
    return {"success": not error, "error": error}


@_rpc("SetConfirmationPolicy")
async def _set_confirmation_policy(app: Application, request: Given) -> Plain:
    policy = await app.control.set_confirmation_policy(
        request["session_id"], convert.confirmation_policy_from(request["policy"])
    )
    return {"success": True, "policy": convert.confirmation_policy(policy)}


@_rpc("GetConfirmationPolicy")
async def _get_confirmation_policy(app: Application, request: Given) -> Plain:
    return {
        "policy": convert.confirmation_policy(await app.control.confirmation_policy(request["session_id"]))
    }


@_rpc("SetLaneHandler")
async def _set_lane_handler(app: Application, request: Given) -> Plain:
    handler = await app.control.set_lane_handler(
        request["session_id"], service.lane(request["lane"]), convert.lane_handler_from(request["config"])
    )
    return {"success": True, "config": convert.lane_handler_config(handler)}


@_rpc("GetLaneHandler")
async def _get_lane_handler(app: Application, request: Given) -> Plain:
    handler = await app.control.lane_handler(request["session_id"], service.lane(request["lane"]))
    return {"config": convert.lane_handler_config(handler)}


@_rpc("CompleteExternalTask")
async def _complete_external_task(app: Application, request: Given) -> Plain:
    error = await service.answered_in_band(
        app.control.complete_external(
            request["session_id"], request["task_id"], request["success"], request["result"], request["error"]
        )
    )
    return {"success": not error, "error": error}


@_rpc("ListPendingExternalTasks")
async def _list_pending_external_tasks(app: Application, request: Given) -> Plain:
    tasks = await app.control.pending_external(request["session_id"])
    return {"tasks": [convert.external_task(t) for t in tasks]}


# permissions


@_rpc("SetPermissionPolicy")
async def _set_permission_policy(app: Application, request: Given) -> Plain:
    policy = await app.permissions.set(
        request["session_id"], convert.permission_policy_from(request["policy"])
    )
    return {"success": True, "policy": convert.permission_policy(policy)}


@_rpc("GetPermissionPolicy")
async def _get_permission_policy(app: Application, request: Given) -> Plain:
    return {"policy": convert.permission_policy(await app.permissions.get(request["session_id"]))}


@_rpc("CheckPermission")
async def _check_permission(app: Application, request: Given) -> Plain:
    verdict = await app.permissions.check(request["session_id"], request["tool_name"], request["arguments"])
    return {
        "decision": convert.DECISION_NUMBERS[verdict.decision],
        "matching_rules": list(verdict.matching_rules),
    }


@_rpc("AddPermissionRule")
async def _add_permission_rule(app: Application, request: Given) -> Plain:
    await app.permissions.add_rule(request["session_id"], request["rule_type"], request["rule"])
    return {"success": True}


def _method(rpc: Rpc) -> Method:
    if rpc.server_streaming:
        streaming = _STREAMING[rpc.name]
        return Method(
            rpc.name, rpc.input, rpc.output, True, _streaming=streaming, cursor=_CURSORS.get(rpc.name)
        )
    return Method(rpc.name, rpc.input, rpc.output, False, _unary=_UNARY[rpc.name])


def _later_method(rpc: Rpc) -> Method:
    handler = LATER_HANDLERS[rpc.name]
    if rpc.server_streaming:
        streaming = _without_call_metadata(cast(StreamHandler, handler))
        return Method(rpc.name, rpc.input, rpc.output, True, _streaming=streaming, codec=LATER)
    unary = _without_metadata(cast(Plainly, handler))
    return Method(rpc.name, rpc.input, rpc.output, False, _unary=unary, codec=LATER)


def _without_call_metadata(handler: StreamHandler) -> Streaming:
    def streaming(
        app: Application, request: Given, metadata: CallMetadata, started: Started
    ) -> AsyncIterator[Plain]:
        return handler(app, request, started)

    return streaming


METHODS: dict[str, Method] = {
    **{rpc.name: _method(rpc) for rpc in RPCS},
    **{rpc.name: _later_method(rpc) for rpc in LATER_RPCS if rpc.name in LATER_HANDLERS},
}
"""Every RPC served, by its proto name: the service's, and the later dialect's own of the groups
later_service.SERVED lists; a missing handler fails the import."""
_BY_NAME = {**METHODS, **{_snake(name): method for name, method in METHODS.items()}}
