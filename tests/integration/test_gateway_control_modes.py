"""``tailguard gateway --control shadow|enforce`` end to end (issue 48): the real command in
a process of its own, a signed L1 directive on the real control topic (read through the
ControlClient with the keys file), the fake OpenAI upstream, lifecycle events to the real
broker, then ``replay`` into the embedded store and ``report``.

In shadow nothing is turned away and the gateway counts (``/tailguard/metrics``) and
records (``control_verdict``) what it would have refused; in enforce exactly those
requests get 429 + Retry-After. The report shows both, as exact counts over the store.
The live controller's side (an overload detected, a directive published and applied by
the same enforcement) is tests/integration/test_closed_loop.py.
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
from confluent_kafka import Consumer, Producer

from pipeline.cli import main
from pipeline.contract.control_signal import Decision, UnsignedSignal, encode, message_key, sign
from producers.control_keys import keyring_from_file
from producers.enforcement import spread_retry_after_s, unit_of
from tests.control_fixtures import write_control_keys
from tests.gateway_fixtures import serve, wait_for
from tests.integration.harness import make_settings
from tests.paths import REPO
from tools.dev.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.integration, pytest.mark.long(15)]

PER_PRIORITY = 10  # requests of each priority 0..3 per mode
SHED_FROM = 2  # the directive turns away priorities 2 and 3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _publish_directive(bootstrap: str, topic: str, keys: Path) -> None:
    issued = int(time.time() * 1000)
    decision = Decision.model_validate({
        "level": 1, "phase": "degraded", "reason": "test: shed priorities >= 2",
        "actions": {"shed_priorities_at_or_above": SHED_FROM, "retry_after_s": 6},
    })  # fmt: skip
    unsigned = UnsignedSignal.model_validate(
        {**decision.model_dump(), "scope": "*", "seq": 1,
         "issued_at_unix_ms": issued, "expires_at_unix_ms": issued + 240_000}
    )  # fmt: skip
    signal_ = sign(unsigned, keyring_from_file(keys))
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, encode(signal_), key=message_key(signal_))
    assert producer.flush(30) == 0


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
                body = {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": i % 2 == 0}
                headers = {"x-request-id": rid, "x-vllm-priority": str(prio),
                           "x-tailguard-model": "m"}  # fmt: skip
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
    deadline = time.monotonic() + 60
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


def test_gateway_shadow_counts_what_enforce_refuses_and_report_shows_both(
    kafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings(kafka.bootstrap_servers, tmp_path)  # creates its topics
    lifecycle, control = settings.lifecycle_topic, settings.control_topic
    keys = write_control_keys(tmp_path / "keys.json")
    _publish_directive(kafka.bootstrap_servers, control, keys)
    env = {**os.environ, "TAILGUARD_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
           "TAILGUARD_LIFECYCLE_TOPIC": lifecycle, "TAILGUARD_CONTROL_TOPIC": control,
           "TAILGUARD_ENGINE_STATS_TOPIC": settings.engine_stats_topic}  # fmt: skip
    results: dict[str, dict[str, tuple[int, int, str | None]]] = {}
    metrics: dict[str, dict[tuple[str, str, str], float]] = {}
    with serve(FakeOpenAI()) as upstream:
        for mode in ("shadow", "enforce"):
            proc, url = _run_gateway(mode, upstream, env, keys, tmp_path / f"gw-{mode}.log")
            try:
                # the signed directive read from the topic, verified and in force
                wait_for(
                    lambda url=url: ((_health(url) or {}).get("control") or {})
                    .get("fleet_directive", {}).get("level") == 1,
                    timeout_s=60.0, what=f"the {mode} gateway to read the L1 directive",
                )  # fmt: skip
                results[mode] = _drive(url, mode)
                metrics[mode] = _metrics(url)
            finally:
                proc.send_signal(signal.SIGTERM)
                # uvicorn re-raises SIGTERM once shut down (the sink flushed before)
                status = proc.wait(30)
                assert status in (0, -signal.SIGTERM), (tmp_path / f"gw-{mode}.log").read_text()
    # shadow serves everything; enforce turns away exactly priorities >= 2, 429 + Retry-After
    assert {s for (_p, s, _r) in results["shadow"].values()} == {200}
    for rid, (prio, status, retry) in results["enforce"].items():
        # the directive's 6 s, spread per request key by the one enforcement
        spread = str(spread_retry_after_s(6, unit_of("retry-after:" + rid)))
        assert (status, retry) == ((429, spread) if prio >= SHED_FROM else (200, None))
    # the would-have counters equal what enforce turned away, per priority and reason
    refused = {(p, w): n for (m, p, w), n in metrics["enforce"].items() if m == "enforce"}
    would = {(p, w): n for (m, p, w), n in metrics["shadow"].items() if m == "shadow"}
    assert refused == would == {("2", "shed_priority"): PER_PRIORITY,
                                ("3", "shed_priority"): PER_PRIORITY}  # fmt: skip
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
        r = rows[("m", prio)]
        assert r["modes"] == {"shadow": PER_PRIORITY, "enforce": PER_PRIORITY}
        shed = {"shed_priority": PER_PRIORITY} if prio >= SHED_FROM else {}
        assert (r["would_refuse"], r["refused"]) == (shed, shed)
        assert r["served"] == 2 * PER_PRIORITY - (PER_PRIORITY if shed else 0)
    capsys.readouterr()
    assert main(["report", "--store", str(store)]) == 0
    text = capsys.readouterr().out
    assert "would have refused" in text.lower() or "would_refuse" in text.lower(), text
