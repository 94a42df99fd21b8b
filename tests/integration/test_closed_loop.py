"""End to end on the real broker: overload -> L1 -> signed directives read by the
simulated gateways through the real ControlClient -> capacity-aware admission by
priority (429) and the queue cut-off (503) -> priority 0 served -> L0.

Time-compressed: the first 7000 requests of the shared trace (~22 min of traffic)
at 60x, arrivals x2 from minute 2 to minute 7. The simulator is paced by the whole loop in
simulated time (it stops its clock until every decision on the traffic 25 s old is in
force at its gateways), so the loop's delay is bounded in event time on any machine and
only the wall time grows with the load: ~8x, 170 s, on this machine when quiet.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from pipeline.app.demo import run_demo
from pipeline.cli import DEFAULT_TRACE
from producers.simulator.model import OverloadEpisode, SimConfig

pytestmark = [pytest.mark.integration, pytest.mark.long(105)]

EPISODE = OverloadEpisode(120, 420, 2.0)


def _p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(int(0.99 * len(s)), len(s) - 1)]


def test_overload_l1_directives_applied_p99_recovers_l0(kafka, tmp_path: Path) -> None:
    start_ns = time.time_ns()
    events = tmp_path / "events.jsonl"
    report_path = tmp_path / "report.json"
    rc = run_demo(
        trace=DEFAULT_TRACE,
        sim_config=SimConfig(start_unix_ns=start_ns, seed=1, overload=EPISODE),
        speedup=60.0,
        partitions=2,
        workdir=tmp_path / "demo",
        bootstrap=kafka.bootstrap_servers,
        limit=7000,
        tee_jsonl=events,
        json_out=report_path,
        closed_loop=True,
    )
    assert rc == 0
    report = orjson.loads(report_path.read_bytes())
    # every decision applied was measured from its evidence on the simulator's clock: never
    # before the window it read ended (one clock: a wall clock mixed in would not hold)
    delay = report["loop_delay"]
    assert delay["decisions"] == len(delay["samples_ms"]) > 0
    assert delay["min_ms"] >= 0
    # ... and never later than the pacer's bound (+ the wait for an arrival to apply it),
    # however busy the machine: the outcome below cannot depend on its speed
    assert delay["pace_gave_up"] == 0
    assert delay["max_ms"] <= delay["bound_ms"] + 5_000, delay
    control = report["control"]
    by_scope: dict[str, list[tuple[int, str]]] = {}
    for c in control:
        by_scope.setdefault(c["scope"], []).append((c["level"], c["phase"]))
    assert by_scope, "no directive was issued"
    for scope, levels in by_scope.items():
        assert (1, "degraded") in levels, (scope, levels)
        assert levels[-1] == (0, "normal"), (scope, levels)  # recovered to L0

    # the gateways applied the signed directives: admission (429) and the queue cut-off
    # (503) turned requests away by priority, priority 3 among them, never priority 0
    received: dict[str, dict] = {}
    done: list[dict] = []
    for line in events.read_bytes().splitlines():
        msg = orjson.loads(line)
        for ev in msg if isinstance(msg, list) else [msg]:
            if ev["kind"] == "gateway.received":
                received[ev["request_id"]] = ev
            elif ev["kind"] == "gateway.completed":
                done.append(ev)
    shed = [e for e in done if e["http_status"] in (429, 503)]
    assert shed, "no request was shed: directives were not applied"
    prios = {received[e["request_id"]]["priority"] for e in shed}
    assert 0 not in prios
    assert 3 in prios
    assert any("-r1" in e["request_id"] for e in shed)  # clients retried after Retry-After
    # ... while the overload they are about was still on (a loop that lags is no loop)
    first_shed_s = (min(e["ts_unix_ns"] for e in shed) - start_ns) / 1e9
    assert first_shed_s < EPISODE.end_offset_s, first_shed_s

    # P99 of the first byte: far over target in the episode, back under it at the end
    def ttfb(lo_s: float, hi_s: float) -> float:
        lo, hi = start_ns + lo_s * 1e9, start_ns + hi_s * 1e9
        xs = [
            e["ttfb_ms"]
            for e in done
            if e["outcome"] == "ok"
            and e["ttfb_ms"] is not None
            and received[e["request_id"]].get("stream")
            and lo <= received[e["request_id"]]["ts_unix_ns"] < hi
        ]
        return _p99(xs)

    # priority 0 keeps its first byte within the 2 s target through the episode (after
    # the first minute: detection and the queue built before it), and everyone after it
    p0 = [
        e["ttfb_ms"]
        for e in done
        if e["outcome"] == "ok"
        and e["ttfb_ms"] is not None
        and received[e["request_id"]]["priority"] == 0
        and received[e["request_id"]].get("stream")
        and start_ns + (EPISODE.start_offset_s + 60) * 1e9
        <= received[e["request_id"]]["ts_unix_ns"]
        < start_ns + EPISODE.end_offset_s * 1e9
    ]
    # No control serves 1.6 % of them within 2 s in the backtest of this configuration
    # (`tailguard backtest --limit 7000 --overload 120:420:2 --seed 1`), tailguard's loop
    # 89 % with directives always the pacer's bound late (`--loop-delay 30000`); live 99 %
    # measured (quiet machine). Before the pacer bounded the delay it grew with the load
    # and a busy CI run measured 66 %.
    assert p0
    assert sum(1 for x in p0 if x <= 2_000) / len(p0) >= 0.8, sorted(p0)[-10:]
    assert ttfb(EPISODE.end_offset_s + 600, EPISODE.end_offset_s + 800) < 2_000
