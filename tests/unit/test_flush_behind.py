"""The worker's flush coordination (``FlushBehind.after_batch``): a full buffer starts a
flush that runs behind the next batches; while it runs, batches go on until
``BEHIND_BUFFERS`` x ``flush_max_rows`` records are buffered, and then wait only until a
flush has taken the buffer, not until it is written. The writer is a fake flush that
snapshots the buffer and then waits for its own gate (the writer thread's write)."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.adapters.flush import BEHIND_BUFFERS, FlushBehind

MAX = 10


class _Buffer:
    """The worker's buffered records, as the chain sees them (their count)."""

    def __init__(self) -> None:
        self.rows: list[int] = []


class _Writes:
    """Fake flush: takes the buffer at once, then waits for its gate."""

    def __init__(self, buffer: _Buffer) -> None:
        self.buffer = buffer
        self.chain: FlushBehind | None = None
        self.taken: list[int] = []
        self.gates: list[asyncio.Event] = []
        self.fail_next = False

    async def __call__(self) -> None:
        assert self.chain is not None
        rows, self.buffer.rows = self.buffer.rows, []
        self.chain.took()
        self.taken.append(len(rows))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if self.fail_next:
            raise RuntimeError("store down")


class _Shell:
    """The chain over a buffer and the fake flush (what the worker gives it)."""

    def __init__(self) -> None:
        self.buffer = _Buffer()
        self.writes = _Writes(self.buffer)
        self.chain = FlushBehind(self.writes, lambda: len(self.buffer.rows), MAX)
        self.writes.chain = self.chain


def _shell() -> tuple[_Shell, _Writes]:
    sh = _Shell()
    return sh, sh.writes


async def _settle() -> None:
    """Let every ready task run (no time passes: the fake flushes wait on gates)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def _first_flush_running() -> tuple[_Shell, _Writes]:
    """A shell whose full buffer started a flush that is now being written (gate closed)."""
    sh, writes = _shell()
    sh.buffer.rows = [0] * MAX
    await sh.chain.after_batch()
    await _settle()
    return sh, writes


def _run(coro) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(asyncio.wait_for(coro, 10))


@pytest.mark.parametrize("extra", [MAX, (BEHIND_BUFFERS - 1) * MAX - 1])
def test_a_batch_below_the_bound_does_not_wait_for_the_running_flush(extra: int) -> None:
    async def go() -> None:
        sh, writes = await _first_flush_running()
        assert writes.taken == [MAX]
        sh.buffer.rows += [0] * extra  # full again while the first flush is written
        await sh.chain.after_batch()  # returns at once: the gate is still closed
        assert sh.chain.again
        assert writes.taken == [MAX]
        writes.gates[0].set()
        await _settle()
        assert writes.taken == [MAX, extra]  # the next flush followed at once
        writes.gates[1].set()
        await sh.chain.running  # type: ignore[misc]

    _run(go())


def test_a_batch_at_the_bound_waits_until_a_flush_takes_the_buffer_not_until_written() -> None:
    async def go() -> None:
        sh, writes = await _first_flush_running()
        sh.buffer.rows += [0] * (BEHIND_BUFFERS * MAX)
        batch = asyncio.ensure_future(sh.chain.after_batch())
        await _settle()
        assert not batch.done()  # the bound: it waits
        writes.gates[0].set()  # the first flush is written; the chain takes the buffer
        await batch  # ... and the batch goes on while that one is written
        assert writes.taken == [MAX, BEHIND_BUFFERS * MAX]
        assert not writes.gates[1].is_set()
        assert sh.buffer.rows == []
        writes.gates[1].set()
        await sh.chain.running  # type: ignore[misc]

    _run(go())


def test_a_failed_flush_fails_the_batch_waiting_at_the_bound() -> None:
    async def go() -> None:
        sh, writes = await _first_flush_running()
        sh.buffer.rows += [0] * (BEHIND_BUFFERS * MAX)
        batch = asyncio.ensure_future(sh.chain.after_batch())
        await _settle()
        writes.fail_next = True
        writes.gates[0].set()
        with pytest.raises(RuntimeError, match="store down"):
            await batch

    _run(go())


def test_a_closed_window_while_a_flush_runs_asks_for_the_next_flush() -> None:
    async def go() -> None:
        sh, writes = await _first_flush_running()
        sh.buffer.rows += [0]
        await sh.chain.after_batch(closed=True)
        assert sh.chain.again
        writes.gates[0].set()
        await _settle()
        assert writes.taken == [MAX, 1]
        writes.gates[1].set()
        await sh.chain.running  # type: ignore[misc]

    _run(go())
