"""tailguard's latency boundaries under OpenTelemetry's names (GenAI semantic conventions).

One table, :data:`BOUNDARY_NAMES` (reproduced in docs/integrations.md): each boundary of
:data:`pipeline.core.record.BOUNDARIES` -> the GenAI / HTTP metric it is (unit seconds),
or, where the conventions have no metric yet, vLLM's ``gen_ai.latency.*`` span attribute
that measures the same interval, or a ``tailguard.*`` name where neither exists.
Attributes: ``gen_ai.request.model`` (the record's model) and ``gen_ai.operation.name``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Kind = Literal["metric", "span_attribute", "tailguard"]

MODEL_ATTRIBUTE: Final = "gen_ai.request.model"
OPERATION_ATTRIBUTE: Final = "gen_ai.operation.name"
# The record does not carry the route; an OpenAI-compatible server's requests are chats
# or completions, both "generate content" operations: GenAI's name for the common case.
DEFAULT_OPERATION: Final = "chat"


@dataclass(frozen=True, slots=True)
class OtelName:
    boundary: str
    name: str
    kind: Kind
    note: str

    @property
    def prometheus_name(self) -> str:
        """The name a Prometheus exporter gives it: dots -> underscores, ``_seconds``."""
        return self.name.replace(".", "_") + "_seconds"


BOUNDARY_NAMES: Final[dict[str, OtelName]] = {
    o.boundary: o
    for o in (
        OtelName(
            "gateway_total_ms", "http.server.request.duration", "metric",
            "gateway: request received -> last response byte",
        ),
        OtelName(
            "engine_e2e_ms", "gen_ai.server.request.duration", "metric",
            "engine: arrival -> finish",
        ),
        OtelName(
            "ttft_engine_ms", "gen_ai.server.time_to_first_token", "metric",
            "engine: arrival -> first token (queue + prefill)",
        ),
        OtelName(
            "tpot_ms", "gen_ai.server.time_per_output_token", "metric",
            "decode time / (output tokens - 1)",
        ),
        OtelName(
            "queue_ms", "gen_ai.latency.time_in_queue", "span_attribute",
            "vLLM span key: queued -> scheduled",
        ),
        OtelName(
            "prefill_ms", "gen_ai.latency.time_in_model_prefill", "span_attribute",
            "vLLM span key: scheduled -> first token",
        ),
        OtelName(
            "decode_ms", "gen_ai.latency.time_in_model_decode", "span_attribute",
            "vLLM span key: first token -> last token",
        ),
        OtelName(
            "inference_ms", "gen_ai.latency.time_in_model_inference", "span_attribute",
            "vLLM span key: scheduled -> last token",
        ),
        OtelName(
            "gateway_ttfb_ms", "tailguard.gateway.time_to_first_byte", "tailguard",
            "no convention: gateway request received -> first response byte",
        ),
        OtelName(
            "gateway_overhead_ms", "tailguard.gateway.overhead", "tailguard",
            "no convention: gateway total - engine end-to-end",
        ),
    )
}  # fmt: skip


def seconds(ms: float) -> float:
    return ms / 1000.0
