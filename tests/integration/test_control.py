"""Overload -> signed L1 on the real control topic -> hysteresis, half-open -> L0; the
serving-side client applies it, lifts it, and rejects forged, replayed and expired signals."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from pipeline.adapters.store import open_store
from pipeline.app.replay import replay_file
from pipeline.contract.control_signal import RejectReason
from pipeline.settings import Settings
from pipeline.spec.policy import load_policy
from producers.control_client import Accepted, ControlClient, DirectiveStore
from producers.control_keys import keyring_from_file
from tests.ceilings import ceiling
from tests.control_fixtures import (
    OVERLOAD_START_S,
    TEST_POLICY,
    emit_overload,
    write_overload_jsonl,
)
from tests.integration.harness import WorkerProcess, control_settings
from tests.measurement_fixtures import START_NS

pytestmark = [pytest.mark.integration, pytest.mark.long(90)]
START_MS = START_NS // 1_000_000


def _phases(raws: list[bytes], scope: str) -> list[tuple[int, str]]:
    """The distinct (level, phase) sequence of a scope (heartbeats collapse)."""
    out: list[tuple[int, str]] = []
    for raw in raws:
        s = orjson.loads(raw)
        if s["scope"] == scope and (not out or out[-1] != (s["level"], s["phase"])):
            out.append((s["level"], s["phase"]))
    return out


def _follow(
    s: Settings, worker: WorkerProcess, done: Callable[[list[bytes]], bool], timeout_s: float
) -> list[bytes]:
    """The control topic's values from the beginning, read as they arrive, until
    ``done(values)``; fails if the worker dies or ``timeout_s`` passes first."""
    c = Consumer(
        s.kafka_config()
        | {"group.id": f"follow-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    try:
        parts = c.list_topics(s.control_topic, timeout=10).topics[s.control_topic].partitions
        c.assign([TopicPartition(s.control_topic, p, OFFSET_BEGINNING) for p in parts])
        raws: list[bytes] = []
        deadline = time.monotonic() + ceiling(timeout_s)
        while not done(raws):
            assert worker.alive(), worker.log_tail()
            assert time.monotonic() < deadline, {
                sc: _phases(raws, sc) for sc in {orjson.loads(r)["scope"] for r in raws}
            }
            msg = c.poll(1.0)  # returns as soon as a signal arrives
            if msg is not None and msg.error() is None and msg.value() is not None:
                raws.append(msg.value())
        return raws
    finally:
        c.close()


def test_overload_degrades_then_recovers_and_the_client_follows(kafka, tmp_path: Path) -> None:
    s, keys = control_settings(kafka.bootstrap_servers, tmp_path)
    keyring = keyring_from_file(keys)

    # The same events through the pure core (replay) say what must happen.
    events = tmp_path / "events.jsonl"
    write_overload_jsonl(events)
    expected = replay_file(events, policy=load_policy(TEST_POLICY)).summary()["control"]
    scopes = sorted({t["scope"] for t in expected})
    assert len(scopes) == 2
    want = [(0, "normal"), (1, "degraded"), (1, "half_open"), (0, "normal")]

    emit_overload(s)

    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        # Every signal, as it arrives (one consumer, blocking polls): until both scopes
        # went through the whole sequence.
        raws = _follow(s, worker, lambda got: all(_phases(got, sc) == want for sc in scopes), 240)
    finally:
        # Stopping writes the audit rows of every signal published (a write still
        # queued behind the writer thread is not lost with the controller agent).
        worker.stop()

    # The audit log: the same transitions, at the same event times as the replay.
    store = open_store(s)
    try:
        rows = store.query_rows(
            "SELECT scope, level, phase, toUnixTimestamp64Milli(event_time) FROM "
            f"{s.database}.control_signals WHERE NOT heartbeat ORDER BY scope, seq"
        )
    finally:
        store.close()
    for sc in scopes:
        audit = [(lvl, ph, t) for scope, lvl, ph, t in rows if scope == sc][1:]  # [0]: initial L0
        # The audit also holds re-issues that only say why a level is held (same level
        # and phase, a new reason): the transitions are the changes of (level, phase).
        got = [x for i, x in enumerate(audit) if i == 0 or x[:2] != audit[i - 1][:2]]
        exp = [
            (t["level"], t["phase"], t["ts_unix_ns"] // 1_000_000)
            for t in expected
            if t["scope"] == sc
        ]
        assert got == exp, sc
        first_l1 = exp[0][2] - START_MS
        # The condition needs 1 min of evaluations; the controller runs one window behind.
        assert OVERLOAD_START_S * 1000 + 60_000 <= first_l1 <= OVERLOAD_START_S * 1000 + 180_000

    # The serving side, message by message: applies L1, then lifts it.
    store = DirectiveStore(keyring)
    levels: dict[str, list[int]] = {sc: [] for sc in scopes}
    for raw in raws:
        sig = orjson.loads(raw)
        assert isinstance(store.apply(raw, sig["issued_at_unix_ms"]), Accepted)
        levels[sig["scope"]].append(store.current(sig["scope"], sig["issued_at_unix_ms"]).level)
    for sc in scopes:
        assert max(levels[sc]) == 1
        assert levels[sc][-1] == 0
    # Forged, replayed and expired signals are rejected and counted.
    last = raws[-1]
    now = orjson.loads(last)["issued_at_unix_ms"]
    forged = last.replace(b'"level":0', b'"level":3')
    assert store.apply(forged, now).reason is RejectReason.BAD_SIGNATURE  # type: ignore[union-attr]
    assert store.apply(last, now).reason is RejectReason.REPLAYED  # type: ignore[union-attr]
    assert store.apply(raws[0], now).reason in (RejectReason.STALE, RejectReason.EXPIRED)  # type: ignore[union-attr]
    assert store.apply(last, now + 10**9).reason is RejectReason.EXPIRED  # type: ignore[union-attr]
    counts = store.counters()
    assert counts["forged"] >= 1
    assert counts["replayed"] >= 1

    # And the real client on the real broker ends lifted (level 0) for both models.
    client = ControlClient({"bootstrap.servers": s.bootstrap_servers}, s.control_topic, keyring)
    client.start()
    try:
        assert client.wait_caught_up(20)
        for sc in scopes:
            assert client.directive(sc).level == 0
        assert client.counters().get("forged", 0) == 0
    finally:
        client.stop()
