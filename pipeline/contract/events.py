"""Event contract v1: the public wire format of tailguard.

Every lifecycle event is one JSON object. A Kafka message carries either one
event (a JSON object) or a batch (a JSON array of events); see
:mod:`pipeline.contract.codec`.

Field names carry their units (``ts_unix_ns``, ``total_ms``). Durations are
measured on one host's monotonic clock; wall-clock timestamps (``*_unix_ns``)
are the emitting host's clock and are never subtracted across hosts.

Compatibility rules for v1: fields may be added (optional, with defaults);
none may be renamed, retyped or removed. Unknown fields are ignored on read so
that newer producers keep working with older workers.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

CONTRACT_VERSION: Final = 1

LIFECYCLE_TOPIC: Final = "tailguard.lifecycle"
ENGINE_STATS_TOPIC: Final = "tailguard.engine-stats"
DLQ_TOPIC: Final = "tailguard.dlq"
SUMMARIES_TOPIC: Final = "tailguard.summaries"  # internal: workers -> the controller
LEDGER_TOPIC: Final = "tailguard.ledger"  # internal: requests counted, per partition
CONTROL_TOPIC: Final = "tailguard.control"  # compacted, key = scope: signed directives

# Every number is bounded by the ClickHouse column that stores it (sql/0001, 0002), so an
# event the contract accepts is one the store can hold: validation rejects the rest, and
# no schema-valid value can fail an insert (a failed insert would stall its whole batch).
INT64_MAX: Final = 2**63 - 1  # Int64: *_unix_ns
UINT32_MAX: Final = 2**32 - 1  # UInt32: token counts, engine queue lengths
UINT16_MAX: Final = 2**16 - 1  # UInt16: preemptions
# Float64 holds any finite duration, but the record adds and subtracts them (ttft, gateway
# overhead) and the sketch takes their logarithm: 2^53 ms (~285,000 years) keeps every
# derived value finite and every whole millisecond exact.
MAX_DURATION_MS: Final = float(2**53)

NonNegMs = Annotated[float, Field(ge=0.0, le=MAX_DURATION_MS, allow_inf_nan=False)]
NonNegInt = Annotated[int, Field(ge=0, le=UINT32_MAX)]  # UInt32 columns
UnixNs = Annotated[int, Field(gt=0, le=INT64_MAX)]  # Int64 columns
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Priority = Annotated[int, Field(ge=0, le=3)]
# What an emitter records (and the control middleware assumes) for a request that names
# no priority: a middle tier, so untagged traffic is neither gold nor first shed.
DEFAULT_PRIORITY: Final = 2
Outcome = Literal["ok", "error", "client_abort", "timeout", "rejected"]
# A gateway's control mode for one request (producers/enforcement.py; absent: off) and why
# the enforcement refused it (enforce) or would have (shadow). One status per reason:
# 429 + Retry-After, 503 for queue_timeout alone.
ControlMode = Literal["shadow", "enforce"]
# "deadline": the request's own first-token SLO would be missed (issue 52: predicted late).
ControlVerdict = Literal[
    "shed_priority",
    "new_session",
    "rate_limit",
    "admission",
    "queue_timeout",
    "retry_budget",
    "deadline",
]
# Verdicts of an enforced refusal answered before the request went to an engine (every
# one but the queue cut-off, which cancels a call already forwarded): such a
# gateway.completed has no engine.finished to wait for (the join records it at once).
REFUSED_BEFORE_ENGINE: Final = frozenset(
    {"shed_priority", "new_session", "rate_limit", "admission", "retry_budget", "deadline"}
)
FinishReason = Literal["stop", "length", "abort", "error"]


class _Event(BaseModel):
    """Fields every event carries."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    v: Literal[1] = Field(description="Contract version; always 1 for this schema.")
    event_id: str = Field(
        min_length=1, max_length=128, description="Unique per event; a repeat is a duplicate."
    )
    ts_unix_ns: UnixNs = Field(description="Wall clock of the emitting host, ns since epoch.")
    host: str = Field(min_length=1, max_length=256, description="Emitting host (or host/engine).")
    model: str = Field(min_length=1, max_length=256, description="Served model name.")

    @field_validator("v", mode="before")
    @classmethod
    def _v_is_the_integer_1(cls, value: object) -> object:
        # Literal[1] accepts True and 1.0 (equal to 1): the version is the JSON integer 1.
        if type(value) is not int:
            raise ValueError("v must be the integer 1")
        return value


class _RequestEvent(_Event):
    request_id: str = Field(
        min_length=1,
        max_length=256,
        description="Request id shared by gateway and engine (the gateway's X-Request-Id).",
    )


class GatewayReceived(_RequestEvent):
    """The gateway accepted a request (gives in-flight visibility)."""

    kind: Literal["gateway.received"]
    priority: Priority = Field(description="0 = highest (real-time) ... 3 = fallback.")
    tenant: str | None = Field(default=None, max_length=256)
    prompt_tokens: NonNegInt | None = None
    stream: bool = False
    # Added in v1 (optional): which try of a logical request this is (issue 47), read by
    # producers/client_retry.py from the client's own headers.
    client_attempt: int = Field(
        default=0,
        ge=0,
        le=UINT16_MAX,
        description=(
            "The client's retry count for this request (x-stainless-retry-count): 0 = its "
            "first try (or unknown), k = its k-th retry."
        ),
    )
    logical_request_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description=(
            "The id the client gave the logical request, the same on each of its attempts "
            "(Idempotency-Key, else x-client-request-id, else the X-Request-Id it reused); "
            "null: none."
        ),
    )


