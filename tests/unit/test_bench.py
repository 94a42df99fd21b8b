"""The benchmark harness's own logic: workload synthesis, batching format, histogram_quantile."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import orjson
import pytest

from bench.accuracy import bucket_quantile, histogram_p99_ms
from bench.data import (
    DictBatcher,
    Partitioner,
    Workload,
    end_margin_ns,
    events,
    messages,
    sentinels,
    template,
)
from pipeline.contract.events import EVENT_ADAPTER
from pipeline.contract.partitioning import partition_for
from pipeline.core.eventtime import ClockConfig
from pipeline.core.join import JoinConfig
from pipeline.core.processor import StreamProcessor
from pipeline.core.windows import WindowConfig
from producers.emit import Batcher, BatchPolicy

W = Workload(instances=6, rate_ev_s=2_000, seeds=2, trace_limit=200)
START = 1_800_000_000_000_000_000


def test_events_are_in_time_order_and_every_instance_is_complete() -> None:
    out = list(events(W, START))
    ts = [t for _, t, _ in out]
    assert ts == sorted(ts)
    assert all(t == ev["ts_unix_ns"] for _, t, ev in out)
    assert len(out) == W.n_events
    by_rid: dict[str, list[str]] = defaultdict(list)
    for rid, _, ev in out:
        assert ev["request_id"] == rid
        assert ev["event_id"] == f"{rid}:{ev['kind']}"
        by_rid[rid].append(ev["kind"])
    assert len(by_rid) == W.n_requests
    # instance i replays seed i % 2: same kinds per request as its template
    for seed in range(2):
        kinds = defaultdict(list)
        for e in template(seed, limit=200).events:
            kinds[e["request_id"]].append(e["kind"])
        for i in range(seed, W.instances, 2):
            for rid, ks in kinds.items():
                assert sorted(by_rid[f"{rid}.{i}"]) == sorted(ks)


def test_folding_keeps_each_requests_durations_and_gaps() -> None:
    src = {
        (e["request_id"], e["kind"]): e
        for seed in range(2)
        for e in template(seed, limit=200).events
    }
    firsts: dict[str, int] = {}
    for rid, ts, ev in events(W, START):
        base, _, _inst = rid.rpartition(".")
        orig = src[(base, ev["kind"])]
        shift = ts - orig["ts_unix_ns"]
        assert firsts.setdefault(rid, shift) == shift  # one shift per request
        for k, v in orig.items():
            if k in ("request_id", "event_id", "ts_unix_ns"):
                continue
            if k == "arrival_unix_ns":
                assert ev[k] == v + shift
            else:
                assert ev[k] == v


def test_events_validate_against_the_contract() -> None:
    for _, _, ev in list(events(W, START))[:500]:
        EVENT_ADAPTER.validate_json(orjson.dumps(ev))


@pytest.mark.parametrize("policy", [BatchPolicy(), BatchPolicy(max_events=1), BatchPolicy(7, 3)])
def test_dict_batcher_is_byte_identical_to_the_producers_batcher(policy: BatchPolicy) -> None:
    ours = DictBatcher(policy)
    theirs = Batcher(4, policy)
    part = Partitioner(4)
    a, b = [], []
    for rid, ts, ev in list(events(W, START))[:3000]:
        now = ts / 1e6
        a += ours.add(part(rid), ev, now)
        b += theirs.add(EVENT_ADAPTER.validate_json(orjson.dumps(ev)), now)
    a += ours.drain()
    b += theirs.drain()
    assert a == b


def test_messages_put_a_requests_events_on_its_partition() -> None:
    for p, value, n in messages(events(W, START), 4, BatchPolicy()):
        doc = orjson.loads(value)
        items = doc if isinstance(doc, list) else [doc]
        assert len(items) == n
        assert {partition_for(e["request_id"], 4) for e in items} == {p}


def test_end_of_input_puts_a_quorum_of_every_hosts_events_on_every_partition() -> None:
    quorum = ClockConfig().quorum
    out = sentinels(8, START, quorum, W.templates())
    hosts = {e["host"] for t in W.templates() for e in t.events}
    assert sorted(p for p, _, _ in out) == list(range(8))
    for p, value, n in out:
        evs = orjson.loads(value)
        assert n == len(evs)
        assert {partition_for(e["request_id"], 8) for e in evs} == {p}
        per_host = Counter(e["host"] for e in evs)
        assert set(per_host) == hosts
        assert min(per_host.values()) >= quorum
        by_rid: dict[str, list[str]] = defaultdict(list)
        for e in evs:
            EVENT_ADAPTER.validate_json(orjson.dumps(e))
            assert e["ts_unix_ns"] >= START
            by_rid[e["request_id"]].append(e["kind"])
        assert all(
            sorted(ks) == ["engine.finished", "gateway.completed", "gateway.received"]
            for ks in by_rid.values()
        )


def _offsets_after(margin_ns: int, quorum: int) -> tuple[dict[int, int], dict[int, int], int]:
    """The data, then the end-of-input requests ``margin_ns`` past its newest event,
    through the worker's core (no wall time): (end of data, safe offsets, dead letters)."""
    w = Workload(instances=4, rate_ev_s=2_000, seeds=2, trace_limit=300)
    offs: dict[int, int] = defaultdict(int)
    items = []
    for p, value, _ in messages(events(w, START), 4, BatchPolicy()):
        items.append((p, offs[p], value))
        offs[p] += 1
    data_end = dict(offs)
    newest = max(ts for _, ts, _ in events(w, START))
    for p, value, _ in sentinels(4, newest + margin_ns, quorum, w.templates()):
        items.append((p, offs[p], value))
        offs[p] += 1
    proc = StreamProcessor("t", JoinConfig(timeout_ms=2_000), window_config=WindowConfig())
    dead = sum(len(proc.process(items[i : i + 100], None).dead) for i in range(0, len(items), 100))
    return data_end, proc.safe_offsets(), dead


