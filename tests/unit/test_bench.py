"""The benchmark harness's own logic: workload synthesis, the end of input, batching format,
histogram_quantile, the RSS line, the results file."""

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
from bench.memory import growth_pct, least_squares, theil_sen
from bench.results import (
    Figure,
    Measured,
    Section,
    StoredSection,
    at_most,
    merge,
    parse_results,
    render_summary,
    stored,
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


# --- the RSS line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ys", "slope", "intercept"),
    [
        ([100.0 + 2 * x for x in range(20)], 2.0, 100.0),  # a line is its own fit
        ([500.0] * 20, 0.0, 500.0),  # flat
        # a flat series with a few spikes (a collection, a flush): the spikes do not tilt it
        ([500.0 + (300 if x in (3, 11, 17) else 0) for x in range(20)], 0.0, 500.0),
        ([1000.0 - 5 * x + (400 if x == 19 else 0) for x in range(20)], -5.0, 1000.0),
    ],
)
def test_theil_sen_is_the_median_line(ys: list[float], slope: float, intercept: float) -> None:
    xs = [float(x) for x in range(len(ys))]
    got_slope, got_intercept = theil_sen(xs, ys)
    assert got_slope == pytest.approx(slope)
    assert got_intercept == pytest.approx(intercept)


def test_least_squares_is_tilted_by_a_spike_that_theil_sen_ignores() -> None:
    xs = [float(x) for x in range(20)]
    ys = [500.0] * 19 + [900.0]
    assert theil_sen(xs, ys)[0] == 0.0
    assert least_squares(xs, ys)[0] > 1.0


def test_theil_sen_needs_two_distinct_xs() -> None:
    with pytest.raises(ValueError, match="two distinct"):
        theil_sen([1.0, 1.0], [2.0, 3.0])


@pytest.mark.parametrize(
    ("slope", "intercept", "x0", "per", "want"),
    [
        (1.0, 1000.0, 0.0, 600.0, 60.0),  # 600 over a level of 1000
        (1.0, 400.0, 600.0, 600.0, 60.0),  # level taken where the fit starts: 1000
        (0.0, 800.0, 660.0, 600.0, 0.0),
        (-0.5, 1330.0, 660.0, 600.0, -30.0),
    ],
)
def test_growth_is_relative_to_the_level_where_the_fit_starts(
    slope: float, intercept: float, x0: float, per: float, want: float
) -> None:
    assert growth_pct(slope, intercept, x0, per) == pytest.approx(want)


# --- the results file: sections replaced in place, summary rebuilt --------------------------


def _section(key: str, title: str, value: float, when: str) -> StoredSection:
    s = Section(key, title, [at_most(f"{key} figure", value, "ms", 10), Figure("ctx", 1.5, "s")])
    s.text.append(f"about {key}")
    s.measured = Measured(when, "c0ffee" + key, "full", "./tg bench", "1 / 1 / 1", "2 / 2 / 2", 3)
    return stored(s)


ORDER = {"a": 1, "b": 2, "c": 3}
TITLES = {"A title": "a", "B title": "b", "C title": "c"}


def _file(sections: list[StoredSection]) -> str:
    return "\n".join(["# header", "", *render_summary(sections), *(s.markdown() for s in sections)])


def test_a_rerun_section_replaces_its_own_and_keeps_the_others() -> None:
    old = [_section("a", "A title", 5.0, "d1"), _section("b", "B title", 50.0, "d1")]
    text = _file(old)
    assert parse_results(text, TITLES) == old  # what is written reads back the same
    new = [_section("b", "B title", 7.0, "d2"), _section("c", "C title", 70.0, "d2")]
    merged = merge(parse_results(text, TITLES), new, ORDER)
    assert [(s.key, s.measured.date_utc if s.measured else "") for s in merged] == [
        ("a", "d1"),
        ("b", "d2"),
        ("c", "d2"),
    ]
    out = _file(merged)
    summary = out[out.index("## Summary") : out.index("<!--")]
    assert "| A title | a figure | 5.00 ms | ≤ 10 ms | PASS | d1 c0ffeea |" in summary
    assert "| B title | b figure | 7.00 ms | ≤ 10 ms | PASS | d2 c0ffeeb |" in summary
    assert "50.00 ms" not in out  # the old b is gone
    assert "1 target(s) missed: c figure (70.00 ms, target ≤ 10 ms)" in summary
    assert "ctx" not in summary  # figures without a target stay in their section
    assert out.count("_Measured d2 at commit c0ffeeb") == 1


LEGACY = """# tailguard benchmarks

- date: 2026-12-01 01:16 UTC (full mode, 36.5 min)
- command: `./tg bench`
- load average (1/5/15 min) before: 8.49 / 8.47 / 7.47; after: 4.36 / 4.44 / 5.52 — shared
- git commit: 1f763eb4036686e7ee0f6cbff3365b190581c576

## Summary

| section | figure | value | target | status |
|---|---|---:|---|---|
| A title | a figure | 6,108 events/s | ≥ 50,000 events/s | **MISS** |
| B title | b figure | 0.999 % | ≤ 1 % | PASS |

1 target(s) missed: a figure (6,108 events/s, target ≥ 50,000 events/s).

## A title

| figure | value | target | status | note |
|---|---:|---|---|---|
| a figure | 6,108 events/s | ≥ 50,000 events/s | **MISS** | |

_(section took 899 s)_

## B title

text of b

_(section took 35 s)_
"""


def test_a_file_from_before_the_markers_is_read_by_its_headings() -> None:
    got = parse_results(LEGACY, TITLES)
    assert [s.key for s in got] == ["a", "b"]
    a, b = got
    assert a.summary == (("a figure", "6,108 events/s", "≥ 50,000 events/s", "**MISS**"),)
    assert b.summary == (("b figure", "0.999 %", "≤ 1 %", "PASS"),)
    assert a.measured is not None
    assert (a.measured.date_utc, a.measured.commit[:7], a.measured.seconds) == (
        "2026-12-01 01:16 UTC",
        "1f763eb",
        899.0,
    )
    assert a.measured.load_before == "8.49 / 8.47 / 7.47"
    assert "text of b" in b.body
    assert "section took" not in b.body
    merged = merge(got, [_section("b", "B title", 3.0, "d2")], ORDER)
    out = _file(merged)
    assert "| A title | a figure | 6,108 events/s | ≥ 50,000 events/s | **MISS** |" in out
    assert "text of b" not in out
    assert parse_results(out, TITLES) == merged
