"""Issue 12, items 1-4 on the real broker: messages that used to stall or crash the worker.

* numbers the store cannot hold (``preemptions: 70000``, tokens >= 2^32, ``ts_unix_ns`` >=
  2^63) are dead letters at validation; a contract-valid row the store still rejects (here:
  a store stricter than the contract, a ``CHECK`` on ``requests``) is isolated by splitting
  its batch and dead-lettered with the store's reason, the rest of the batch is written;
* null and empty Kafka messages are dead letters;
* one ``NaN`` inside an array dead-letters only that event;
* a 10 MiB message (the topic's limit raised) lands in a DLQ whose limit is 64 KiB,
  truncated, with its original size and reason, before its offset is committed.

Each test checks the worker kept writing, the DLQ holds each bad message with its reason,
and every valid request is in the store (against the producer's own list).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from pipeline.adapters.store import migrate, open_store
from pipeline.contract.codec import encode_batch, event_to_dict
from pipeline.contract.events import Event
from pipeline.contract.partitioning import partition_for
from pipeline.settings import Settings
from tests.integration.faults import (
    committed_offsets,
    dead_letters,
    lifecycle_events,
    produce_batches,
    producer,
    send_all,
)
from tests.integration.harness import (
    REPO,
    make_settings,
    run_until_caught_up,
    settings_env,
)

pytestmark = [pytest.mark.integration, pytest.mark.long(95)]

STRICT = "ifNull(preemptions, 0) < 60000"  # a store stricter than the contract (<= 65535)


def _stored_requests(s: Settings) -> set[str]:
    store = open_store(s)
    try:
        rows = store.query_rows(f"SELECT request_id FROM {s.database}.requests FINAL")
        return {r for (r,) in rows}
    finally:
        store.close()


def _single(ev: Event, **fields: object) -> bytes:
    d = event_to_dict(ev)
    d.update(fields)
    return json.dumps(d).encode()  # integers beyond 64 bits too


def _set_topic_config(s: Settings, topic: str, **config: str) -> None:
    a = AdminClient(s.kafka_config())
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()
    ]
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    for fut in a.incremental_alter_configs([res]).values():
        fut.result(timeout=30)


def _add_strict_constraint(s: Settings) -> None:
    """The store's requests table refuses what ``STRICT`` rejects (a row the contract allows)."""
    store = open_store(s)
    try:
        migrate(store)
        store.command(f"ALTER TABLE {s.database}.requests ADD CONSTRAINT strict CHECK {STRICT}")
    finally:
        store.close()


