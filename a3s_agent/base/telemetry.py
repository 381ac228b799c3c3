"""OpenTelemetry traces in the GenAI semantic conventions, for the faces, the loop and the providers.

Off unless an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`
turn it off again). Off costs nothing: the SDK is not imported, no tracer provider nor exporter
thread exists, and every function here returns at its first line. On, `configure` builds a tracer
provider that the standard `OTEL_*` variables configure (service name, resource, sampler, the
exporter's endpoint, headers and timeouts) and exports over OTLP/HTTP (protobuf) in batches.

A span started here is made current only in code that runs to its end in one task (`span`, a
server's request); a generation's spans are passed explicitly (`start`, `end`), and the tasks a
span's work runs in are started in `context_of` it.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, SpanKind, Tracer

Kind = Literal["server", "client", "internal"]
Attributes = Mapping[str, str | int | bool | float | list[str]]

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_content = False
CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI conventions' opt-in to recording content (prompts, replies, tool arguments and results)."""


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint named, the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure(service_version: str) -> bool:
    """Start exporting traces when the environment asks for them (once); whether it does."""
    global _tracer, _provider, _content
    if _tracer is not None or not wanted():
        return _tracer is not None
    _content = os.environ.get(CONTENT_VARIABLE, "").strip().lower() == "true"
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # The sampler is OTEL_TRACES_SAMPLER's (and _ARG's), the SDK's parentbased_always_on by default.
    _provider = TracerProvider(resource=resource(service_version))
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _tracer = _provider.get_tracer("a3s_agent", service_version)
    return True


def resource(service_version: str) -> Resource:
    """The service's resource: the operator's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    first, ours filling what they leave (traces' and metrics' alike)."""
    from opentelemetry.sdk.resources import Resource

    detected = Resource.create()
    ours: dict[str, str] = {}
    if str(detected.attributes.get("service.name", "")).startswith("unknown_service"):
        ours["service.name"] = "a3s-agent"
    if "service.version" not in detected.attributes:
        ours["service.version"] = service_version
    return detected.merge(Resource(ours))


def enabled() -> bool:
    return _tracer is not None


def content_recorded() -> bool:
    """Whether spans record content: tracing on, and the operator opted in (CONTENT_VARIABLE)."""
    return _content and _tracer is not None


def shutdown() -> None:
    """Export what is left and stop the exporter (the server's stop)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _kind(kind: Kind) -> SpanKind:
    from opentelemetry.trace import SpanKind

    return {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}[kind]


def start(
    name: str, attributes: Attributes, kind: Kind = "internal", parent: Span | None = None
) -> Span | None:
    """A span under `parent` (else under the current span), not made current; None when off."""
    if _tracer is None:
        return None
    from opentelemetry.trace import set_span_in_context

    context = set_span_in_context(parent) if parent is not None else None
    return _tracer.start_span(name, context=context, kind=_kind(kind), attributes=attributes)


def end(span: Span | None, attributes: Attributes | None = None, error: str | None = None) -> None:
    """End `span` with these attributes; `error` (the failure's type, e.g. its class) marks it failed."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    if attributes:
        span.set_attributes(attributes)
    if error:
        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR))
    span.end()


@contextmanager
def span(
    name: str, attributes: Attributes, kind: Kind = "internal", carrier: Mapping[str, str] | None = None
) -> Iterator[Span | None]:
    """A span made current while the block runs (only in code that does not yield to others
    between; a server's request, a tool call's task); `carrier`'s W3C `traceparent` (and
    `tracestate`, `baggage`), when given, is its parent. An exception ending the block marks it failed."""
    if _tracer is None:
        yield None
        return
    from opentelemetry import propagate

    context = propagate.extract(carrier) if carrier is not None else None
    with _tracer.start_as_current_span(
        name, context=context, kind=_kind(kind), attributes=attributes
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_attribute("error.type", type(exc).__qualname__)
            raise


def note(attributes: Attributes) -> None:
    """Add attributes to the current span (a tool call's decisions, made deep in its task)."""
    if _tracer is None:
        return
    from opentelemetry.trace import get_current_span

    get_current_span().set_attributes(attributes)


def current_ids() -> tuple[str, str] | None:
    """The current span's trace and span ids, in hex as W3C writes them (a log line's); None when
    off or outside any span."""
    if _tracer is None:
        return None
    from opentelemetry.trace import get_current_span

    context = get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def current_traceparent() -> str:
    """The W3C traceparent of the current span, to keep with work another process may finish
    (a run's lease); "" when off or outside any span."""
    if _tracer is None:
        return ""
    from opentelemetry.trace import get_current_span

    return headers(get_current_span()).get("traceparent", "")


def context_of(parent: Span | None) -> contextvars.Context | None:
    """A copy of the current context with `parent` current, for a task doing its work
    (`asyncio.create_task(..., context=...)`); None when there is no span."""
    if parent is None:
        return None
    from opentelemetry.context import attach
    from opentelemetry.trace import set_span_in_context

    context = contextvars.copy_context()
    context.run(attach, set_span_in_context(parent))
    return context


def headers(span: Span | None) -> dict[str, str]:
    """The W3C trace context headers (`traceparent`, `tracestate`) an outgoing request made for
    `span` carries ({} when off). Only the span's: a caller's baggage is not passed on to the
    model's server."""
    if span is None:
        return {}
    from opentelemetry import propagate
    from opentelemetry.context import Context
    from opentelemetry.trace import set_span_in_context

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=set_span_in_context(span, Context()))
    return carrier
