"""CodeAgentService: the A3S RPCs over the core. Conversion and error mapping only, no logic."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import grpc
from google.protobuf.message import Message

from ...core.agent import DoneEvent, TextEvent
from ...core.errors import InvalidArgument
from ...core.events import parse_event_types
from ...core.jsontext import parse_json
from ...core.models import Message as CoreMessage
from ...core.models import Session, SessionState, ToolCall
from ...core.permissions import PermissionPolicy, add_rule, evaluate
from ...core.session_settings import SessionSettings
from ...core.structured import StructuredDone, run_structured
from ...proto import code_agent_pb2 as pb
from ...proto import code_agent_pb2_grpc as pb_grpc
from ...runtime import Runtime
from . import convert, paging
from .errors import decoding, rpc

log = logging.getLogger(__name__)

# What GetCapabilities advertises: every RPC of the service is served.
FEATURES = [
    "lifecycle", "sessions", "persistent_sessions", "tool_execution", "code_generation", "streaming",
    "structured_output", "custom_tools", "skills", "context_management", "auto_compaction", "events",
    "control", "confirmation", "lanes", "external_tasks", "permissions",
]  # fmt: skip

_LOG_LEVELS = {
    pb.LogConfig.LEVEL_DEBUG: "DEBUG",
    pb.LogConfig.LEVEL_INFO: "INFO",
    pb.LogConfig.LEVEL_WARN: "WARNING",
    pb.LogConfig.LEVEL_ERROR: "ERROR",
}


class CodeAgentService(pb_grpc.CodeAgentServiceServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    # --- lifecycle -------------------------------------------------------------------------

    @rpc
    async def HealthCheck(self, request: pb.HealthCheckRequest, context: Any) -> pb.HealthCheckResponse:
        rt = self.rt
        if rt.shutting_down:
            status, message = pb.HealthCheckResponse.STATUS_UNHEALTHY, "shutting down"
        else:
            status, message = pb.HealthCheckResponse.STATUS_HEALTHY, "ok"
        return pb.HealthCheckResponse(
            status=status,
            message=message,
            details={
                "version": rt.info.version,
                "uptime_s": f"{rt.uptime_s:.1f}",
                "sessions": str(len(rt.sessions)),
                "active_sessions": str(rt.sessions.count(SessionState.ACTIVE)),
                "histories_in_memory": str(rt.sessions.histories_in_memory),
                "workspace": str(rt.workspace),
                "store": rt.store.backend,
                "durability": rt.store.durability,
            },
        )

    @rpc
    async def GetCapabilities(
        self, request: pb.GetCapabilitiesRequest, context: Any
    ) -> pb.GetCapabilitiesResponse:
        rt = self.rt
        return pb.GetCapabilitiesResponse(
            info=self._info(),
            features=FEATURES,
            tools=[convert.tool_capability_to_pb(t) for t in rt.registry.enabled()],
            models=[
                pb.ModelCapability(provider=m.provider or "openai", model=m.model, features=["chat"])
                for m in rt.configured_models()
            ],
            limits=pb.ResourceLimits(
                max_context_tokens=rt.settings.max_context_tokens,
                max_concurrent_sessions=rt.settings.max_sessions,
                max_tools_per_request=rt.settings.max_tools_per_request,
            ),
            metadata={"store": rt.store.backend, "protocols": "grpc,http,websocket"},
        )

    @rpc
    async def Initialize(self, request: pb.InitializeRequest, context: Any) -> pb.InitializeResponse:
        config = request.config
        level = _LOG_LEVELS.get(config.log.level) if config.HasField("log") else None
        if config.HasField("log") and level is None:
            raise InvalidArgument(
                "config.log.level must be LEVEL_DEBUG, LEVEL_INFO, LEVEL_WARN or LEVEL_ERROR"
            )
        await self.rt.initialize(
            workspace=request.workspace,
            llm=convert.llm_from_pb(config.llm) if config.HasField("llm") else None,
            enabled_tools=list(config.tools.enabled_tools),
            disabled_tools=list(config.tools.disabled_tools),
            tool_config=dict(config.tools.tool_config),
            log_level=level,
            env=dict(request.env),
        )
        return pb.InitializeResponse(
            success=True, message=f"initialized; workspace {self.rt.workspace}", info=self._info()
        )

    @rpc
    async def Shutdown(self, request: pb.ShutdownRequest, context: Any) -> pb.ShutdownResponse:
        self.rt.shutdown_requested.set()
        return pb.ShutdownResponse(success=True, message="shutting down")

    # --- sessions --------------------------------------------------------------------------

    @rpc
    async def CreateSession(self, request: pb.CreateSessionRequest, context: Any) -> pb.CreateSessionResponse:
        given = convert.config_metadata(paging.call_metadata(context)).compaction
        settings = SessionSettings(compaction=self.rt.context.checked_settings({}, given)) if given else None
        session = await self.rt.sessions.create(
            request.session_id if request.HasField("session_id") else None,
            convert.session_config_from_pb(request.config),
            await self._messages(request.initial_context, "initial_context"),
            settings=settings,
        )
        self._hand_out_compaction(context, session)
        return pb.CreateSessionResponse(session_id=session.id, session=await self._session_pb(session))

    @rpc
    async def DestroySession(
        self, request: pb.DestroySessionRequest, context: Any
    ) -> pb.DestroySessionResponse:
        self.rt.sessions.get(request.session_id)
        self.rt.control.forget(request.session_id)  # a running generation stops with its session
        await self.rt.sessions.destroy(request.session_id)
        return pb.DestroySessionResponse(success=True)

    @rpc
    async def ListSessions(self, request: pb.ListSessionsRequest, context: Any) -> pb.ListSessionsResponse:
        """A page of sessions (see paging.py), without reading any history: context_usage carries
        the message count only; GetSession and GetContextUsage count the tokens."""
        size, after = paging.requested_page(context)
        sessions, more = self.rt.sessions.page(after, size)
        if more:
            paging.hand_out(context, paging.token(sessions[-1]))
        return pb.ListSessionsResponse(sessions=[convert.session_to_pb(s, None) for s in sessions])

    @rpc
    async def GetSession(self, request: pb.GetSessionRequest, context: Any) -> pb.GetSessionResponse:
        session = self.rt.sessions.get(request.session_id)
        self._hand_out_compaction(context, session)
        return pb.GetSessionResponse(session=await self._session_pb(session))

    @rpc
    async def ConfigureSession(
        self, request: pb.ConfigureSessionRequest, context: Any
    ) -> pb.ConfigureSessionResponse:
        metadata = convert.config_metadata(paging.call_metadata(context))
        current = self.rt.sessions.get(request.session_id).settings
        settings = self.rt.context.checked_settings(
            {} if metadata.replace_all else current.compaction, metadata.compaction
        )
        session = await self.rt.sessions.configure(
            request.session_id,
            convert.session_config_from_pb(request.config),
            replace_all=metadata.replace_all,
            settings=replace(current, compaction=settings),
        )
        self._hand_out_compaction(context, session)
        return pb.ConfigureSessionResponse(session=await self._session_pb(session))

    def _hand_out_compaction(self, context: Any, session: Session) -> None:
        """The session's compaction threshold and target, in the reply's trailing metadata (callers
        without metadata, the HTTP face, get none)."""
        set_trailing = getattr(context, "set_trailing_metadata", None)
        if set_trailing is not None:
            set_trailing(convert.compaction_metadata(*self.rt.context.shares(session)))

    async def _session_pb(self, session: Session) -> pb.Session:
        return convert.session_to_pb(session, await self.rt.context.usage(session.id))

    async def _messages(self, messages: Sequence[pb.Message], field: str) -> list[CoreMessage]:
        """Checked and converted on a worker thread: for tens of megabytes that takes a while."""
        if not messages:
            return []
        return await asyncio.to_thread(
            convert.messages_from_pb, messages, field, self.rt.settings.max_request_messages
        )

    # --- context ---------------------------------------------------------------------------

    @rpc
    async def GetContextUsage(
        self, request: pb.GetContextUsageRequest, context: Any
    ) -> pb.GetContextUsageResponse:
        usage = await self.rt.context.usage(request.session_id)
        return pb.GetContextUsageResponse(usage=convert.context_usage_to_pb(usage))

    @rpc
    async def CompactContext(
        self, request: pb.CompactContextRequest, context: Any
    ) -> pb.CompactContextResponse:
        async with self.rt.sessions.generation_lock(request.session_id):
            result = await self.rt.context.compact(request.session_id)
        return pb.CompactContextResponse(
            success=True,
            before=convert.context_usage_to_pb(result.before),
            after=convert.context_usage_to_pb(result.after),
        )

    @rpc
    async def ClearContext(self, request: pb.ClearContextRequest, context: Any) -> pb.ClearContextResponse:
        async with self.rt.sessions.generation_lock(request.session_id):
            await self.rt.sessions.replace_history(request.session_id, [])
        return pb.ClearContextResponse(success=True)

    # --- generation ------------------------------------------------------------------------

    @rpc
    async def Generate(self, request: pb.GenerateRequest, context: Any) -> pb.GenerateResponse:
        options = convert.options_from_pb(request)
        messages = await self._messages(request.messages, "messages")
        async for event in self.rt.agent.run(request.session_id, messages, options):
            if isinstance(event, DoneEvent):
                return convert.generate_response(
                    request.session_id, event.generation, options.return_intermediate_steps
                )
        raise AssertionError("the agent loop ended without a result")

    @rpc
    async def StreamGenerate(
        self, request: pb.GenerateRequest, context: Any
    ) -> AsyncIterator[pb.GenerateChunk]:
        options = convert.options_from_pb(request)
        messages = await self._messages(request.messages, "messages")
        async for event in self.rt.agent.run(request.session_id, messages, options):
            yield convert.event_to_chunk(request.session_id, event, options.return_intermediate_steps)

    @rpc
    async def GenerateStructured(
        self, request: pb.GenerateStructuredRequest, context: Any
    ) -> pb.GenerateStructuredResponse:
        async for event in self._structured(request):
            if isinstance(event, StructuredDone):
                return pb.GenerateStructuredResponse(
                    session_id=request.session_id,
                    data=event.data,
                    usage=convert.usage_to_pb(event.usage),
                    metadata={"model": event.model, "attempts": str(event.attempts)},
                )
        raise AssertionError("structured generation ended without a result")

    @rpc
    async def StreamGenerateStructured(
        self, request: pb.GenerateStructuredRequest, context: Any
    ) -> AsyncIterator[pb.GenerateStructuredChunk]:
        async for event in self._structured(request):
            if isinstance(event, TextEvent):
                yield pb.GenerateStructuredChunk(session_id=request.session_id, data=event.text)
            elif isinstance(event, StructuredDone):
                yield pb.GenerateStructuredChunk(session_id=request.session_id, data=event.data, done=True)

    async def _structured(self, request: pb.GenerateStructuredRequest) -> AsyncIterator[Any]:
        messages = await self._messages(request.messages, "messages")
        async for event in run_structured(
            self.rt.agent, request.session_id, messages, convert.options_from_pb(request), request.schema
        ):
            yield event

    # --- tools -----------------------------------------------------------------------------

    @rpc
    async def ExecuteTool(self, request: pb.ExecuteToolRequest, context: Any) -> pb.ExecuteToolResponse:
        if not request.tool_name:
            raise InvalidArgument("tool_name is required")
        result = await self.rt.tools.execute(request.session_id, request.tool_name, request.arguments)
        return pb.ExecuteToolResponse(result=convert.tool_result_to_pb(result))

    @rpc
    async def ExecuteToolBatch(
        self, request: pb.ExecuteToolBatchRequest, context: Any
    ) -> pb.ExecuteToolBatchResponse:
        calls = [ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in request.tool_calls]
        results = await self.rt.tools.execute_batch(request.session_id, calls)
        return pb.ExecuteToolBatchResponse(results=[convert.tool_result_to_pb(r) for r in results])

    @rpc
    async def ListTools(self, request: pb.ListToolsRequest, context: Any) -> pb.ListToolsResponse:
        session = self.rt.sessions.get(request.session_id) if request.session_id else None
        return pb.ListToolsResponse(tools=[convert.tool_to_pb(t) for t in self.rt.tools_for(session)])

    @rpc
    async def RegisterTool(self, request: pb.RegisterToolRequest, context: Any) -> pb.RegisterToolResponse:
        tool = request.tool
        spec = self.rt.client_tools.validate(
            tool.name, tool.description, tool.parameters_schema, list(tool.tags)
        )
        await self.rt.client_tools.register(request.session_id, spec)
        return pb.RegisterToolResponse(success=True)

    # --- skills --------------------------------------------------------------------------

    @rpc
    async def LoadSkill(self, request: pb.LoadSkillRequest, context: Any) -> pb.LoadSkillResponse:
        content = request.skill_content if request.HasField("skill_content") else None
        names = await self.rt.skills.load(request.session_id, request.skill_name, content)
        return pb.LoadSkillResponse(success=True, tool_names=names)

    @rpc
    async def UnloadSkill(self, request: pb.UnloadSkillRequest, context: Any) -> pb.UnloadSkillResponse:
        removed = await self.rt.skills.unload(request.session_id, request.skill_name)
        return pb.UnloadSkillResponse(success=True, removed_tools=removed)

    @rpc
    async def ListSkills(self, request: pb.ListSkillsRequest, context: Any) -> pb.ListSkillsResponse:
        session = self.rt.sessions.get(request.session_id) if request.session_id else None
        await self.rt.skills.rescan()
        return pb.ListSkillsResponse(
            skills=[
                pb.Skill(
                    name=entry.skill.name,
                    description=entry.skill.description,
                    tools=entry.skill.tool_names,
                    metadata=entry.metadata,
                )
                for entry in self.rt.skills.listing(session)
            ]
        )

    # --- events and control ---------------------------------------------------------------

    @rpc
    async def SubscribeEvents(
        self, request: pb.SubscribeEventsRequest, context: Any
    ) -> AsyncIterator[pb.AgentEvent]:
        session_id = request.session_id if request.HasField("session_id") and request.session_id else None
        if session_id is not None:
            self.rt.sessions.get(session_id)
        types = parse_event_types(request.event_types)
        subscription = self.rt.events.subscribe(session_id, types)
        try:
            async for event in subscription:
                yield convert.event_to_pb(event)
        finally:
            subscription.close()

    @rpc
    async def Cancel(self, request: pb.CancelRequest, context: Any) -> pb.CancelResponse:
        operation = request.operation_id if request.HasField("operation_id") else None
        return pb.CancelResponse(success=self.rt.control.cancel(request.session_id, operation))

    @rpc
    async def Pause(self, request: pb.PauseRequest, context: Any) -> pb.PauseResponse:
        await self.rt.control.pause(request.session_id)
        return pb.PauseResponse(success=True)

    @rpc
    async def Resume(self, request: pb.ResumeRequest, context: Any) -> pb.ResumeResponse:
        await self.rt.control.resume(request.session_id)
        return pb.ResumeResponse(success=True)

    @rpc
    async def ConfirmToolExecution(
        self, request: pb.ConfirmToolExecutionRequest, context: Any
    ) -> pb.ConfirmToolExecutionResponse:
        self.rt.control.confirm(request.session_id, request.tool_id, request.approved, request.reason)
        return pb.ConfirmToolExecutionResponse(success=True)

    @rpc
    async def SetConfirmationPolicy(
        self, request: pb.SetConfirmationPolicyRequest, context: Any
    ) -> pb.SetConfirmationPolicyResponse:
        self.rt.sessions.get(request.session_id)
        policy = await self.rt.control.set_confirmation_policy(
            request.session_id, convert.confirmation_policy_from_pb(request.policy)
        )
        return pb.SetConfirmationPolicyResponse(
            success=True, policy=convert.confirmation_policy_to_pb(policy)
        )

    @rpc
    async def GetConfirmationPolicy(
        self, request: pb.GetConfirmationPolicyRequest, context: Any
    ) -> pb.GetConfirmationPolicyResponse:
        policy = self.rt.control.confirmation_policy(request.session_id)
        return pb.GetConfirmationPolicyResponse(policy=convert.confirmation_policy_to_pb(policy))

    @rpc
    async def SetLaneHandler(
        self, request: pb.SetLaneHandlerRequest, context: Any
    ) -> pb.SetLaneHandlerResponse:
        self.rt.sessions.get(request.session_id)
        handler = await self.rt.control.set_lane_handler(
            request.session_id,
            convert.lane_from_pb(request.lane),
            convert.lane_handler_from_pb(request.config),
        )
        return pb.SetLaneHandlerResponse(success=True, config=convert.lane_handler_to_pb(handler))

    @rpc
    async def GetLaneHandler(
        self, request: pb.GetLaneHandlerRequest, context: Any
    ) -> pb.GetLaneHandlerResponse:
        self.rt.sessions.get(request.session_id)
        handler = self.rt.control.lane_handler(request.session_id, convert.lane_from_pb(request.lane))
        return pb.GetLaneHandlerResponse(config=convert.lane_handler_to_pb(handler))

    @rpc
    async def CompleteExternalTask(
        self, request: pb.CompleteExternalTaskRequest, context: Any
    ) -> pb.CompleteExternalTaskResponse:
        self.rt.control.complete_external(
            request.session_id, request.task_id, request.success, request.result, request.error
        )
        return pb.CompleteExternalTaskResponse(success=True)

    @rpc
    async def ListPendingExternalTasks(
        self, request: pb.ListPendingExternalTasksRequest, context: Any
    ) -> pb.ListPendingExternalTasksResponse:
        tasks = self.rt.control.pending_external(request.session_id)
        return pb.ListPendingExternalTasksResponse(tasks=[convert.external_task_to_pb(t) for t in tasks])

    # --- permissions ----------------------------------------------------------------------

    def _permission_policy(self, session_id: str) -> PermissionPolicy:
        return self.rt.sessions.get(session_id).settings.permission_policy

    @rpc
    async def SetPermissionPolicy(
        self, request: pb.SetPermissionPolicyRequest, context: Any
    ) -> pb.SetPermissionPolicyResponse:
        self.rt.sessions.get(request.session_id)
        policy = convert.permission_policy_from_pb(request.policy)
        await self.rt.sessions.set_settings(
            request.session_id, replace(self.rt.sessions.get(request.session_id).settings, permissions=policy)
        )
        return pb.SetPermissionPolicyResponse(success=True, policy=convert.permission_policy_to_pb(policy))

    @rpc
    async def GetPermissionPolicy(
        self, request: pb.GetPermissionPolicyRequest, context: Any
    ) -> pb.GetPermissionPolicyResponse:
        policy = self._permission_policy(request.session_id)
        return pb.GetPermissionPolicyResponse(policy=convert.permission_policy_to_pb(policy))

    @rpc
    async def CheckPermission(
        self, request: pb.CheckPermissionRequest, context: Any
    ) -> pb.CheckPermissionResponse:
        policy = self._permission_policy(request.session_id)
        arguments = parse_json(request.arguments or "{}", "arguments")
        if not isinstance(arguments, dict):
            raise InvalidArgument("arguments must be a JSON object")
        workspace = self.rt.sessions.get(request.session_id).config.workspace
        verdict = evaluate(policy, request.tool_name, arguments, workspace)
        return pb.CheckPermissionResponse(
            decision=convert.DECISION_NUMBERS[verdict.decision], matching_rules=list(verdict.matching_rules)
        )

    @rpc
    async def AddPermissionRule(
        self, request: pb.AddPermissionRuleRequest, context: Any
    ) -> pb.AddPermissionRuleResponse:
        policy = add_rule(self._permission_policy(request.session_id), request.rule_type, request.rule)
        await self.rt.sessions.set_settings(
            request.session_id, replace(self.rt.sessions.get(request.session_id).settings, permissions=policy)
        )
        return pb.AddPermissionRuleResponse(success=True)

    def _info(self) -> pb.AgentInfo:
        info = self.rt.info
        return pb.AgentInfo(
            name=info.name,
            version=info.version,
            description=info.description,
            author=info.author,
            license=info.license,
            homepage=info.homepage,
        )


def add_to_server(runtime: Runtime, server: grpc.aio.Server) -> CodeAgentService:
    """Register every RPC. Requests are decoded here rather than by grpc, so that bytes that are
    not a valid request answer INVALID_ARGUMENT (grpc's own decoding failure is UNKNOWN)."""
    service = CodeAgentService(runtime)
    descriptor = pb.DESCRIPTOR.services_by_name["CodeAgentService"]
    handlers = {}
    for method in descriptor.methods:
        request_type = getattr(pb, method.input_type.name)
        behavior = decoding(getattr(service, method.name), request_type, method.server_streaming)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(behavior, response_serializer=_serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(descriptor.full_name, handlers),))
    return service


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()