def test_poison_numbers_null_messages_and_nan_are_dead_letters_nothing_valid_lost(
    kafka, tmp_path: Path
) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    _add_strict_constraint(s)

    events = lifecycle_events(2_000, seed=71)
    # A contract-valid engine.finished the store rejects, in the middle of a full batch.
    victim = next(ev for ev in events[len(events) // 2 :] if ev.kind == "engine.finished")
    events = [
        ev.model_copy(update={"preemptions": 65_000}) if ev is victim else ev for ev in events
    ]
    produce_batches(s, events)
    valid = {ev.request_id for ev in events}

    n = s.topic_partitions
    nan_events = lifecycle_events(60, seed=72, prefix="n-", start_ns=events[-1].ts_unix_ns)
    by_part: dict[int, list[Event]] = {}
    for ev in nan_events:
        by_part.setdefault(partition_for(ev.request_id, n), []).append(ev)
    poison = [ev for ev in events if ev.kind == "engine.finished"][:3]
    sent_poison = [
        ("preemptions", _single(poison[0], preemptions=70_000, request_id="p-1")),
        ("output_tokens", _single(poison[1], output_tokens=2**32, request_id="p-2")),
        ("ts_unix_ns", _single(poison[2], ts_unix_ns=2**63, request_id="p-3")),
    ]
    messages: list[tuple[str, int, bytes | None]] = [
        (s.lifecycle_topic, 0, raw) for _, raw in sent_poison
    ]
    messages += [
        (s.lifecycle_topic, 1, None),  # a null value
        (s.lifecycle_topic, 2, b""),
        (s.engine_stats_topic, 0, None),  # the stats topic too
    ]
    nan_rid = None
    for p, evs in sorted(by_part.items()):
        items = [orjson.dumps(event_to_dict(ev)) for ev in evs]
        if nan_rid is None:  # one array carries a NaN in one of its events
            bad = next(ev for ev in evs if ev.kind == "gateway.completed")
            nan_rid = bad.request_id
            i = evs.index(bad)
            items[i] = items[i].replace(b'"total_ms":', b'"total_ms":NaN,"was":', 1)
        messages.append((s.lifecycle_topic, p, b"[" + b",".join(items) + b"]"))
    send_all(s, messages)
    # The NaN event's request still completes: its engine.finished joins as engine-only.
    valid |= {ev.request_id for ev in nan_events}

    log_text = run_until_caught_up(s, tmp_path / "worker.log")
    assert "Traceback" not in log_text, log_text[-3000:]

    dlq = dead_letters(s)
    reasons = sorted(d["tailguard.reason"] for d in dlq)
    print("dead letters:", reasons)
    for field, raw in sent_poison:
        [d] = [d for d in dlq if d["value"] == raw]
        assert field in d["tailguard.reason"], d
    assert sum(r.startswith("empty_message") for r in reasons) == 3
    assert any(d["tailguard.source.topic"] == s.engine_stats_topic for d in dlq)
    [nan_letter] = [d for d in dlq if b"NaN" in d["value"]]
    assert "finite" in nan_letter["tailguard.reason"]
    assert "tailguard.source.index" in nan_letter
    [rejected] = [d for d in dlq if d["tailguard.reason"].startswith("store_rejected")]
    assert victim.request_id.encode() in rejected["value"]
    assert "strict" in rejected["tailguard.reason"]
    assert len(dlq) == 3 + 3 + 1 + 1

    stored = _stored_requests(s)
    assert stored == valid - {victim.request_id}, (
        f"missing {sorted(valid - stored)[:5]}, extra {sorted(stored - valid)[:5]}"
    )
    assert "ClickHouse rejected one row of write of records" in log_text


def test_a_10_mib_message_lands_in_a_64_kib_dlq_truncated_before_its_offset_commits(
    kafka, tmp_path: Path
) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    _set_topic_config(s, s.lifecycle_topic, **{"max.message.bytes": str(12 * 2**20)})
    _set_topic_config(s, s.dlq_topic, **{"max.message.bytes": str(64 * 1024)})
    before = lifecycle_events(500, seed=73, prefix="a-")
    produce_batches(s, before)
    big = random.Random(12).randbytes(10 * 2**20)  # incompressible: lz4 does not shrink it
    prod = producer(s)
    prod_big = type(prod)(s.kafka_config() | {"message.max.bytes": 12 * 2**20})
    prod_big.produce(s.lifecycle_topic, big, partition=0)
    assert prod_big.flush(60) == 0
    after = lifecycle_events(500, seed=74, prefix="b-", start_ns=before[-1].ts_unix_ns)
    produce_batches(s, after)

    log_text = run_until_caught_up(s, tmp_path / "worker.log")
    assert "Traceback" not in log_text, log_text[-3000:]
    assert committed_offsets(s)[0] > 0
    [d] = dead_letters(s)
    assert d["tailguard.reason"].startswith("oversize"), d["tailguard.reason"]
    assert d["tailguard.original.size"] == str(len(big))
    assert len(d["value"]) <= 64 * 1024
    assert big.startswith(d["value"])
    assert "DLQ delivery failed" in log_text  # the 256 KiB cut was refused and shrunk
    stored = _stored_requests(s)
    assert stored == {ev.request_id for ev in before + after}


def test_replay_isolates_a_record_the_store_rejects(tmp_path: Path) -> None:
    events = lifecycle_events(300, seed=75)
    victim = next(ev for ev in events if ev.kind == "engine.finished")
    # Contract-valid, but more than the store takes:
    events = [
        ev.model_copy(update={"preemptions": 65_000}) if ev is victim else ev for ev in events
    ]
    path = tmp_path / "events.jsonl"
    lines = [encode_batch(events[i : i + 50]) for i in range(0, len(events), 50)]
    lines.append(_single(victim, preemptions=70_000, request_id="p-1"))  # over the contract
    path.write_bytes(b"\n".join(lines) + b"\n")
    s = Settings(store_dir=tmp_path / "store")
    _add_strict_constraint(s)
    env = settings_env(s)
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "replay", str(path), "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    dead = [json.loads(x) for x in Path(summary["dlq_file"]).read_text().splitlines()]
    reasons = sorted(d["reason"].split(":")[0] for d in dead)
    assert reasons == ["invalid_event", "store_rejected"], reasons
    assert summary["store_rejected"] == 1
    stored = _stored_requests(s)
    assert stored == {ev.request_id for ev in events} - {victim.request_id}
