from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.join import JoinConfig, Joiner, ResolvedMemory
from pipeline.core.record import build_record, ctx_bucket
from tests.factories import T0_NS, completed, finished, received

MS = 1_000_000


def _now(ms: float) -> int:
    return T0_NS // MS + int(ms)


@pytest.mark.parametrize(
    "order", list(itertools.permutations(["received", "completed", "finished"]))
)
def test_join_completes_in_any_order(order: tuple[str, ...]) -> None:
    j = Joiner(JoinConfig(timeout_ms=1000))
    make = {"received": received, "completed": completed, "finished": finished}
    out = [j.add(make[k]("r1"), i) for i, k in enumerate(order)]
    recs = [r for r in out if r is not None]
    # received last: the joined record, then an upgrade that adds priority/tenant
    assert len(recs) == (2 if order[-1] == "received" else 1)
    rec = recs[-1]
    assert (rec.source, rec.revision) == ("joined", 3)  # joined, with gateway.received
    assert (rec.tenant, rec.priority) == ("t1", 1)
    assert rec.gateway_total_ms == 100.0
    assert rec.engine_e2e_ms == 88.0
    assert rec.gateway_overhead_ms == pytest.approx(12.0)
    assert rec.ttft_engine_ms == 18.0
    assert rec.tpot_ms == pytest.approx(70.0 / 7)
    assert j.pending_count == 0


def test_duplicates_and_conflicts_are_ignored_and_counted() -> None:
    j = Joiner()
    assert j.add(received("r1"), 0) is None
    assert j.add(received("r1"), 1) is None  # same event_id
    assert j.add(completed("r1"), 2) is None
    # same kind, other id, other content: a conflict (tests/unit/test_join_conflicts.py)
    assert j.add(completed("r1", total_ms=150.0, eid="other"), 3) is None
    rec = j.add(finished("r1"), 4)
    assert rec is not None
    assert (rec.conflicts, rec.gateway_total_ms) == (1, 150.0)  # the worse one
    assert j.add(finished("r1"), 5) is None  # after the join: still a duplicate
    assert j.counters.duplicates == 2
    assert j.counters.conflicts == 1
    assert j.counters.joined == 1


@pytest.mark.parametrize(
    ("events", "source", "outcome", "gateway_total", "queue"),
    [
        # client abort: vLLM never reports it, so only the gateway side exists
        (
            [received("a"), completed("a", total_ms=900.0, outcome="client_abort", http_status=0)],
            "gateway_only",
            "client_abort",
            900.0,
            None,
        ),
        # direct traffic: engine only
        ([finished("b", 100.0)], "engine_only", "ok", None, 10.0),
    ],
)
def test_partial_records_after_timeout(
    events: list, source: str, outcome: str, gateway_total: float | None, queue: float | None
) -> None:
    j = Joiner(JoinConfig(timeout_ms=1000))
    for i, ev in enumerate(events):
        assert j.add(ev, i) is None
    assert j.advance(_now(100 + 999)) == []  # not yet
    recs = j.advance(_now(100 + 1000))
    assert len(recs) == 1
    rec = recs[0]
    # a partial: revision 0, or 1 with gateway.received
    assert (rec.source, rec.revision & 2, rec.outcome) == (source, 0, outcome)
    assert rec.gateway_total_ms == gateway_total
    assert rec.queue_ms == queue
    assert rec.direct_traffic is (source == "engine_only")


def test_late_partner_upgrades_a_partial_record() -> None:
    j = Joiner(JoinConfig(timeout_ms=1000))
    j.add(completed("r"), 0)
    (partial,) = j.advance(_now(5000))
    assert partial.source == "gateway_only"
    out = j.add_emitted(finished("r", 6000), 1)
    assert out is not None
    rec = out.record
    assert (rec.source, rec.revision) == ("joined", 2)
    assert out.upgrade
    assert out.previous == partial  # the windows take the partial back
    assert j.counters.upgraded == 1
    assert j.add(finished("r", 6000), 2) is None  # and a repeat of it is a duplicate
    assert j.counters.duplicates == 1


def test_lone_received_is_dropped_after_inflight_ttl() -> None:
    j = Joiner(JoinConfig(timeout_ms=1000, inflight_ttl_ms=10_000))
    j.add(received("r"), 0)
    assert j.advance(_now(9_999)) == []
    assert j.pending_count == 1
    assert j.advance(_now(10_000)) == []
    assert j.pending_count == 0
    assert j.counters.orphaned_received == 1


def test_terminal_event_replaces_inflight_deadline() -> None:
    j = Joiner(JoinConfig(timeout_ms=1000, inflight_ttl_ms=600_000))
    j.add(received("r", 0), 0)
    j.add(completed("r", 100), 1)
    assert [r.source for r in j.advance(_now(1100))] == ["gateway_only"]


