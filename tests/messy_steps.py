"""Messy lifecycle traffic as processor calls, for the tests that run two processors side
by side on it and compare every output call by call (the fast path against its
reference).

One request (:data:`REQUEST`): gap after the previous one (ms), engine time (ms), hosts
(0-2), the fate of each of its three events (0 as sent, 1 lost, 2 twice, 3 late: sent
``late_ms`` after it was stamped, 4 stamped far ahead: a wrong clock), how its first
attempt ends (ok, a 502, a client abort) and whether the client retries it (a second
attempt under the same request id, which ends well).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from hypothesis import strategies as st

from pipeline.contract.codec import encode_event
from pipeline.core.eventtime import ClockConfig
from pipeline.core.join import JoinConfig
from pipeline.core.processor import Output, StreamProcessor
from pipeline.core.windows import ClosedWindow, WindowConfig
from tests.factories import completed, finished, received

REQUEST = st.tuples(
    st.integers(0, 400),
    st.integers(20, 3_000),
    st.integers(0, 2),
    st.tuples(*[st.sampled_from([0, 0, 0, 0, 1, 2, 3, 4])] * 3),
    st.sampled_from(["ok", "ok", "error", "abort"]),
    st.booleans(),
)

# The draws both comparisons start with: the requests, then how the traffic reaches the
# processors and how long the join waits.
TRAFFIC = (
    st.lists(REQUEST, min_size=1, max_size=80),
    st.sampled_from([0, 2_000, 20_000]),  # late_ms
    st.integers(1, 6),  # messages per process call
    st.sampled_from([None, 0, 200]),  # wall time per call (None: a replay)
    st.sampled_from([200, 1_000, 15_000]),  # join timeout
)
QUORUM = st.sampled_from([1, 3, 5])  # the event-time clock's quorum


def configs(
    timeout_ms: int, window: tuple[int, int], quorum: int, max_pending: int | None = None
) -> tuple[JoinConfig, WindowConfig, ClockConfig]:
    """The processors' configs for a draw: the join's TTLs scale with its timeout."""
    join = JoinConfig(timeout_ms=timeout_ms, inflight_ttl_ms=4 * timeout_ms,
                      resolved_ttl_ms=3 * timeout_ms)  # fmt: skip
    if max_pending is not None:
        join = dataclasses.replace(join, max_pending=max_pending)
    return (
        join,
        WindowConfig(size_ms=window[0], grace_ms=window[1]),
        ClockConfig(max_ahead_ms=60_000, quorum=quorum, host_idle_ms=5_000, hold_events=20),
    )


_ENDS = {"ok": (200, "ok"), "error": (502, "error"), "abort": (0, "client_abort")}


def _attempt(rid: str, n: int, t: int, e2e: int, host: int, *, end: str) -> list[Any]:
    """(event, host) of one attempt starting at ``t``."""
    done = t + e2e + 5
    status, outcome = _ENDS[end]
    return [
        (received(rid, t, eid=f"{rid}:r{n}"), f"gw-{host}"),
        (finished(rid, done - 1, decode_ms=e2e - 18.0, eid=f"{rid}:f{n}"), f"m-{host}"),
        (
            completed(rid, done, total_ms=e2e + 5.0, http_status=status, outcome=outcome,
                      eid=f"{rid}:c{n}"),
            f"gw-{(host + 1) % 3}",
        ),
    ]  # fmt: skip


def traffic(
    requests: list[Any], late_ms: int, skew_ms: tuple[int, int, int] = (0, 0, 0)
) -> list[tuple[int, dict[str, Any]]]:
    """(send time ms, event dict) in send order; host ``gw-i`` stamps ``skew_ms[i]`` off."""
    out: list[tuple[int, int, dict[str, Any]]] = []
    t = 0
    for i, (gap, e2e, host, fates, end, retry) in enumerate(requests):
        t += gap
        rid = f"r{i}"
        events = _attempt(rid, 1, t, e2e, host, end=end)
        if retry and end != "ok":
            events += _attempt(rid, 2, t + e2e + 50, e2e, (host + 1) % 3, end="ok")
        for k, (ev, h) in enumerate(events):
            d = orjson.loads(encode_event(ev))
            d["host"] = h
            sent = d["ts_unix_ns"] // 1_000_000
            if h.startswith("gw-"):
                d["ts_unix_ns"] += skew_ms[int(h[3:])] * 1_000_000
            fate = fates[k % 3]
            if fate == 1:
                continue
            if fate == 3:
                sent += late_ms
            if fate == 4:
                d["ts_unix_ns"] += 600_000 * 1_000_000
                sent += 1
            out.append((sent, len(out), d))
            if fate == 2:
                out.append((sent + 50, len(out), d))
    out.sort(key=lambda x: (x[0], x[1]))
    return [(sent, d) for sent, _, d in out]


def steps_of(
    sent: list[tuple[int, dict[str, Any]]], per_call: int, wall_step: int | None, rnd: Any
) -> list[Any]:
    """The traffic as processor calls: ``("process", [(partition, offset, body)], wall_ms,
    lagging)`` of 1-4 events per message and ``per_call`` messages per call, and idle
    ``("tick", None, wall_ms, lagging)`` between them; wall time None: a replay."""
    steps: list[Any] = []
    wall = 1_000_000
    i = 0
    while i < len(sent):
        batch = []
        for _ in range(per_call):
            chunk = sent[i : i + rnd.randint(1, 4)]
            if not chunk:
                break
            offset = i
            i += len(chunk)
            body = orjson.dumps([d for _, d in chunk] if len(chunk) > 1 else chunk[0][1])
            batch.append((rnd.randint(0, 1), offset, body))
        if not batch:
            break
        if wall_step is not None:  # wall time follows the traffic, plus the call's work
            wall = max(wall, 1_000_000 + sent[i - 1][0]) + wall_step
        lagging = frozenset({0}) if rnd.random() < 0.2 else frozenset()
        steps.append(("process", batch, None if wall_step is None else wall, lagging))
        if wall_step is not None and rnd.random() < 0.2:
            wall += rnd.choice([100, 1_000, 20_000])
            steps.append(("tick", None, wall, frozenset()))
    return steps


def seen_window(w: ClosedWindow) -> tuple[Any, ...]:
    slos = w.slos.rows() if w.slos is not None else None
    return (
        w.partition, w.start_ms, list(w.records.items()), w.sketches, w.correction, w.ledger,
        slos,
    )  # fmt: skip


def seen(out: Output) -> tuple[Any, ...]:
    return (
        out.records,
        [(d.reason, d.source) for d in out.dead],
        [seen_window(w) for w in out.windows],
    )


def run_steps(p: StreamProcessor, steps: list[Any]) -> list[Any]:
    """Everything ``p`` gives out, call by call: outputs, offsets, watermarks, what is
    pending, horizons, and its counters after draining."""
    out: list[Any] = []
    for kind, arg, wall_ms, lagging in steps:
        got = p.process(arg, wall_ms, lagging) if kind == "process" else p.tick(wall_ms, lagging)
        out.append(seen(got))
        out.append((p.safe_offsets(), p.watermarks(), p.pending(), p.horizons()))
    out.append(seen(p.drain()))
    out.append((p.counters, p.join_counters(), p.window_counters()))
    return out
