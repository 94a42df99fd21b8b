"""Logical requests (issue 47): what users saw, a request and its retries counted once.

Pure: records in, records and counts out. The one rule that ``tailguard backtest``,
``tailguard report`` and ``tools/dev/backtest_matrix.py`` count "per logical request" by
(the backtest over its joined records, the report over the stored rows of ``requests``).

The rule
--------
* **Which attempts.** A record is one attempt (``RequestRecord``). Its *logical key* is
  its ``logical_request_id`` (the id the client gave the logical request, recorded by
  the gateway from the SDK's headers, ``producers/client_retry.py``), else its
  ``request_id``. So the attempts that name one logical id are one logical request; the
  join's attempts of one reused request id (``RequestRecord.attempt``) are one; a first
  try without a logical id is keyed by its own request id, which is the id its retries
  name when they reused it (the gateway suffixes their request ids). A record with
  neither (no gateway.received: engine-only, or a lost received) is its own request.
* **The final attempt** is the one with the highest ``(client_attempt, ts_unix_ns,
  attempt, request_id)``: the client's retry count first; attempts with equal counts (a
  client that sends no count) by their start, each on its own gateway's clock (an order,
  never a difference: retries are seconds apart, hosts' clocks milliseconds).
* **Outcome.** The logical request's outcome is its final attempt's. It was **never
  served** when that outcome is a failure (``rejected``, ``error``, ``timeout``: what
  :mod:`pipeline.core.slo` counts as failures); a client abort is the client's choice,
  counted with the served ones' latency rules (``client_abort: measure``).
* **Latency the client saw.** Timestamps of two hosts are never subtracted. When every
  attempt went through one gateway instance (same ``gateway_host``, each with its
  ``gateway_received_unix_ns``), the client waited ``wait_ms`` = final attempt's
  received - first attempt's received on that gateway's clock, before the final attempt
  began; the boundaries measured from the gateway's arrival (``gateway_ttfb_ms``,
  ``gateway_total_ms``) are then the final attempt's plus ``wait_ms``
  (``latency = "from_first"``). Otherwise (attempts on different gateways, or a time
  missing) they are the final attempt's own, a lower bound of what the client saw
  (``latency = "final_only"``, counted). Engine boundaries are always the final
  attempt's: they measure the engine's work, not the client's wait.
* **Placement.** The logical request's record starts at its first attempt's
  ``ts_unix_ns`` and ends at its final attempt's ``end_unix_ns``; a surface places it
  (a report's range, a backtest's episode) by the same column it places attempts by.

Every SLO then counts the logical record with :class:`pipeline.core.slo.SLOEvaluator`,
the same classification as an attempt (selection by the final attempt's model, priority,
...): per-logical compliance = good logical requests / counted logical requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOEvaluator
from pipeline.spec.slo import SLOSpec

Latency = Literal["single", "from_first", "final_only"]

# Boundaries measured from the gateway's arrival: what the client waited, shifted by the
# client's wait before its final attempt ("from_first").
CLIENT_BOUNDARIES: Final = ("gateway_ttfb_ms", "gateway_total_ms")
SERVED: Final = frozenset({"ok", "client_abort"})


def logical_key(r: RequestRecord) -> str:
    """The key of the logical request an attempt belongs to (see "Which attempts")."""
    return r.logical_request_id if r.logical_request_id is not None else r.request_id


def _order(r: RequestRecord) -> tuple[int, int, int, str]:
    return (r.client_attempt, r.ts_unix_ns, r.attempt, r.request_id)


@dataclass(frozen=True, slots=True)
class LogicalRequest:
    """One logical request: its attempts (first to final) and the record the client saw."""

    key: str
    attempts: tuple[RequestRecord, ...]
    record: RequestRecord  # the final attempt, as the client saw it (see the rule)
    latency: Latency
    wait_ms: float | None  # the client's wait before its final attempt (from_first)

    @property
    def final(self) -> RequestRecord:
        return self.attempts[-1]

    @property
    def never_served(self) -> bool:
        return self.final.outcome not in SERVED


def logical_request(key: str, attempts: Iterable[RequestRecord]) -> LogicalRequest:
    """The logical request of ``attempts`` (records of one logical key)."""
    chain = tuple(sorted(attempts, key=_order))
    first, final = chain[0], chain[-1]
    if len(chain) == 1:
        return LogicalRequest(key, chain, final, "single", 0.0)
    hosts = {r.gateway_host for r in chain}
    t0, t1 = first.gateway_received_unix_ns, final.gateway_received_unix_ns
    replace = msgspec.structs.replace
    if (
        len(hosts) == 1
        and None not in hosts
        and all(r.gateway_received_unix_ns is not None for r in chain)
        and t0 is not None
        and t1 is not None
    ):
        wait_ms = max(0.0, (t1 - t0) / 1e6)  # one gateway's clock
        shifted = {
            b: (v + wait_ms if (v := getattr(final, b)) is not None else None)
            for b in CLIENT_BOUNDARIES
        }
        rec = replace(final, ts_unix_ns=first.ts_unix_ns, superseded=False, **shifted)
        return LogicalRequest(key, chain, rec, "from_first", wait_ms)
    rec = replace(final, ts_unix_ns=first.ts_unix_ns, superseded=False)
    return LogicalRequest(key, chain, rec, "final_only", None)


def logical_requests(records: Iterable[RequestRecord]) -> list[LogicalRequest]:
    """The logical requests of ``records`` (every attempt of each: see the rule), in the
    order of their first record."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(logical_key(r), []).append(r)
    return [logical_request(k, rs) for k, rs in groups.items()]


def counts(spec: SLOSpec | None, logical: Iterable[LogicalRequest]) -> dict[str, Any]:
    """``{"attempts", "requests", "retried", "never_served", "latency": {"from_first",
    "final_only"}, "slos": {name: {"total", "good", "compliance", ...}}}`` of logical
    requests (``slos``: :meth:`SLOEvaluator.to_json`'s, over their records; empty
    without a spec)."""
    ev = SLOEvaluator(spec) if spec is not None else None
    n = attempts = retried = never = from_first = final_only = 0
    for lr in logical:
        n += 1
        attempts += len(lr.attempts)
        retried += len(lr.attempts) > 1
        never += lr.never_served
        from_first += lr.latency == "from_first"
        final_only += lr.latency == "final_only"
        if ev is not None:
            ev.add(lr.record)
    return {
        "attempts": attempts,
        "requests": n,
        "retried": retried,
        "never_served": never,
        "latency": {"from_first": from_first, "final_only": final_only},
        "slos": ev.to_json()["slos"] if ev is not None else {},
    }
