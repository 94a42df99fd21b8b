"""A write of windows that fails after window_sketches took its rows (injected in the engine:
a view's target rejects the insert) still lands in every rollup, exactly once: retried, or
cut short (the process killed, a replay that failed) and set right at the next start."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.adapters.store import (
    PartialWriteInjectingStore,
    migrate,
    open_store,
    write_windows,
)
from pipeline.adapters.store.rollups import check_rollups, repair_rollups, write_windows_repairing
from pipeline.app.replay import replay_file
from pipeline.cli import main
from pipeline.core.windows import ClosedWindow
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from pipeline.spec.slo import load_spec_file
from tests.measurement_fixtures import simulate_jsonl
from tools.dev.fault_checks import rollup_drift

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory) -> list[ClosedWindow]:
    events = tmp_path_factory.mktemp("events") / "events.jsonl"
    simulate_jsonl(events, seed=5, limit=3000)
    wins = replay_file(events, spec=load_spec_file(DEFAULT_SLO_SPEC)).windows
    assert len(wins) > 20
    return wins


def _open(tmp_path: Path, flag: Path) -> PartialWriteInjectingStore:
    store = open_store(Settings(store_dir=tmp_path / "store", fault_store_partial_file=flag))
    assert isinstance(store, PartialWriteInjectingStore)
    migrate(store)
    return store


@pytest.mark.parametrize("blocked", ["slo_windows", "latency_1m", "latency_1h", "slo_1h"])
def test_a_write_killed_between_the_base_table_and_a_view_is_set_right_at_start(
    tmp_path: Path, windows: list[ClosedWindow], blocked: str
) -> None:
    flag = tmp_path / "partial"
    half = len(windows) // 2
    store = _open(tmp_path, flag)
    write_windows(store, windows[:half], "t", 0.01, "tok-1", through_offsets={0: 1})
    assert rollup_drift(store) == {}
    flag.write_text(f"{blocked}\n")
    with pytest.raises(Exception, match="VIOLATED_CONSTRAINT"):
        write_windows(store, windows[half:], "t", 0.01, "tok-2", through_offsets={0: 1})
    # a real partial write: the base table took every row, the blocked rollup did not
    db = store.database
    n = store.query_rows(
        f"SELECT sum(records) FROM {db}.window_sketches WHERE boundary = '__slo__'"
    )
    assert int(n[0][0]) == sum(w.records.get(("*", "*", "*"), 0) for w in windows)
    short = rollup_drift(store)
    assert short, "the injected failure left every rollup whole"
    store.close()  # killed: the write is never retried (the windows are never emitted again)

    flag.unlink()
    store = _open(tmp_path, flag)  # the next start
    try:
        first = check_rollups(store)
        assert first.total > 0
        assert rollup_drift(store) == {}, short
        assert repair_rollups(store).total == 0  # nothing left anywhere, nothing added twice
    finally:
        store.close()


def test_a_write_retried_through_a_partial_failure_lands_once(
    tmp_path: Path, windows: list[ClosedWindow], caplog: pytest.LogCaptureFixture
) -> None:
    """Retried with its token: the engine pushes the retry to the views that missed it
    (deduplicate_blocks_in_dependent_materialized_views), and the repair that follows the
    failure finds nothing to add (it adds nothing twice)."""
    flag = tmp_path / "partial"
    store = _open(tmp_path, flag)
    flag.write_text("latency_1h\nslo_1m\n")
    failures: list[str] = []

    def retry(fn: Callable[[], None], what: str) -> int:
        for n in range(5):
            try:
                fn()
            except Exception as exc:
                failures.append(f"{what}: {exc}")
                if n == 1:
                    flag.unlink()  # the disk has room again
            else:
                return n
        raise AssertionError("never landed")

    try:
        with caplog.at_level(logging.WARNING, "pipeline.adapters.store.rollups"):
            retries = write_windows_repairing(
                store, windows, "t", 0.01, "tok", through_offsets={0: 1}, retry=retry
            )
        assert retries == 2
        assert all("VIOLATED_CONSTRAINT" in f for f in failures), failures
        assert rollup_drift(store) == {}
        assert "write of" in caplog.text
        assert "every rollup equals its source" in caplog.text
        assert repair_rollups(store).total == 0
    finally:
        store.close()


def test_replay_cut_short_between_the_base_table_and_a_view_is_set_right_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``replay --store`` fails at its write of windows (no retries: a local store); the
    same file replayed again writes no window twice, so before the start-up check the
    rollups stayed short for good."""
    events = tmp_path / "events.jsonl"
    simulate_jsonl(events, seed=7, limit=2000)
    store_dir = tmp_path / "store"
    flag = tmp_path / "partial"
    flag.write_text("latency_1h\nslo_windows\n")
    monkeypatch.setenv("TAILGUARD_FAULT_STORE_PARTIAL_FILE", str(flag))
    try:
        rc = main(["replay", str(events), "--store", str(store_dir), "--json"])
        error = capsys.readouterr().err
    except Exception as exc:  # the write before this fix: not through with_retry
        rc, error = 1, str(exc)
    assert rc != 0
    assert "VIOLATED_CONSTRAINT" in error
    flag.unlink()
    assert main(["replay", str(events), "--store", str(store_dir), "--json"]) == 0
    capsys.readouterr()
    store = open_store(Settings(store_dir=store_dir))
    try:
        n = store.query_rows("SELECT count() FROM tailguard.window_sketches")[0][0]
        assert int(n) > 0
        assert rollup_drift(store) == {}
    finally:
        store.close()
