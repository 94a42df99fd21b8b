"""The LiteLLM proxy integration: lifecycle events and the one enforcement, as a LiteLLM
callback (``CustomLogger``), configured in LiteLLM's own ``config.yaml``::

    litellm_settings:
      callbacks: producers.litellm_hook.tailguard_hook

``tailguard_hook`` is built on first use from the environment (:meth:`TailguardGate.
from_env`: Kafka as every emitter reads it, ``TAILGUARD_*``; the control mode; the
control keys). A module of one's own beside ``config.yaml`` may build it with arguments
instead (``TailguardLiteLLM(gate=TailguardGate.from_env(directives=...))``), which is how
a test injects a directive lookup. Importing this module never imports LiteLLM (the base
install has none): the LiteLLM class is built when ``TailguardLiteLLM`` or
``tailguard_hook`` is first read.

Per request (LiteLLM's hooks, in the order LiteLLM calls them)
--------------------------------------------------------------
* ``async_pre_call_hook`` (after LiteLLM's auth, before the call): ``gateway.received``,
  with the request id (the client's ``X-Request-Id`` when usable, else LiteLLM's call id,
  which the client gets as ``x-litellm-call-id``), the model (the model group LiteLLM
  serves), the priority (:class:`producers.gateway.PriorityRules` on the request's
  headers: ``X-Vllm-Priority``, else the request metadata's ``priority``, else llm-d's
  header, else ``service_tier``, else 2), the tenant (the LiteLLM key's ``team_id``, else
  its ``key_alias``, else its ``user_id``) and ``stream``. The arrival is LiteLLM's own
  stamp (``arrival_time``, taken at the top of its auth), moved onto this host's
  monotonic clock once. Then :class:`producers.enforcement.Enforcement` decides under the
  directive in force for the model; a refusal in ``enforce`` raises a FastAPI
  ``HTTPException(429, headers=...)`` with the enforcement's refusal headers
  (``Retry-After``, ``x-tailguard-level``, and ``x-should-retry: false`` for a retry over
  the retry budget), which LiteLLM's proxy answers with that status and those headers.
  The client's attempt (retry count, logical id) is read from the SDKs' own headers by
  :func:`producers.client_retry.client_attempt`, as every gateway does. An admitted
  request goes upstream with ``X-Request-Id``
  (vLLM adopts it as its request id, so engine events join) and, when the directive asks,
  ``x-tailguard-max-context-tokens`` / ``x-tailguard-fallback-model`` (as the ASGI
  middleware passes them).
* ``async_post_call_streaming_iterator_hook`` (streams): the first chunk is the first
  byte (``ttfb_ms``); the end of the iteration the last; the usage of a chunk that
  carries one gives the tokens; the client leaving mid-stream is ``client_abort``.
* ``async_post_call_success_hook`` (non-streaming): first and last byte at once, tokens
  from the response's ``usage``.
* ``async_post_call_failure_hook``: the status of the exception (our refusal: 429,
  ``rejected``), the rest by :func:`producers.gateway.terminal_status`.

``gateway.completed`` carries ``control_mode`` and ``control_verdict``: in ``enforce``,
the refusal reason (outcome ``rejected``); in ``shadow``, the reason the request would
have been refused (it is served). Events go to :mod:`producers.emit`'s sink, which never
blocks or raises: with Kafka down requests are served as without the hook. Nothing here
fails a request: an error of the hook is counted (``counters["errors"]``) and logged.

Not done here: the queue cut-off (``queue_timeout_ms``) is not enforced (LiteLLM gives a
callback no hold on the upstream call before its first byte); in shadow, a first byte
later than the cut-off is counted as a would-have ``queue_timeout``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from pipeline.contract.control_signal import ALL_SCOPES
from pipeline.contract.events import GatewayCompleted, GatewayReceived
from producers.asgi_control import SLO_TTFT_HEADER, positive_ms
from producers.client_retry import (
    ClientAttempt,
    attempt_request_id,
    client_attempt,
    logical_request_id,
)
from producers.control_keys import keyring_from_environ
from producers.emit import EventSink
from producers.enforcement import (
    PASS_OFF,
    Decision,
    DirectiveLike,
    Enforcement,
    Modes,
    RequestFacts,
)
from producers.gateway import (
    PriorityRules,
    terminal_status,
    usable_request_id,
    usage_tokens,
)
from producers.gateway_queue import Forwarded

log = logging.getLogger(__name__)

ENV_DEFAULT_PRIORITY: Final = "TAILGUARD_DEFAULT_PRIORITY"
ENV_HOST: Final = "TAILGUARD_LITELLM_HOST"  # host in events (default litellm/<hostname>)
ENV_STATS_FILE: Final = "TAILGUARD_LITELLM_STATS_FILE"  # counters as JSON, rewritten on change

REQUEST_ID_HEADER: Final = b"x-request-id"  # as producers.gateway reads and forwards it
SESSION_HEADER: Final = "x-tailguard-session"
MAX_CONTEXT_HEADER: Final = "x-tailguard-max-context-tokens"
FALLBACK_MODEL_HEADER: Final = "x-tailguard-fallback-model"
METADATA_PRIORITY: Final = "priority"
MAX_IN_FLIGHT: Final = 100_000
# wall - monotonic moving more than CLOCK_STEP_NS plus MAX_SLEW of the monotonic time since
# the last arrival: the wall clock stepped (NTP slews it at most 500 ppm; anything faster is
# a step, and a step of a few ms between LiteLLM's stamp and the hook made a non-streamed
# request's first byte later than the client's in a CI run)
CLOCK_STEP_NS: Final = 1_000_000
MAX_SLEW: Final = 500e-6

DirectiveLookup = Callable[[str], DirectiveLike | None]


@dataclass(slots=True)
class Exchange:
    """What the hook learns of one request between its hooks."""

    request_id: str
    model: str
    facts: RequestFacts
    decision: Decision
    t0_ns: int  # arrival, this host's monotonic clock
    first_byte_ns: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cutoff_counted: bool = False
    # counted in the queue this gateway sees until its first byte (producers.gateway_queue)
    forwarded: Forwarded | None = None


def request_headers(data: Mapping[str, Any]) -> dict[str, str]:
    """The client's request headers as LiteLLM keeps them (lower-case names)."""
    psr = data.get("proxy_server_request")
    headers = psr.get("headers") if isinstance(psr, Mapping) else None
    if not isinstance(headers, Mapping):
        meta = data.get("metadata")
        headers = meta.get("headers") if isinstance(meta, Mapping) else None
    if not isinstance(headers, Mapping):
        return {}
    return {str(k).lower(): str(v) for k, v in headers.items()}


