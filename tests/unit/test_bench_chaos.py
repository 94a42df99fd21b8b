"""The chaos run's pure parts: its seeded fault schedule and its record of acknowledgements."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from bench.chaos import Acks, plan


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

    def topic(self) -> str:
        return self.topic_

    def value(self) -> bytes:
        return orjson.dumps(self.doc)


def _ev(kind: str, rid: str) -> dict[str, str]:
    return {"kind": kind, "request_id": rid}


def test_a_request_is_expected_once_its_completed_or_finished_event_is_acknowledged() -> None:
    acks = Acks()
    acks.delivered(None, _Msg([_ev("gateway.received", "a"), _ev("gateway.received", "b")]), "lc")
    acks.delivered(None, _Msg(_ev("engine.finished", "a")), "lc")
    acks.delivered(None, _Msg(_ev("gateway.completed", "a")), "lc")
    acks.delivered("broker gone", _Msg(_ev("gateway.completed", "b")), "lc")
    acks.delivered(None, _Msg({"kind": "engine.stats", "host": "e"}, topic_="stats"), "lc")
    assert acks.expected() == {"a"}  # b: only its received event reached the broker
    assert acks.requests == 1
    assert (acks.events_acked, acks.events_failed) == (4, 1)
    acks.generation = 1  # the topic deleted: later acknowledgements are the new topic's
    acks.delivered(None, _Msg(_ev("gateway.completed", "c")), "lc")
    assert acks.gen_of == {"a": 0, "c": 1}
