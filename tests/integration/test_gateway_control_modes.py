"""``tailguard gateway --control shadow|enforce`` end to end (issue 48), with the live
loop: a simulated overload on the real broker, the real worker and controller (its
control topic, signed with the keys file), and two real ``tailguard gateway`` processes,
one in shadow and one in enforce, reading the controller's directive through their
ControlClient, in front of the fake OpenAI upstream, emitting lifecycle events to the
real broker; then ``replay`` of what the gateways emitted into the embedded store and
``report``.

The overload is the shared trace at x3 (tests/control_fixtures.py), sent only up to a
few minutes into the episode: the controller enters L1 (shed priority 3, Retry-After
30 s) and holds it, re-issuing it every heartbeat, while the gateways are driven. In
shadow nothing is turned away and the gateway counts (``/tailguard/metrics``) and records
(``control_verdict``) what it would have refused; in enforce exactly those requests get
429 + Retry-After. The report shows both, as exact counts over the store.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Consumer

from pipeline.app.demo import kafka_sink
from pipeline.cli import main
from pipeline.settings import Settings
from producers.enforcement import spread_retry_after_s, unit_of
from tests.ceilings import ceiling
from tests.control_fixtures import (
    OVERLOAD_START_S,
    overload_simulator,
)
from tests.gateway_fixtures import serve, wait_for
from tests.integration.harness import WorkerProcess, control_settings, make_settings
from tests.measurement_fixtures import START_NS
from tests.paths import REPO
from tools.dev.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.integration, pytest.mark.long(60)]

PER_PRIORITY = 10  # requests of each priority 0..3 per mode
SHED_FROM = 3  # TEST_POLICY's L1 turns away priority 3
RETRY_AFTER = "30"  # TEST_POLICY's L1 retry_after_s
MODEL = "llama-3-70b"  # a scope of the overload (the trace's models are its scopes)
# The overload's events up to this far into the episode: L1 needs p99.queue_ms > 5 s for
# a minute, and the controller runs a window behind; nothing after it lets L1 exit.
SENT_UNTIL_NS = START_NS + (OVERLOAD_START_S + 300) * 1_000_000_000


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _emit_overload_start(settings: Settings) -> None:
    """The overload's events up to SENT_UNTIL_NS onto the worker's lifecycle topic."""
    sink = kafka_sink(settings)
    for ev in overload_simulator().events():
        if ev.ts_unix_ns < SENT_UNTIL_NS:
            sink.emit(ev)
    sink.flush()


def _level(url: str) -> int | None:
    """The level the gateway enforces for MODEL (from its health page), None if down."""
    health = _health(url)
    if health is None:
        return None
    scopes = (health.get("control") or {}).get("directives") or {}
    d = scopes.get(MODEL) or (health.get("control") or {}).get("fleet_directive") or {}
    return d.get("level")


def _run_gateway(mode: str, upstream: str, env: dict[str, str], keys: Path, log: Path) -> Any:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "gateway", "--upstream", upstream,
         "--listen", f"127.0.0.1:{port}", "--name", f"gw-{mode}", "--control", mode,
         "--control-keys-file", str(keys)],
        cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def _health(url: str) -> dict[str, Any] | None:
    try:
        return httpx.get(f"{url}/tailguard/health", timeout=2.0).json()  # type: ignore[no-any-return]
    except httpx.HTTPError:
        return None


def _drive(url: str, mode: str) -> dict[str, tuple[int, int, str | None]]:
    """PER_PRIORITY requests of each priority, half streamed: request id -> (priority,
    status, Retry-After)."""
    out: dict[str, tuple[int, int, str | None]] = {}
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for i in range(PER_PRIORITY):
            for prio in range(4):
                rid = f"{mode}-{prio}-{i}"
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": i % 2 == 0}
                headers = {"x-request-id": rid, "x-vllm-priority": str(prio),
                           "x-tailguard-model": MODEL}  # fmt: skip
                r = client.post("/v1/completions", json=body, headers=headers)
                out[rid] = (prio, r.status_code, r.headers.get("retry-after"))
    return out


def _metrics(url: str) -> dict[tuple[str, str, str], float]:
    """tailguard_gateway_control_refusals_total samples: (mode, priority, reason) -> n."""
    got: dict[tuple[str, str, str], float] = {}
    for line in httpx.get(f"{url}/tailguard/metrics", timeout=5.0).text.splitlines():
        if line.startswith("tailguard_gateway_control_refusals_total{"):
            labels, value = line[line.index("{") + 1 :].split("} ")
            kv = dict(part.split("=", 1) for part in labels.split(","))
            key = (kv["mode"].strip('"'), kv["priority"].strip('"'), kv["reason"].strip('"'))
            got[key] = float(value)
    return got


def _events(bootstrap: str, topic: str, out: Path, want_completed: int) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    events: list[dict[str, Any]] = []
    lines: list[bytes] = []
    deadline = time.monotonic() + ceiling(60)
    try:
        while sum(e["kind"] == "gateway.completed" for e in events) < want_completed:
            assert time.monotonic() < deadline, "the gateway's events did not all arrive"
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            lines.append(msg.value())
            doc = orjson.loads(msg.value())
            events.extend(doc if isinstance(doc, list) else [doc])
    finally:
        consumer.close()
    out.write_bytes(b"\n".join(lines) + b"\n")
    return events


def test_live_overload_gateways_shadow_count_what_enforce_refuses_report_shows_both(
    kafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s, keys = control_settings(kafka.bootstrap_servers, tmp_path)
    # the gateways' own events go to a topic of their own (their clock is now; the
    # overload's is in the past), replayed into a store of their own below
    gw = make_settings(kafka.bootstrap_servers, tmp_path / "gateways")
    lifecycle = gw.lifecycle_topic
    env = {**os.environ, "TAILGUARD_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
           "TAILGUARD_LIFECYCLE_TOPIC": lifecycle, "TAILGUARD_CONTROL_TOPIC": s.control_topic,
           "TAILGUARD_ENGINE_STATS_TOPIC": gw.engine_stats_topic}  # fmt: skip
    _emit_overload_start(s)
    worker = WorkerProcess(s, tmp_path / "worker.log")
    results: dict[str, dict[str, tuple[int, int, str | None]]] = {}
    metrics: dict[str, dict[tuple[str, str, str], float]] = {}
    procs: dict[str, tuple[Any, str]] = {}
    try:
        with serve(FakeOpenAI()) as upstream:
            for mode in ("shadow", "enforce"):
                procs[mode] = _run_gateway(mode, upstream, env, keys, tmp_path / f"gw-{mode}.log")
            try:
                for mode, (_proc, url) in procs.items():
                    # the controller's signed L1 for MODEL, read from the control topic
                    wait_for(
                        lambda url=url: worker.alive() and _level(url) == 1,
                        timeout_s=240.0,
                        what=f"the {mode} gateway to enforce the controller's L1 for {MODEL}",
                    )
                assert worker.alive(), worker.log_tail()
                for mode, (_proc, url) in procs.items():
                    results[mode] = _drive(url, mode)
                    metrics[mode] = _metrics(url)
                    assert _level(url) == 1, "L1 lifted while the gateways were driven"
            finally:
                for mode, (proc, _url) in procs.items():
                    proc.send_signal(signal.SIGTERM)
                    # uvicorn re-raises SIGTERM once shut down (the sink flushed before)
                    status = proc.wait(30)
                    log = (tmp_path / f"gw-{mode}.log").read_text()
                    assert status in (0, -signal.SIGTERM), log
    finally:
        worker.stop()
    # shadow serves everything; enforce turns away exactly priorities >= 2, 429 + Retry-After
    assert {s for (_p, s, _r) in results["shadow"].values()} == {200}
    for rid, (prio, status, retry) in results["enforce"].items():
        # the level's Retry-After, spread per request key by the one enforcement
        spread = str(spread_retry_after_s(int(RETRY_AFTER), unit_of("retry-after:" + rid)))
        assert (status, retry) == ((429, spread) if prio >= SHED_FROM else (200, None))
    # the would-have counters equal what enforce turned away, per priority and reason
    refused = {(p, w): n for (m, p, w), n in metrics["enforce"].items() if m == "enforce"}
    would = {(p, w): n for (m, p, w), n in metrics["shadow"].items() if m == "shadow"}
    assert refused == would == {("3", "shed_priority"): PER_PRIORITY}
    # the events carry the mode and the verdict; replayed, the report counts both
    n = 2 * 4 * PER_PRIORITY
    events = _events(kafka.bootstrap_servers, lifecycle, tmp_path / "events.jsonl", n)
    done = {e["request_id"]: e for e in events if e["kind"] == "gateway.completed"}
    assert len(done) == n
    for rid, e in done.items():
        mode, prio = rid.split("-")[0], int(rid.split("-")[1])
        want = "shed_priority" if prio >= SHED_FROM else None
        assert (e.get("control_mode"), e.get("control_verdict")) == (mode, want), rid
        assert e["outcome"] == ("rejected" if mode == "enforce" and want else "ok"), rid
    store = tmp_path / "store"
    assert main(["replay", str(tmp_path / "events.jsonl"), "--store", str(store), "--json"]) == 0
    capsys.readouterr()
    assert main(["report", "--store", str(store), "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    rows = {(r["model"], r["priority"]): r for r in report["control_verdicts"]}
    for prio in range(4):
        r = rows[(MODEL, prio)]
        assert r["modes"] == {"shadow": PER_PRIORITY, "enforce": PER_PRIORITY}
        shed = {"shed_priority": PER_PRIORITY} if prio >= SHED_FROM else {}
        assert (r["would_refuse"], r["refused"]) == (shed, shed)
        assert r["served"] == 2 * PER_PRIORITY - (PER_PRIORITY if shed else 0)
    capsys.readouterr()
    assert main(["report", "--store", str(store)]) == 0
    text = capsys.readouterr().out
    assert "would have refused" in text.lower() or "would_refuse" in text.lower(), text