class GatewayCompleted(_RequestEvent):
    """The gateway finished a request; durations from the gateway's monotonic clock."""

    kind: Literal["gateway.completed"]
    total_ms: NonNegMs = Field(description="Received -> last byte sent (or client gone).")
    ttfb_ms: NonNegMs | None = Field(
        default=None, description="Received -> first byte sent; null when none was sent."
    )
    http_status: int = Field(ge=0, le=599, description="0 = client disconnected.")
    outcome: Outcome
    output_tokens: NonNegInt | None = None
    # Added in v1 (optional): what a gateway with no engine plugin learns at the end.
    prompt_tokens: NonNegInt | None = Field(
        default=None, description="Prompt tokens from the response's usage (gateway-only)."
    )
    slo_ttft_ms: NonNegMs | None = Field(
        default=None, description="The request's own TTFT objective (llm-d x-llm-d-slo-ttft-ms)."
    )
    slo_tpot_ms: NonNegMs | None = Field(
        default=None, description="The request's own TPOT objective (llm-d x-llm-d-slo-tpot-ms)."
    )
    # Added in v1 (optional): what the gateway's enforcement said (issue 48).
    control_mode: ControlMode | None = Field(
        default=None,
        description="The gateway's control mode for this request; null: off (or no control).",
    )
    control_verdict: ControlVerdict | None = Field(
        default=None,
        description=(
            "Why the enforcement refused this request (control_mode enforce: outcome "
            "rejected) or would have (shadow: the request was served as without control); "
            "null: admitted."
        ),
    )


class EngineFinished(_RequestEvent):
    """The engine finished a request; durations from the engine's monotonic clock."""

    kind: Literal["engine.finished"]
    arrival_unix_ns: UnixNs = Field(description="Engine wall clock at arrival.")
    queue_ms: NonNegMs = Field(description="Queued -> scheduled.")
    prefill_ms: NonNegMs = Field(description="Scheduled -> first token.")
    decode_ms: NonNegMs = Field(description="First token -> last token.")
    inference_ms: NonNegMs = Field(description="Scheduled -> last token.")
    e2e_ms: NonNegMs = Field(description="Arrival -> finish.")
    prompt_tokens: NonNegInt
    output_tokens: NonNegInt
    cached_tokens: NonNegInt = 0
    finish_reason: FinishReason
    preemptions: Annotated[int, Field(ge=0, le=UINT16_MAX)] = 0  # UInt16 column
    priority: Priority | None = None
    cold_start_unix_ns: UnixNs | None = Field(
        default=None,
        description=(
            "Set only for a request served while its engine was loading or within its "
            "first seconds after (a cold start): engine wall clock at which that engine "
            "(re)started. Null otherwise. One value per engine start, so (host, value) "
            "names the cold start; contracts may exempt such requests (added in v1)."
        ),
    )


class EngineStats(_Event):
    """Scheduler snapshot of one engine (topic ``tailguard.engine-stats``, key = host)."""

    kind: Literal["engine.stats"]
    request_id: str = Field(
        default="", max_length=256, description="Unused for stats; empty by convention."
    )
    num_running: NonNegInt
    num_waiting: NonNegInt
    kv_cache_usage: Fraction
    prefix_cache_hit_rate: Fraction | None = None
    gpu_memory_used_fraction: Fraction | None = None
    preemptions: Annotated[int, Field(ge=0, le=UINT32_MAX)] | None = Field(
        default=None,
        description=(
            "Requests the engine preempted since its previous engine.stats event (the "
            "plugin: vLLM's IterationStats.num_preempted_reqs summed; vllm-scrape: a "
            "difference of vllm:num_preemptions_total). Null: unknown (the first "
            "snapshot, a counter reset, or an emitter that does not count them). Optional, "
            "added in v1: events without it stay valid."
        ),
    )


LifecycleEvent = GatewayReceived | GatewayCompleted | EngineFinished
Event = Annotated[
    GatewayReceived | GatewayCompleted | EngineFinished | EngineStats,
    Field(discriminator="kind"),
]

EVENT_ADAPTER: Final[TypeAdapter[Event]] = TypeAdapter(Event)
EVENT_KINDS: Final = ("gateway.received", "gateway.completed", "engine.finished", "engine.stats")


def json_schema() -> dict[str, object]:
    """JSON Schema of one v1 event (a message is one event or an array of them)."""
    one = EVENT_ADAPTER.json_schema()
    defs = one.pop("$defs", {})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://tailguard.dev/schema/lifecycle/v1.json",
        "title": "tailguard lifecycle message v1",
        "description": (
            "A Kafka message value: one event object, or a JSON array of event objects."
        ),
        "oneOf": [one, {"type": "array", "items": one}],
        "$defs": defs,
    }
