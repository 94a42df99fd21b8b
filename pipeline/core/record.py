"""The request record: one request measured at every boundary.

Built from whichever of the three lifecycle events arrived. Every boundary is
a duration measured on one host's clock (gateway segments on the gateway's
monotonic clock, engine segments on the engine's); derived values such as
``gateway_overhead_ms`` are differences of *durations*, never of timestamps
taken on different hosts.
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

import msgspec

from pipeline.contract.boundaries import BOUNDARIES as BOUNDARIES  # noqa: PLC0414
from pipeline.contract.boundaries import CTX_BUCKETS as CTX_BUCKETS  # noqa: PLC0414
from pipeline.contract.boundaries import ctx_bucket as ctx_bucket  # noqa: PLC0414
from pipeline.contract.events import ControlMode, ControlVerdict
from pipeline.contract.wire import AnyCompleted, AnyFinished

Source = Literal["joined", "gateway_only", "engine_only"]

_FINISH_TO_OUTCOME: Final = {
    "stop": "ok",
    "length": "ok",
    "abort": "client_abort",
    "error": "error",
}


class ReceivedFields(Protocol):
    """What a record takes from ``gateway.received``: the event itself, or the join's
    compact copy of it (``pipeline.core.join``)."""

    @property
    def ts_unix_ns(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def client_attempt(self) -> int: ...
    @property
    def logical_request_id(self) -> str | None: ...
    @property
    def model(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def tenant(self) -> str | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def stream(self) -> bool: ...


# What a record's events may contradict each other on (each one host's own durations, so
# a contradiction is a bug or a clock glitch at the source, not network time):
FLAGS: Final = {
    "ttfb_gt_total": "gateway first byte after the gateway's last byte",
    "e2e_lt_inference": "engine end-to-end shorter than its own inference time",
    "e2e_lt_queue": "engine end-to-end shorter than its own queue time",
    "negative_gateway_overhead": "gateway total shorter than the engine's end-to-end",
}
_EPS_MS: Final = 1e-6


def record_flags(
    total: float | None, ttfb: float | None, e2e: float | None, inference: float | None,
    queue: float | None,
) -> tuple[str, ...]:  # fmt: skip
    """The contradictions (names of :data:`FLAGS`) among one record's durations."""
    if (total is None or ttfb is None or ttfb <= total + _EPS_MS) and (
        e2e is None
        or (
            (inference is None or e2e + _EPS_MS >= inference)
            and (queue is None or e2e + _EPS_MS >= queue)
            and (total is None or total + _EPS_MS >= e2e)
        )
    ):
        return ()  # the common case, without building a list (each check below fails)
    out = []
    if total is not None and ttfb is not None and ttfb > total + _EPS_MS:
        out.append("ttfb_gt_total")
    if e2e is not None and inference is not None and e2e + _EPS_MS < inference:
        out.append("e2e_lt_inference")
    if e2e is not None and queue is not None and e2e + _EPS_MS < queue:
        out.append("e2e_lt_queue")
    if total is not None and e2e is not None and total + _EPS_MS < e2e:
        out.append("negative_gateway_overhead")
    return tuple(out)


def record_revision(source: Source, has_received: bool) -> int:
    """How much of a request a record holds, as the store's version (higher replaces):
    0 partial, 1 partial with ``gateway.received``, 2 joined, 3 joined with it."""
    return (2 if source == "joined" else 0) + (1 if has_received else 0)


# Keys of one attempt of a request (join state, ledger): the request id for attempt 1,
# ``request_id + ATTEMPT_SEP + n`` for attempt n >= 2.
ATTEMPT_SEP: Final = "\x1f"


def attempt_key(request_id: str, attempt: int) -> str:
    """The key of one attempt of a request in the join's state and in the ledger."""
    return request_id if attempt == 1 else f"{request_id}{ATTEMPT_SEP}{attempt}"


# A record whose terminal events conflicted (``RequestRecord.conflicts``) ranks above the
# same revision without: a late conflict's correction replaces the row it corrects.
CONFLICTED_VERSION: Final = 8


def store_version(revision: int, superseded: bool, conflicted: bool = False) -> int:
    """The store's version of a record (``requests.revision``; the highest replaces):
    twice the revision, plus 1 once a retry superseded it, plus 8 once its terminal events
    conflicted (``pipeline.core.join``; revision <= 3, so the three never mix)."""
    return 2 * revision + (1 if superseded else 0) + (CONFLICTED_VERSION if conflicted else 0)


def revision_of_version(version: int) -> int:
    """The revision in a store version (:func:`store_version`)."""
    return (version % CONFLICTED_VERSION) // 2


