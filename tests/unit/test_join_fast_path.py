"""The join's fast paths (``Joiner.add_emitted`` for the common sequence of a request's
first attempt) against its general path: the same records, counters, offsets and
deadlines on random event orders with duplicates, conflicts, retries, late partners,
timeouts and evictions. And ``record_flags``'s early return against the flags'
definitions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contract.events import LifecycleEvent
from pipeline.contract.wire import from_model
from pipeline.core.join import JoinConfig, Joiner
from pipeline.core.record import record_flags
from tests.factories import completed, finished, received


class _General(Joiner):
    _fast = False


# One step: an event (request 0-4, kind, which of two event ids, ms after the start,
# ok / failed / refused by the gateway's enforcement) or a clock advance (ms).
_EVENT = st.tuples(
    st.integers(0, 4),
    st.sampled_from(["r", "c", "f"]),
    st.integers(0, 1),
    st.integers(0, 3_000),
    st.sampled_from(["ok", "failed", "refused"]),
)
_STEP = st.one_of(_EVENT, st.integers(0, 3_000).map(lambda ms: ("advance", ms)))


def _event(step: tuple[int, str, int, int, str]) -> LifecycleEvent:
    n, kind, variant, t_ms, how = step
    rid, eid = f"req-{n}", f"{kind}{n}.{variant}"
    if kind == "r":
        return received(rid, t_ms, eid=eid, tenant=None if variant else "t1")
    if kind == "c":
        if how == "failed":
            return completed(rid, t_ms, http_status=500, outcome="error", eid=eid)
        if how == "refused":  # no partner will come: recorded at once on both paths
            return completed(
                rid, t_ms, total_ms=1.0, ttfb_ms=None, http_status=429, outcome="rejected",
                eid=eid, control_mode="enforce", control_verdict="admission",
            )  # fmt: skip
        return completed(rid, t_ms, total_ms=50.0 + 100 * variant, eid=eid)
    return finished(rid, t_ms, decode_ms=20.0 + 60 * variant, eid=eid)


def _run(cls: type[Joiner], steps: list[Any], config: JoinConfig, wire: bool) -> list[Any]:
    j = cls(config)
    seen: list[Any] = []
    now_ms = 0
    for offset, step in enumerate(steps):
        if step[0] == "advance":
            now_ms += step[1]
            seen.append(j.advance_emitted(now_ms, now_ms if offset % 2 else None))
            seen.append(j.oldest_terminal_ms())
        else:
            ev = _event(step)
            seen.append(j.add_emitted(from_model(ev) if wire else ev, offset, offset, now_ms))
        # the state too (deadlines included), not only what it returns
        seen.append((j.safe_offset(offset + 1), dict(j._pending), j._resolved.items()))
    seen.append(j.drain_emitted())
    seen.append(j.counters)
    return seen


@given(
    st.lists(_STEP, max_size=60),
    st.integers(1, 8),
    st.integers(1, 8),
    st.sampled_from([500, 2_000, 10**6]),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_fast_and_general_paths_give_the_same_results(
    steps: list[Any], max_pending: int, max_resolved: int, timeout_ms: int, wire: bool
) -> None:
    config = JoinConfig(
        timeout_ms=timeout_ms, inflight_ttl_ms=2 * timeout_ms, resolved_ttl_ms=3 * timeout_ms,
        max_pending=max_pending, max_resolved=max_resolved,
    )  # fmt: skip
    assert _run(Joiner, steps, config, wire) == _run(_General, steps, config, wire)


@pytest.mark.parametrize("order", ["rcf", "rfc", "crf", "cfr", "frc", "fcr", "rrcf", "rcfcf"])
def test_the_general_path_differs_where_the_fast_path_is_taken(order: str) -> None:
    """The comparison above can fail: the general path is really taken (its events go
    through ``_store``, the fast path's do not) and both build the records."""
    steps = [(0, k, 0, 10 * i, "ok") for i, k in enumerate(order)]
    config = JoinConfig()
    fast, general = _run(Joiner, steps, config, True), _run(_General, steps, config, True)
    assert fast == general
    records = [e for e in fast if hasattr(e, "record")]
    assert records
    assert records[-1].record.source == "joined"
    assert _General._fast is False
    assert Joiner._fast is True


# Each flag: (name, a, b) for "durations[a] > durations[b] + 1e-6", both known; the
# durations are (gateway total, gateway ttfb, engine e2e, inference, queue).
_FLAG_DEFINITIONS = [
    ("ttfb_gt_total", 1, 0),
    ("e2e_lt_inference", 3, 2),
    ("e2e_lt_queue", 4, 2),
    ("negative_gateway_overhead", 2, 0),
]
# near-equal values too (the tolerance's edge)
_MS = st.one_of(
    st.none(),
    st.sampled_from([0.0, 1e-7, 1e-6, 2e-6, 10.0, 10.0 + 1e-6, 10.0 + 2e-6]),
    st.floats(0, 1e4),
)


@given(st.tuples(_MS, _MS, _MS, _MS, _MS))
@settings(max_examples=500, deadline=None)
def test_record_flags_match_their_definitions(durations: tuple[float | None, ...]) -> None:
    want = tuple(
        name
        for name, a, b in _FLAG_DEFINITIONS
        if (x := durations[a]) is not None and (y := durations[b]) is not None and x > y + 1e-6
    )
    assert record_flags(*durations) == want
