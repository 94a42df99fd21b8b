"""Piped output is as wide as its tables need, in every command that prints tables
(issue 51: ``demo``, ``explain``, ``capacity`` and ``sql`` cut it at 80 columns, rich's
width when stdout is not a terminal and ``COLUMNS`` is unset)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.adapters.store import open_store
from pipeline.app.demo import _print_report
from pipeline.cli import main
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from producers.simulator.model import SimConfig
from tests.measurement_fixtures import START_NS, simulate_jsonl

pytestmark = pytest.mark.integration
LONG = "x" * 150  # one cell wider than 80 columns


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wide")
    events, store_dir = tmp / "events.jsonl", tmp / "store"
    simulate_jsonl(events, seed=3, limit=1500)
    assert main(["replay", str(events), "--store", str(store_dir), "--json"]) == 0
    return store_dir


def _request_id(store_dir: Path) -> str:
    store = open_store(Settings(store_dir=store_dir))
    try:
        ((rid,),) = store.query_rows(
            f"SELECT request_id FROM {store.database}.requests ORDER BY request_id LIMIT 1"
        )
    finally:
        store.close()
    return str(rid)


def _demo(store_dir: Path) -> None:
    settings = Settings(store_dir=store_dir, slo_spec=DEFAULT_SLO_SPEC)
    _print_report(settings, {}, SimConfig(start_unix_ns=START_NS), speedup=None, gate=None,
                  json_out=None)  # fmt: skip


def _cli(*argv: str) -> Callable[[Path], None]:
    def run(store_dir: Path) -> None:
        args = [a.replace("{rid}", _request_id(store_dir)) if "{rid}" in a else a for a in argv]
        assert main([*args, "--store", str(store_dir)]) == 0

    return run


# (command, how to print its tables into a pipe, what must be printed whole)
CASES = [
    ("sql", _cli("sql", f"SELECT '{LONG}' AS wide, 1 AS n"), LONG),
    ("explain", _cli("explain", "{rid}", "--slo", str(DEFAULT_SLO_SPEC)), None),
    ("capacity", _cli("capacity", "--min-requests", "1"), None),
    ("demo", _demo, None),
]


@pytest.mark.parametrize(("command", "printed", "whole"), CASES, ids=[c[0] for c in CASES])
def test_piped_tables_are_not_cut_at_80_columns(
    command: str,
    printed: Callable[[Path], None],
    whole: str | None,
    *,
    store_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    capsys.readouterr()
    printed(store_dir)
    out = capsys.readouterr().out
    assert out.strip(), command
    assert max(len(line) for line in out.splitlines()) > 80, out
    if whole is not None:
        assert whole in out
