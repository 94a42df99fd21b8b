"""A restarted controller rebuilds its error budgets from ClickHouse."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import orjson
import pytest

from pipeline.adapters.controller import ControllerShell
from pipeline.adapters.store import open_store
from pipeline.cli import main
from pipeline.settings import Settings
from tests.measurement_fixtures import simulate_jsonl

pytestmark = pytest.mark.integration


def test_budgets_are_rebuilt_from_stored_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "events.jsonl"
    simulate_jsonl(events, seed=9, limit=4000)
    store_dir = tmp_path / "store"
    assert main(["replay", str(events), "--store", str(store_dir), "--json"]) == 0
    replayed = orjson.loads(capsys.readouterr().out)

    keys = tmp_path / "keys.json"
    keys.write_text(
        orjson.dumps(
            {"active": "k", "keys": {"k": base64.b64encode(os.urandom(32)).decode()}}
        ).decode()
    )
    settings = Settings(store_dir=store_dir, control_enabled=True, control_keys_file=keys)
    shell = ControllerShell(settings)
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
