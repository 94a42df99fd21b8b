"""A lifecycle message delivered again at an offset the partition's state has handled
already, on a partition the stall guard read again, is dropped before the processor (no
broker): a fetch that came late after its partition was read again from where the
worker stood would otherwise be handled twice, and a malformed message in it
dead-lettered twice. On other partitions nothing is dropped: a topic created again
restarts its offsets below what the old generation's state handled."""

from __future__ import annotations

import pytest

from pipeline.adapters.worker_counts import not_handled
from pipeline.contract.codec import encode_batch
from pipeline.core.processor import StreamProcessor
from tests.factories import received


def _processor(handled: dict[int, int]) -> StreamProcessor:
    """A processor whose partitions handled every offset below ``handled[p]``."""
    processor = StreamProcessor("lc")
    for p, next_offset in handled.items():
        processor.init_partition(p)
        processor._parts[p].next_offset = next_offset  # as if it had handled up to there
    return processor


@pytest.mark.parametrize(
    ("handled", "delivered", "kept"),
    [
        ({}, [(0, 0), (0, 1)], [(0, 0), (0, 1)]),  # nothing handled: every offset passes
        ({0: 3}, [(0, 0), (0, 2), (0, 3), (0, 4)], [(0, 3), (0, 4)]),  # late fetch of 0..2
        ({0: 3}, [(1, 0), (1, 1)], [(1, 0), (1, 1)]),  # another partition: its own offsets
        ({0: 3, 1: 1}, [(1, 0), (0, 5), (1, 1)], [(0, 5), (1, 1)]),  # in the order given
        ({0: 0}, [(0, 0)], [(0, 0)]),  # a state that handled nothing yet
    ],
)
def test_messages_at_handled_offsets_are_dropped(
    handled: dict[int, int], delivered: list[tuple[int, int]], kept: list[tuple[int, int]]
) -> None:
    processor = _processor(handled)
    rereading = set(handled)
    got = not_handled(processor.next_offsets(), [(p, off, b"x") for p, off in delivered], rereading)
    assert [(p, off) for p, off, _ in got] == kept
    # a partition past its duplicates is no longer filtered
    assert rereading == {p for p in handled if p not in {q for q, _ in kept}}


def test_partitions_not_read_again_pass_whatever_their_offsets() -> None:
    """A topic created again: the new generation's first offsets, below what the old
    state handled, reach the processor (the worker notices the generation after)."""
    processor = _processor({0: 50, 1: 50})
    delivered = [(0, 0, b"x"), (1, 3, b"x")]
    assert not_handled(processor.next_offsets(), delivered, set()) == delivered
    assert not_handled(processor.next_offsets(), delivered, {1}) == [(0, 0, b"x")]


def test_a_partition_whose_state_was_dropped_reads_its_offsets_again() -> None:
    """A rebalance (or a finished generation) drops the state: the offsets it had handled
    are read again from the commit, as they should be."""
    processor = _processor({0: 10})
    processor.revoke([0])
    got = not_handled(processor.next_offsets(), [(0, 4, b"x")], {0})
    assert [(p, off) for p, off, _ in got] == [(0, 4)]


def test_a_lower_offset_never_moves_the_next_offset_back() -> None:
    """A new topic generation's message fetched at the old positions before the worker
    noticed (offsets restart at 0): handled, but where the old generation's reading stood
    stays its next offset (what its finish reports as read)."""
    processor = StreamProcessor("lc")
    processor.init_partition(0)
    message = encode_batch([received("r1")])
    processor.process([(0, 40, message)], 0, set())
    assert processor.next_offsets() == {0: 41}
    processor.process([(0, 3, encode_batch([received("r2")]))], 0, set())
    assert processor.next_offsets() == {0: 41}
