"""Issue 38 item 2: ``tailguard replay --store`` and a live worker write the same rows.

Both write through one writer in one order (``pipeline.adapters.flush.FlushWriter``). A
small messy input file (partners apart, requests late for their window, a gateway's clock
off, duplicates, a malformed line) goes, line by line, to a one-partition lifecycle topic
on the real broker; a worker consumes it until its close horizon passes the last window
(the idle wall time of a caught-up partition closes the last windows); the same file is
replayed with ``replay --store`` into a second store. The stores are then compared table by table.

Columns left out, because they differ by construction: ``window_sketches.source_topic``
(the lifecycle topic, against ``replay:<file>``), ``through_offset`` (Kafka offsets from
0, against a replay's line numbers) and ``written_at`` (wall time of the insert). The
rollups are compared merged (their parts follow the inserts), sums of floats rounded.

The disorder stays within what live and replay resolve alike: a live worker's join also
waits for wall time before it gives a partner up (``Joiner``), a replay has only event
time, so a side whose clock is off by more than the join timeout would be a partial
record (then upgraded) in the replay and not live. Partners here are at most 1 s apart and
the slow gateway 0.5 s off (join timeout: 2 s).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from pipeline.adapters.store import open_store
from pipeline.app.replay import replay_file
from pipeline.contract.codec import event_to_dict
from pipeline.contract.summary import Progress, decode_summary
from pipeline.settings import Settings
from pipeline.spec.slo import load_spec_file
from tests.ceilings import ceiling
from tests.disorder import delay, duplicate, skew_host, write_layout
from tests.integration.faults import lifecycle_events, send_all
from tests.integration.harness import REPO, WorkerProcess, make_settings, settings_env

pytestmark = [pytest.mark.integration, pytest.mark.long(60)]

# Per table: the columns compared (every column but those that differ by construction).
WINDOW_COLUMNS_LEFT_OUT = ("source_topic", "through_offset", "written_at")
TABLES = {
    "requests": "SELECT * FROM {db}.requests FINAL",
    "window_sketches": "SELECT * EXCEPT ({left_out}) FROM {db}.window_sketches",
    "slo_windows": "SELECT * EXCEPT (source_topic) FROM {db}.slo_windows",
    **{
        f"latency_{r}": (
            "SELECT window_start, model, priority, ctx_bucket, boundary, sum(records), "
            "sum(count), round(sum(sum), 3), min(min), max(max), sum(zero_count), "
            f"sumMapMerge(pos), sumMapMerge(neg) FROM {{db}}.latency_{r} "
            "GROUP BY window_start, model, priority, ctx_bucket, boundary"
        )
        for r in ("1m", "1h")
    },
    **{
        f"slo_{r}": (
            "SELECT window_start, slo, kind, any(objective), any(secondary_weight), "
            "sum(total), sum(good), sum(good_secondary_only) "
            f"FROM {{db}}.slo_{r} GROUP BY window_start, slo, kind"
        )
        for r in ("1m", "1h")
    },
}


def _pick(event: dict[str, Any], one_in: int) -> bool:
    """About one request in ``one_in``, the same on every run (``hash`` of a str is not)."""
    return zlib.crc32(str(event["request_id"]).encode()) % one_in == 0


def _messy_file(path: Path) -> None:
    """Simulated requests, made messy, as JSON arrays of 1-50 events a line, with a
    malformed line in the middle (a dead letter to both)."""
    evs: list[dict[str, Any]] = [
        event_to_dict(e) for e in lifecycle_events(300, seed=38, prefix="same-")
    ]
    # partners apart (within the join timeout)
    evs = delay(evs, lambda e: e["kind"] == "engine.finished" and _pick(e, 17), 1_000)
    evs = delay(evs, lambda e: _pick(e, 23), 8_000)  # requests late for their window
    hosts = sorted({e["host"] for e in evs if e["kind"].startswith("gateway")})
    evs = skew_host(evs, hosts[0], -500)  # one gateway's clock 0.5 s slow
    evs = duplicate(evs, 0.02, seed=38)
    write_layout(path, evs, "arrays", seed=38)
    lines = path.read_bytes().splitlines()
    lines.insert(len(lines) // 2, b'{"v":1,"kind":"gateway.completed"')
    path.write_bytes(b"\n".join(lines) + b"\n")


def _produce_lines(s: Settings, path: Path) -> None:
    """Each line of the file, one message, in order, to the topic's one partition."""
    send_all(s, [(s.lifecycle_topic, 0, line) for line in path.read_bytes().splitlines()])


def _wait_horizon(s: Settings, worker: WorkerProcess, horizon_ms: int, timeout_s: float) -> None:
    """Until the worker says (a ``Progress`` on the summaries topic, sent once the windows
    are stored) that every window of partition 0 ending at or before ``horizon_ms`` is."""
    c = Consumer(
        s.kafka_config() | {"group.id": f"same-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    try:
        c.assign([TopicPartition(s.summaries_topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + ceiling(timeout_s)
        seen = -1
        while seen < horizon_ms:
            assert worker.alive(), worker.log_tail()
            assert time.monotonic() < deadline, (seen, horizon_ms, worker.log_tail())
            msg = c.poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            summary = decode_summary(msg.value() or b"")
            if isinstance(summary, Progress) and summary.partition == 0:
                seen = max(seen, summary.horizon_ms)
    finally:
        c.close()


def _rows(s: Settings) -> dict[str, list[str]]:
    store = open_store(s)
    try:
        out = {}
        for table, sql in TABLES.items():
            q = sql.format(db=s.database, left_out=", ".join(WINDOW_COLUMNS_LEFT_OUT))
            out[table] = sorted(repr(row) for row in store.query_rows(q))  # repr: NaN == NaN
        return out
    finally:
        store.close()


def test_replay_store_and_a_live_worker_write_the_same_rows(kafka: Any, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path, topic_partitions=1)
    path = tmp_path / "events.jsonl"
    _messy_file(path)

    # The replay first: it says where the last window ends.
    replayed = s.model_copy(update={"store_dir": tmp_path / "replayed"})
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "replay", str(path), "--json",
         "--store", str(replayed.store_dir)],
        cwd=REPO, env=settings_env(s), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = orjson.loads(done.stdout)
    assert summary["dead_letters"] >= 1  # the malformed line
    assert summary["join"]["duplicates"] > 0
    assert summary["windows"]["corrections"] > 0  # the late requests
    windows = replay_file(
        path, s.join_config(), spec=load_spec_file(s.slo_spec) if s.slo_spec else None,
        window_config=s.window_config(), clock_config=s.clock_config(),
    ).windows  # fmt: skip
    last_end_ms = max(w.start_ms + w.size_ms for w in windows)

    _produce_lines(s, path)
    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        _wait_horizon(s, worker, last_end_ms, timeout_s=240)
    finally:
        assert worker.stop() == 0, worker.log_tail()

    live, replay = _rows(s), _rows(replayed)
    assert live["requests"], "the worker stored no request"
    assert len(live["requests"]) == summary["requests"]
    for table in TABLES:
        only_live = sorted(set(live[table]) - set(replay[table]))
        only_replay = sorted(set(replay[table]) - set(live[table]))
        assert (only_live, only_replay) == ([], []), table
        assert live[table] == replay[table], table  # (and as many of each)
