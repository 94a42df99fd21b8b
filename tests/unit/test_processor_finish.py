"""StreamProcessor.finish (issue 49 item 1): a partition whose topic generation is gone is
written out, not forgotten: its pending joins as partial records, its open windows closed
with what they hold; a later generation of the partition never closes those windows a
second time (its records for them are corrections)."""

from __future__ import annotations

from pipeline.contract.codec import encode_batch, encode_event
from pipeline.core.join import JoinConfig
from pipeline.core.processor import StreamProcessor
from pipeline.core.windows import ALL_KEY
from tests.factories import completed, finished, received


def _proc() -> StreamProcessor:
    return StreamProcessor("t", JoinConfig(timeout_ms=60_000))


def test_finish_writes_the_open_windows_and_the_pending_joins_as_partials() -> None:
    p = _proc()
    p.process(
        [
            (0, 0, encode_batch([received("a"), completed("a"), finished("a")])),
            (0, 1, encode_batch([received("b", 10), completed("b", 120)])),  # waits for engine
            (0, 2, encode_event(finished("c", 130))),  # waits for the gateway
            (0, 3, encode_event(received("d", 140))),  # a lone received
            (1, 0, encode_batch([received("e"), completed("e"), finished("e")])),
        ],
        wall_ms=0,
    )
    out, done = p.finish([0, 7])  # 7: no state, nothing to do
    assert sorted(r.request_id for r in out.records) == ["b", "c"]
    assert {r.request_id: r.source for r in out.records} == {
        "b": "gateway_only",
        "c": "engine_only",
    }
    (w,) = [w for w in out.windows if not w.correction]
    assert w.partition == 0
    assert w.records[ALL_KEY] == 3
    assert set(w.ledger) == {"a", "b", "c"}
    assert (done.partitions, done.requests, done.windows, done.partials) == ([0], 3, 1, 2)
    assert not p.has_partition(0)
    assert p.has_partition(1)
    assert p.safe_offsets() == {1: 0}
    assert p.ended_horizon(0) == w.start_ms + w.size_ms
    assert p.ended_horizon(1) == 0


def test_a_new_generation_adds_to_a_finished_window_as_a_correction() -> None:
    p = _proc()
    p.process([(0, 0, encode_batch([received("a"), completed("a"), finished("a")]))], 0)
    out, _ = p.finish([0])
    (closed,) = out.windows
    # the new generation of partition 0, from its first offset: same window, new requests
    p.init_partition(0)
    x = encode_batch([received("x", 50), completed("x"), finished("x")])
    late = p.process([(0, 0, x)], 0).windows + p.tick(10**9).windows
    assert [(w.start_ms, w.correction, w.records[ALL_KEY]) for w in late] == [
        (closed.start_ms, True, 1)
    ]


def test_revoke_keeps_dropping_the_state() -> None:
    """An ordinary rebalance: the next owner rebuilds from the committed offset, so the
    state is dropped (nothing written, no horizon kept)."""
    p = _proc()
    p.process([(0, 0, encode_batch([received("b"), completed("b")]))], 0)
    p.revoke([0])
    assert not p.has_partition(0)
    assert p.ended_horizon(0) == 0


def test_entries_before_an_end_mark_count_by_time_only() -> None:
    """The ledger rule of an ended generation (pipeline.core.ledger.ENDED_THROUGH): its
    entries' ``through`` (offsets of the old generation) say nothing about the new one;
    what it counted last (its finish, the newest windows) is still known by time."""
    from pipeline.contract.ledger import LedgerEntry
    from pipeline.core.ledger import ENDED_THROUGH, counted_since, unpack

    old = LedgerEntry("t", 0, 9_000, {"old": 3}, 10_000)  # the old generation, long ago
    end = LedgerEntry("t", 0, ENDED_THROUGH, {"fin": 1}, 600_000)  # its finish
    new = LedgerEntry("t", 0, 40, {"new": 3}, 610_000)  # the new generation, offset 40
    got = counted_since([old, end, new], "t", 0, 0, 60_000)
    assert {k: unpack(v)[0] for k, v in got.items()} == {"fin": 1, "new": 3}
    # without the mark, the old generation's offsets were taken for the new one's
    assert "old" in counted_since([old, new], "t", 0, 0, 60_000)
    # a restart of the new generation past offset 40: the finish by time, as before
    assert set(counted_since([old, end, new], "t", 0, 50, 60_000)) == {"fin", "new"}
    assert set(counted_since([old, end, new], "t", 0, 50, 1_000)) == {"new"}
