"""CodeAgentService: the A3S RPCs over the application layer (app/). Conversion and error mapping only."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message

from ...app import Application
from ...app.lifecycle import InitializeRequest
from ...app.types import ContextUsage, Session, StructuredDone, TextEvent
from ...base.errors import InvalidArgument
from ...base.models import DEFAULT_PROVIDER, ToolCall
from ...base.models import Message as CoreMessage
from ...proto import code_agent_pb2 as pb
from ...proto import code_agent_pb2_grpc as pb_grpc
from .. import call_metadata
from ..agent_service import (
    MODEL_FEATURES,
    PROTOCOLS,
    answered_in_band,
    features,
    health_details,
    health_message,
    lane,
    sandbox_details,
    steer_text,
    structured_metadata,
)
from . import convert, later_convert, metadata
from .dialect_choice import DECIDING, Dialects
from .errors import decoding, rpc
from .later_only import later_only_handlers

log = logging.getLogger(__name__)

_INLINE_MESSAGES, _INLINE_BYTES = 16, 64 << 10
"""Request messages converted on the event loop: at most this many, of at most this size in all."""

_LOG_LEVELS = {
    pb.LogConfig.LEVEL_DEBUG: "DEBUG",
    pb.LogConfig.LEVEL_INFO: "INFO",
    pb.LogConfig.LEVEL_WARN: "WARNING",
    pb.LogConfig.LEVEL_ERROR: "ERROR",
}


class CodeAgentService(pb_grpc.CodeAgentServiceServicer):
    """Each RPC: the request converted (convert.py, its `a3s-*` metadata by metadata.py), one call
    into the application layer, the reply converted. Requests and replies are Box-era messages;
    dialect_choice.py converts those of later-dialect clients around these methods, and
    `dialects` says which a call's connection speaks where a reply has later-only values."""

    def __init__(self, app: Application, dialects: Dialects) -> None:
        self.app = app
        self.dialects = dialects

    # --- lifecycle -------------------------------------------------------------------------

    @rpc
    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Any) -> pb.HealthCheckResponse:
        health = self.app.lifecycle.health()
        return pb.HealthCheckResponse(
            status=pb.HealthCheckResponse.STATUS_UNHEALTHY
            if health.shutting_down
            else pb.HealthCheckResponse.STATUS_HEALTHY,
            message=health_message(health),
            details=health_details(health),
        )

    @rpc
    async def GetCapabilities(
        self, request: pb.GetCapabilitiesRequest, context: Any
    ) -> pb.GetCapabilitiesResponse:
        await self.app.tools.ready(None)  # the server's own MCP servers' tools are listed too
        capabilities = self.app.lifecycle.capabilities()
        limits = capabilities.limits
        return pb.GetCapabilitiesResponse(
            info=convert.info_to_pb(capabilities.info),
            features=features(capabilities),
            tools=[convert.tool_capability_to_pb(t) for t in capabilities.tools],
            models=[
                pb.ModelCapability(
                    provider=m.provider or DEFAULT_PROVIDER, model=m.model, features=MODEL_FEATURES
                )
                for m in capabilities.models
            ],
            limits=pb.ResourceLimits(
                max_context_tokens=limits.max_context_tokens,
                max_concurrent_sessions=limits.max_concurrent_sessions,
                max_tools_per_request=limits.max_tools_per_request,
            ),
            metadata={
                "store": capabilities.store,
                "protocols": PROTOCOLS,
                **sandbox_details(capabilities.sandbox),
            },
        )

    @rpc
    async def Initialize(self, request: pb.InitializeRequest, context: Any) -> pb.InitializeResponse:
        config = request.config
        level = _LOG_LEVELS.get(config.log.level) if config.HasField("log") else None
        if config.HasField("log") and level is None:
            raise InvalidArgument(
                "config.log.level must be LEVEL_DEBUG, LEVEL_INFO, LEVEL_WARN or LEVEL_ERROR"
            )
        initialized = await self.app.lifecycle.initialize(
            InitializeRequest(
                workspace=request.workspace,
                llm=convert.llm_from_pb(config.llm) if config.HasField("llm") else None,
                enabled_tools=list(config.tools.enabled_tools),
                disabled_tools=list(config.tools.disabled_tools),
                tool_config=dict(config.tools.tool_config),
                log_level=level or "",
                env=dict(request.env),
                custom=dict(config.custom),
            )
        )
        return pb.InitializeResponse(
            success=True,
            message=initialized.message,
            info=convert.info_to_pb(self.app.lifecycle.info),
        )

    @rpc
    async def Shutdown(self, request: pb.ShutdownRequest, context: Any) -> pb.ShutdownResponse:
        self.app.lifecycle.request_shutdown()
        return pb.ShutdownResponse(success=True, message="shutting down")

    # --- sessions --------------------------------------------------------------------------

    @rpc
    async def CreateSession(self, request: pb.CreateSessionRequest, context: Any) -> pb.CreateSessionResponse:
        fork = call_metadata.fork_request(metadata.given(context))
        if fork is not None:  # a fork of a session at a checkpoint (call_metadata.py)
            if request.initial_context:
                raise InvalidArgument(
                    "initial_context: a fork's history is its session's, up to the checkpoint"
                )
            view = await self.app.checkpoints.fork(
                fork.session_id,
                fork.checkpoint,
                copy_workspace=fork.copy_workspace,
                workspace=request.config.workspace,
            )
            metadata.hand_out(context, call_metadata.session_metadata(view))
            return pb.CreateSessionResponse(
                session_id=view.session.id, session=self._session_to_pb(view.session, view.usage, context)
            )
        given = call_metadata.config_metadata(metadata.given(context))
        view = await self.app.sessions.create(
            request.session_id if request.HasField("session_id") else None,
            convert.session_config_from_pb(request.config),
            await self._messages(request.initial_context, "initial_context"),
            {**later_convert.session_extras(request.config), **given.compaction},
            given.token_budget,
            given.mcp_servers,
            given.memory,
        )
        metadata.hand_out(context, call_metadata.session_metadata(view))
        session = self._session_to_pb(view.session, view.usage, context)
        return pb.CreateSessionResponse(session_id=view.session.id, session=session)

    @rpc
    async def DestroySession(
        self, request: pb.DestroySessionRequest, context: Any
    ) -> pb.DestroySessionResponse:
        await self.app.sessions.destroy(request.session_id)
        return pb.DestroySessionResponse(success=True)

    @rpc
    async def ListSessions(self, request: pb.ListSessionsRequest, context: Any) -> pb.ListSessionsResponse:
        """A page of sessions (see call_metadata.py), without reading any history: context_usage
        carries the message count only; GetSession and GetContextUsage count the tokens."""
        size, after = call_metadata.requested_page(metadata.given(context))
        page = await self.app.sessions.page(after, size)
        metadata.hand_out(context, call_metadata.next_page(page.next_after))
        later = self.dialects.is_later(context)
        return pb.ListSessionsResponse(sessions=[_session_to_pb(s, None, later) for s in page.sessions])

    @rpc
    async def GetSession(self, request: pb.GetSessionRequest, context: Any) -> pb.GetSessionResponse:
        view = await self.app.sessions.get(request.session_id)
        metadata.hand_out(context, call_metadata.session_metadata(view))
        return pb.GetSessionResponse(session=self._session_to_pb(view.session, view.usage, context))

    @rpc
    async def ConfigureSession(
        self, request: pb.ConfigureSessionRequest, context: Any
    ) -> pb.ConfigureSessionResponse:
        given = call_metadata.config_metadata(metadata.given(context))
        view = await self.app.sessions.configure(
            request.session_id,
            convert.session_config_from_pb(request.config),
            replace_all=given.replace_all,
            compaction={**later_convert.session_extras(request.config), **given.compaction},
            token_budget=given.token_budget,
            mcp_servers=given.mcp_servers,
            memory=given.memory,
        )
        metadata.hand_out(context, call_metadata.session_metadata(view))
        return pb.ConfigureSessionResponse(session=self._session_to_pb(view.session, view.usage, context))

    def _session_to_pb(self, session: Session, usage: ContextUsage, context: Any) -> pb.Session:
        return _session_to_pb(session, usage, self.dialects.is_later(context))

    async def _messages(self, messages: Sequence[pb.Message], field: str) -> list[CoreMessage]:
        """Checked and converted; on a worker thread unless they are few and small: for tens of
        megabytes that takes a while, for a prompt of a few lines less than the hop would."""
        if not messages:
            return []
        limit = self.app.max_request_messages
        if len(messages) <= _INLINE_MESSAGES and sum(m.ByteSize() for m in messages) <= _INLINE_BYTES:
            return convert.messages_from_pb(messages, field, limit)
        return await asyncio.to_thread(convert.messages_from_pb, messages, field, limit)

    # --- context ---------------------------------------------------------------------------

    @rpc
    async def GetContextUsage(
        self, request: pb.GetContextUsageRequest, context: Any
    ) -> pb.GetContextUsageResponse:
        usage = await self.app.context.usage(request.session_id)
        return pb.GetContextUsageResponse(usage=convert.context_usage_to_pb(usage))

    @rpc
    async def CompactContext(
        self, request: pb.CompactContextRequest, context: Any
    ) -> pb.CompactContextResponse:
        result = await self.app.context.compact(request.session_id)
        return pb.CompactContextResponse(
            success=True,
            before=convert.context_usage_to_pb(result.before),
            after=convert.context_usage_to_pb(result.after),
        )

    @rpc
    async def ClearContext(self, request: pb.ClearContextRequest, context: Any) -> pb.ClearContextResponse:
        rewind = call_metadata.rewind_request(metadata.given(context))
        if rewind is None:
            await self.app.context.clear(request.session_id)
        else:  # back to before a checkpoint (call_metadata.py)
            done = await self.app.checkpoints.rewind(
                request.session_id,
                rewind.checkpoint,
                conversation_only=rewind.conversation_only,
                force=rewind.force,
            )
            metadata.hand_out(context, call_metadata.rewound_metadata(done))
        return pb.ClearContextResponse(success=True)

    # --- generation ------------------------------------------------------------------------

    @rpc
    async def Generate(self, request: pb.GenerateRequest, context: Any) -> pb.GenerateResponse:
        options = convert.options_from_pb(request)
        messages = await self._messages(request.messages, "messages")
        if call_metadata.steer_requested(metadata.given(context)):
            steer_id = await self.app.control.steer(request.session_id, steer_text(messages))
            metadata.hand_out(context, [(call_metadata.STEER_ID_KEY, steer_id)])
            return pb.GenerateResponse(session_id=request.session_id, metadata={"steer_id": steer_id})
        generation = await self.app.generation.generate(request.session_id, messages, options)
        return convert.generate_response(request.session_id, generation, options.return_intermediate_steps)

    @rpc
    async def StreamGenerate(
        self, request: pb.GenerateRequest, context: Any
    ) -> AsyncIterator[pb.GenerateChunk]:
        """A generation that runs on if the client goes away (Cancel stops it); with `a3s-after-seq`
        (call_metadata.py) the one that wrote that chunk, followed from the next chunk."""
        after = call_metadata.after_seq(metadata.given(context))
        options = convert.options_from_pb(request)
        messages = [] if after is not None else await self._messages(request.messages, "messages")
        chunks = self.app.generation.chunks(request.session_id, messages, options, after)
        async for event, seq in chunks:
            yield convert.event_to_chunk(request.session_id, event, options.return_intermediate_steps, seq)

    @rpc
    async def GenerateStructured(
        self, request: pb.GenerateStructuredRequest, context: Any
    ) -> pb.GenerateStructuredResponse:
        messages = await self._messages(request.messages, "messages")
        done = await self.app.generation.generate_structured(
            request.session_id, messages, convert.options_from_pb(request), request.schema
        )
        return pb.GenerateStructuredResponse(
            session_id=request.session_id,
            data=done.data,
            usage=convert.usage_to_pb(done.usage),
            metadata=structured_metadata(done),
        )

    @rpc
    async def StreamGenerateStructured(
        self, request: pb.GenerateStructuredRequest, context: Any
    ) -> AsyncIterator[pb.GenerateStructuredChunk]:
        messages = await self._messages(request.messages, "messages")
        events = self.app.generation.stream_structured(
            request.session_id, messages, convert.options_from_pb(request), request.schema
        )
        async for event in events:
            if isinstance(event, TextEvent):
                yield pb.GenerateStructuredChunk(session_id=request.session_id, data=event.text)
            elif isinstance(event, StructuredDone):
                yield pb.GenerateStructuredChunk(session_id=request.session_id, data=event.data, done=True)

    # --- tools -----------------------------------------------------------------------------

    @rpc
    async def ExecuteTool(self, request: pb.ExecuteToolRequest, context: Any) -> pb.ExecuteToolResponse:
        result = await self.app.tools.execute(request.session_id, request.tool_name, request.arguments)
        return pb.ExecuteToolResponse(result=convert.tool_result_to_pb(result))

    @rpc
    async def ExecuteToolBatch(
        self, request: pb.ExecuteToolBatchRequest, context: Any
    ) -> pb.ExecuteToolBatchResponse:
        calls = [ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in request.tool_calls]
        results = await self.app.tools.execute_batch(request.session_id, calls)
        return pb.ExecuteToolBatchResponse(results=[convert.tool_result_to_pb(r) for r in results])

    @rpc
    async def ListTools(self, request: pb.ListToolsRequest, context: Any) -> pb.ListToolsResponse:
        await self.app.tools.ready(request.session_id or None)
        tools = self.app.tools.available(request.session_id or None)
        return pb.ListToolsResponse(tools=[convert.tool_to_pb(t) for t in tools])

    @rpc
    async def RegisterTool(self, request: pb.RegisterToolRequest, context: Any) -> pb.RegisterToolResponse:
        tool = request.tool
        await self.app.tools.register(
            request.session_id, tool.name, tool.description, tool.parameters_schema, list(tool.tags)
        )
        return pb.RegisterToolResponse(success=True)

    # --- skills --------------------------------------------------------------------------

    @rpc
    async def LoadSkill(self, request: pb.LoadSkillRequest, context: Any) -> pb.LoadSkillResponse:
        content = request.skill_content if request.HasField("skill_content") else None
        names = await self.app.skills.load(request.session_id, request.skill_name, content)
        return pb.LoadSkillResponse(success=True, tool_names=names)

    @rpc
    async def UnloadSkill(self, request: pb.UnloadSkillRequest, context: Any) -> pb.UnloadSkillResponse:
        removed = await self.app.skills.unload(request.session_id, request.skill_name)
        return pb.UnloadSkillResponse(success=True, removed_tools=removed)

    @rpc
    async def ListSkills(self, request: pb.ListSkillsRequest, context: Any) -> pb.ListSkillsResponse:
        listing = await self.app.skills.listing(request.session_id or None)
        return pb.ListSkillsResponse(
            skills=[
                pb.Skill(
                    name=entry.skill.name,
                    description=entry.skill.description,
                    tools=entry.skill.tool_names,
                    metadata=entry.metadata,
                )
                for entry in listing
            ]
        )

    # --- events and control ---------------------------------------------------------------

    @rpc
    async def SubscribeEvents(
        self, request: pb.SubscribeEventsRequest, context: Any
    ) -> AsyncIterator[pb.AgentEvent]:
        """A later-dialect connection gets compaction and the memory events as their later types
        (16-20, later_convert.later_type), a Box one as the INFO events they are; a filter may name
        the later types (later_convert.EventFilter)."""
        session_id = request.session_id if request.HasField("session_id") and request.session_id else None
        after = call_metadata.events_after(metadata.given(context), session_id)
        wanted = later_convert.event_filter(request.event_types)
        later = self.dialects.is_later(context)
        async for event in self.app.events.subscribe(session_id, wanted.names, after):
            if not wanted.passes(event):
                continue
            out = convert.event_to_pb(event)
            kind = later_convert.later_type(event) if later else None
            if kind is not None:
                out.type = kind
            yield out

    @rpc
    async def Cancel(self, request: pb.CancelRequest, context: Any) -> pb.CancelResponse:
        operation = request.operation_id if request.HasField("operation_id") else None
        return pb.CancelResponse(success=await self.app.control.cancel(request.session_id, operation))

    @rpc
    async def Pause(self, request: pb.PauseRequest, context: Any) -> pb.PauseResponse:
        await self.app.control.pause(request.session_id)
        return pb.PauseResponse(success=True)

    @rpc
    async def Resume(self, request: pb.ResumeRequest, context: Any) -> pb.ResumeResponse:
        await self.app.control.resume(request.session_id)
        return pb.ResumeResponse(success=True)

    @rpc
    async def ConfirmToolExecution(
        self, request: pb.ConfirmToolExecutionRequest, context: Any
    ) -> pb.ConfirmToolExecutionResponse:
        error = await answered_in_band(
            self.app.control.confirm(request.session_id, request.tool_id, request.approved, request.reason)
        )
        return pb.ConfirmToolExecutionResponse(success=not error, error=error)

    @rpc
    async def SetConfirmationPolicy(
        self, request: pb.SetConfirmationPolicyRequest, context: Any
    ) -> pb.SetConfirmationPolicyResponse:
        policy = await self.app.control.set_confirmation_policy(
            request.session_id, convert.confirmation_policy_from_pb(request.policy)
        )
        return pb.SetConfirmationPolicyResponse(
            success=True, policy=convert.confirmation_policy_to_pb(policy)
        )

    @rpc
    async def GetConfirmationPolicy(
        self, request: pb.GetConfirmationPolicyRequest, context: Any
    ) -> pb.GetConfirmationPolicyResponse:
        policy = await self.app.control.confirmation_policy(request.session_id)
        return pb.GetConfirmationPolicyResponse(policy=convert.confirmation_policy_to_pb(policy))

    @rpc
    async def SetLaneHandler(
        self, request: pb.SetLaneHandlerRequest, context: Any
    ) -> pb.SetLaneHandlerResponse:
        handler = await self.app.control.set_lane_handler(
            request.session_id,
            lane(request.lane),
            convert.lane_handler_from_pb(request.config),
        )
        return pb.SetLaneHandlerResponse(success=True, config=convert.lane_handler_to_pb(handler))

    @rpc
    async def GetLaneHandler(
        self, request: pb.GetLaneHandlerRequest, context: Any
    ) -> pb.GetLaneHandlerResponse:
        handler = await self.app.control.lane_handler(request.session_id, lane(request.lane))
        return pb.GetLaneHandlerResponse(config=convert.lane_handler_to_pb(handler))

    @rpc
    async def CompleteExternalTask(
        self, request: pb.CompleteExternalTaskRequest, context: Any
    ) -> pb.CompleteExternalTaskResponse:
        error = await answered_in_band(
            self.app.control.complete_external(
                request.session_id, request.task_id, request.success, request.result, request.error
            )
        )
        return pb.CompleteExternalTaskResponse(success=not error, error=error)

    @rpc
    async def ListPendingExternalTasks(
        self, request: pb.ListPendingExternalTasksRequest, context: Any
    ) -> pb.ListPendingExternalTasksResponse:
        tasks = await self.app.control.pending_external(request.session_id)
        return pb.ListPendingExternalTasksResponse(tasks=[convert.external_task_to_pb(t) for t in tasks])

    # --- permissions ----------------------------------------------------------------------

    @rpc
    async def SetPermissionPolicy(
        self, request: pb.SetPermissionPolicyRequest, context: Any
    ) -> pb.SetPermissionPolicyResponse:
        policy = await self.app.permissions.set(
            request.session_id, convert.permission_policy_from_pb(request.policy)
        )
        return pb.SetPermissionPolicyResponse(success=True, policy=convert.permission_policy_to_pb(policy))

    @rpc
    async def GetPermissionPolicy(
        self, request: pb.GetPermissionPolicyRequest, context: Any
    ) -> pb.GetPermissionPolicyResponse:
        policy = await self.app.permissions.get(request.session_id)
        return pb.GetPermissionPolicyResponse(policy=convert.permission_policy_to_pb(policy))

    @rpc
    async def CheckPermission(
        self, request: pb.CheckPermissionRequest, context: Any
    ) -> pb.CheckPermissionResponse:
        verdict = await self.app.permissions.check(request.session_id, request.tool_name, request.arguments)
        return pb.CheckPermissionResponse(
            decision=convert.DECISION_NUMBERS[verdict.decision], matching_rules=list(verdict.matching_rules)
        )

    @rpc
    async def AddPermissionRule(
        self, request: pb.AddPermissionRuleRequest, context: Any
    ) -> pb.AddPermissionRuleResponse:
        await self.app.permissions.add_rule(request.session_id, request.rule_type, request.rule)
        return pb.AddPermissionRuleResponse(success=True)


