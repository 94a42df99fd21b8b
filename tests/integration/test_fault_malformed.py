"""10,000 hypothesis-generated malformed messages mixed into valid traffic: each one is in
the DLQ with its reason, the valid traffic's results equal a clean run's, the worker lives."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.adapters.store import open_store
from pipeline.contract.codec import SourceRef, decode_message, encode_batch, event_to_dict
from pipeline.settings import Settings
from tests.integration.faults import (
    batches,
    dead_letters,
    flush,
    lifecycle_events,
    producer,
    send_all,
)
from tests.integration.harness import WorkerProcess, make_settings
from tests.integration.malformed import Malformed, generate

pytestmark = [pytest.mark.integration, pytest.mark.long(110)]

N_MALFORMED = 10_000
MAX_MESSAGE_BYTES = 128 * 1024
VALID_REQUESTS = 10_000
PER_MESSAGE = 50  # events per valid message (more carriers for the mixed batches)

Key = tuple[int, int, int | None]  # (partition, offset, index in the batch)


def _plan(
    bad: list[Malformed], carriers: list[tuple[int, list[Any]]], partitions: int
) -> list[tuple[int, bytes, list[tuple[int | None, str]], int]]:
    """The dirty topic's messages in order: (partition, value, expected dead letters as
    (index, reason), number of valid events carried). Mixed batches ride on valid messages."""
    mixed = [m for m in bad if m.bad_items]
    whole = [m for m in bad if not m.bad_items]
    assert len(mixed) <= len(carriers), "more mixed batches than valid messages to carry them"
    mixed_at = {j * len(carriers) // len(mixed): m for j, m in enumerate(mixed)} if mixed else {}
    whole_after: dict[int, list[Malformed]] = {}
    for k, m in enumerate(whole):
        whole_after.setdefault(k * len(carriers) // len(whole), []).append(m)
    plan = []
    for c, (p, chunk) in enumerate(carriers):
        m = mixed_at.get(c)
        if m is None:
            plan.append((p, encode_batch(chunk), [], len(chunk)))
        else:
            items: list[Any] = [event_to_dict(e) for e in chunk]
            for pos, item in zip(m.positions, m.bad_items, strict=True):
                items.insert(min(pos, len(items)), item)
            plan.append((p, orjson.dumps(items), [], len(chunk)))
        for k, w in enumerate(whole_after.get(c, [])):
            assert w.raw is not None
            plan.append(((c + k) % partitions, w.raw, [], 0))
    # The expected dead letters: what the contract's codec says of each message.
    out = []
    for p, raw, _, n_valid in plan:
        d = decode_message(raw, SourceRef("t", p, 0), max_bytes=MAX_MESSAGE_BYTES)
        assert len(d.events) == n_valid, f"a malformed example decodes to events: {raw[:200]!r}"
        assert n_valid or d.dead, f"a malformed example is not rejected: {raw[:200]!r}"
        out.append((p, raw, [(x.index, x.reason) for x in d.dead], n_valid))
    return out


def _produce(s: Settings, plan: list[tuple[int, bytes, Any, int]]) -> list[tuple[int, int]]:
    """Produce in order; the (partition, offset) of each message."""
    prod = producer(s)
    coords: list[tuple[int, int] | None] = [None] * len(plan)

    def delivered(i: int):  # type: ignore[no-untyped-def]
        def cb(err: Any, msg: Any) -> None:
            assert err is None, err
            coords[i] = (msg.partition(), msg.offset())

        return cb

    for i, (p, raw, _, _) in enumerate(plan):
        while True:
            try:
                prod.produce(s.lifecycle_topic, raw, partition=p, on_delivery=delivered(i))
                break
            except BufferError:
                prod.poll(0.05)
        prod.poll(0)
    flush(prod)
    assert all(c is not None for c in coords)
    return coords  # type: ignore[return-value]


def _results(s: Settings) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """All request rows, and what the windows hold per (partition, window, key, boundary)
    and per SLO: every count, sum, extreme and sketch bin (rows of a window and of its
    corrections added up; where a live worker cut its inserts may differ between runs)."""
    store = open_store(s)
    try:
        db = s.database
        requests = store.query_rows(f"SELECT * FROM {db}.requests FINAL ORDER BY request_id")
        windows = store.query_rows(
            "SELECT partition, window_start, model, priority, ctx_bucket, boundary, "
            "sum(records), sum(count), round(sum(sum), 6), min(min), max(max), "
            "sum(zero_count), sumMap(pos_keys, pos_counts), sumMap(neg_keys, neg_counts) "
            f"FROM {db}.window_sketches "
            "GROUP BY partition, window_start, model, priority, ctx_bucket, boundary "
            "ORDER BY partition, window_start, model, priority, ctx_bucket, boundary"
        )
        windows += store.query_rows(
            "SELECT partition, window_start, slo, kind, sum(total), sum(good), "
            f"sum(good_secondary_only) FROM {db}.slo_windows "
            "GROUP BY partition, window_start, slo, kind "
            "ORDER BY partition, window_start, slo, kind"
        )
        return requests, windows
    finally:
        store.close()


def test_malformed_messages_go_to_the_dlq_and_change_nothing(kafka, tmp_path: Path) -> None:
    t0 = time.monotonic()
    bad = generate(N_MALFORMED, MAX_MESSAGE_BYTES)
    assert len(bad) == N_MALFORMED
    t_gen = time.monotonic()
    dirty = make_settings(
        kafka.bootstrap_servers, tmp_path / "dirty", max_message_bytes=MAX_MESSAGE_BYTES
    )
    clean = make_settings(
        kafka.bootstrap_servers, tmp_path / "clean", max_message_bytes=MAX_MESSAGE_BYTES
    )
    events = lifecycle_events(VALID_REQUESTS, seed=41)
    carriers = list(batches(events, dirty.topic_partitions, PER_MESSAGE))
    plan = _plan(bad, carriers, dirty.topic_partitions)
    coords = _produce(dirty, plan)
    send_all(clean, [(clean.lifecycle_topic, p, encode_batch(chunk)) for p, chunk in carriers])
    expected: dict[Key, str] = {}
    for (p, off), (_, _, dead, _) in zip(coords, plan, strict=True):
        for index, reason in dead:
            expected[(p, off, index)] = reason
    whole_raw = {
        (p, off): raw for (p, off), (_, raw, _, n) in zip(coords, plan, strict=True) if n == 0
    }
    t_loaded = time.monotonic()

    w_dirty = WorkerProcess(dirty, tmp_path / "dirty.log")
    w_clean = WorkerProcess(clean, tmp_path / "clean.log")
    try:
        w_dirty.wait_caught_up(timeout_s=180)  # asserts the worker is alive at every poll
        w_clean.wait_caught_up(timeout_s=180)
        assert w_dirty.alive()
    finally:
        rc = w_dirty.stop()
        w_clean.stop()
    t_done = time.monotonic()
    assert rc == 0, "the worker did not stop cleanly"
    assert "Traceback" not in w_dirty.log_path.read_text(errors="replace")

    got: dict[Key, str] = {}
    for h in dead_letters(dirty):
        assert h["tailguard.source.topic"] == dirty.lifecycle_topic
        index = int(h["tailguard.source.index"]) if "tailguard.source.index" in h else None
        key = (int(h["tailguard.source.partition"]), int(h["tailguard.source.offset"]), index)
        assert key not in got, f"dead letter {key} twice"
        assert h["tailguard.reason"], f"dead letter {key} without a reason"
        got[key] = h["tailguard.reason"]
        if index is None:
            assert h["value"] == whole_raw[key[:2]], f"dead letter {key}: not the raw message"
    assert got == expected
    assert dead_letters(clean) == []

    dirty_requests, dirty_windows = _results(dirty)
    clean_requests, clean_windows = _results(clean)
    assert len(clean_requests) == VALID_REQUESTS
    assert dirty_requests == clean_requests
    assert dirty_windows == clean_windows
    print(
        f"generated {N_MALFORMED} malformed examples in {t_gen - t0:.1f}s "
        f"({len(expected)} dead letters expected); loaded in {t_loaded - t_gen:.1f}s; "
        f"both workers caught up in {t_done - t_loaded:.1f}s"
    )
