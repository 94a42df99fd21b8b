"""Gateway request latency with the broker up vs stopped (issue 5: "Kafka down is not an outage").

Three processes on loopback: the fake OpenAI upstream, ``tailguard gateway`` in front of
it, and this client. Phases, measured side by side in one run:

1. ``direct``      — client -> upstream (no gateway): the floor;
2. ``broker_up``   — client -> gateway -> upstream, events delivered to Kafka;
3. ``broker_down`` — the same with the broker stopped (events buffered in the gateway);
4. ``recovered``   — broker started again (buffered events drain while serving).

Each phase sends ``n`` sequential non-streaming chat completions (one connection, keep-alive)
after ``warmup`` unmeasured ones, and reports p50/p90/p99/mean in ms. The gateway's producer
counters (``/tailguard/health``) before and after show that nothing was lost.

Run alone: ``python -m bench.gateway_latency [--quick]`` (prints JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import spawn, stop_process
from tools.dev.kafka_local import LocalKafka

REPO = Path(__file__).resolve().parents[1]
TARGET_DELTA_MS = 3.0  # "within a few milliseconds": p50 and p99 of down minus up


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1.0)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        else:
            return


def _percentiles(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return {
        "n": len(s),
        "p50_ms": round(q(0.50), 3),
        "p90_ms": round(q(0.90), 3),
        "p99_ms": round(q(0.99), 3),
        "mean_ms": round(statistics.fmean(s), 3),
    }


def _phase(client: httpx.Client, url: str, n: int, warmup: int) -> dict[str, float]:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    out: list[float] = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        r = client.post(f"{url}/v1/chat/completions", json=body)
        dt = (time.perf_counter() - t0) * 1000
        if r.status_code != 200:
            raise RuntimeError(f"request failed: {r.status_code} {r.text[:200]}")
        if i >= warmup:
            out.append(dt)
    return _percentiles(out)


def run(quick: bool = False, workdir: Path | None = None) -> dict[str, Any]:
    n, warmup = (300, 50) if quick else (2000, 200)
    tmp = Path(tempfile.mkdtemp(prefix="tg-bench-gw-", dir=workdir))
    broker = LocalKafka(tmp / "kafka")
    broker.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        up_port, gw_port = _free_port(), _free_port()
        env_base = {
            "TAILGUARD_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "TAILGUARD_LIFECYCLE_TOPIC": "bench.gw.lc",
            "TAILGUARD_ENGINE_STATS_TOPIC": "bench.gw.stats",
            "TAILGUARD_DLQ_TOPIC": "bench.gw.dlq",
            "TAILGUARD_TOPIC_PARTITIONS": "8",
        }
        env = dict(os.environ) | env_base
        subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "topics"],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
        )
        log = (tmp / "procs.log").open("wb")
        upstream = spawn(["tools.dev.fake_openai", "--port", str(up_port)], env, log)
        procs.append(upstream)
        up_url = f"http://127.0.0.1:{up_port}"
        gw = spawn(
            ["pipeline.cli", "gateway", "--upstream", up_url,
             "--listen", f"127.0.0.1:{gw_port}", "--name", "bench-gw"],
            env,
            log,
        )  # fmt: skip
        procs.append(gw)
        gw_url = f"http://127.0.0.1:{gw_port}"
        _wait_http(up_url + "/health", upstream)
        _wait_http(gw_url + "/tailguard/health", gw)

        def health() -> dict[str, Any]:
            doc: dict[str, Any] = httpx.get(gw_url + "/tailguard/health").json()["producer"]
            return doc

        result: dict[str, Any] = {"requests_per_phase": n, "warmup_per_phase": warmup}
        with httpx.Client(timeout=30.0) as client:
            result["direct"] = _phase(client, up_url, n, warmup)
            result["broker_up"] = _phase(client, gw_url, n, warmup)
            result["producer_after_up"] = health()
            broker.stop()
            try:
                result["broker_down"] = _phase(client, gw_url, n, warmup)
                result["producer_after_down"] = health()
            finally:
                broker.start()
            result["recovered"] = _phase(client, gw_url, n, warmup)
        deadline = time.monotonic() + 60
        expected = 2 * 3 * (n + warmup)
        while health()["events_sent"] < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        result["producer_final"] = health()
        result["events_expected"] = expected
        up, down = result["broker_up"], result["broker_down"]
        result["delta_p50_ms"] = round(down["p50_ms"] - up["p50_ms"], 3)
        result["delta_p99_ms"] = round(down["p99_ms"] - up["p99_ms"], 3)
        result["target_delta_ms"] = TARGET_DELTA_MS
        result["pass"] = (
            abs(result["delta_p50_ms"]) <= TARGET_DELTA_MS
            and result["delta_p99_ms"] <= TARGET_DELTA_MS
            and result["producer_final"]["events_sent"] == expected
        )
        return result
    finally:
        for p in reversed(procs):
            stop_process(p, 20)
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(orjson.dumps(run(args.quick), option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()


# --- the results-file section ------------------------------------------------------------

try:
    from bench.results import Figure, Section, at_most, register
except ImportError:  # pragma: no cover
    register = None  # type: ignore[assignment]

if register is not None:

    @register("gateway", "Gateway latency: Kafka up vs down", order=60)
    def gateway_section(ctx: Any) -> Section:
        sec = Section("gateway", "Gateway latency: Kafka up vs down")
        r = run(quick=ctx.mode == "quick", workdir=ctx.workdir)
        up, down = r["broker_up"], r["broker_down"]
        sec.figures += [
            at_most("p50 broker down − broker up", r["delta_p50_ms"], "ms", TARGET_DELTA_MS),
            at_most("p99 broker down − broker up", r["delta_p99_ms"], "ms", TARGET_DELTA_MS),
            Figure("p50 direct (no gateway)", r["direct"]["p50_ms"], "ms"),
            Figure("p50 / p99 broker up", up["p50_ms"], "ms", note=f"p99 {up['p99_ms']} ms"),
            Figure("p50 / p99 broker down", down["p50_ms"], "ms", note=f"p99 {down['p99_ms']} ms"),
            Figure("events delivered after recovery", r["producer_final"]["events_sent"], "",
                   note=f"of {r['events_expected']}; dropped "
                   f"{r['producer_final']['events_dropped']}, failed "
                   f"{r['producer_final']['events_failed']}"),
        ]  # fmt: skip
        sec.text.append(
            f"{r['requests_per_phase']} sequential non-streaming chat completions per phase "
            f"(after {r['warmup_per_phase']} unmeasured), one keep-alive connection: client -> "
            "`tailguard gateway` (a process) -> the fake OpenAI upstream (a process), with the "
            "real broker up, then stopped, then started again."
        )
        sec.text.append("Raw result:\n\n```json\n" + json.dumps(r, indent=2) + "\n```")
        sec.commands.append("python -m bench.gateway_latency")
        return sec
