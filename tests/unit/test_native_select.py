"""Choosing the core's hot path (issue 39): with or without the native extension built.

Runs either way (unlike ``test_native_diff.py``): ``auto`` falls back to the Python
references when ``tailguard_native`` is absent, ``native`` is then a start error, and a
command's start log says which implementation runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.contract.codec import encode_batch
from pipeline.core import native
from pipeline.core.eventtime import PartitionClock
from tests.factories import completed, received

BUILT = native.NATIVE is not None


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = native.active().name
    yield
    native.select(before)


def test_auto_takes_the_extension_only_when_it_is_built() -> None:
    impl = native.resolve("auto")
    assert impl.name == ("native" if BUILT else "python")
    assert (impl.sketch_bump is None, impl.boundary_table is None) == (not BUILT, not BUILT)


def test_python_is_the_reference_whatever_is_built() -> None:
    impl = native.select("python")
    assert impl is native.PYTHON
    assert impl.clock is PartitionClock
    assert (native.sketch_kernel(), native.table_kernel()) == (None, None)
    if BUILT:
        why = "forced"
    elif native.EXTENSION is not None:  # installed, but older than this tree (no Joiner)
        why = "tailguard_native is older than this tree: rebuild it (./tg)"
    else:
        why = "tailguard_native not built"
    assert impl.describe() == f"core hot path: python ({why})"


@pytest.mark.skipif(BUILT, reason="tailguard_native is built here")
def test_native_without_the_extension_is_a_start_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="not built"):
        native.resolve("native")
    f = tmp_path / "e.jsonl"
    f.write_bytes(encode_batch([received("a"), completed("a")]) + b"\n")
    monkeypatch.setenv("TAILGUARD_CORE_IMPL", "native")
    with pytest.raises(SystemExit, match="core_impl=native but the tailguard_native"):
        main(["replay", str(f), "--no-store"])


@pytest.mark.parametrize("requested", ["auto", "python", "native"])
def test_replay_logs_which_implementation_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    requested: str,
) -> None:
    if requested == "native" and not BUILT:
        pytest.skip("tailguard_native is not built (see the start-error test)")
    f = tmp_path / "e.jsonl"
    f.write_bytes(encode_batch([received("a"), completed("a")]) + b"\n")
    monkeypatch.setenv("TAILGUARD_CORE_IMPL", requested)
    with caplog.at_level(logging.INFO, logger="tailguard"):
        assert main(["replay", str(f), "--json", "--no-store"]) == 0
    runs = native.resolve(requested).name  # type: ignore[arg-type]
    assert native.active().name == runs
    assert [r.getMessage() for r in caplog.records if "core hot path" in r.getMessage()] == [
        native.active().describe()
    ]
    assert '"requests":1' in capsys.readouterr().out.replace(" ", "")
