"""The processor's per-watermark work (issue 14, session 7) against its reference.

The processor's partitions (``_PartitionState.advance_to``) look up only the terminal
events that can hold a window the close horizon reaches
(``Joiner.oldest_terminal_before``), and the join keeps first
terminal events and their partners' deadlines in time buckets until event time nears
them (most are joined and dropped unseen). The reference below is the processor before
that: every watermark move asks for the exact oldest terminal event, and its joins take
the general path (every deadline and terminal event pushed on a heap at once). On messy
traffic (hosts out of step, duplicates, lost and late partners, events far ahead, small
timeouts and windows, evictions, idle wall time) both give the same records, windows,
dead letters, offsets and counters, call by call.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.core.join_timers as timers_module
from pipeline.core.join import Joiner
from pipeline.core.processor import Output, StreamProcessor, _PartitionState
from tests.messy_steps import QUORUM, TRAFFIC, configs, run_steps, steps_of, traffic


class _GeneralJoiner(Joiner):
    _fast = False


@dataclass(slots=True)
class _ReferencePartition(_PartitionState):
    def advance_to(self, now: int, wall_ms: int | None, out: Output) -> None:
        for emitted in self.joiner.advance_emitted(now, wall_ms):
            self.window(emitted, out)
        self.closed(self.windows.close(now, self.joiner.oldest_terminal_ms()), now, out)


class _Reference(StreamProcessor):
    def init_partition(
        self, partition: int, ledger: dict[str, int] | None = None, *, seed_join: bool = True
    ) -> None:
        super().init_partition(partition, ledger, seed_join=seed_join)
        st = self._parts[partition]
        ref = _ReferencePartition(**{f.name: getattr(st, f.name) for f in fields(st)})
        ref.joiner = _GeneralJoiner(self.join_config)
        self._parts[partition] = ref


def _run(cls: type[StreamProcessor], steps: list[Any], configs: tuple[Any, ...]) -> list[Any]:
    join, windows, clock = configs
    p = cls("t", join, window_config=windows, clock_config=clock, max_pending=join.max_pending)
    return run_steps(p, steps)


@given(
    *TRAFFIC,
    st.sampled_from([4, 10_000]),  # max_pending
    st.sampled_from([(500, 0), (1_000, 300), (500, 2_000), (2_000, 3_000)]),  # size, grace
    QUORUM,
    st.sampled_from([(5, 4), (14, 12)]),  # bucket bits: in flight, terminal events
    st.randoms(use_true_random=False),
)
@settings(max_examples=150, deadline=None)
def test_processor_equals_its_reference_on_messy_traffic(  # noqa: PLR0917
    requests: list[Any], late_ms: int, per_call: int, wall_step: int | None, timeout_ms: int,
    max_pending: int, window: tuple[int, int], quorum: int, bits: tuple[int, int], rnd: Any,
) -> None:  # fmt: skip
    steps = steps_of(traffic(requests, late_ms), per_call, wall_step, rnd)
    drawn = configs(timeout_ms, window, quorum, max_pending)
    saved = timers_module._BUCKET_BITS, timers_module._TERMINAL_BITS
    timers_module._BUCKET_BITS, timers_module._TERMINAL_BITS = bits  # type: ignore[misc]
    try:
        assert _run(StreamProcessor, steps, drawn) == _run(_Reference, steps, drawn)
    finally:
        timers_module._BUCKET_BITS, timers_module._TERMINAL_BITS = saved  # type: ignore[misc]
