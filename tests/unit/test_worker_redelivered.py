"""A lifecycle message delivered again at an offset the partition's state has handled
already is dropped before the processor (no broker): a fetch that came late after its
partition was read again from where the worker stood would otherwise be handled twice,
and a malformed message in it dead-lettered twice."""

from __future__ import annotations

import pytest

from pipeline.adapters.worker_counts import not_handled
from pipeline.core.processor import StreamProcessor


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
    got = not_handled(processor.next_offsets(), [(p, off, b"x") for p, off in delivered])
    assert [(p, off) for p, off, _ in got] == kept


def test_a_partition_whose_state_was_dropped_reads_its_offsets_again() -> None:
    """A rebalance (or a finished generation) drops the state: the offsets it had handled
    are read again from the commit, as they should be."""
    processor = _processor({0: 10})
    processor.revoke([0])
    got = not_handled(processor.next_offsets(), [(0, 4, b"x")])
    assert [(p, off) for p, off, _ in got] == [(0, 4)]
