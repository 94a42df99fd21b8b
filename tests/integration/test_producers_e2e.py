"""Producers end to end on the real broker and the real worker: `tailguard gateway` (a
subprocess, stopped by its PID) proxying to an OpenAI-compatible upstream, engine events
for the same request ids, and `tailguard envoy` over an access log — joined by a worker
into ClickHouse request records."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from pipeline.adapters.store import open_store
from pipeline.app.demo import kafka_sink
from pipeline.settings import Settings
from tests.factories import finished
from tests.gateway_fixtures import serve, wait_for
from tests.integration.harness import REPO, WorkerProcess, make_settings, read_all, settings_env
from tests.kafka_fixture import KafkaUnderTest
from tools.dev.fake_openai import FakeOpenAI

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gateway_process(
    kafka: KafkaUnderTest, tmp_path: Path
) -> Iterator[tuple[str, Settings, FakeOpenAI, subprocess.Popen[bytes]]]:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    upstream = FakeOpenAI()
    port = free_port()
    log = (tmp_path / "gateway.log").open("wb")
    with serve(upstream) as upstream_url:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline.cli",
                "gateway",
                "--upstream",
                upstream_url,
                "--listen",
                f"127.0.0.1:{port}",
                "--name",
                "gw-e2e",
            ],
            cwd=REPO,
            env=settings_env(s),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
            try:
                return httpx.get(f"{url}/tailguard/health").status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_for(up, 30, "the gateway to listen")
            yield url, s, upstream, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            log.close()


def test_gateway_and_envoy_events_join_with_engine_events_into_records(
    gateway_process: tuple[str, Settings, FakeOpenAI, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    url, s, upstream, proc = gateway_process
    served: list[str] = []
    with httpx.Client() as client:
        for i in range(20):
            body = {"model": "llama", "prompt": str(i), "max_tokens": 4, "stream": i % 2 == 0}
            r = client.post(f"{url}/v1/completions", json=body, headers={"x-vllm-priority": "1"})
            assert r.status_code == 200
            served.append(r.headers["x-request-id"])
        aborted: list[str] = []
        for _ in range(3):
            body = {"model": "llama", "prompt": "long", "max_tokens": 1000, "stream": True}
            with client.stream(
                "POST",
                f"{url}/v1/completions",
                json=body,
                headers={"x-test-chunk-delay-ms": "20"},
            ) as r:
                aborted.append(r.headers["x-request-id"])
                next(r.iter_raw())  # one chunk, then hang up
    assert set(served) <= set(upstream.seen)  # the upstream saw the gateway's request ids
    wait_for(lambda: set(aborted) <= upstream.abandoned, 10, "the upstream to see the aborts")

    # The engine (vLLM) reports the served requests under the same ids; the aborted ones
    # never finish there (a real vLLM reports finish_reason=abort; here: nothing at all).
    engine = kafka_sink(s)
    now_ms = (time.time_ns() - 1_700_000_000_000_000_000) / 1e6  # factories' T0 offset
    for rid in served:
        engine.emit(finished(rid, now_ms, model="llama"))
    # Envoy access log: two requests, one the client abandoned (DC).
    t0 = time.time()
    log_file = tmp_path / "envoy.jsonl"
    lines = [
        {
            "request_id": "envoy-ok",
            "start_time": f"{t0:.6f}",
            "total_us": 250000,
            "ttfb_us": 40000,
            "response_code": 200,
            "response_flags": "-",
            "model": "llama",
        },
        {
            "request_id": "envoy-dc",
            "start_time": f"{t0:.6f}",
            "total_us": 90000,
            "ttfb_us": 30000,
            "response_code": 0,
            "response_flags": "DC",
            "model": "llama",
        },
        "not json at all",
    ]
    log_file.write_bytes(
        b"\n".join(x.encode() if isinstance(x, str) else orjson.dumps(x) for x in lines) + b"\n"
    )
    engine.emit(finished("envoy-ok", now_ms, model="llama"))
    assert engine.flush(30) == 0
    engine.close()
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "envoy", str(log_file), "--name", "envoy-1"],
        cwd=REPO,
        env=settings_env(s),
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode()
    stats = orjson.loads(out.stdout.splitlines()[-1])
    assert (stats["requests"], stats["dead"]) == (2, 1)
    dlq = read_all(s, s.dlq_topic)
    assert len(dlq) == 1
    assert dict(dlq[0].headers())["tailguard.reason"].startswith(b"not JSON")

    # Stop the gateway by its PID: it flushes its producer before exiting (uvicorn then
    # re-raises SIGTERM, so the exit status is -SIGTERM).
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) in (0, -signal.SIGTERM)
    gw_log = (tmp_path / "gateway.log").read_text()
    assert "producer closed: sent=46 dropped=0 failed=0" in gw_log, gw_log[-3000:]

    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        worker.wait_caught_up(120)
    finally:
        assert worker.stop() == 0
    store = open_store(s)
    try:
        rows = store.query_rows(
            "SELECT request_id, source, outcome, http_status, gateway_host, engine_host,"
            f" queue_ms, gateway_total_ms FROM {s.database}.requests FINAL"
        )
    finally:
        store.close()
    by_id = {r[0]: r for r in rows}
    for rid in served:
        assert by_id[rid][1:4] == ("joined", "ok", 200), by_id.get(rid)
        assert by_id[rid][4] == "gw-e2e"
        assert by_id[rid][6] is not None
    for rid in aborted:
        assert by_id[rid][1:4] == ("gateway_only", "client_abort", 0), by_id.get(rid)
        assert by_id[rid][6] is None
    assert by_id["envoy-ok"][1:4] == ("joined", "ok", 200)
    assert by_id["envoy-ok"][7] == pytest.approx(250.0)
    assert by_id["envoy-dc"][1:4] == ("gateway_only", "client_abort", 0)
    assert len(by_id) == 20 + 3 + 2
