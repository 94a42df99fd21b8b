"""Which source positions were dead-lettered beyond the committed offset (pure: no I/O).

A worker restarted (or handed a partition) re-reads from the committed offset, and would
dead-letter again every bad message between that offset and where the last run got to.
The worker keeps, per lifecycle partition, the positions it has dead-lettered at or after
its committed offset (with when: the DLQ's timestamps), learns those of an earlier run
from the DLQ when it takes a partition, and sends no second letter for one of them. The
commit records from when the DLQ must be read back for its partition (:meth:`scan_from_ms`).
"""

from __future__ import annotations

Position = tuple[int, int | None]  # (offset, which letter of the message: see dead_subposition)


class DeadPositions:
    """Per partition: ``{(offset, index): sent_ms}`` of letters at or after the commit."""

    __slots__ = ("_by_partition",)

    def __init__(self) -> None:
        self._by_partition: dict[int, dict[Position, int]] = {}

    def known(self, partition: int, offset: int, index: int | None) -> bool:
        """True when this position already has its letter on the DLQ."""
        return (offset, index) in self._by_partition.get(partition, {})

    def add(self, partition: int, offset: int, index: int | None, sent_ms: int) -> None:
        """A letter for this position was sent (or found on the DLQ) at ``sent_ms``."""
        at = self._by_partition.setdefault(partition, {})
        at[(offset, index)] = min(sent_ms, at.get((offset, index), sent_ms))

    def committed(self, partition: int, offset: int) -> None:
        """The partition is committed up to ``offset``: positions below it are never
        read again, so they need not be remembered."""
        at = self._by_partition.get(partition)
        if at:
            for pos in [pos for pos in at if pos[0] < offset]:
                del at[pos]

    def scan_from_ms(self, partition: int, offset: int, now_ms: int) -> int:
        """For a commit of ``offset`` made at ``now_ms``: a time from which the DLQ holds
        every letter for a position at or after ``offset`` (letters sent later are
        stamped later)."""
        sent = [
            ms for (off, _i), ms in self._by_partition.get(partition, {}).items() if off >= offset
        ]
        return min([now_ms, *sent])

    def drop(self, partition: int) -> None:
        """The partition was revoked (its next owner reads the DLQ back)."""
        self._by_partition.pop(partition, None)

    def clear(self) -> None:
        self._by_partition.clear()

    def count(self, partition: int) -> int:
        return len(self._by_partition.get(partition, {}))