def request_metadata(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the client sent as ``metadata`` (LiteLLM keeps a copy as ``requester_metadata``;
    ``litellm_metadata`` on the routes that use that name)."""
    for name in ("metadata", "litellm_metadata"):
        meta = data.get(name)
        if isinstance(meta, Mapping):
            inner = meta.get("requester_metadata")
            return inner if isinstance(inner, Mapping) else meta
    return {}


def request_id_of(data: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> str:
    """The client's ``X-Request-Id`` when usable (a retry's suffixed, as the gateway
    middleware's: :func:`producers.client_retry.attempt_request_id`), else LiteLLM's
    call id."""
    if headers is None:
        headers = request_headers(data)
    adopted = usable_request_id(headers.get(REQUEST_ID_HEADER.decode()))
    if adopted is not None:
        return attempt_request_id(adopted, client_attempt_of(headers))
    call_id = data.get("litellm_call_id")
    return str(call_id or uuid.uuid4().hex)


def client_attempt_of(headers: Mapping[str, str]) -> ClientAttempt:
    """The client's attempt from its request headers (lower-case names, as
    :func:`request_headers` gives them)."""
    return client_attempt(headers.get)


def tenant_of(key: Any) -> str | None:
    """The tenant of a LiteLLM key (``UserAPIKeyAuth``): its team, else its alias, else its
    user; None for the master key without a team."""
    for name in ("team_id", "key_alias", "user_id"):
        value = getattr(key, name, None)
        if isinstance(value, str) and value.strip():
            return value.strip()[:256]
    return None


def resolve_priority(
    rules: PriorityRules, headers: Mapping[str, str], data: Mapping[str, Any]
) -> int:
    """:class:`PriorityRules` on the headers; the request metadata's ``priority`` counts as
    an ``X-Vllm-Priority`` header the client did not send."""
    pairs = [
        (k.encode("latin-1", "replace"), v.encode("latin-1", "replace")) for k, v in headers.items()
    ]
    if rules.vllm_header.decode() not in headers:
        value = request_metadata(data).get(METADATA_PRIORITY)
        if isinstance(value, int | str) and not isinstance(value, bool):
            pairs.append((rules.vllm_header, str(value).encode("latin-1", "replace")))
    return rules.resolve({"headers": pairs}, data)


def status_of(exc: BaseException) -> int:
    """The HTTP status LiteLLM's proxy answers ``exc`` with (500 when it names none)."""
    for name in ("status_code", "code"):
        value = getattr(exc, name, None)
        try:
            status = int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if 100 <= status <= 599:
            return status
    return 500


