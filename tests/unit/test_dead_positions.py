"""One dead letter per source position across restarts (pipeline/core/dead_positions.py)."""

from __future__ import annotations

from pipeline.core.dead_positions import DeadPositions


def test_a_position_with_a_letter_is_known_until_committed_past() -> None:
    d = DeadPositions()
    d.add(0, 10, None, 1_000)
    d.add(0, 12, 3, 1_500)
    d.add(1, 10, None, 2_000)
    assert d.known(0, 10, None)
    assert d.known(0, 12, 3)
    assert not d.known(0, 12, None)  # another element of that message
    assert not d.known(1, 12, 3)  # another partition
    d.committed(0, 11)
    assert not d.known(0, 10, None)  # below the commit: never read again
    assert d.known(0, 12, 3)
    assert d.known(1, 10, None)


def test_the_scan_starts_at_the_earliest_letter_at_or_after_the_commit() -> None:
    d = DeadPositions()
    d.add(0, 5, None, 1_000)
    d.add(0, 20, None, 3_000)
    d.add(0, 30, None, 2_000)
    assert d.scan_from_ms(0, 0, now_ms=9_000) == 1_000
    assert d.scan_from_ms(0, 6, now_ms=9_000) == 2_000
    assert d.scan_from_ms(0, 31, now_ms=9_000) == 9_000  # none: letters sent from now on
    assert d.scan_from_ms(1, 0, now_ms=9_000) == 9_000


def test_the_first_time_a_position_was_sent_is_kept() -> None:
    d = DeadPositions()
    d.add(0, 5, None, 2_000)
    d.add(0, 5, None, 1_000)  # found on the DLQ, sent earlier
    d.add(0, 5, None, 3_000)
    assert d.scan_from_ms(0, 0, now_ms=9_000) == 1_000


def test_a_revoked_partition_is_forgotten() -> None:
    d = DeadPositions()
    d.add(0, 5, None, 1)
    d.add(1, 5, None, 1)
    d.drop(0)
    assert not d.known(0, 5, None)
    assert d.count(1) == 1
    d.clear()
    assert d.count(1) == 0
