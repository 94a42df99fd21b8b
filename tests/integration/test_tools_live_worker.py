"""explain, sql and report while a real worker owns the embedded store (real broker),
then the same commands once it stopped (the store opened directly)."""

from __future__ import annotations

import json
import stat
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pipeline.adapters.query_server import DISCOVERY_FILE
from pipeline.app.demo import kafka_sink
from pipeline.contract.codec import encode_event
from tests.factories import completed, finished, received
from tests.integration.harness import WorkerProcess, make_settings, tailguard

pytestmark = [pytest.mark.integration, pytest.mark.long(60)]

N = 200


def tg(*args: str) -> subprocess.CompletedProcess[str]:
    return tailguard(*args, timeout_s=120)


def count(store: Path) -> int:
    p = tg("sql", "SELECT count() AS n FROM tailguard.requests FINAL", "--store", str(store),
           "--format", "json")  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return int(json.loads(p.stdout)[0]["n"])


def test_tools_work_with_and_without_a_running_worker(kafka, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    store = s.store_dir
    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        sink = kafka_sink(s)
        single = Producer(s.kafka_config() | {"partitioner": "murmur2_random", "linger.ms": 5})
        for i in range(N):
            rid = f"req-{i}"
            single.produce(s.lifecycle_topic, encode_event(received(rid, i)), key=rid)
            # every 10th request waits 500 ms in the engine queue: tier1 (400 ms) broken
            q = 500.0 if i % 10 == 0 else 5.0
            sink.emit(finished(rid, i + 98 + q, queue_ms=q))
            single.produce(
                s.lifecycle_topic,
                encode_event(completed(rid, i + 100 + q, total_ms=100.0 + q)),
                key=rid,
            )
        sink.flush()
        assert single.flush(30) == 0
        worker.wait_caught_up()
        # the worker publishes its port in the store directory
        info = json.loads((store / DISCOVERY_FILE).read_text())
        assert info["pid"] == worker.proc.pid
        assert info["port"] > 0

        t0 = time.perf_counter()
        assert count(store) == N  # through the worker's port: it owns the directory
        print(f"sql through the live worker's port: {time.perf_counter() - t0:.2f} s (process)")

        p = tg("explain", "req-10", "--store", str(store), "--json")
        assert p.returncode == 0, p.stderr[-2000:]
        out = json.loads(p.stdout)
        slos = {x["slo"]: x for x in out["slos"]}
        assert slos["tier1-gateway"]["verdict"] == "bad"
        assert slos["tier1-gateway"]["value_ms"] == pytest.approx(600.0)
        assert slos["queue-95"]["verdict"] == "bad"
        assert slos["tier2-compute"]["verdict"] == "good"
        assert {b["segment"]: b["ms"] for b in out["breakdown"]}["queue"] == pytest.approx(500.0)
        # (no raw events shown: the factories' 2023 timestamps are past the 7-day TTL)
        p = tg("explain", "req-11", "--store", str(store), "--json")
        assert p.returncode == 0, p.stderr[-2000:]
        assert {x["slo"]: x["verdict"] for x in json.loads(p.stdout)["slos"]}["tier1-gateway"] == (
            "good"
        )

        p = tg("report", "--store", str(store), "--json")
        assert p.returncode == 0, p.stderr[-2000:]
        rep = json.loads(p.stdout)
        assert rep["requests"] == N
        # right after the traffic, windows still in their grace period are announced
        text = tg("report", "--store", str(store)).stdout
        after = rep["open_windows"]["requests_after"]
        print(f"requests after the last closed window: {after} of {N}")
        if after:
            assert f"{after} of {N} requests ended after the last closed window" in text
            assert "still open" in text

        p = tg("sql", "DROP TABLE tailguard.requests", "--store", str(store))
        assert p.returncode == 1
        assert "164" in p.stderr
        # the store's own tables only, through the worker's port too; unqualified names work
        for sql in (
            "DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
            "SELECT * FROM url('http://127.0.0.1:9/x', 'LineAsString')",
            "SELECT * FROM system.tables",
        ):
            p = tg("sql", sql, "--store", str(store))
            assert p.returncode == 1, p.stdout
            assert "(code 164)" in p.stderr
            assert "root:" not in p.stderr
        p = tg("sql", "SELECT count() AS n FROM requests FINAL", "--store", str(store),
               "--format", "json")  # fmt: skip
        assert json.loads(p.stdout) == [{"n": N}]
        # the port itself: nothing without the discovery file's token (mode 0600)
        assert stat.S_IMODE((store / DISCOVERY_FILE).stat().st_mode) == 0o600
        request = urllib.request.Request(
            f"http://127.0.0.1:{info['port']}/",
            data=b"DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
        )
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(request, timeout=10)
        assert exc.value.code == 401
        request = urllib.request.Request(
            f"http://127.0.0.1:{info['port']}/",
            data=b"DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
            headers={"X-ClickHouse-Key": info["token"]},
        )
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(request, timeout=10)
        assert exc.value.code == 403
        assert b"root:" not in exc.value.read()
        assert worker.alive()
        assert count(store) == N
    finally:
        rc = worker.stop()
    assert rc == 0, worker.log_tail()
    assert not (store / DISCOVERY_FILE).exists()
    # without a worker: the tools open the directory themselves
    assert count(store) == N
    p = tg("explain", "req-10", "--store", str(store), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert {x["slo"]: x["verdict"] for x in json.loads(p.stdout)["slos"]}["tier1-gateway"] == "bad"