class RequestRecord(msgspec.Struct, frozen=True, gc=False):
    """One attempt of a request, measured at every boundary (immutable).

    A msgspec Struct, not a dataclass: the join builds one per request on the hot path,
    and a frozen dataclass's constructor (one ``object.__setattr__`` per field) cost
    ~5 µs a record against ~0.1 µs here (issue 14). ``gc=False``: a record holds only
    scalars, strings and a tuple of strings, so it can take part in no reference cycle.
    Copy with ``msgspec.structs.replace``, convert with ``msgspec.structs.asdict``.
    """

    request_id: str
    source: Source
    revision: int  # see record_revision: 0/1 partial (one side timed out), 2/3 joined
    ts_unix_ns: int  # request start on the first side's own clock (gateway if present)
    end_unix_ns: int  # request end, engine clock if known else gateway: the window time
    model: str
    priority: int | None
    tenant: str | None
    ctx_bucket: str
    outcome: str
    http_status: int | None
    finish_reason: str | None
    stream: bool | None
    gateway_host: str | None
    engine_host: str | None
    gateway_received_unix_ns: int | None
    engine_arrival_unix_ns: int | None
    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    preemptions: int | None
    gateway_total_ms: float | None
    gateway_ttfb_ms: float | None
    engine_e2e_ms: float | None
    queue_ms: float | None
    prefill_ms: float | None
    decode_ms: float | None
    inference_ms: float | None
    ttft_engine_ms: float | None
    tpot_ms: float | None
    gateway_overhead_ms: float | None
    # Contradictions between the events (see FLAGS): the record is kept as reported
    flags: tuple[str, ...] = ()
    # Client retries reusing the request id: 1 for the first attempt (see join.py)
    attempt: int = 1
    # A failed attempt the client retried: SLOs with ``attempts: last`` skip it
    superseded: bool = False
    # The request's own objectives, as the client sent them (llm-d's x-llm-d-slo-*-ms)
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # Served during a cold start of its engine: the engine's (re)start time, engine clock
    # (engine.finished ``cold_start_unix_ns``); contracts may exempt it
    cold_start_unix_ns: int | None = None
    # Terminal events of this attempt that conflicted with the ones kept (same kind,
    # another event id, other content: e.g. two gateway.completed, ok then error 500).
    # The record holds the worse of each kind (see pipeline.core.join, "Conflicts").
    conflicts: int = 0
    # What the gateway's enforcement said (gateway.completed, issue 48): its control mode
    # (None: off, or no control) and why it refused the request (enforce: the outcome is
    # ``rejected``) or would have (shadow: served as without control); None: admitted
    control_mode: ControlMode | None = None
    control_verdict: ControlVerdict | None = None
    # Which try of a logical request this is, as the client said (gateway.received,
    # issue 47): its retry count (0: the first try, or unknown) and the id it gave the
    # logical request (None: none). pipeline/core/logical.py groups attempts by it.
    client_attempt: int = 0
    logical_request_id: str | None = None

    @property
    def version(self) -> int:
        """What the store orders versions of this attempt by (see store_version)."""
        return store_version(self.revision, self.superseded, self.conflicts > 0)

    @property
    def direct_traffic(self) -> bool:
        """Engine saw it, no gateway did: traffic that bypassed the gateways."""
        return self.source == "engine_only"

    def boundary(self, name: str) -> float | None:
        value: float | None = getattr(self, name)
        return value


def build_record(
    request_id: str,
    received: ReceivedFields | None,
    completed: AnyCompleted | None,
    finished: AnyFinished | None,
    *,
    attempt: int = 1,
    retried: bool = False,
    conflicts: int = 0,
) -> RequestRecord:
    """Combine the events of one request (one attempt of it) into its record (pure).
    ``retried``: a later attempt of the request exists (a failed attempt is then
    superseded). ``conflicts``: terminal events set aside as conflicting (the join's)."""
    return record_of(request_id, received, completed, finished, attempt, retried, conflicts)


# What the engine side gives a record (engine.finished, or the gateway's stand-ins when
# no engine reported): in :class:`RequestRecord`'s field order where they sit together.
_EngineSide = tuple[
    int,  # end_unix_ns: the window time
    str | None,  # finish_reason
    str | None,  # engine_host
    int | None,  # engine_arrival_unix_ns
    int | None,  # prompt_tokens
    int | None,  # output_tokens
    int | None,  # cached_tokens
    int | None,  # preemptions
    float | None,  # engine_e2e_ms
    float | None,  # queue_ms
    float | None,  # prefill_ms
    float | None,  # decode_ms
    float | None,  # inference_ms
    float | None,  # ttft_engine_ms
    float | None,  # tpot_ms
    int | None,  # cold_start_unix_ns
]
# What a record takes from where the request started (gateway.received when it is known)
_Origin = tuple[
    str,  # model
    int,  # ts_unix_ns
    int | None,  # priority
    str | None,  # tenant
    bool | None,  # stream
    int | None,  # gateway_received_unix_ns
    int,  # client_attempt
    str | None,  # logical_request_id
]


def _engine_side(finished: AnyFinished) -> _EngineSide:
    """The engine's durations and counts of a record, from ``engine.finished``."""
    # Window time: the engine's clock when the engine side is known, else the gateway's.
    # A request is then placed by one clock whichever gateway served it.
    tpot = (
        finished.decode_ms / (finished.output_tokens - 1) if finished.output_tokens >= 2 else None
    )
    return (
        finished.ts_unix_ns,
        finished.finish_reason,
        finished.host,
        finished.arrival_unix_ns,
        finished.prompt_tokens,
        finished.output_tokens,
        finished.cached_tokens,
        finished.preemptions,
        finished.e2e_ms,
        finished.queue_ms,
        finished.prefill_ms,
        finished.decode_ms,
        finished.inference_ms,
        finished.queue_ms + finished.prefill_ms,
        tpot,
        finished.cold_start_unix_ns,
    )


