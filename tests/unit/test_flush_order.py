"""The order of one flush's writes (``FlushWriter.write``, the writer thread): request
rows before the windows and their ledger, because the ledger tells the next owner of a
partition that those requests are counted, and a complete request it then re-reads is a
duplicate to it (its record, and so its row, never comes out again). A stop between two
writes must leave no request that the ledger counts without its row."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.adapters import flush as flush_module
from pipeline.adapters.flush import Flush, FlushWriter
from pipeline.contract.codec import encode_event
from pipeline.core.processor import KeptMessage, StreamProcessor
from pipeline.core.windows import WindowConfig
from tests.factories import completed, finished, received
from tests.flush_fakes import fake_writer


class _StoppedError(Exception):
    """The stop arriving at a given write (what the writer raises then)."""


def _closed_windows() -> tuple[list[Any], list[Any]]:
    proc = StreamProcessor("t", window_config=WindowConfig(size_ms=10_000, grace_ms=0))
    evs = [received("r1", 0.0), finished("r1", 90.0), completed("r1", 95.0)]
    out = proc.process([(0, i, encode_event(e)) for i, e in enumerate(evs)], wall_ms=None)
    drained = proc.drain()
    return out.records + drained.records, out.windows + drained.windows


_WRITES = {  # the flush module's store writes, by what they write
    "write_requests": "rows",
    "write_windows_repairing": "windows",  # write_windows, rollups set right on a failure
    "write_raw_isolating": "raw events",
    "write_checkpoints": "checkpoints",
}


def _writer(calls: list[str], **kwargs: Any) -> FlushWriter:
    """A writer whose ledger and controller feed note what they are given."""
    told = SimpleNamespace(
        windows_stored=lambda *_a: calls.append("summary"), flush=lambda _stop: None
    )
    ports: dict[str, Any] = {
        "ledger": SimpleNamespace(
            publish=lambda *_a: calls.append("ledger"), flush=lambda _s: None
        ),
        "told": told,
    }
    ports.update(kwargs)
    return fake_writer(**ports)


def _fake_writes(monkeypatch: pytest.MonkeyPatch, calls: list[str], stop_at: str | None) -> None:
    """The store writes note what they write in ``calls``; ``stop_at`` raises instead."""

    def fake(name: str) -> Any:
        def write(*_a: Any, **_k: Any) -> Any:
            if name == stop_at:
                raise _StoppedError(name)
            calls.append(name)
            return (0, []) if name == "raw events" else 0 if name == "windows" else None

        return write

    for attr, name in _WRITES.items():
        monkeypatch.setattr(flush_module, attr, fake(name))


def _run(monkeypatch: pytest.MonkeyPatch, stop_at: str | None) -> list[str]:
    calls: list[str] = []
    _fake_writes(monkeypatch, calls, stop_at)
    writer = _writer(calls)
    records, windows = _closed_windows()
    assert records
    assert windows
    with contextlib.suppress(_StoppedError):
        writer.write(Flush(records, windows, [KeptMessage(0, 3, [], b"[]")], [], {0: 3}))
    return calls


def test_rows_then_windows_and_ledger_then_summaries_then_raw_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _run(monkeypatch, None) == [
        "rows", "windows", "ledger", "summary", "raw events", "checkpoints",
    ]  # fmt: skip


@pytest.mark.parametrize("stop_at", ["rows", "windows", "raw events", "checkpoints"])
def test_a_stop_at_any_write_leaves_no_ledger_without_the_rows(
    monkeypatch: pytest.MonkeyPatch, stop_at: str
) -> None:
    calls = _run(monkeypatch, stop_at)
    if "ledger" in calls:
        assert calls.index("rows") < calls.index("ledger"), calls


def test_the_ledger_is_acknowledged_with_the_summaries_and_the_clocks_follow_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger's round trip overlaps the summaries' (both before the raw events and the
    commit), and the controller gets the clocks the written windows were capping right
    after their summaries (on the event loop), not at the next provisional tick."""
    calls: list[str] = []
    _fake_writes(monkeypatch, calls, None)
    writer = _writer(
        calls,
        ledger=SimpleNamespace(
            publish=lambda *_a: calls.append("ledger"),
            flush=lambda _s: calls.append("ledger acked"),
        ),
        told=SimpleNamespace(
            windows_stored=lambda *_a: None, flush=lambda _stop: calls.append("summaries acked")
        ),
        on_told=lambda windows: calls.append(f"clocks after {len(windows)} windows"),
    )
    records, windows = _closed_windows()
    writer.write(Flush(records, windows, [KeptMessage(0, 3, [], b"[]")], [], {0: 3}))
    assert calls == [
        "rows", "windows", "ledger", "summaries acked", "ledger acked",
        f"clocks after {len(windows)} windows", "raw events", "checkpoints",
    ]  # fmt: skip


def test_a_replay_writes_the_same_rows_in_the_same_order_without_kafka(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``replay --store`` has no ledger topic and no controller to tell: its writer writes
    the rows, then the windows, then (nothing: no raw events) the checkpoints (none)."""
    calls: list[str] = []
    _fake_writes(monkeypatch, calls, None)
    records, windows = _closed_windows()
    _writer(calls, ledger=None, told=None).write(Flush(records, windows, through={0: 1}))
    assert calls == ["rows", "windows", "checkpoints"]
