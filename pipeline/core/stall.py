"""Messages a consumer fetched and never handed over (pure: no I/O, time passed in).

A Kafka consumer's *position* is the next offset it fetches; the worker knows the next
offset it expects to process. The position runs ahead while fetched messages wait in
the client's buffers for the worker, which is busy. But a fetch can also be dropped on
its way (issue 49: Faust drops a batch it fetched while its flow was stopped around a
rebalance, and seeks back only where a commit says), and then nothing tells anybody:
the position stands past messages that will never come, and a partition that receives
nothing new is never read again.

:class:`StallWatch` notices that: a partition whose position has stood past the offset
the worker expects, with the worker idle and the expected offset not moving, for
``after_ms``, is to be read again from the expected offset. Reading again is safe: a
message handed over twice is a duplicate to the join. Busy (a batch in progress, the
store down and the input held back) or paused (Faust's flow control), a partition is
not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

# Long enough that a batch waiting in the client's buffers while the worker is between
# two batches (Faust's take waits 0.1 s) is never taken for a lost one; short enough
# that a lost fetch costs seconds, not the ceiling of whoever waits for it.
STALL_AFTER_MS: Final = 10_000


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition as the consumer and the worker see it."""

    position: int | None  # the consumer's next fetch offset (None: not known yet)
    expected: int  # the next offset the worker expects to process
    paused: bool = False  # the consumer holds it (flow control, a rebalance)


class StallWatch:
    """Per partition, since when its position has stood past the expected offset."""

    def __init__(self, after_ms: int = STALL_AFTER_MS) -> None:
        if after_ms <= 0:
            raise ValueError(f"after_ms must be > 0, got {after_ms}")
        self.after_ms = after_ms
        self._since: dict[int, tuple[int, int]] = {}  # partition -> (first seen ms, expected)

    def observe(
        self, now_ms: int, views: Mapping[int, PartitionView], busy: bool
    ) -> dict[int, int]:
        """``{partition: offset}`` to read again from: those whose position stood past
        the expected offset, unchanged, with the worker not ``busy``, for ``after_ms``
        (each reported once; watched again from then on)."""
        if busy:
            self._since.clear()
            return {}
        back: dict[int, int] = {}
        for p in set(self._since) - set(views):
            del self._since[p]
        for p, v in views.items():
            ahead = v.position is not None and v.position > v.expected and not v.paused
            seen = self._since.get(p)
            if not ahead:
                self._since.pop(p, None)
            elif seen is None or seen[1] != v.expected:  # first seen, or progress made
                self._since[p] = (now_ms, v.expected)
            elif now_ms - seen[0] >= self.after_ms:
                back[p] = v.expected
                del self._since[p]
        return back
