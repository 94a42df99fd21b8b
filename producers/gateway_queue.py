"""The queue one gateway sees: what it forwarded that still waits for a first byte
(issue 52, deadline-aware refusal).

A directive's first-token prediction (``ttft_queue_ms``) is the engines' queue as the
controller read it, ``budget_lag_ms`` and a loop behind: in an overload the queue a
request meets forms in the seconds after that reading (on the shared trace the
prediction's P90 error was 89-338 ms, docs/admission.md). A gateway sees its own part of
that queue now. For each scope (a model) it counts the requests it forwarded that carry
their own first-token SLO and have had no first byte yet, ``L``, and the first bytes of
such requests over the last :data:`WINDOW_MS` (or since its first forward, if younger),
``λ``. Engines that serve in
arrival order serve this gateway's requests as a sample of their queue, so Little's law
gives the wait of a request forwarded now, ``W = L / λ`` (:meth:`GatewayQueue.wait_ms`).

* Only requests that carry their own first-token SLO are counted: their first byte is
  when they left the queue (they are streams; ``x-llm-d-slo-ttft-ms`` is a streaming
  objective). A non-streaming request's first byte is its whole answer, so counting it
  would count its decoding as queue (measured: the prediction's P90 error 0.7-0.8 s
  instead of ~10 ms).
* Fewer than :data:`MIN_FIRST_BYTES` first bytes in the window: no estimate (``None``),
  the directive's prediction stands.
* The gateway reports each forwarded request's first byte (:meth:`first_byte`) or its
  end without one (:meth:`ended`): whichever comes first counts, the other is ignored.
* At most :data:`MAX_MODELS` models are kept (a request names its model); the oldest
  is forgotten first, and what its requests report then is ignored.

Pure and clock-free, as :mod:`producers.enforcement` (which owns one per gateway
instance, ``Enforcement.queue``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "MAX_MODELS",
    "MIN_FIRST_BYTES",
    "PREDICTION_ERRORS_KEPT",
    "WINDOW_MS",
    "Forwarded",
    "GatewayQueue",
    "error_percentiles",
]

WINDOW_MS: Final = 10_000.0  # the first bytes that give the queue's service rate
MIN_FIRST_BYTES: Final = 5  # fewer in the window: no estimate
ANY_MODEL: Final = "*"  # requests whose model the gateway does not know
# models kept at most (a model is a request's to name): the oldest is forgotten first
MAX_MODELS: Final = 1_024
PREDICTION_ERRORS_KEPT: Final = 10_000  # the last predicted - actual first-token errors


def error_percentiles(errors_ms: Iterable[float]) -> dict[str, float | int | None]:
    """``{"n", "p50_ms", "p90_ms"}`` of first-token prediction errors (predicted -
    actual; None while there is none)."""
    xs = sorted(errors_ms)
    if not xs:
        return {"n": 0, "p50_ms": None, "p90_ms": None}
    return {
        "n": len(xs),
        "p50_ms": xs[min(len(xs) - 1, int(0.5 * len(xs)))],
        "p90_ms": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
    }


@dataclass(slots=True, eq=False)
class Forwarded:
    """One forwarded request, until its first byte or its end."""

    scope: str
    waiting: bool = True


@dataclass(slots=True)
class _Scope:
    since_ms: float  # the first forward: a younger window is shorter
    waiting: int = 0
    first_bytes_ms: deque[float] = field(default_factory=deque)

    def prune(self, now_ms: float) -> None:
        seen = self.first_bytes_ms
        while seen and seen[0] < now_ms - WINDOW_MS:
            seen.popleft()


@dataclass(slots=True)
class GatewayQueue:
    """Per scope: forwarded requests with their own first-token SLO and no first byte
    yet, and their first bytes over the last :data:`WINDOW_MS` (module docstring)."""

    _scopes: dict[str, _Scope] = field(default_factory=dict)
    # predicted - actual first-token time (ms) of admitted requests, the last ones
    _ttft_errors: deque[float] = field(default_factory=lambda: deque(maxlen=PREDICTION_ERRORS_KEPT))

    def forwarded(
        self, model: str | None, slo_ttft_ms: float | None, now_ms: float
    ) -> Forwarded | None:
        """A request forwarded to ``model``'s engines (None: unknown) at ``now_ms``;
        ``None`` (nothing to report) when it carries no first-token SLO of its own."""
        if slo_ttft_ms is None:
            return None
        scope = model or ANY_MODEL
        s = self._scopes.get(scope)
        if s is None:
            if len(self._scopes) >= MAX_MODELS:
                del self._scopes[next(iter(self._scopes))]
            s = self._scopes[scope] = _Scope(now_ms)
        s.waiting += 1
        return Forwarded(scope)

    def first_byte(self, f: Forwarded | None, now_ms: float) -> None:
        """Its first byte reached the gateway at ``now_ms``."""
        if f is None or not f.waiting:
            return
        f.waiting = False
        s = self._scopes.get(f.scope)
        if s is None:  # its model was forgotten meanwhile
            return
        s.waiting -= 1
        s.prune(now_ms)
        s.first_bytes_ms.append(now_ms)

    def ended(self, f: Forwarded | None) -> None:
        """It ended without a first byte (cut off, given up, failed): it waits no more."""
        if f is None or not f.waiting:
            return
        f.waiting = False
        s = self._scopes.get(f.scope)
        if s is not None:
            s.waiting -= 1

    def wait_ms(self, model: str | None, now_ms: float) -> float | None:
        """The queue wait of a request forwarded to ``model`` now, ``L / λ``; ``None``
        with fewer than :data:`MIN_FIRST_BYTES` first bytes in the window."""
        s = self._scopes.get(model or ANY_MODEL)
        if s is None:
            return None
        s.prune(now_ms)
        n = len(s.first_bytes_ms)
        if n < MIN_FIRST_BYTES:
            return None
        return s.waiting * min(WINDOW_MS, now_ms - s.since_ms) / n

    def observe_ttft(self, predicted_ms: float | None, actual_ms: float | None) -> None:
        """The gateway saw the first byte of a request admitted with a prediction of
        ``predicted_ms`` (its verdict's) after ``actual_ms`` (None: never): the error is
        kept."""
        if predicted_ms is not None and actual_ms is not None:
            self._ttft_errors.append(predicted_ms - actual_ms)

    @property
    def ttft_errors_ms(self) -> tuple[float, ...]:
        """Predicted - actual first-token time (ms) of the last admitted requests with a
        prediction."""
        return tuple(self._ttft_errors)

    def prediction_error(self) -> dict[str, float | int | None]:
        """:func:`error_percentiles` of :attr:`ttft_errors_ms`."""
        return error_percentiles(self._ttft_errors)
