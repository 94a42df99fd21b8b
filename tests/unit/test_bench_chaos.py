"""The chaos run's pure parts: its seeded fault schedule and its record of acknowledgements."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest

from bench.chaos import plan
from bench.chaos_checks import match_letters, read_positions, split_missing, was_read
from bench.chaos_traffic import Acks
from pipeline.contract.codec import DLQ_OFFSET, DLQ_PARTITION, DLQ_TOPIC_ID


def test_a_seed_fixes_the_schedule_and_every_fault_kind_is_in_it() -> None:
    assert plan(30, 7) == plan(30, 7)
    assert plan(30, 7) != plan(30, 8)
    for minutes in (5, 30, 120):
        faults = plan(minutes, 1)
        kinds = [f.kind for f in faults]
        assert {"broker", "store", "disk", "topic"} <= set(kinds)
        assert kinds.count("kill") == max(1, round(minutes / 6))
        moments = [f.at_s for f in faults]
        assert moments == sorted(moments)
        assert minutes * 60 * 0.1 <= moments[0]
        assert moments[-1] <= minutes * 60 * 0.8
        kills = [f for f in faults if f.kind == "kill"]
        assert kills[0].after_commit  # every other kill right after a commit, the first one too
    assert {f.kind for f in plan(30, 1, ("kill", "disk"))} == {"kill", "disk"}
    assert plan(30, 1, ()) == []


@dataclass
class _Msg:
    doc: object
    topic_: str = "lc"
    partition_: int = 0
    offset_: int = 0

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def value(self) -> bytes:
        return orjson.dumps(self.doc)


def _ev(kind: str, rid: str) -> dict[str, str]:
    return {"kind": kind, "request_id": rid}


def test_a_request_is_expected_once_its_completed_or_finished_event_is_acknowledged() -> None:
    acks = Acks()
    acks.delivered(None, _Msg([_ev("gateway.received", "a"), _ev("gateway.received", "b")]), "lc")
    acks.delivered(None, _Msg(_ev("engine.finished", "a"), partition_=2, offset_=7), "lc")
    acks.delivered(None, _Msg(_ev("gateway.completed", "a"), partition_=2, offset_=9), "lc")
    acks.delivered("broker gone", _Msg(_ev("gateway.completed", "b")), "lc")
    acks.delivered(None, _Msg({"kind": "engine.stats", "host": "e"}, topic_="stats"), "lc")
    assert acks.expected() == {"a"}  # b: only its received event reached the broker
    assert acks.requests == 1
    assert (acks.events_acked, acks.events_failed) == (4, 1)
    acks.generation = 1  # the topic deleted (and created again)
    acks.delivered(None, _Msg(_ev("gateway.completed", "c"), offset_=3), "lc")
    # late callbacks of the deleted topic's acknowledgements: still the old generation's
    acks.delivered(None, _Msg(_ev("gateway.completed", "d"), partition_=2, offset_=10), "lc")
    acks.delivered(None, _Msg(_ev("gateway.completed", "e"), partition_=2, offset_=0), "lc")
    acks.delivered(None, _Msg(_ev("gateway.completed", "f"), partition_=2, offset_=1), "lc")
    # where each request's first terminal event landed: (generation, partition, offset)
    assert acks.first_terminal == {
        "a": (0, 2, 7),
        "c": (0, 0, 3),  # partition 0's first acknowledgement: of the generation it began
        "d": (0, 2, 10),  # acknowledged before the deletion, its callback after it
        "e": (1, 2, 0),  # the offsets started again: the new generation
        "f": (1, 2, 1),
    }


LOG = (
    "... finished from topic lc's generation OLD: partitions [0, 1], 2 windows closed "
    'counting 3 requests, 1 partial records ...; read up to offsets {"0": 10, "1": 4}\n'
    "... finished from topic lc's generation OLD: partitions [1], 0 windows closed "
    'counting 0 requests, 0 partial records ...; read up to offsets {"1": 6}\n'
    "... finished from topic lc's generation ELSEWHERE: partitions [0] ...; "
    'read up to offsets {"0": 99}\n'
)


def test_where_the_worker_stopped_reading_a_deleted_generation_comes_from_its_log() -> None:
    assert read_positions(LOG, {0: "OLD", 1: "NEW"}) == {0: {0: 10, 1: 6}}


@pytest.mark.parametrize(
    ("where", "read"),
    [
        ((0, 0, 9), True),  # before where reading stopped: read
        ((0, 0, 10), False),  # at it: never read
        ((0, 1, 5), True),
        ((0, 2, 0), False),  # a partition the worker held nothing of
        ((1, 0, 10_000), True),  # the current generation: drained to its end
    ],
)
def test_a_message_counts_as_read_before_where_reading_stopped(
    where: tuple[int, int, int], read: bool
) -> None:
    assert was_read(where, 1, {0: {0: 10, 1: 6}}) is read


def test_missing_requests_are_split_into_lost_and_never_read() -> None:
    first = {"a": (0, 0, 9), "b": (0, 0, 10), "c": (1, 3, 0), "d": (0, 1, 100)}
    lost, never = split_missing(["a", "b", "c", "d"], first, 1, {0: {0: 10, 1: 6}})
    assert (lost, never) == (["a", "c"], ["b", "d"])


def _letter(tid: str, p: int, o: int) -> dict[str, str]:
    return {DLQ_TOPIC_ID: tid, DLQ_PARTITION: str(p), DLQ_OFFSET: str(o)}


def test_a_bad_position_needs_one_letter_only_where_the_worker_read_it() -> None:
    bad = [("OLD", 0, 3), ("OLD", 0, 12), ("NEW", 1, 5), ("NEW", 2, 8)]
    letters = [_letter("OLD", 0, 3), _letter("NEW", 1, 5), _letter("NEW", 1, 5), _letter("X", 0, 0)]
    got = match_letters(bad, letters, {0: "OLD", 1: "NEW"}, 1, {0: {0: 10}})
    # read: OLD 0@3 (one letter), NEW 1@5 (two), NEW 2@8 (none); OLD 0@12 never read
    assert (got.acknowledged, got.read, got.one_each, got.unmatched) == (4, 3, 1, 1)
