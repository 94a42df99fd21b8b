"""The client's attempt on the record (issue 47): gateway.received's ``client_attempt`` and
``logical_request_id`` are carried to ``RequestRecord`` by the record builder and by
the join (the packed in-flight path holds neither: such a received takes the full one)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.contract.wire import from_model
from pipeline.core.record import build_record
from tests.factories import completed, finished, joined, received

# (events the record is built from, client_attempt, logical id, what the record holds)
CASES = [
    ("rcf", 0, None, (0, None)),
    ("rcf", 1, "a", (1, "a")),
    ("rcf", 0, "idem-1", (0, "idem-1")),
    ("rc", 3, "x" * 256, (3, "x" * 256)),
    ("rf", 2, "b", (2, "b")),
    # no gateway.received: nothing tells the attempt
    ("cf", 2, "b", (0, None)),
    ("c", 2, "b", (0, None)),
]


def _events(kinds: str, attempt: int, logical: str | None) -> list[Any]:
    rcv = received("q").model_copy(
        update={"client_attempt": attempt, "logical_request_id": logical}
    )
    out = {"r": rcv, "c": completed("q"), "f": finished("q")}
    return [out[k] for k in kinds]


@pytest.mark.parametrize(("kinds", "attempt", "logical", "want"), CASES)
def test_build_record_carries_the_attempt(
    kinds: str, attempt: int, logical: str | None, want: tuple[Any, Any]
) -> None:
    ev = {e.kind: e for e in _events(kinds, attempt, logical)}
    for wire in (False, True):
        conv = {k: from_model(v) if wire else v for k, v in ev.items()}
        r = build_record("q", conv.get("gateway.received"), conv.get("gateway.completed"),
                         conv.get("engine.finished"))  # fmt: skip
        assert (r.client_attempt, r.logical_request_id) == want


@pytest.mark.parametrize(("kinds", "attempt", "logical", "want"), CASES)
def test_the_join_carries_them(
    kinds: str, attempt: int, logical: str | None, want: tuple[Any, Any]
) -> None:
    events = _events(kinds, attempt, logical)
    for order in (events, events[::-1]):  # the received first (in flight) or last
        recs = joined(order)  # received last: a partial record, then its upgrade
        assert (recs[-1].client_attempt, recs[-1].logical_request_id) == want
