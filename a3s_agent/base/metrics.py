"""OpenTelemetry metrics: the GenAI conventions' client metrics and the server's own, exported
over OTLP/HTTP, scraped from the HTTP face's Prometheus `/metrics`, or both.

Off unless asked for: OTLP when an endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`; `OTEL_SDK_DISABLED=true`, or `OTEL_METRICS_EXPORTER`
without `otlp`, turn it off again), Prometheus when the server is told to serve `/metrics`. Off
costs nothing: the SDK is not imported and every function here returns at its first line.

Instruments are declared here (`Instrument`) and made once the SDK is on; `add` and `record`
take them by declaration, gauges are callbacks read at each collection (`observe`), possibly on
the exporter's thread: they read counts, never await or lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from . import telemetry
from .prices import ModelPrice

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry

Attributes = Mapping[str, str | int | bool]
Reading = Iterable[tuple[float, Attributes]]
"""A gauge's values now, each with its attributes."""

# The GenAI conventions' advised bucket boundaries (gen_ai.client.* metrics).
TOKEN_BUCKETS = tuple(float(4**n) for n in range(14))  # 1 .. 67,108,864 tokens
DURATION_BUCKETS = tuple(0.01 * 2**n for n in range(14))  # 10 ms .. 81.92 s


@dataclass(frozen=True)
class Instrument:
    name: str
    kind: Literal["counter", "histogram"]
    unit: str
    description: str
    buckets: tuple[float, ...] | None = None


TOKEN_USAGE = Instrument(
    "gen_ai.client.token.usage", "histogram", "{token}",
    "Tokens of each model request, by gen_ai.token.type (input, output)", TOKEN_BUCKETS,
)  # fmt: skip
OPERATION_DURATION = Instrument(
    "gen_ai.client.operation.duration", "histogram", "s",
    "Duration of a model request (chat) or of a generation (invoke_agent)", DURATION_BUCKETS,
)  # fmt: skip
COST = Instrument(
    "a3s.gen_ai.client.cost.usd", "counter", "{USD}",
    "Money the model requests cost at the operator's prices (--model-prices)",
)  # fmt: skip
GENERATIONS = Instrument("a3s.generations", "counter", "{generation}", "Generations ended, by finish reason")
TOOL_DURATION = Instrument(
    "a3s.tool.duration", "histogram", "s",
    "Duration of a tool call the model made, by tool and outcome", DURATION_BUCKETS,
)  # fmt: skip
COMPACTIONS = Instrument(
    "a3s.compactions", "counter", "{compaction}", "Context compactions, by trigger and how they summarized"
)
SANDBOX_DENIALS = Instrument(
    "a3s.sandbox.denials", "counter", "{denial}", "Commands whose failure the OS sandbox caused"
)
STORE_COMMIT = Instrument(
    "a3s.store.commit.duration", "histogram", "s",
    "Duration of a commit of event-log entries (and the state change they carry) to the store",
    DURATION_BUCKETS,
)  # fmt: skip

INSTRUMENTS = (
    TOKEN_USAGE, OPERATION_DURATION, COST, GENERATIONS, TOOL_DURATION, COMPACTIONS, SANDBOX_DENIALS,
    STORE_COMMIT,
)  # fmt: skip

_provider: MeterProvider | None = None
_meter: Meter | None = None
_instruments: dict[str, Any] = {}
_registry: CollectorRegistry | None = None
_prices: Mapping[str, ModelPrice] = {}


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for metrics over OTLP: an endpoint named, the SDK not disabled,
    `OTEL_METRICS_EXPORTER` (default `otlp`) naming otlp."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_METRICS_EXPORTER", "otlp").split(",")}
    if "otlp" not in exporters:
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure(service_version: str, prometheus: bool, prices: Mapping[str, ModelPrice]) -> bool:
    """Start the meter (once) when OTLP export is wanted or `prometheus` (the /metrics route) is;
    whether metrics are on. `prices` turn tokens into money (`spend`)."""
    global _provider, _meter, _registry, _prices
    otlp = wanted()
    if _meter is not None or not (otlp or prometheus):
        return _meter is not None
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    readers: list[MetricReader] = []
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        # Every OTEL_METRIC_EXPORT_INTERVAL (default 60 s), to the endpoint the OTEL_* variables name.
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry

        _registry = CollectorRegistry()  # ours alone: no process-wide collectors of other libraries
        readers.append(PrometheusMetricReader(registry=_registry))
    _provider = MeterProvider(metric_readers=readers, resource=telemetry.resource(service_version))
    _meter = _provider.get_meter("a3s_agent", service_version)
    _prices = prices
    for instrument in INSTRUMENTS:
        if instrument.kind == "counter":
            made: Any = _meter.create_counter(instrument.name, instrument.unit, instrument.description)
        else:
            made = _meter.create_histogram(
                instrument.name,
                instrument.unit,
                instrument.description,
                explicit_bucket_boundaries_advisory=instrument.buckets,
            )
        _instruments[instrument.name] = made
    return True


def enabled() -> bool:
    return _meter is not None


def shutdown() -> None:
    """Export what is left and stop the exporter (the server's stop)."""
    global _provider, _meter, _registry
    if _provider is not None:
        _provider.shutdown()
    _provider = _meter = _registry = None
    _instruments.clear()


def add(instrument: Instrument, amount: float, attributes: Attributes) -> None:
    """Count `amount` on a counter."""
    if _meter is None:
        return
    _instruments[instrument.name].add(amount, attributes)


def record(instrument: Instrument, value: float, attributes: Attributes) -> None:
    """Record a value of a histogram."""
    if _meter is None:
        return
    _instruments[instrument.name].record(value, attributes)


def spend(attributes: Attributes, prompt_tokens: int, completion_tokens: int) -> None:
    """Count the cost of a model request's tokens at the price of its `gen_ai.request.model`
    (nothing for a model the price table lacks)."""
    if _meter is None:
        return
    price = _prices.get(str(attributes.get("gen_ai.request.model", "")))
    if price is not None:
        _instruments[COST.name].add(price.cost(prompt_tokens, completion_tokens), attributes)


def observe(name: str, unit: str, description: str, read: Callable[[], Reading]) -> None:
    """A gauge whose values `read` gives at each collection (the server's state: sessions, queues)."""
    if _meter is None:
        return
    from opentelemetry.metrics import CallbackOptions, Observation

    def callback(_: CallbackOptions) -> Iterable[Observation]:
        try:
            return [Observation(value, dict(attributes)) for value, attributes in read()]
        except RuntimeError:  # the loop changed what it read meanwhile: none this time
            return []

    _meter.create_observable_gauge(name, [callback], unit, description)


def prometheus_text() -> bytes | None:
    """Every metric in Prometheus' text format now; None when /metrics is not served."""
    if _registry is None:
        return None
    from prometheus_client import generate_latest

    return generate_latest(_registry)