class TailguardGate:
    """The hook's logic over plain values (no LiteLLM): one instance per proxy process,
    called from its event loop. ``directives(model)``: the directive in force for a model
    (``ControlClient.directive``); None with mode ``off``. ``counters``: requests, events,
    refused, errors, evicted (in flight when :data:`MAX_IN_FLIGHT` more arrived)."""

    def __init__(
        self,
        sink: EventSink,
        *,
        host: str,
        modes: Modes | None = None,
        directives: DirectiveLookup | None = None,
        priority: PriorityRules | None = None,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        wall_ns: Callable[[], int] = time.time_ns,
        stats_file: Path | None = None,
    ) -> None:
        self.sink = sink
        self.host = host
        self.enforcement = Enforcement(modes or Modes("off"))
        self.directives = directives
        self.priority = priority or PriorityRules()
        self._mono = monotonic_ns
        self._wall = wall_ns
        # (wall - monotonic, monotonic) at the last arrival
        self._clock_offset: tuple[int, int] | None = None
        self._inflight: OrderedDict[str, Exchange] = OrderedDict()
        self.counters: dict[str, int] = dict.fromkeys(
            ("requests", "events", "refused", "errors", "evicted"), 0
        )
        self._closers: list[Callable[[], None]] = []
        self._stats = _StatsWriter(stats_file, self.stats) if stats_file is not None else None

    @classmethod
    def from_env(
        cls,
        *,
        directives: DirectiveLookup | None = None,
        env: Mapping[str, str] | None = None,
        sink: EventSink | None = None,
    ) -> TailguardGate:
        """Built as ``tailguard gateway`` is: Kafka from ``TAILGUARD_*`` (:class:`pipeline.
        kafka_settings.EmitterSettings`), the mode from ``TAILGUARD_CONTROL_MODE`` (off |
        shadow | enforce; default off), ``TAILGUARD_CONTROL_ENFORCE_FROM_PRIORITY`` and
        ``TAILGUARD_CONTROL_MODE_SCOPES``; with a mode other than off and no ``directives``
        given, a :class:`producers.control_client.ControlClient` on the control topic with
        the control keys (a missing key fails here, at start-up, never on a request)."""
        from pipeline.kafka_settings import EmitterSettings
        from producers.emit import open_kafka_sink

        e = os.environ if env is None else env
        # the settings every emitter reads (pipeline.kafka_settings), from ``env`` when given
        given = {
            k[len("TAILGUARD_") :].lower(): v
            for k, v in e.items()
            if k.startswith("TAILGUARD_")
            and k[len("TAILGUARD_") :].lower() in EmitterSettings.model_fields
        }
        settings = EmitterSettings(**cast(dict[str, Any], given))  # (values as strings)
        modes = Modes.of_settings(settings)
        closers: list[Callable[[], None]] = []
        if sink is None:
            kafka_sink = open_kafka_sink(settings, service="litellm")
            sink = kafka_sink
            closers.append(lambda: kafka_sink.close(timeout_s=5.0))
        uses_control = modes.mode != "off" or any(m != "off" for _, m in modes.scopes)
        if directives is None and uses_control:
            from producers.control_client import ControlClient

            client = ControlClient.from_settings(settings, keyring_from_environ(e))
            client.start()
            closers.append(client.stop)
            directives = client.directive
        host = e.get(ENV_HOST) or f"litellm/{socket.gethostname()}"
        stats = e.get(ENV_STATS_FILE)
        gate = cls(
            sink,
            host=host,
            modes=modes,
            directives=directives,
            priority=PriorityRules(default=int(e.get(ENV_DEFAULT_PRIORITY, "2"))),
            stats_file=Path(stats) if stats else None,
        )
        gate._closers = closers
        return gate

    # -- the hooks' side
    def arrive(self, data: dict[str, Any], key: Any) -> Exchange:
        """``gateway.received`` and the enforcement's decision for a request LiteLLM is
        about to call (``data``: its request dict; ``key``: its ``UserAPIKeyAuth``)."""
        mono, wall = self._mono(), self._wall()
        t0, ts0 = mono, wall
        # LiteLLM stamps the arrival on the wall clock; it moves onto the monotonic clock
        # only when the wall clock did not step since the last arrival (a VM resumed, an
        # NTP step): a step between LiteLLM's stamp and now would be counted as waiting.
        offset, last = wall - mono, self._clock_offset
        self._clock_offset = (offset, mono)
        steady = last is None or (
            abs(offset - last[0]) <= CLOCK_STEP_NS + MAX_SLEW * (mono - last[1])
        )
        arrival = (data.get("proxy_server_request") or {}).get("arrival_time")
        if steady and isinstance(arrival, int | float) and not isinstance(arrival, bool):
            waited = wall - int(arrival * 1e9)
            if 0 <= waited <= 60 * 10**9:  # LiteLLM's stamp, unless the wall clock moved
                t0, ts0 = mono - waited, wall - waited
        headers = request_headers(data)
        request_id = request_id_of(data, headers)
        client = client_attempt_of(headers)
        adopted = usable_request_id(headers.get(REQUEST_ID_HEADER.decode()))
        call_id = str(data.get("litellm_call_id") or request_id)
        model = data.get("model")
        model = model.strip()[:256] if isinstance(model, str) and model.strip() else "unknown"
        tenant = tenant_of(key)
        facts = RequestFacts(
            model=model,
            priority=resolve_priority(self.priority, headers, data),
            new_session=SESSION_HEADER not in headers,
            # the attempt's id, as the middleware's request key (a retry's is suffixed)
            request_key=request_id if adopted is not None else None,
            tenant=tenant,
            attempt=client.attempt,
            logical_id=client.logical_id,
            slo_ttft_ms=positive_ms(headers.get(SLO_TTFT_HEADER.decode())),
        )
        self.counters["requests"] += 1
        self._emit(
            GatewayReceived(
                v=1,
                kind="gateway.received",
                event_id=uuid.uuid4().hex,
                ts_unix_ns=ts0,
                host=self.host,
                model=model,
                request_id=request_id,
                priority=facts.priority,
                tenant=tenant,
                stream=data.get("stream") is True,
                client_attempt=client.attempt,
                logical_request_id=logical_request_id(client, adopted),
            )
        )
        decision = PASS_OFF
        if self.directives is not None and (
            self.enforcement.modes.of(model, facts.priority) != "off"  # off: never read
        ):
            try:
                directive = self.directives(model or ALL_SCOPES)
                decision = self.enforcement.decide(directive, facts, t0 / 1e6)
            except Exception:
                self.counters["errors"] += 1
                log.exception("litellm hook: enforcement failed; the request passes")
        if decision.refused:
            self.counters["refused"] += 1
        x = Exchange(request_id, model, facts, decision, t0)
        if decision.mode != "off" and not decision.refused:
            x.forwarded = self.enforcement.queue.forwarded(model, facts.slo_ttft_ms, t0 / 1e6)
        self._inflight[call_id] = x
        while len(self._inflight) > MAX_IN_FLIGHT:
            _call, gone = self._inflight.popitem(last=False)
            self.enforcement.queue.ended(gone.forwarded)
            self.counters["evicted"] += 1
        if self._stats is not None:
            self._stats.changed()
        return x

    def get(self, call_id: object) -> Exchange | None:
        return self._inflight.get(str(call_id)) if call_id is not None else None

    def chunk(self, call_id: object, usage: object = None) -> None:
        """A streamed chunk passed (the first: the first byte); ``usage`` its usage, if any."""
        x = self.get(call_id)
        if x is None:
            return
        if x.first_byte_ns is None:
            self._first_byte(x, self._mono())
        if usage is not None:
            self._usage(x, usage)

    def _first_byte(self, x: Exchange, now_ns: int) -> None:
        """The request's first byte went out at ``now_ns``: its queue cut-off is judged,
        it leaves the queue this gateway sees, its first-token prediction is timed."""
        x.first_byte_ns = now_ns
        self._check_cutoff(x)
        queue = self.enforcement.queue
        queue.first_byte(x.forwarded, now_ns / 1e6)
        predicted_ms = x.decision.verdict.predicted_ttft_ms
        queue.observe_ttft(predicted_ms, (now_ns - x.t0_ns) / 1e6)
        if predicted_ms is not None and self._stats is not None:
            self._stats.changed()  # its error is in stats()

    def finish(
        self,
        call_id: object,
        status: int | None,
        *,
        usage: object = None,
        disconnected: bool = False,
        failed: bool = False,
        at_once: bool = False,
    ) -> None:
        """``gateway.completed`` (once per request: a later call for it does nothing).
        ``at_once``: the whole body went out now (a JSON answer, an error)."""
        x = self._inflight.pop(str(call_id), None) if call_id is not None else None
        if x is None:
            return
        end = self._mono()
        if at_once and x.first_byte_ns is None:
            self._first_byte(x, end)
        self.enforcement.queue.ended(x.forwarded)  # without a first byte
        if usage is not None:
            self._usage(x, usage)
        d = x.decision
        rejected = d.refused and status == d.verdict.status
        code, outcome = terminal_status(
            status, disconnected=disconnected, done=not disconnected, failed=failed,
            rejected=rejected,
        )  # fmt: skip
        ok = code and code < 400
        ttfb = None if x.first_byte_ns is None else max(0.0, (x.first_byte_ns - x.t0_ns) / 1e6)
        verdict = d.verdict.reason if d.mode in ("shadow", "enforce") else None
        if verdict is None and x.cutoff_counted:
            verdict = "queue_timeout"
        self._emit(
            GatewayCompleted(
                v=1,
                kind="gateway.completed",
                event_id=uuid.uuid4().hex,
                ts_unix_ns=self._wall(),
                host=self.host,
                model=x.model,
                request_id=x.request_id,
                total_ms=max(0.0, (end - x.t0_ns) / 1e6),
                ttfb_ms=ttfb,
                http_status=code,
                outcome=outcome,
                prompt_tokens=x.prompt_tokens if ok else None,
                output_tokens=x.output_tokens if ok else None,
                control_mode=d.mode if d.mode != "off" else None,
                control_verdict=verdict,
            )
        )
        if self._stats is not None:
            self._stats.changed()

    def upstream_headers(self, x: Exchange) -> dict[str, str]:
        """Headers for the upstream call: the request id, and what the directive asks to
        pass on (enforce only: :attr:`Decision.act`)."""
        out = {REQUEST_ID_HEADER.decode(): x.request_id}
        act = x.decision.act
        if act.cap_context_tokens is not None:
            out[MAX_CONTEXT_HEADER] = str(act.cap_context_tokens)
        if act.fallback_model is not None:
            out[FALLBACK_MODEL_HEADER] = act.fallback_model
        return out

    def stats(self) -> dict[str, Any]:
        """The enforcement's counts and the hook's (what ``TAILGUARD_LITELLM_STATS_FILE``
        holds): ``refusals`` rows ``[mode, model, priority, reason, n]``;
        ``ttft_prediction_error`` the P50/P90 of predicted - actual first byte over the
        last admitted requests with a first-token prediction (issue 52; the reference
        proxy's ``tailguard_gateway_ttft_prediction_error_ms``)."""
        sink_counters = getattr(self.sink, "counters", None)
        return {
            "refusals": [[*k, n] for k, n in sorted(self.enforcement.refusals.items())],
            "applied": dict(self.enforcement.applied),
            "ttft_prediction_error": self.enforcement.queue.prediction_error(),
            "counters": dict(self.counters),
            "sink": dict(vars(sink_counters)) if sink_counters is not None else {},
        }

    def close(self) -> None:
        if self._stats is not None:
            self._stats.close()
        for close in reversed(self._closers):
            try:
                close()
            except Exception:
                log.exception("litellm hook: closing")
        self._closers.clear()

    # -- helpers
    def _check_cutoff(self, x: Exchange) -> None:
        """Shadow: a first byte later than the cut-off of the request's priority is a
        would-have ``queue_timeout`` (enforce: not enforced by this hook, see the docs)."""
        d = x.decision
        cutoff = d.verdict.queue_timeout_ms
        if d.mode != "shadow" or cutoff is None or x.first_byte_ns is None:
            return
        if (x.first_byte_ns - x.t0_ns) / 1e6 > cutoff:
            x.cutoff_counted = True
            self.enforcement.count_cutoff(d, x.facts)
            if self._stats is not None:
                self._stats.changed()

    def _usage(self, x: Exchange, usage: object) -> None:
        doc = usage if isinstance(usage, Mapping) else _plain(usage)
        found = usage_tokens({"usage": doc})
        if found is not None:
            x.prompt_tokens, x.output_tokens = found

    def _emit(self, event: GatewayReceived | GatewayCompleted) -> None:
        self.sink.emit(event)
        self.counters["events"] += 1


