"""The ledger: wire format, merge rules, and what a worker taking a partition over skips."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline.contract.codec import encode_event
from pipeline.contract.ledger import MAX_IDS_PER_MESSAGE, LedgerEntry, decode_ledger, encode_ledger
from pipeline.core.eventtime import ClockConfig
from pipeline.core.join import JoinConfig
from pipeline.core.ledger import (
    RETRACTED,
    counted_since,
    ledger_entries,
    merge_versions,
    pack,
    unpack,
)
from pipeline.core.processor import StreamProcessor
from pipeline.core.windows import ALL_KEY, ClosedWindow, WindowConfig
from tests.factories import T0_NS, completed, finished, received


def test_round_trip_and_chunks() -> None:
    versions = {f"r{i}": i % 8 for i in range(MAX_IDS_PER_MESSAGE + 5)}
    entry = LedgerEntry("lc", 3, 120, versions, 10_000)
    raws = list(encode_ledger(entry))
    assert len(raws) == 2
    back: dict[str, int] = {}
    for raw in raws:
        e = decode_ledger(raw)
        assert (e.topic, e.partition, e.through, e.end_ms) == ("lc", 3, 120, 10_000)
        back.update(e.versions)
    assert back == versions


@pytest.mark.parametrize(
    ("have", "more", "want"),
    [
        (1, 3, 3),  # a partial, then its joined record: the joined one
        (3, 1, 3),  # the other way round: still the joined one
        (2, 3, 3),  # joined, then joined with gateway.received
        (4, 1, 1),  # engine-only partial (rev 0), then gateway partial with received (rev 1)
        (1, 4, 1),
        (1, 1 | RETRACTED, 1 | RETRACTED),  # a partial, then its take-back
        (1 | RETRACTED, 3, 3),  # taken back, then the joined record that replaced it
        (3, 1 | RETRACTED, 3),
        (3, 3 | 8, 3 | 8),  # joined, then superseded by a retry
        (3 | 8, 3 | RETRACTED, 3 | 8),
    ],
)
def test_highest_revision_wins(have: int, more: int, want: int) -> None:
    into = {"r": have}
    merge_versions(into, {"r": more})
    assert into == {"r": want}


def test_counted_since_takes_what_may_be_reread_or_repeated() -> None:
    entries = [
        LedgerEntry("lc", 0, 10, {"old": 3}, 1_000),  # before the offset, long ago
        LedgerEntry("lc", 0, 20, {"recent": 3}, 590_000),  # before the offset, in memory
        LedgerEntry("lc", 0, 30, {"reread": 1}, 600_000),  # past the offset
        LedgerEntry("lc", 1, 30, {"other-partition": 3}, 600_000),
        LedgerEntry("other", 0, 30, {"other-topic": 3}, 600_000),
    ]
    got = counted_since(entries, "lc", 0, 25, memory_ms=60_000)
    assert got == {"recent": pack(3, 590_000), "reread": pack(1, 600_000)}


def _msgs(events: list) -> list[tuple[int, int, bytes]]:
    return [(0, i, encode_event(e)) for i, e in enumerate(events)]


@pytest.mark.parametrize(
    ("ledger", "seed_join", "want_net", "want_ids", "want_replayed"),
    [
        ({}, True, 2, {"r1", "r2"}, 0),  # nothing counted before: both counted
        # r1 counted complete: the join takes its events for duplicates
        ({"r1": pack(3, 0)}, True, 1, {"r2"}, 0),
        # the same in a replay (no seeding): r1's record comes out and is skipped
        ({"r1": pack(3, 0)}, False, 1, {"r2"}, 1),
        # r1 counted as a gateway partial (with received): taken back, joined added
        ({"r1": pack(1, 0)}, True, 1, {"r1", "r2"}, 0),
        # r1's partial counted and taken back already (the window holding the take-back
        # was written, the one adding its joined record was not): joined added, no
        # second take-back
        ({"r1": pack(1 | RETRACTED, 0)}, True, 2, {"r1", "r2"}, 0),
    ],
)
def test_a_worker_taking_over_counts_nothing_twice(
    ledger: dict[str, int], seed_join: bool, want_net: int, want_ids: set[str],
    want_replayed: int,
) -> None:  # fmt: skip
    proc = StreamProcessor("t", window_config=WindowConfig(size_ms=10_000, grace_ms=0))
    proc.init_partition(0, ledger, seed_join=seed_join)
    events = []
    for rid, t in (("r1", 0.0), ("r2", 50.0)):
        events += [received(rid, t), finished(rid, t + 90), completed(rid, t + 95)]
    out = proc.process(_msgs(events), wall_ms=None)
    windows = out.windows + proc.drain().windows
    assert sum(w.records.get(ALL_KEY, 0) for w in windows) == want_net
    assert {rid for w in windows for rid in w.ledger} == want_ids
    assert proc.counters.replayed == want_replayed


@pytest.mark.parametrize(
    ("code", "r1_kinds", "want_net"),
    [
        # r1's gateway partial counted, then taken back for an upgrade whose add was never
        # written (its owner stopped): this worker meets only the partial again
        (1 | RETRACTED, ("received", "completed"), 2),
        # ... or the joined record this time
        (1 | RETRACTED, ("received", "finished", "completed"), 2),
        # r1's joined record taken back (superseded by a retry) and the replacement never
        # written: its events are no duplicates of anything the store counts
        (3 | RETRACTED, ("received", "finished", "completed"), 2),
        # for contrast, r1 counted complete and not taken back: not counted again
        (3, ("received", "finished", "completed"), 1),
    ],
)
def test_a_take_back_whose_replacement_was_never_written_leaves_the_request_to_count(
    code: int, r1_kinds: tuple[str, ...], want_net: int
) -> None:
    """The furthest version in the ledger is a take-back: the store holds the add and
    its take-back, net nothing, so the worker taking over counts r1 once, whatever
    version of it the input gives it now (a take-back of a written replacement is never
    the furthest code: the replacement's revision ranks higher)."""
    proc = StreamProcessor("t", window_config=WindowConfig(size_ms=10_000, grace_ms=0))
    proc.init_partition(0, {"r1": pack(code, 10_000)})
    make = {"received": received, "finished": finished, "completed": completed}
    at = {"received": 0.0, "finished": 90.0, "completed": 95.0}
    events = [make[k]("r1", at[k]) for k in r1_kinds]
    events += [received("r2", 50.0), finished("r2", 140.0), completed("r2", 145.0)]
    out = proc.process(_msgs(events), wall_ms=None)
    windows = out.windows + proc.drain().windows
    assert sum(w.records.get(ALL_KEY, 0) for w in windows) == want_net
    assert "r2" in {rid for w in windows for rid in w.ledger}


def test_a_take_back_written_before_its_replacement_is_not_repeated() -> None:
    """Worker 1 writes the window that takes a partial back (a correction: the partial's
    window closed long ago) but stops before the window adding the joined record closes;
    worker 2 resumes at worker 1's safe offset with the ledger of what was written. The
    union of what both wrote counts the request once."""
    cfg = WindowConfig(size_ms=10_000, grace_ms=0)
    events = [
        received("r1", 0.0),
        completed("r1", 95.0),  # the partial: gateway-only, window 0
        *[received(f"f{i}", 30_000.0 + i) for i in range(6)],  # the clock moves on
        *[completed(f"f{i}", 30_010.0 + i) for i in range(6)],
        finished("r1", 31_000.0),  # the late partner: joined record in window 30 s
    ]
    first = StreamProcessor("t", JoinConfig(timeout_ms=1_000), window_config=cfg)
    first.init_partition(0)
    out = first.process(_msgs(events), wall_ms=None)
    written = out.windows  # closed windows (and corrections) only: the open ones are lost
    assert any(w.correction and w.records.get(ALL_KEY, 0) < 0 for w in written)
    ledger: dict[str, int] = {}
    for w in written:
        merge_versions(ledger, {k: pack(code, w.start_ms + 10_000) for k, code in w.ledger.items()})
    resume = first.safe_offsets()[0]
    second = StreamProcessor("t", JoinConfig(timeout_ms=1_000), window_config=cfg)
    second.init_partition(0, ledger)
    rest = _msgs(events)[resume:]
    out2 = second.process(rest, wall_ms=None)
    windows = written + out2.windows + second.drain().windows
    per_window: dict[int, int] = {}
    for w in windows:
        per_window[w.start_ms] = per_window.get(w.start_ms, 0) + w.records.get(ALL_KEY, 0)
    first_window = min(per_window)
    assert per_window[first_window] == 0, per_window  # the partial: added, taken back once
    assert sum(per_window.values()) == 1 + 6 * 1  # r1 once (joined), f0-f5 partials


@dataclass(frozen=True)
class _Win:
    partition: int
    start_ms: int
    ledger: dict[str, int]
    size_ms: int = 10_000


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_one_insert_publishes_the_furthest_version_whatever_the_window_order(
    order: tuple[int, ...],
) -> None:
    wins = [
        _Win(0, 0, {"r": 1}),  # the partial added
        _Win(0, 10_000, {"r": 1 | RETRACTED}),  # taken back (a correction)
        _Win(0, 30_000, {"r": 3, "s": 2}),  # its joined record
    ]
    (entry,) = ledger_entries("lc", [wins[i] for i in order], {0: 42})
    assert (entry.partition, entry.through, entry.end_ms) == (0, 42, 40_000)
    assert dict(entry.versions) == {"r": 3, "s": 2}


def test_a_take_back_lost_after_its_replacement_was_written_is_not_a_double_count() -> None:
    """The mirror of the test above (session 9's double count under a rebalance).

    r1's gateway side is stamped ~30 s ahead of its engine side, so its gateway-only
    partial lands in window 30 s and its joined record in window 0 s. Worker 1 counts
    the partial (window 30 s, closed by wall time) and loses the partition before the
    engine side arrives. Worker 2 re-reads it all: the partial's take-back is for window
    30 s, open in worker 2's fresh state; the joined record is late for window 0 s (a
    correction, written at once). Worker 2 then loses the partition with window 30 s
    still open. Worker 3 resumes with the ledger of everything written. The union of
    what the three wrote counts r1 once: the take-back was written no later than the
    add that replaced it.
    """
    cfg = WindowConfig(size_ms=10_000, grace_ms=0)

    def worker(ledger: dict[str, int] | None = None) -> StreamProcessor:
        proc = StreamProcessor(
            "t", JoinConfig(timeout_ms=1_000), window_config=cfg,
            clock_config=ClockConfig(quorum=1),
        )  # fmt: skip
        proc.init_partition(0, ledger)
        return proc

    events = [
        received("hold", 33_000.0),  # open until the end: holds every commit at offset 0
        received("r1", 34_000.0),
        completed("r1", 35_000.0),
        *[received(f"g{i}", 35_000.0 + 500 * i) for i in range(4)],
        *[completed(f"g{i}", 35_100.0 + 500 * i) for i in range(4)],
        finished("r1", 5_000.0),  # r1's engine side, on the engine's clock
        *[finished(f"e{i}", 12_000.0 + i) for i in range(3)],
        completed("hold", 36_900.0),
    ]
    msgs = _msgs(events)
    written: list[ClosedWindow] = []

    def ledger() -> dict[str, int]:
        out: dict[str, int] = {}
        for w in written:
            merge_versions(out, {k: pack(c, w.start_ms + w.size_ms) for k, c in w.ledger.items()})
        return out

    wall_ms = 1_000_000
    first = worker()
    written += first.process(msgs[:11], wall_ms=wall_ms).windows
    written += first.tick(wall_ms + 5_000).windows  # caught up: wall time closes window 30 s
    assert unpack(ledger()["r1"])[0] == 1  # the gateway partial (with its received)
    resume = first.safe_offsets()[0]
    assert resume == 0

    second = worker(ledger())
    out = second.process(msgs[resume : len(msgs) - 1], wall_ms=None)  # lagging: event time
    assert second.watermarks()[0] < T0_NS // 1_000_000 + 40_000  # window 30 s still open
    written += out.windows  # what it wrote before losing the partition
    resume = second.safe_offsets()[0]
    assert resume == 0

    third = worker(ledger())
    written += third.process(msgs[resume:], wall_ms=None).windows
    written += third.drain().windows
    per_window: dict[int, int] = {}
    for w in written:
        start = w.start_ms - T0_NS // 1_000_000
        per_window[start] = per_window.get(start, 0) + w.records.get(ALL_KEY, 0)
    # r1 once (joined, window 0 s); g0-g3 gateway partials; e0-e2 engine partials; hold
    assert per_window == {0: 1, 10_000: 3, 30_000: 5}, per_window
