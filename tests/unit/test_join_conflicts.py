"""Conflicting terminal events (issue 36 item 5; ``pipeline.core.join``, "Conflicts"):
same request, another event id, other content. Kept as a conflict -- counted, flagged on
the record, resolved to the worse event whatever the order -- and a late one corrects the
record already emitted (taken back and replaced, like a late partner's upgrade). True
duplicates (the same id, or the same content under another id) stay duplicates."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contract.wire import from_model
from pipeline.core.join import Emitted, JoinConfig, Joiner, worse_terminal
from pipeline.core.record import store_version
from tests.factories import completed, finished, received

OK = completed("r", total_ms=100.0)
OK_OTHER_ID = completed("r", total_ms=100.0, eid="r:c2")  # same content: a duplicate
ERROR_500 = completed("r", total_ms=90.0, ttfb_ms=None, outcome="error", http_status=500,
                      eid="r:c3")  # fmt: skip
SLOW_OK = completed("r", total_ms=900.0, eid="r:c4")
ABORT = completed("r", total_ms=80.0, outcome="client_abort", http_status=0, eid="r:c5")
FIN = finished("r")
FIN_ERROR = finished("r", eid="r:f2").model_copy(update={"finish_reason": "error"})
FIN_SLOW = finished("r", decode_ms=700.0, eid="r:f3")


class _General(Joiner):
    _fast = False


def _feed(events: list[Any], joiner: Joiner | None = None) -> tuple[Joiner, list[Emitted]]:
    j = joiner or Joiner(JoinConfig(timeout_ms=1_000))
    out = [e for i, ev in enumerate(events) if (e := j.add_emitted(ev, i)) is not None]
    return j, out


# (case, events, outcome, gateway total, finish reason, conflicts, duplicates)
CASES = [
    ("same-id-is-a-duplicate", [OK, OK, FIN], "ok", 100.0, "stop", 0, 1),
    ("same-content-other-id-is-a-duplicate", [OK, OK_OTHER_ID, FIN], "ok", 100.0, "stop", 0, 1),
    ("error-beats-ok", [OK, ERROR_500, FIN], "error", 90.0, "stop", 1, 0),
    ("error-beats-ok-either-order", [ERROR_500, OK, FIN], "error", 90.0, "stop", 1, 0),
    ("error-beats-abort", [ABORT, ERROR_500, FIN], "error", 90.0, "stop", 1, 0),
    ("abort-beats-ok", [OK, ABORT, FIN], "client_abort", 80.0, "stop", 1, 0),
    ("slower-ok-beats-ok", [OK, SLOW_OK, FIN], "ok", 900.0, "stop", 1, 0),
    ("three-completions", [SLOW_OK, OK, ERROR_500, OK, FIN], "error", 90.0, "stop", 2, 1),
    ("engine-error-beats-stop", [FIN, FIN_ERROR, OK], "ok", 100.0, "error", 1, 0),
    ("slower-engine-run", [FIN_SLOW, FIN, OK], "ok", 100.0, "stop", 1, 0),
]


@pytest.mark.parametrize(
    ("events", "outcome", "total", "reason", "conflicts", "duplicates"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
@pytest.mark.parametrize("cls", [Joiner, _General], ids=["fast", "general"])
def test_a_conflict_keeps_the_worse_event_and_is_flagged(  # noqa: PLR0917
    cls: type[Joiner], events: list[Any], outcome: str, total: float, reason: str,
    conflicts: int, duplicates: int,
) -> None:  # fmt: skip
    j, out = _feed([received("r"), *events], cls(JoinConfig(timeout_ms=1_000)))
    (e,) = out  # one record: the conflicts came before it was complete
    rec = e.record
    assert (rec.outcome, rec.gateway_total_ms, rec.finish_reason) == (outcome, total, reason)
    assert rec.conflicts == conflicts
    assert (j.counters.conflicts, j.counters.duplicates) == (conflicts, duplicates)
    assert j.counters.conflicts_corrected == 0


@pytest.mark.parametrize("wire", [False, True], ids=["model", "wire"])
def test_a_late_conflict_corrects_the_emitted_record(wire: bool) -> None:
    """ok, joined and emitted; then a gateway.completed error 500 (another id): the record
    is corrected (the ok one taken back), flagged, and ranks above it in the store."""
    conv = from_model if wire else (lambda ev: ev)
    j, out = _feed([conv(ev) for ev in (received("r"), OK, FIN, ERROR_500, ERROR_500, OK)])
    first, fix = out
    assert (first.record.outcome, first.record.conflicts) == ("ok", 0)
    assert fix.upgrade
    assert fix.previous == first.record  # what the windows take back
    assert (fix.record.outcome, fix.record.http_status, fix.record.conflicts) == ("error", 500, 1)
    assert fix.record.version > first.record.version  # the store keeps the correction
    assert fix.record.version == store_version(3, False, True)
    c = j.counters
    assert (c.conflicts, c.conflicts_corrected, c.duplicates) == (1, 1, 2)


def test_a_late_conflict_that_is_better_still_flags_the_record() -> None:
    """A faster ok after an emitted slow one: the record keeps the slow one's values, but
    is re-emitted flagged (the windows' counts are unchanged: taken back and re-added)."""
    _, out = _feed([received("r"), SLOW_OK, FIN, OK])
    first, fix = out
    assert fix.previous == first.record
    assert fix.record.gateway_total_ms == 900.0
    assert fix.record.conflicts == 1


def test_a_late_conflict_corrects_a_partial_record() -> None:
    j = Joiner(JoinConfig(timeout_ms=1_000))
    _feed([received("r"), OK], j)
    (partial,) = j.advance_emitted(10_000_000_000_000)
    assert partial.record.source == "gateway_only"
    fix = j.add_emitted(ERROR_500, 9)
    assert fix is not None
    assert fix.previous == partial.record
    assert (fix.record.source, fix.record.outcome, fix.record.conflicts) == (
        "gateway_only", "error", 1,
    )  # fmt: skip


def test_after_conflict_ttl_a_late_conflict_counts_as_a_duplicate() -> None:
    """The documented limit: a joined request's events are kept conflict_ttl_ms."""
    config = JoinConfig(timeout_ms=1_000, conflict_ttl_ms=2_000)
    j, _ = _feed([received("r"), OK, FIN], Joiner(config))
    t_ms = FIN.ts_unix_ns // 1_000_000
    j.advance_emitted(t_ms + 1_999)
    assert j.add_emitted(SLOW_OK, 3) is not None  # within: corrected
    j.advance_emitted(t_ms + 2_000)
    assert j.add_emitted(ERROR_500, 4) is None  # beyond: the join holds no events
    assert (j.counters.conflicts_corrected, j.counters.duplicates) == (1, 1)


def test_conflict_ttl_is_at_most_the_resolved_memory() -> None:
    with pytest.raises(ValueError, match="conflict_ttl_ms"):
        JoinConfig(conflict_ttl_ms=-1)
    assert JoinConfig(resolved_ttl_ms=1_000, conflict_ttl_ms=2_000).conflict_keep_ms == 1_000
    j, _ = _feed([received("r"), OK, FIN], Joiner(JoinConfig(conflict_ttl_ms=0)))
    assert j.add_emitted(ERROR_500, 3) is None  # nothing kept: counted as a duplicate
    assert j.counters.duplicates == 1


@pytest.mark.parametrize(
    ("a", "b"),
    [(ERROR_500, OK), (ERROR_500, ABORT), (ABORT, OK), (SLOW_OK, OK), (FIN_ERROR, FIN),
     (FIN_SLOW, FIN), (OK_OTHER_ID, OK)],  # the last: equal but for the id (tie-break)
)  # fmt: skip
def test_worse_terminal_is_a_strict_order(a: Any, b: Any) -> None:
    assert worse_terminal(a, b)
    assert not worse_terminal(b, a)
    assert not worse_terminal(a, a)


TERMINALS = [OK, OK_OTHER_ID, ERROR_500, SLOW_OK, ABORT, FIN, FIN_ERROR, FIN_SLOW]


@given(st.lists(st.sampled_from(TERMINALS), min_size=1, max_size=7), st.randoms())
@settings(max_examples=200, deadline=None)
def test_the_final_record_does_not_depend_on_the_order(events: list[Any], rnd: Any) -> None:
    """Whatever order the events come in (the conflicts before or after the record), the
    last record emitted is the same: the worst completion and engine run, the same flag
    count. Counts (windows) follow: every correction names the record it replaces."""
    shuffled = list(events)
    rnd.shuffle(shuffled)
    finals = []
    for evs in (events, shuffled):
        j = Joiner(JoinConfig(timeout_ms=1_000))
        _, out = _feed([received("r"), *evs], j)
        out += j.drain_emitted()
        for prev, nxt in itertools.pairwise(out):
            assert nxt.previous == prev.record  # each one replaces the one before
        finals.append(out[-1].record)
    assert finals[0] == finals[1]
