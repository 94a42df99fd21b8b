"""A :class:`~pipeline.adapters.flush.FlushWriter` over fakes, for the unit tests of the
flush's order and of its yielding: no store (every write the test looks at is patched),
retries that run once, dead rows dropped; and a
:class:`~pipeline.adapters.worker.WorkerShell` opened on fake ports, whose flushes the
test's ``write`` takes."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pipeline.adapters.dead_letters import DeadLetters
from pipeline.adapters.flush import FlushSettings, FlushWriter
from pipeline.adapters.worker import WorkerPorts, WorkerSettings, WorkerShell


def fake_writer(**ports: Any) -> FlushWriter:
    """``ports``: the ledger, the controller feed (``told``), ... as the test wants them."""
    return FlushWriter(
        object(),  # type: ignore[arg-type]  # the store: every write is faked
        "g",
        "t",
        0.01,
        retry=lambda fn, what: (fn(), 0)[1],
        dead_rows=lambda dead: None,
        **ports,
    )


def fake_shell(
    processor: Any,
    write: Callable[..., Any],
    *,
    topic_ids: Callable[[], str | None],
    lifecycle_input: Any,
    commits: Any,
) -> WorkerShell:
    """A shell built through its constructor (telemetry that records nothing, 2 messages
    a take), opened on fake ports: the store, dead letters and the ledgers do nothing;
    ``write(flush, hurry=)`` writes; the group's last assignment is ``generation-1``."""
    noop = SimpleNamespace(record=lambda *_a: None, add=lambda *_a: None)
    telemetry = SimpleNamespace(
        write_duration=noop, write_retries=noop, records=noop, windows_closed=noop,
        record_latencies=lambda _r: None, dead_letters=noop, join_timeouts=noop,
        join_conflicts=noop, join_duplicates=noop, lateness=noop,
    )  # fmt: skip
    settings = WorkerSettings(
        flush=FlushSettings("g", "t", 0.01, flush_max_rows=100, take_max_messages=2),
        engine_stats_topic="s", max_message_bytes=1 << 20, store_raw_events=True,
        inflight_ttl_ms=0, join_memory_ms=0, provisional=False,
    )  # fmt: skip
    sh = WorkerShell(
        settings, SimpleNamespace(), processor, telemetry,  # type: ignore[arg-type]
        topic_ids=topic_ids, lifecycle_input=lifecycle_input, commits=commits,
    )  # fmt: skip
    sink = SimpleNamespace(flush=lambda _s: None, send_dead=lambda *_a, **_k: None)
    sh.open(
        WorkerPorts(
            store=SimpleNamespace(close=lambda: None),  # type: ignore[arg-type]
            dead=DeadLetters("t", sink, lambda *_a: []),
            feed=None,
            ledger=None,
            read_ledgers=lambda *_a: {},
            writer=SimpleNamespace(write=write),
        )
    )
    sh.watch.assigned_gen = "generation-1"
    return sh
