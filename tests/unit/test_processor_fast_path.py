"""The processor's per-watermark work (issue 14, session 7) against its reference.

The processor's partitions (``_PartitionState.advance_to``) look up only the terminal
events that can hold a window the close horizon reaches
(``Joiner.oldest_terminal_before``), and the join keeps first
terminal events and their partners' deadlines in time buckets until event time nears
them (most are joined and dropped unseen). The reference below is the processor before
that: every watermark move asks for the exact oldest terminal event, and its joins take
the general path (every deadline and terminal event pushed on a heap at once). On messy
traffic (hosts out of step, duplicates, lost and late partners, events far ahead, small
timeouts and windows, evictions, idle wall time) both give the same records, windows,
dead letters, offsets and counters, call by call.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.core.join_timers as timers_module
from pipeline.contract.codec import encode_event
from pipeline.core.eventtime import ClockConfig
from pipeline.core.join import JoinConfig, Joiner
from pipeline.core.processor import Output, StreamProcessor, _PartitionState
from pipeline.core.windows import ClosedWindow, WindowConfig
from tests.factories import completed, finished, received


class _GeneralJoiner(Joiner):
    _fast = False


@dataclass(slots=True)
class _ReferencePartition(_PartitionState):
    def advance_to(self, now: int, wall_ms: int | None, out: Output) -> None:
        for emitted in self.joiner.advance_emitted(now, wall_ms):
            self.window(emitted, out)
        self.closed(self.windows.close(now, self.joiner.oldest_terminal_ms()), now, out)


class _Reference(StreamProcessor):
    def init_partition(
        self, partition: int, ledger: dict[str, int] | None = None, *, seed_join: bool = True
    ) -> None:
        super().init_partition(partition, ledger, seed_join=seed_join)
        st = self._parts[partition]
        ref = _ReferencePartition(**{f.name: getattr(st, f.name) for f in fields(st)})
        ref.joiner = _GeneralJoiner(self.join_config)
        self._parts[partition] = ref


# One request: gap after the previous one (ms), engine time (ms), hosts (0-2), and the
# fate of each of its three events: 0 as sent, 1 lost, 2 twice, 3 late (sent
# ``late_ms`` after it was stamped), 4 stamped far ahead (a wrong clock).
_REQUEST = st.tuples(
    st.integers(0, 400),
    st.integers(20, 3_000),
    st.integers(0, 2),
    st.tuples(*[st.sampled_from([0, 0, 0, 0, 1, 2, 3, 4])] * 3),
    st.booleans(),
)


def _traffic(requests: list[Any], late_ms: int) -> list[tuple[int, dict[str, Any]]]:
    """(send time ms, event dict) in send order."""
    out: list[tuple[int, int, dict[str, Any]]] = []
    t = 0
    for i, (gap, e2e, host, fates, failed) in enumerate(requests):
        t += gap
        rid = f"r{i}"
        done = t + e2e + 5
        events = [
            (received(rid, t), f"gw-{host}"),
            (finished(rid, done - 1, decode_ms=e2e - 18.0), f"m-{host}"),
            (
                completed(rid, done, total_ms=e2e + 5.0, http_status=500, outcome="error")
                if failed
                else completed(rid, done, total_ms=e2e + 5.0),
                f"gw-{(host + 1) % 3}",
            ),
        ]
        for (ev, h), fate in zip(events, fates, strict=True):
            d = orjson.loads(encode_event(ev))
            d["host"] = h
            sent = d["ts_unix_ns"] // 1_000_000
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
    return [(s, d) for s, _, d in out]


def _seen_window(w: ClosedWindow) -> tuple[Any, ...]:
    return (
        w.partition, w.start_ms, list(w.records.items()), w.sketches, w.correction, w.ledger,
    )  # fmt: skip


def _seen(out: Output) -> tuple[Any, ...]:
    return (
        out.records,
        [(d.reason, d.source) for d in out.dead],
        [_seen_window(w) for w in out.windows],
    )


def _run(cls: type[StreamProcessor], steps: list[Any], configs: tuple[Any, ...]) -> list[Any]:
    join, windows, clock = configs
    p = cls("t", join, window_config=windows, clock_config=clock, max_pending=join.max_pending)
    seen: list[Any] = []
    for kind, arg, wall_ms, lagging in steps:
        out = p.process(arg, wall_ms, lagging) if kind == "process" else p.tick(wall_ms, lagging)
        seen.append(_seen(out))
        seen.append((p.safe_offsets(), p.watermarks(), p.pending(), p.horizons()))
    seen.append(_seen(p.drain()))
    seen.append((p.counters, p.join_counters(), p.window_counters()))
    return seen


@given(
    st.lists(_REQUEST, min_size=1, max_size=80),
    st.sampled_from([0, 2_000, 20_000]),  # late_ms
    st.integers(1, 6),  # messages per process call
    st.sampled_from([None, 0, 200]),  # wall time per call (None: a replay)
    st.sampled_from([200, 1_000, 15_000]),  # join timeout
    st.sampled_from([4, 10_000]),  # max_pending
    st.sampled_from([(500, 0), (1_000, 300), (500, 2_000), (2_000, 3_000)]),  # size, grace
    st.sampled_from([1, 3, 5]),  # clock quorum
    st.sampled_from([(5, 4), (14, 12)]),  # bucket bits: in flight, terminal events
    st.randoms(use_true_random=False),
)
@settings(max_examples=150, deadline=None)
def test_processor_equals_its_reference_on_messy_traffic(  # noqa: PLR0917
    requests: list[Any], late_ms: int, per_call: int, wall_step: int | None, timeout_ms: int,
    max_pending: int, window: tuple[int, int], quorum: int, bits: tuple[int, int], rnd: Any,
) -> None:  # fmt: skip
    traffic = _traffic(requests, late_ms)
    steps: list[Any] = []
    wall = 1_000_000
    i = 0
    while i < len(traffic):
        batch = []
        for _ in range(per_call):
            k = rnd.randint(1, 4)
            chunk = traffic[i : i + k]
            if not chunk:
                break
            offset = i
            i += len(chunk)
            part = rnd.randint(0, 1)
            body = orjson.dumps([d for _, d in chunk] if len(chunk) > 1 else chunk[0][1])
            batch.append((part, offset, body))
        if not batch:
            break
        if wall_step is not None:  # wall time follows the traffic, plus the call's work
            wall = max(wall, 1_000_000 + traffic[i - 1][0]) + wall_step
        lagging = frozenset({0}) if rnd.random() < 0.2 else frozenset()
        steps.append(("process", batch, None if wall_step is None else wall, lagging))
        if wall_step is not None and rnd.random() < 0.2:
            wall += rnd.choice([100, 1_000, 20_000])
            steps.append(("tick", None, wall, frozenset()))
    configs = (
        JoinConfig(
            timeout_ms=timeout_ms, inflight_ttl_ms=4 * timeout_ms, resolved_ttl_ms=3 * timeout_ms,
            max_pending=max_pending,
        ),
        WindowConfig(size_ms=window[0], grace_ms=window[1]),
        ClockConfig(max_ahead_ms=60_000, quorum=quorum, host_idle_ms=5_000, hold_events=20),
    )  # fmt: skip
    saved = timers_module._BUCKET_BITS, timers_module._TERMINAL_BITS
    timers_module._BUCKET_BITS, timers_module._TERMINAL_BITS = bits  # type: ignore[misc]
    try:
        assert _run(StreamProcessor, steps, configs) == _run(_Reference, steps, configs)
    finally:
        timers_module._BUCKET_BITS, timers_module._TERMINAL_BITS = saved  # type: ignore[misc]