def test_safe_offset_is_the_oldest_open_request() -> None:
    j = Joiner()
    assert j.safe_offset(0) == 0
    j.add(received("a"), 10)
    j.add(received("b"), 11)
    assert j.safe_offset(12) == 10
    j.add(completed("a"), 12)
    j.add(finished("a"), 13)
    assert j.safe_offset(14) == 11
    j.add(completed("b"), 14)
    j.add(finished("b"), 15)
    assert j.safe_offset(16) == 16


def test_state_is_bounded() -> None:
    j = Joiner(JoinConfig(timeout_ms=1000, max_pending=3))
    for i in range(5):
        j.add(completed(f"r{i}"), i)
    assert j.pending_count == 3
    assert j.counters.evicted == 2
    assert [r.request_id for r in j.advance(0)] == ["r0", "r1"]


def test_drain_resolves_everything() -> None:
    j = Joiner()
    j.add(completed("a"), 0)
    j.add(finished("b"), 1)
    j.add(received("c"), 2)
    assert sorted(r.source for r in j.drain()) == ["engine_only", "gateway_only"]
    assert j.pending_count == 0
    assert j.counters.orphaned_received == 1


def _requests(n: int) -> list:
    evs = []
    for i in range(n):
        rid = f"r{i}"
        t = i * 3.0
        evs += [
            received(rid, t),
            finished(rid, t + 90, queue_ms=float(i % 7)),
            completed(rid, t + 95),
        ]
    return evs


@given(st.integers(min_value=0, max_value=2**32), st.floats(min_value=0.0, max_value=0.3))
@settings(max_examples=40, deadline=None)
def test_shuffled_with_duplicates_gives_identical_records(seed: int, dup_share: float) -> None:
    events = _requests(40)
    rng = random.Random(seed)
    noisy = events + [e for e in events if rng.random() < dup_share]
    rng.shuffle(noisy)

    def run(evs: list) -> list:
        j = Joiner(JoinConfig(timeout_ms=10**9))
        out = [r for i, e in enumerate(evs) if (r := j.add(e, i)) is not None]
        out += j.drain()
        final = {r.request_id: r for r in out}  # the last version of each request wins
        return sorted(
            (r.request_id, r.source, r.queue_ms, r.gateway_total_ms, r.tenant)
            for r in final.values()
        )

    assert run(noisy) == run(events)


@pytest.mark.parametrize(
    ("tokens", "bucket"),
    [
        (None, "unknown"),
        (0, "<512"),
        (511, "<512"),
        (512, "512-4k"),
        (4095, "512-4k"),
        (4096, "4k-8k"),
        (8191, "4k-8k"),
        (8192, "8k-16k"),
        (16384, "8k-16k"),
        (16385, ">16k"),
    ],
)
def test_ctx_bucket(tokens: int | None, bucket: str) -> None:
    assert ctx_bucket(tokens) == bucket


@pytest.mark.parametrize(("out_tokens", "tpot"), [(0, None), (1, None), (2, 70.0), (11, 7.0)])
def test_tpot_needs_two_tokens(out_tokens: int, tpot: float | None) -> None:
    rec = build_record("r", None, None, finished("r", output_tokens=out_tokens))
    assert rec.tpot_ms == tpot


def test_record_needs_a_terminal_event() -> None:
    with pytest.raises(ValueError, match=r"gateway\.completed or engine\.finished"):
        build_record("r", received("r"), None, None)


def test_backlog_does_not_time_out_before_processing_time_passes() -> None:
    # Event time races ahead (a backlog where one producer's messages are far
    # ahead of another's in the log); the partner is only missing in event time.
    j = Joiner(JoinConfig(timeout_ms=1000))
    j.add(finished("r", 0.0), 0, wall_ms=50_000)
    assert j.advance(_now(60_000), wall_ms=50_500) == []
    assert j.add(completed("r", 2.0), 1, wall_ms=50_600) is not None
    j.add(finished("s", 0.0), 2, wall_ms=50_700)
    assert j.advance(_now(60_000), wall_ms=51_699) == []
    (rec,) = j.advance(_now(60_000), wall_ms=51_700)
    assert rec.source == "engine_only"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=60))
def test_resolved_requests_are_remembered_until_exactly_their_expiry(ids: list[int]) -> None:
    """Each resolved request is remembered (a repeat is a duplicate) until its expiry,
    ``resolved_ttl_ms`` after it was joined, and forgotten from then on, whatever
    generation of the resolved memory holds it; the memory is empty once all expired."""
    cfg = JoinConfig(timeout_ms=1000)
    j = Joiner(cfg)
    t = 0.0
    joined_at: dict[str, int] = {}
    for i in ids:
        rid = f"r{i}"
        t += 100.0
        fresh = rid not in j._resolved
        for ev in (received(rid, t), completed(rid, t + 10), finished(rid, t + 5)):
            j.add_emitted(ev, 0, None)
        if fresh:
            joined_at[rid] = _now(t + 5)  # joined by its last event (finished, at t + 5)
        j.advance_emitted(_now(t + 20), None)
        now = _now(t + 20)
        want = {r for r, at in joined_at.items() if at + cfg.resolved_ttl_ms > now}
        assert set(j._resolved.keys()) == want
    last = max(joined_at.values())
    j.advance_emitted(last + cfg.resolved_ttl_ms - 1, None)
    assert set(j._resolved.keys()) == {r for r, at in joined_at.items() if at == last}
    j.advance_emitted(last + cfg.resolved_ttl_ms, None)
    assert not j._resolved.keys()
    j.advance_emitted(last + 2 * cfg.resolved_ttl_ms, None)
    assert len(j._resolved) == 0  # every generation dropped, not only expired


