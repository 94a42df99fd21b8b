"""A restarted controller rebuilds its error budgets from ClickHouse."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store import open_store
from tests.control_fixtures import replayed_controller

pytestmark = pytest.mark.integration


def test_budgets_are_rebuilt_from_stored_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replayed, settings, shell = replayed_controller(tmp_path, capsys, seed=9, limit=4000)
    store = open_store(settings)
    try:
        loaded = shell.load_history(store)
        last = store.query_rows(
            "SELECT toUnixTimestamp64Milli(max(window_start)) + 10000 FROM tailguard.slo_windows"
        )[0][0]
    finally:
        store.close()
    assert loaded > 0
    book = shell.controller.book
    assert book is not None
    totals = {st.slo: st.total for st in book.evaluate(int(last))}
    for name, want in replayed["slos"].items():
        assert totals[name] == want["total"], name
    # Summaries of windows already loaded are not counted again.
    assert shell.controller._seen
