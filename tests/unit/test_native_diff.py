"""The native hot path (``tailguard_native``, issue 39) against its Python references.

Same hypothesis-generated inputs through both implementations, identical outputs:

* the partition clock, operation by operation (return values, watermark, wall time of
  the last advance, event count, bootstrap flag, marks, limits);
* the sketch kernel: bins (as dicts), zero count, count, sum, min and max after any
  sequence of ``add_many`` / ``remove_many`` batches, and the same error for a bad value;
* the boundary table of a batch of records, bit for bit;
* the whole processor on messy traffic (disorder, duplicates, lost and late partners,
  gateway hosts with skewed clocks, far-ahead events, failures, client aborts, retries
  under the same request id, two partitions): records, dead letters, windows (counts,
  sketch columns, ledgers), SLO counts, offsets, watermarks and counters, call by call.

Skipped (with the reason) where the extension is not built: ``./tg`` builds it when a
Rust toolchain is present; ``pip install ./native`` builds it by hand.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core import native
from pipeline.core.eventtime import ClockConfig, PartitionClock
from pipeline.core.join import JoinConfig
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import BOUNDARIES
from pipeline.core.sketch import QuantileSketch
from pipeline.core.slo import boundary_table
from pipeline.core.slo_windows import slo_factory
from pipeline.settings import Settings
from pipeline.spec.slo import load_spec_file
from tests.messy_steps import QUORUM, TRAFFIC, configs, run_steps, steps_of, traffic

pytestmark = pytest.mark.skipif(
    native.NATIVE is None,
    reason="tailguard_native is not built (no Rust toolchain when ./tg ran; "
    "`pip install ./native` builds it)",
)


@contextmanager
def _selected(name: native.CoreImplName) -> Iterator[None]:
    before = native.active()
    native.select(name)
    try:
        yield
    finally:
        native.select(before.name)


@pytest.fixture
def restore_impl() -> Iterator[None]:
    with _selected(native.active().name):
        yield


# --- selection ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "runs"), [("auto", "native"), ("native", "native"), ("python", "python")]
)
def test_selection_names_what_runs(restore_impl: None, requested: Any, runs: str) -> None:
    impl = native.select(requested)
    assert (impl.name, native.active().name) == (runs, runs)
    assert impl.describe().startswith(f"core hot path: {runs}")
    assert (native.sketch_kernel() is None) == (runs == "python")


def test_an_unknown_implementation_is_a_start_error() -> None:
    with pytest.raises(ValueError, match="core_impl must be one of"):
        native.resolve("rust")  # type: ignore[arg-type]


# --- partition clock ----------------------------------------------------------

_CLOCK_OPS = st.lists(
    st.tuples(
        st.sampled_from(["observe"] * 10 + ["jump", "establish", "now", "now_lagging"]),
        st.integers(0, 4),  # host
        st.integers(0, 400_000),  # event time (ms)
        st.integers(0, 20_000) | st.none(),  # wall time (ms)
    ),
    max_size=400,
)


def _clock_state(c: Any) -> tuple[Any, ...]:
    return (
        c.watermark_ms, c.wall_at_advance_ms, c.events, c.bootstrapping, c.host_marks(),
        c.newest_ms, c.ahead_limit_ms(), c.ahead_limit_ms(123_456), c.in_range(350_000),
    )  # fmt: skip


@given(_CLOCK_OPS, st.sampled_from([1, 2, 3, 5]), st.sampled_from([1_000, 60_000]))
@settings(max_examples=500, deadline=None)
def test_clock_equals_the_reference(
    ops: list[tuple[str, int, int, int | None]], quorum: int, idle_ms: int
) -> None:
    cfg = ClockConfig(max_ahead_ms=100_000, quorum=quorum, host_idle_ms=idle_ms)
    assert native.NATIVE is not None
    ref, nat = PartitionClock(cfg), native.NATIVE.clock(cfg)
    assert nat.config is cfg
    for op, host, ts, wall in ops:
        got = []
        for c in (ref, nat):
            if op == "observe":
                got.append(c.observe(f"h{host}", ts, wall or 0))
            elif op == "jump":
                got.append(c.jump(ts, wall or 0))
            elif op == "establish":
                got.append(c.establish(wall or 0))
            else:
                got.append(c.now(wall, caught_up=op == "now"))
            got.append(_clock_state(c))
        assert got[:2] == got[2:], (op, host, ts, wall)


def test_clock_attributes_can_be_set_as_on_the_reference() -> None:
    assert native.NATIVE is not None
    c = native.NATIVE.clock(ClockConfig())
    c.watermark_ms, c.wall_at_advance_ms = 5, 7
    assert (c.watermark_ms, c.wall_at_advance_ms, c.now(10), c.now(None)) == (5, 7, 8, 5)


# --- sketch kernel ------------------------------------------------------------

_FLOATS = (
    st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False)
    | st.floats(-1e-300, 1e-300)  # the zero bucket and the smallest keys
    | st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, 250.0, 1e300, -1e300])  # no overflow to inf
)
_BATCHES = st.lists(
    st.tuples(st.booleans(), st.lists(_FLOATS, max_size=60)),  # (take back?, values)
    max_size=8,
)


def _sketch_state(s: QuantileSketch) -> tuple[Any, ...]:
    return (s._pos, s._neg, s.zero_count, s.count, s.sum, s.min, s.max, s.to_columns())


def _run_sketch(batches: list[tuple[bool, list[float]]], rel_acc: float) -> list[Any]:
    s = QuantileSketch(rel_acc)
    seen: list[Any] = []
    for remove, values in batches:
        arr = np.asarray(values, dtype=np.float64)
        if remove:
            s.remove_many(arr)
        else:
            s.add_many(arr)
        seen.append(_sketch_state(s))
    return seen


@given(_BATCHES, st.sampled_from([0.01, 0.02, 0.005]))
@settings(max_examples=400, deadline=None)
def test_sketch_kernel_equals_the_reference(
    batches: list[tuple[bool, list[float]]], rel_acc: float
) -> None:
    with _selected("python"):
        want = _run_sketch(batches, rel_acc)
    with _selected("native"):
        assert _run_sketch(batches, rel_acc) == want


@pytest.mark.parametrize("rel_acc", [0.01, 0.001])
def test_sketch_kernel_keys_at_bucket_edges_are_the_librarys(rel_acc: float) -> None:
    """Where ``ceil`` is most sensitive: values at the edges between buckets (``gamma``
    to an integer power) and one ulp either side, over the whole range of magnitudes."""
    assert native.NATIVE is not None
    m = QuantileSketch(rel_acc)._mapping
    top = int(1_020 * m._multiplier)  # 2 ** 1020: within the mapping
    edges = [2.0 ** (k / m._multiplier) for k in range(-top, top, max(1, top // 3_000))]
    edges = [e for e in edges if m.min_possible < e <= m.max_possible / 2]
    values = np.array(
        [v for e in edges for v in (np.nextafter(e, 0.0), e, np.nextafter(e, np.inf))]
    )
    pos: dict[int, int] = {}
    bad, zero, _ = native.NATIVE.sketch_bump(
        pos, {}, values, 1, m._multiplier, m._offset, math.log(2.0), m.min_possible,
        m.max_possible, 0.0,
    )  # fmt: skip
    want: dict[int, int] = {}
    for v in values.tolist():
        want[m.key(v)] = want.get(m.key(v), 0) + 1
    assert (bad, zero, len(values)) == (-1, 0, 3 * len(edges))
    assert pos == want


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1.8e308])
@pytest.mark.parametrize("remove", [False, True])
def test_a_bad_value_fails_alike_and_changes_nothing(
    restore_impl: None, bad: float, remove: bool
) -> None:
    errors, states = [], []
    for impl in ("python", "native"):
        native.select(impl)  # type: ignore[arg-type]
        s = QuantileSketch()
        s.add_many(np.array([1.0, 2.0]))
        with pytest.raises(ValueError, match="cannot") as e:
            (s.remove_many if remove else s.add_many)(np.array([3.0, bad, 4.0]))
        errors.append(str(e.value))
        states.append(_sketch_state(s))
    assert errors[0] == errors[1]
    assert states[0] == states[1]


# --- boundary table -------------------------------------------------------------

_BOUNDARY = (
    st.none()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(2**60), 2**60)
    | st.sampled_from([0.0, -0.0, 1e-320])
)


@given(st.lists(st.lists(_BOUNDARY, min_size=len(BOUNDARIES), max_size=len(BOUNDARIES)),
                max_size=40))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_boundary_table_equals_the_reference(rows: list[list[float | int | None]]) -> None:
    records = [SimpleNamespace(**dict(zip(BOUNDARIES, r, strict=True))) for r in rows]
    with _selected("python"):
        want = boundary_table(records)  # type: ignore[arg-type]
    with _selected("native"):
        got = boundary_table(records)  # type: ignore[arg-type]
    assert got.shape == want.shape == (len(rows), len(BOUNDARIES))
    assert got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()  # bit for bit: NaN, -0.0, int rounding
    got[:1] = 0.0  # writable, as the reference's table


# --- the whole processor (tests/messy_steps.py: the traffic) ----------------------

_SLOS = slo_factory(load_spec_file(Settings().slo_spec))


def _run(steps: list[Any], configs: tuple[Any, ...]) -> list[Any]:
    join, windows, clock = configs
    p = StreamProcessor(
        "t", join, window_config=windows, clock_config=clock, max_pending=join.max_pending,
        slo_factory=_SLOS,
    )  # fmt: skip
    return run_steps(p, steps)


@given(
    *TRAFFIC,
    st.sampled_from([(500, 0), (1_000, 300), (2_000, 3_000)]),  # window size, grace
    QUORUM,
    st.sampled_from([(0, 0, 0), (0, 2_500, 0), (-4_000, 0, 90_000)]),  # gateway clock skews
    st.randoms(use_true_random=False),
)
@settings(max_examples=80, deadline=None)
def test_processor_gives_the_same_output_with_either_implementation(  # noqa: PLR0917
    requests: list[Any], late_ms: int, per_call: int,
    wall_step: int | None, timeout_ms: int, window: tuple[int, int], quorum: int,
    skew_ms: tuple[int, int, int], rnd: Any,
) -> None:  # fmt: skip
    steps = steps_of(traffic(requests, late_ms, skew_ms), per_call, wall_step, rnd)
    drawn = configs(timeout_ms, window, quorum)
    with _selected("python"):
        want = _run(steps, drawn)
    with _selected("native"):
        assert _run(steps, drawn) == want


# --- the join, call by call ------------------------------------------------------


# One step: an event (request 0-4; kind; which of three event ids; which of three
# contents; ms after the start; how it ends), a clock advance (ms, with wall time or
# not), an eviction, or a look at the oldest terminal event before a bound.
def _join_events(tag: str, kinds: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    """(tag, request, kind or kinds, event id, content, ms after the start, how it ends)."""
    return st.tuples(
        st.just(tag),
        st.integers(0, 3),
        kinds,
        st.integers(0, 2),
        st.integers(0, 2),
        st.integers(0, 3_000),
        st.sampled_from(["ok", "ok", "error", "abort"]),
    )


_JOIN_EVENT = _join_events("event", st.sampled_from(["r", "c", "f"]))
# A whole attempt: its three events (one id and content each), in one of the six orders.
_JOIN_ATTEMPT = _join_events("attempt", st.permutations(["r", "c", "f"]))
_JOIN_STEP = st.one_of(
    _JOIN_EVENT,
    _JOIN_EVENT,
    _JOIN_ATTEMPT,
    _JOIN_ATTEMPT,
    st.tuples(st.just("advance"), st.integers(0, 3_000), st.booleans()),
    st.tuples(st.just("evict"), st.integers(0, 3)),
    st.tuples(st.just("before"), st.integers(-2_000, 6_000)),
)
_END = {"ok": (200, "ok", "stop"), "error": (502, "error", "error"),
        "abort": (0, "client_abort", "abort")}  # fmt: skip


# the client's attempt (issue 47): a first try (packed in flight), a retry naming its
# logical request (never packed), a first try with an idempotency key
_CLIENT: list[dict[str, Any]] = [
    {},
    {"client_attempt": 2, "logical_request_id": "logical-7"},
    {"logical_request_id": "idem-key"},
]


_CONTROL: list[dict[str, Any]] = [
    {},
    {"control_mode": "shadow", "control_verdict": "admission"},
    {"control_mode": "enforce", "control_verdict": "shed_priority"},
]


def _join_event(step: tuple[Any, ...]) -> Any:
    from tests.factories import completed, finished, received

    _, n, kind, eid, content, t_ms, end = step
    rid = f"req-{n}"
    status, outcome, reason = _END[end]
    if kind == "r":
        # content 2: a prompt too long for the reference's packed in-flight int
        ev = received(rid, t_ms, eid=f"r{n}.{eid}", tenant=None if content else "t1",
                      priority=content, prompt_tokens=[100, None, 1 << 25][content])  # fmt: skip
        return ev.model_copy(update=_CLIENT[(content + n) % 3])
    if kind == "c":
        ttfb = None if content == 2 else 20.0
        ev = completed(rid, t_ms, total_ms=50.0 + 300 * content, http_status=status,
                       outcome=outcome, eid=f"c{n}.{eid}", ttfb_ms=ttfb)  # fmt: skip
        # the enforcement's fields (issue 48): none, shadow, enforce
        return ev.model_copy(update=_CONTROL[content])
    ev = finished(rid, t_ms, decode_ms=20.0 + 200 * content, eid=f"f{n}.{eid}",
                  output_tokens=[8, 1, 300][content])  # fmt: skip
    if reason != "stop":
        ev = ev.model_copy(update={"finish_reason": reason})
    return ev


def _run_join(impl: native.CoreImpl, steps: list[Any], config: JoinConfig, wire: bool,
              seeds: list[tuple[str, int]]) -> list[Any]:  # fmt: skip
    from pipeline.contract.wire import from_model
    from tests.factories import T0_NS

    t0_ms = T0_NS // 1_000_000
    j = impl.joiner(config)
    for key, expires_ms in seeds:
        j.seed_resolved(key, t0_ms + expires_ms)
    seen: list[Any] = []
    now_ms = t0_ms
    wall_ms = 5_000
    flat = []
    for step in steps:
        if step[0] == "attempt":
            _, n, order, eid, content, t_ms, end = step
            flat += [("event", n, k, eid, content, t_ms + 7 * i, end) for i, k in enumerate(order)]
        else:
            flat.append(step)
    for offset, step in enumerate(flat):
        if step[0] == "advance":
            now_ms += step[1]
            wall_ms += step[1] // 2
            seen.append(j.advance_emitted(now_ms, wall_ms if step[2] else None))
            seen.append(j.oldest_terminal_ms())
        elif step[0] == "evict":
            seen.append(j.evict(step[1]))
        elif step[0] == "before":
            seen.append(j.oldest_terminal_before(now_ms + step[1]))
        else:
            ev = _join_event(step)
            ev = from_model(ev) if wire else ev
            seen.append(j.add_emitted(ev, offset, wall_ms if offset % 3 else None, now_ms))
        durable = j.safe_offset(offset + 1, lone_received_durable=True)
        seen.append((j.safe_offset(offset + 1), durable, j.pending_count, native.join_view(j),
                     copy.copy(j.counters)))  # fmt: skip
    seen.append(j.drain_emitted())
    seen.append((copy.copy(j.counters), native.join_view(j)))
    return seen


@given(
    st.lists(_JOIN_STEP, min_size=5, max_size=60),
    st.integers(1, 8),
    st.integers(1, 12),
    st.sampled_from([500, 2_000, 10**6]),
    st.sampled_from([0, 1_000, 15_000]),
    st.booleans(),
    st.lists(st.tuples(st.sampled_from(["req-0", "req-1", "req-2\x1f2", "req-3\x1f3", "x\x1fy"]),
                       st.integers(0, 20_000)), max_size=3),
)  # fmt: skip
@settings(max_examples=400, deadline=None)
def test_join_equals_the_reference(  # noqa: PLR0917
    steps: list[Any], max_pending: int, max_resolved: int, timeout_ms: int,
    conflict_ttl_ms: int, wire: bool, seeds: list[tuple[str, int]],
) -> None:  # fmt: skip
    """Every output of the join, call by call: records and what they replace (upgrades,
    conflicts corrected, superseded attempts, partials), the events they were built from,
    counters, offsets, the oldest terminal event, deadlines, resolved memory, attempts."""
    config = JoinConfig(
        timeout_ms=timeout_ms, inflight_ttl_ms=2 * timeout_ms, resolved_ttl_ms=3 * timeout_ms,
        max_pending=max_pending, max_resolved=max_resolved, conflict_ttl_ms=conflict_ttl_ms,
    )  # fmt: skip
    assert native.NATIVE is not None
    seeds = sorted(seeds, key=lambda s: s[1])
    want = _run_join(native.PYTHON, steps, config, wire, seeds)
    got = _run_join(native.NATIVE, steps, config, wire, seeds)
    assert got == want


def test_join_equals_the_reference_past_the_codec_table() -> None:
    """More distinct tenants than the reference's packed ints have string ids for (4,095):
    the requests after that are held unpacked by both, with the same deadlines, records
    and offsets."""
    from pipeline.contract.wire import from_model
    from tests.factories import T0_NS, completed, finished, received

    assert native.NATIVE is not None
    config = JoinConfig(timeout_ms=1_000, inflight_ttl_ms=60_000)
    t0_ms = T0_NS // 1_000_000
    seen: list[list[Any]] = []
    for impl in (native.PYTHON, native.NATIVE):
        j = impl.joiner(config)
        out: list[Any] = []
        for i in range(4_200):
            ev = from_model(received(f"r{i}", i, tenant=f"tenant-{i}"))
            out.append(j.add_emitted(ev, i, 10_000 + i, t0_ms + i))
        for i in range(0, 4_200, 7):
            out.append(j.add_emitted(from_model(completed(f"r{i}", i + 50)), 5_000 + i, None, 0))
            out.append(j.add_emitted(from_model(finished(f"r{i}", i + 40)), 9_000 + i, None, 0))
        out.append(native.join_view(j))
        out.append((j.safe_offset(20_000), copy.copy(j.counters)))
        out.append(j.advance_emitted(t0_ms + 70_000, 80_000))
        out.append((native.join_view(j), copy.copy(j.counters)))
        seen.append(out)
    assert seen[1] == seen[0]
    in_flight = [row[1] for row in seen[0][-4][0]]
    # packed and unpacked both held
    assert True in in_flight
    assert False in in_flight