def _plain(usage: object) -> dict[str, Any]:
    return {
        name: getattr(usage, name, None)
        for name in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")
    }


class _StatsWriter:
    """Rewrites a JSON file with ``snapshot()`` at most every ``period_s`` after a change
    (a daemon thread; atomic rename), and once at close."""

    def __init__(
        self, path: Path, snapshot: Callable[[], dict[str, Any]], period_s: float = 0.2
    ) -> None:
        self.path = path
        self._snapshot = snapshot
        self._period = period_s
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="tailguard-litellm-stats", daemon=True
        )
        self._thread.start()

    def changed(self) -> None:
        self._dirty.set()

    def _write(self) -> None:
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self._snapshot()))
        tmp.replace(self.path)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._dirty.wait(self._period) and not self._stop.is_set():
                self._dirty.clear()
                try:
                    self._write()
                except Exception:
                    log.exception("litellm hook: writing %s", self.path)
                self._stop.wait(self._period)

    def close(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._thread.join(5.0)
        try:
            self._write()
        except Exception:
            log.exception("litellm hook: writing %s", self.path)


def _logger_class() -> type:
    """``TailguardLiteLLM``: a LiteLLM ``CustomLogger`` over a :class:`TailguardGate`
    (built here so that importing this module needs no LiteLLM)."""
    import asyncio

    from fastapi import HTTPException
    from litellm.integrations.custom_logger import CustomLogger

    class TailguardLiteLLM(CustomLogger):  # type: ignore[misc]  # untyped base
        """See the module docstring. ``gate`` None: :meth:`TailguardGate.from_env`."""

        def __init__(self, gate: TailguardGate | None = None, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.gate = gate if gate is not None else TailguardGate.from_env()
            atexit.register(self.gate.close)

        async def async_pre_call_hook(
            self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
        ) -> dict[str, Any]:
            try:
                x = self.gate.arrive(data, user_api_key_dict)
            except Exception:
                self.gate.counters["errors"] += 1
                log.exception("litellm hook: could not record the request; it passes")
                return data
            verdict = x.decision.act
            if verdict.reason is not None:
                raise HTTPException(
                    status_code=verdict.status,
                    detail={
                        "error": "overloaded",
                        "reason": verdict.reason,
                        "level": x.decision.level,
                        "retry_after_s": verdict.retry_after_s,
                    },
                    headers=dict(verdict.refusal_headers(x.decision.level)),
                )
            try:
                extra = data.get("extra_headers")
                data["extra_headers"] = {
                    **(extra if isinstance(extra, dict) else {}),
                    **self.gate.upstream_headers(x),
                }
            except Exception:
                self.gate.counters["errors"] += 1
                log.exception("litellm hook: could not add the upstream headers")
            return data

        async def async_post_call_response_headers_hook(
            self,
            data: dict[str, Any],
            user_api_key_dict: Any,
            response: Any,
            request_headers: dict[str, str] | None = None,
            litellm_call_info: dict[str, Any] | None = None,
        ) -> dict[str, str] | None:
            try:
                return {REQUEST_ID_HEADER.decode(): request_id_of(data)}
            except Exception:
                self.gate.counters["errors"] += 1
                return None

        async def async_post_call_streaming_iterator_hook(
            self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
        ) -> Any:
            call_id = request_data.get("litellm_call_id")
            gate = self.gate
            try:
                async for item in response:
                    try:
                        gate.chunk(call_id, getattr(item, "usage", None))
                    except Exception:
                        gate.counters["errors"] += 1
                        log.exception("litellm hook: chunk")
                    yield item
            except (GeneratorExit, asyncio.CancelledError):
                self._finish(call_id, 200, disconnected=True)
                raise
            except Exception:
                self._finish(call_id, 200, failed=True)
                raise
            self._finish(call_id, 200)

        async def async_post_call_success_hook(
            self, data: dict[str, Any], user_api_key_dict: Any, response: Any
        ) -> Any:
            self._finish(
                data.get("litellm_call_id"), 200, usage=getattr(response, "usage", None),
                at_once=True,
            )  # fmt: skip
            return None

        async def async_post_call_failure_hook(
            self,
            request_data: dict[str, Any],
            original_exception: Exception,
            user_api_key_dict: Any,
            traceback_str: str | None = None,
        ) -> Any:
            self._finish(
                request_data.get("litellm_call_id"), status_of(original_exception), at_once=True
            )
            return None

        def _finish(self, call_id: object, status: int, **kwargs: Any) -> None:
            try:
                self.gate.finish(call_id, status, **kwargs)
            except Exception:
                self.gate.counters["errors"] += 1
                log.exception("litellm hook: could not record the end of a request")

    return TailguardLiteLLM


def __getattr__(name: str) -> Any:
    """``TailguardLiteLLM`` (the class) and ``tailguard_hook`` (the instance LiteLLM's
    ``callbacks:`` names, from the environment), built on first read."""
    if name == "TailguardLiteLLM":
        cls = globals()[name] = _logger_class()
        return cls
    if name == "tailguard_hook":
        hook = globals()[name] = __getattr__("TailguardLiteLLM")()
        return hook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