def _session_to_pb(session: Session, usage: ContextUsage | None, later: bool) -> pb.Session:
    """The wire session; for a later-dialect connection with its own auto_compact_threshold."""
    out = convert.session_to_pb(session, usage)
    if later:
        later_convert.with_threshold(out.config, session.settings.compaction.get("threshold", 0))
    return out


def add_to_server(app: Application, server: grpc.aio.Server) -> CodeAgentService:
    """Register every RPC of both dialects (`--a3s-dialect`, dialect_choice.py). Requests are
    decoded here rather than by grpc, so that bytes that are not a valid request answer
    INVALID_ARGUMENT (grpc's own decoding failure is UNKNOWN)."""
    dialects = Dialects(app.lifecycle.settings.a3s_dialect)
    service = CodeAgentService(app, dialects)
    descriptor = pb.DESCRIPTOR.services_by_name["CodeAgentService"]
    handlers = {}
    for method in descriptor.methods:
        request_type = getattr(pb, method.input_type.name)
        implementation = getattr(service, method.name)
        if method.name in DECIDING:
            behavior = dialects.deciding(method.name, implementation, request_type, method.server_streaming)
        else:
            behavior = decoding(implementation, request_type, method.server_streaming)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(behavior, response_serializer=_serialize)
    for name, handler in later_only_handlers(app).items():
        handlers[name] = dialects.remembering(handler)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(descriptor.full_name, handlers),))
    return service


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()