def _gateway_only_side(
    received: ReceivedFields | None, completed: AnyCompleted, ttfb: float | None
) -> _EngineSide:
    """A record's engine fields when no engine reported: none, but the window time, the
    tokens and (streamed) the time per output token as the gateway saw them."""
    prompt_tokens = received.prompt_tokens if received is not None else None
    output_tokens = completed.output_tokens
    tpot = None
    if received is not None and received.stream and ttfb is not None and (output_tokens or 0) >= 2:
        # Gateway only, streamed: first byte -> last byte over the tokens after the first,
        # both on the gateway's monotonic clock (what the client saw, network included).
        tpot = max(0.0, completed.total_ms - ttfb) / ((output_tokens or 0) - 1)
    return (completed.ts_unix_ns, None, None, None, prompt_tokens, output_tokens, None, None,
            None, None, None, None, None, None, tpot, None)  # fmt: skip


def _origin(
    received: ReceivedFields | None, completed: AnyCompleted | None, finished: AnyFinished | None
) -> _Origin:
    """Where a record's request started: ``gateway.received`` when it is known, else what
    the terminal events say of it (the start on the first side's own clock)."""
    if received is not None:
        return (received.model, received.ts_unix_ns, received.priority, received.tenant,
                received.stream, received.ts_unix_ns, received.client_attempt,
                received.logical_request_id)  # fmt: skip
    if completed is not None:
        start_ns = completed.ts_unix_ns - int(completed.total_ms * 1e6)
        priority = finished.priority if finished is not None else None
        return (completed.model, start_ns, priority, None, None, None, 0, None)
    assert finished is not None
    return (finished.model, finished.arrival_unix_ns, finished.priority, None, None, None, 0,
            None)  # fmt: skip


def record_of(  # noqa: PLR0917  (the hot path: the join calls it once per record)
    request_id: str,
    received: ReceivedFields | None,
    completed: AnyCompleted | None,
    finished: AnyFinished | None,
    attempt: int,
    retried: bool,
    conflicts: int = 0,
) -> RequestRecord:
    """:func:`build_record`, every argument positional (the join's call: keyword
    arguments cost a Python call ~0.1 µs more). Built positionally (field order of
    :class:`RequestRecord`): keyword calls cost ~2 µs a record more."""
    if completed is None and finished is None:
        raise ValueError("a record needs gateway.completed or engine.finished")
    revision = 1 if received is not None else 0
    if completed is not None:
        outcome: str = completed.outcome
        total: float | None = completed.total_ms
        ttfb = completed.ttfb_ms
        http_status: int | None = completed.http_status
        slo_ttft: float | None = completed.slo_ttft_ms
        slo_tpot: float | None = completed.slo_tpot_ms
        control_mode: ControlMode | None = completed.control_mode
        control_verdict: ControlVerdict | None = completed.control_verdict
        gateway_host: str | None = completed.host
    else:
        assert finished is not None
        outcome = _FINISH_TO_OUTCOME[finished.finish_reason]
        total = ttfb = slo_ttft = slo_tpot = None
        http_status = control_mode = control_verdict = None
        gateway_host = received.host if received is not None else None
    source: Source
    if finished is None:
        assert completed is not None
        source = "gateway_only"
        side = _gateway_only_side(received, completed, ttfb)
    elif completed is None:
        source = "engine_only"
        side = _engine_side(finished)
    else:
        source = "joined"
        revision += 2
        side = _engine_side(finished)
    (end_unix_ns, finish_reason, engine_host, arrival, prompt_tokens, output_tokens,
     cached, preemptions, e2e, queue, prefill, decode, inference, ttft, tpot,
     cold_start) = side  # fmt: skip
    if prompt_tokens is None and completed is not None:  # a gateway that read `usage`
        prompt_tokens = completed.prompt_tokens
    (model, ts_unix_ns, priority, tenant, stream, received_ns, client_attempt,
     logical_id) = _origin(received, completed, finished)  # fmt: skip
    overhead = (total - e2e) if total is not None and e2e is not None else None
    return RequestRecord(
        request_id,
        source,
        revision,
        ts_unix_ns,
        end_unix_ns,
        model,
        priority,
        tenant,
        ctx_bucket(prompt_tokens),
        outcome,
        http_status,
        finish_reason,
        stream,
        gateway_host,
        engine_host,
        received_ns,
        arrival,
        prompt_tokens,
        output_tokens,
        cached,
        preemptions,
        total,
        ttfb,
        e2e,
        queue,
        prefill,
        decode,
        inference,
        ttft,
        tpot,
        overhead,
        record_flags(total, ttfb, e2e, inference, queue),
        attempt,
        retried and outcome != "ok",
        slo_ttft,
        slo_tpot,
        cold_start,
        conflicts,
        control_mode,
        control_verdict,
        client_attempt,
        logical_id,
    )