@pytest.mark.parametrize(
    ("puts", "now_ms", "remembered", "held"),
    [
        # ttl 8,000 ms: generations of 1,000 ms of expiry times
        ([("a", 1_500), ("b", 1_900), ("c", 2_100)], 0, {"a", "b", "c"}, 3),
        # a expired: forgotten at once; its generation (1,000-2,000) is kept for b
        ([("a", 1_500), ("b", 1_900), ("c", 2_100)], 1_500, {"b", "c"}, 3),
        # the generation 1,000-2,000 is over: dropped whole
        ([("a", 1_500), ("b", 1_900), ("c", 2_100)], 2_000, {"c"}, 1),
        ([("a", 1_500), ("b", 1_900), ("c", 2_100)], 2_100, set(), 1),
        ([("a", 1_500), ("b", 1_900), ("c", 2_100)], 3_000, set(), 0),
        # expiries out of order: each entry still lives until its own expiry
        ([("c", 5_000), ("a", 1_500)], 1_600, {"c"}, 2),
    ],
)
def test_the_resolved_memory_forgets_at_each_expiry_and_drops_generations_whole(
    puts: list[tuple[str, int]], now_ms: int, remembered: set[str], held: int
) -> None:
    mem = ResolvedMemory(ttl_ms=8_000, max_items=100)
    for key, expires in puts:
        mem.put(key, expires)
    mem.expire(now_ms)
    assert {k for k, _ in puts if k in mem} == remembered
    assert set(mem.keys()) == remembered
    assert len(mem) == held


@pytest.mark.parametrize(
    ("expiries", "max_items", "remembered"),
    [
        # over the cap: the oldest generation goes whole
        ([1_100, 1_200, 2_100, 2_200, 3_100], 4, {"k2", "k3", "k4"}),
        # one generation only: its oldest entries, one by one
        ([1_100, 1_200, 1_300, 1_400], 2, {"k2", "k3"}),
        ([1_100], 1, {"k0"}),
    ],
)
def test_the_resolved_memory_is_bounded(
    expiries: list[int], max_items: int, remembered: set[str]
) -> None:
    mem = ResolvedMemory(ttl_ms=8_000, max_items=max_items)
    for i, expires in enumerate(expiries):
        mem.put(f"k{i}", expires)
        assert len(mem) <= max_items
    assert set(mem.keys()) == remembered


@pytest.mark.parametrize(
    ("mode", "verdict", "at_once"),
    [
        ("enforce", "admission", True),
        ("enforce", "shed_priority", True),
        ("enforce", "rate_limit", True),
        ("enforce", "new_session", True),
        ("enforce", "retry_budget", True),
        ("enforce", "deadline", True),
        # the queue cut-off cancels a call already forwarded: an engine run may report
        ("enforce", "queue_timeout", False),
        # shadow: the request was served as without control
        ("shadow", "admission", False),
        (None, None, False),
    ],
)
def test_a_request_refused_before_any_engine_is_recorded_at_once(
    mode: str | None, verdict: str | None, at_once: bool
) -> None:
    """No engine.finished comes for a request the gateway turned away: its record is not
    held for the partner's timeout (nor the windows and decisions behind it)."""
    j = Joiner(JoinConfig(timeout_ms=5_000))
    assert j.add(received("r1", 0.0), 0) is None
    refusal = completed(
        "r1", 2.0, total_ms=2.0, ttfb_ms=None, http_status=429, outcome="rejected",
        control_mode=mode, control_verdict=verdict,
    )  # fmt: skip
    out = j.add_emitted(refusal, 1)
    rec = out.record if out is not None else None
    if at_once:
        assert rec is not None
        assert (rec.source, rec.outcome) == ("gateway_only", "rejected")
        assert rec.control_verdict == verdict
        assert j.pending_count == 0
        assert j.oldest_terminal_ms() is None
        # the same record the timeout would have given, upgraded by a partner that comes
        late = j.add(finished("r1", 3.0), 2)
        assert late is not None
        assert late.source == "joined"
    else:
        assert rec is None
        assert j.oldest_terminal_ms() is not None  # its windows wait for the partner
        timed_out = j.advance(_now(2.0 + 5_000))
        assert [r.source for r in timed_out] == ["gateway_only"]
