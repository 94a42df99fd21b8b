"""The ledger: wire format, merge rules, and what a worker taking a partition over skips."""

from __future__ import annotations

import pytest

from pipeline.contract.codec import encode_event
from pipeline.core.ledger import (
    MAX_IDS_PER_MESSAGE,
    LedgerEntry,
    counted_since,
    decode_ledger,
    encode_ledger,
    merge_versions,
    pack,
)
from pipeline.core.processor import StreamProcessor
from pipeline.core.windows import ALL_KEY, WindowConfig
from tests.factories import completed, finished, received


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
