"""WorkerShell.on_revoked (issue 49 item 1): an ordinary rebalance drops the revoked
partitions' state (the next owner rebuilds it from the committed offset: writing it here
would count it twice); a revocation because the topic generation is gone (deleted, or
deleted and created again) finishes it and writes it in the revocation's flush, before
the group assigns the new generation (no broker: the topic id is the test's)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from faust.types import TP

from pipeline.adapters.flush import Flush
from pipeline.adapters.worker import WorkerShell
from pipeline.contract.codec import encode_batch
from pipeline.core.join import JoinConfig
from pipeline.core.ledger import ENDED_THROUGH
from pipeline.core.processor import StreamProcessor
from pipeline.core.windows import ALL_KEY
from tests.factories import completed, finished, received
from tests.flush_fakes import fake_shell
from tests.unit.test_flush_yield import _Input


class _Commits:
    def __init__(self) -> None:
        self.committed: dict[int, int] = {}
        self.resume_at: dict[int, int] = {}
        self.gone: list[list[int]] = []

    def floored(self, offsets: dict[int, int]) -> dict[int, int]:
        return offsets

    def changed(self, _offsets: dict[int, int]) -> dict[int, int]:
        return {}  # nothing to commit here

    def revoked(self, _parts: list[int]) -> None:
        pass

    def generation_gone(self, parts: list[int]) -> None:
        self.gone.append(list(parts))


def _shell(topic_id: str | None) -> tuple[WorkerShell, list[Flush]]:
    processor = StreamProcessor("t", JoinConfig(timeout_ms=60_000))
    written: list[Flush] = []

    def write(flush: Flush, *, hurry: Any) -> Any:
        written.append(flush)
        return 0, []

    sh = fake_shell(
        processor,
        write,
        topic_ids=lambda: topic_id,
        lifecycle_input=_Input({0: 0, 1: 0}),
        commits=_Commits(),
    )
    for p in (0, 1):
        processor.init_partition(p)
    # Partition 0: one request joined (in an open window), one waiting for its partner.
    out = processor.process(
        [
            (0, 0, encode_batch([received("a"), completed("a"), finished("a")])),
            (0, 1, encode_batch([received("b"), completed("b")])),
            (1, 0, encode_batch([received("c"), completed("c"), finished("c")])),
        ],
        wall_ms=int(time.time() * 1000),  # (the flush's clock: nothing times out before)
    )
    sh._collect(out)  # as on_batch does
    return sh, written


def _revoke(sh: WorkerShell, *parts: int) -> None:
    asyncio.run(asyncio.wait_for(sh.on_revoked({TP("t", p) for p in parts}), 10))


def test_an_ordinary_rebalance_drops_the_state() -> None:
    sh, written = _shell("generation-1")  # the topic is still the assigned generation
    _revoke(sh, 0)
    assert not sh.processor.has_partition(0)
    assert sh.processor.has_partition(1)
    assert not [w for f in written for w in f.windows]
    assert not [r for f in written for r in f.records if r.request_id == "b"]
    assert sh.processor.ended_horizon(0) == 0
    assert sh.counts.finished_requests == 0
    assert all(ENDED_THROUGH not in f.through.values() for f in written)


@pytest.mark.parametrize("now", [None, "generation-2"], ids=["deleted", "created-again"])
def test_a_gone_generation_is_finished_and_written(
    now: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    sh, written = _shell(now)
    with caplog.at_level(logging.WARNING, logger="tailguard.worker"):
        _revoke(sh, 0, 1)
    assert not sh.processor.has_partition(0)
    assert not sh.processor.has_partition(1)
    windows = [w for f in written for w in f.windows]
    assert sorted((w.partition, w.records[ALL_KEY]) for w in windows) == [(0, 2), (1, 1)]
    records = {r.request_id: r.source for f in written for r in f.records}
    assert records == {"a": "joined", "b": "gateway_only", "c": "joined"}
    # their ledger's ``through`` marks the generation ended (pipeline.core.ledger)
    assert all(f.through[w.partition] == ENDED_THROUGH for f in written for w in f.windows)
    c = sh.counts
    assert (c.finished_requests, c.finished_windows, c.finished_partials) == (3, 2, 1)
    assert sh.counts.health(0, sh.input)["generation_finished_partials"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "finished from topic" in r.getMessage()]
    assert "partitions [0, 1], 2 windows closed counting 3 requests, 1 partial" in line
    # where reading stopped: whatever the generation held from there on was never read
    assert line.endswith('read up to offsets {"0": 2, "1": 1}')
