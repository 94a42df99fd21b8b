"""What closed windows counted, remembered past the join's memory (pipeline/core/counted.py).

A duplicate that reaches the stream after the join forgot its request (at a random
position far down the stream) must not be counted twice: the windows then equal the
exact count over distinct requests whatever the distance.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.app.replay import replay_file
from pipeline.core.counted import FREEZE_AT, CountedArchive
from pipeline.core.join import JoinConfig
from pipeline.settings import DEFAULT_SLO_SPEC
from pipeline.spec.slo import load_spec_file
from tests.disorder import duplicate, write_layout
from tests.measurement_fixtures import load_events, simulate_jsonl

SPEC = load_spec_file(DEFAULT_SLO_SPEC)


@pytest.mark.parametrize(
    ("adds", "key", "want"),
    [
        ([], "a", None),
        ([({"a": 1}, 10)], "a", 1),
        ([({"a": 1}, 10)], "b", None),
        # the furthest version wins (code_order), whatever the order windows arrive in
        ([({"a": 1}, 10), ({"a": 0}, 20)], "a", 1),
        ([({"a": 0}, 10), ({"a": 1}, 20)], "a", 1),
        # the same order (one side's partial, then the other's): the later window's
        ([({"a": 5}, 10), ({"a": 1}, 20)], "a", 1),
        # a take-back (RETRACTED, 16) ranks above the version it takes back
        ([({"a": 1}, 10), ({"a": 17}, 20)], "a", 17),
    ],
)
def test_lookup_table(adds: list[tuple[dict[str, int], int]], key: str, want: int | None) -> None:
    arch = CountedArchive(ttl_ms=1_000, max_entries=100)
    for ledger, end_ms in adds:
        arch.add(ledger, end_ms)
    assert arch.get(key) == want


@pytest.mark.parametrize(
    ("ttl_ms", "max_entries", "now_ms", "kept"),
    [
        (1_000, 10**7, 0, True),
        (1_000, 10**7, FREEZE_AT + 998, True),  # the generation ended at FREEZE_AT - 1
        (1_000, 10**7, FREEZE_AT + 999, False),  # ttl after its newest window
        (10**9, FREEZE_AT - 1, 0, False),  # over max_entries: the oldest goes first
        (0, 10**7, 0, False),  # disabled
        (1_000, 0, 0, False),  # disabled
    ],
)
def test_expiry_table(ttl_ms: int, max_entries: int, now_ms: int, kept: bool) -> None:
    arch = CountedArchive(ttl_ms=ttl_ms, max_entries=max_entries)
    # one whole generation (frozen into arrays), then one entry in the dict
    for i in range(FREEZE_AT):
        arch.add({f"r{i}": 3}, i)
    arch.add({"newest": 3}, FREEZE_AT)
    arch.expire(now_ms)
    assert (arch.get("r7") == 3) is kept
    assert (arch.get(f"r{FREEZE_AT - 1}") == 3) is kept
    if arch.enabled:
        assert arch.get("newest") == 3  # the newest entries are never the ones dropped


def test_negative_bounds_are_a_config_error() -> None:
    with pytest.raises(ValueError, match="counted_ttl_ms"):
        JoinConfig(counted_ttl_ms=-1)
    with pytest.raises(ValueError, match="max_counted"):
        JoinConfig(max_counted=-1)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    path = tmp_path_factory.mktemp("counted") / "events.jsonl"
    simulate_jsonl(path, seed=5, limit=2000)  # ~6 minutes of event time
    return load_events(path)


def _window_totals(path: Path, join: JoinConfig) -> tuple[dict, dict, dict]:
    """What the windows count (what the store's window tables hold): per boundary, per
    SLO (total, good); and the replay's counters."""
    result = replay_file(path, join, spec=SPEC)
    per_boundary: dict[str, int] = {}
    per_slo: dict[str, tuple[int, int]] = {}
    for w in result.windows:
        for (_, boundary), cols in w.sketches.items():
            per_boundary[boundary] = per_boundary.get(boundary, 0) + cols.count
        for row in w.slos.rows() if w.slos is not None else ():
            t, g = per_slo.get(row.slo, (0, 0))
            per_slo[row.slo] = (t + row.total, g + row.good)
    return per_boundary, per_slo, result.summary()["windows"]


@pytest.mark.parametrize(
    ("resolved_ttl_ms", "counted_ttl_ms", "exact"),
    [
        (600_000, 86_400_000, True),  # every duplicate within the join's memory
        (30_000, 86_400_000, True),  # most of them beyond it: the archive knows them
        (30_000, 0, False),  # no archive: the old double count (the test can fail)
    ],
)
def test_duplicates_beyond_the_joins_memory_are_not_counted_twice(
    tmp_path: Path, base: list[dict], resolved_ttl_ms: int, counted_ttl_ms: int, exact: bool
) -> None:
    clean = tmp_path / "clean.jsonl"
    dup = tmp_path / "dup.jsonl"
    write_layout(clean, base, "lines")
    # 5 % of the events again, each anywhere after its original (minutes later)
    write_layout(dup, duplicate(base, 0.05, seed=11), "arrays", seed=3)
    join = JoinConfig(resolved_ttl_ms=resolved_ttl_ms, counted_ttl_ms=counted_ttl_ms)
    want_b, want_s, _ = _window_totals(clean, JoinConfig())
    got_b, got_s, counters = _window_totals(dup, join)
    assert (got_b, got_s) == (want_b, want_s) if exact else (got_b, got_s) != (want_b, want_s)
    if exact and resolved_ttl_ms < 600_000:
        assert counters["counted_before_records"] > 0  # the archive answered