QUORUM = ClockConfig().quorum
END = end_margin_ns(WindowConfig().size_ms, WindowConfig().grace_ms)


@pytest.mark.parametrize(
    ("margin_ns", "quorum", "ends"),
    [
        (END, QUORUM, True),
        (5 * 10**9, QUORUM, False),  # within the grace period: the last windows stay open
        (END, 1, False),  # too few events per host to move its mark: the clock stays
        (3_600 * 10**9, QUORUM, True),  # out of range, but every host agrees: a jump
    ],
)
def test_end_of_input_closes_every_partitions_last_windows(
    margin_ns: int, quorum: int, ends: bool
) -> None:
    data_end, safe, dead = _offsets_after(margin_ns, quorum)
    assert dead == 0
    assert (safe == data_end) is ends
    assert all(safe[p] <= end for p, end in data_end.items())


INF = math.inf


@pytest.mark.parametrize(
    ("q", "bounds", "counts", "want"),
    [
        (0.5, [1, 2, INF], [10, 20, 20], 1.0),  # rank 10 lands on the first bucket's top
        (0.75, [1, 2, INF], [10, 20, 20], 1.5),  # linear inside (1, 2]
        (0.25, [1, 2, INF], [10, 20, 20], 0.5),  # lowest bucket interpolates from 0
        (0.99, [1, 2, INF], [0, 0, 10], 2.0),  # rank in +Inf: highest finite bound
        (0.5, [2, 1, INF], [20, 10, 20], 1.0),  # unsorted input is sorted first
        (0.5, [1, 2], [10, 20], math.nan),  # no +Inf bucket
        (0.5, [1, INF], [0, 0], math.nan),  # no observations
        (0.5, [-1, 1, INF], [4, 10, 10], -1 + 2 * (1 / 6)),
        (0.1, [-1, 1, INF], [4, 10, 10], -1.0),  # lowest bound <= 0 is returned as is
        (0.6, [1, 2, 3, INF], [10, 8, 16, 20], 2 + 2 / 6),  # non-monotonic: lifted to 10, 10, 16
        (-0.1, [1, INF], [1, 1], -math.inf),
        (1.1, [1, INF], [1, 1], math.inf),
    ],
)
def test_bucket_quantile_follows_prometheus(
    q: float, bounds: list[float], counts: list[float], want: float
) -> None:
    got = bucket_quantile(q, bounds, counts)
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(want)


def test_histogram_p99_observes_in_seconds_with_inclusive_upper_bounds() -> None:
    # 100 values of exactly 100 ms sit in le=0.1; P99 interpolates inside (0, 0.1].
    assert histogram_p99_ms([100.0] * 100, [0.1, 0.2]) == pytest.approx(99.0)
