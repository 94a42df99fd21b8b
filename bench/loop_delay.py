"""The control loop's delay, live: ``tailguard demo``'s closed loop (local Kafka, the
simulator paced at a speed factor, the worker and its controller, the signed control
topic, the simulated gateways' real ``ControlClient``) run briefly in real time and at
the demo's speeds.

Per decision: the simulator's clock at the first arrival decided under it minus the
decision's ``as_of_unix_ms`` (the end of the latest window it read), both event time
(:mod:`producers.loop_delay`; ``pipeline/app/demo.py``). At a speed factor ``s`` a wall
second of the trip engine -> Kafka -> worker -> window close -> summary -> controller ->
control topic -> gateway is ``s`` seconds of event time, so the delay grows with the
speed, up to the demo pacer's bound (30 s of event time: past it the simulated clock
stops until the trip is done); the window close (the windows' grace) and the
controller's decision clock are event time and do not. ``tailguard backtest
--loop-delay`` takes the P99 at 1x (real time, as deployed) as its default
(``pipeline.app.backtest.DEFAULT_LOOP_DELAY_MS``); the P99 at 20x is what a backtest of
the demo's time-compressed run needs.

The runs (:data:`RUNS`): at 1x the shared trace's first 8 minutes with arrivals x2 from
minute 2 to 6; at 20x and 60x its first 25 minutes with arrivals x2 from minute 10 to 20
(the demo's episode, earlier); the demo's settings otherwise. No target:
figures for the backtest and the docs.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from bench.context import Context
from bench.results import Figure, Section, register
from producers.loop_delay import quantile

SHARED_TRACE = Path(__file__).resolve().parents[1] / "data" / "azure-llm-2023" / "conv.csv"
# (speed factor, trace seconds simulated, the x2 episode): real time (1x: a live
# deployment's delay, which the backtest's default applies), then the demo's default
# speed and the one docs/control.md section 6 also runs (the time-compressed demo, which
# a backtest reproduces with --loop-delay set to that speed's P99).
RUNS = ((1.0, 480, "120:360:2"), (20.0, 1500, "600:1200:2"), (60.0, 1500, "600:1200:2"))
SEED = 1


def _limit(span_s: float) -> int:
    from producers.simulator.trace import read_trace

    return sum(1 for t in read_trace(SHARED_TRACE) if t.arrival_offset_ms < span_s * 1000)


@register("loop_delay", "Control loop delay, live (the demo's closed loop)", order=58)
def loop_delay(ctx: Context) -> Section:
    from pipeline.app.demo import parse_overload, run_demo
    from producers.simulator.model import SimConfig

    sec = Section("loop_delay", "Control loop delay, live (the demo's closed loop)")
    for speed, span_s, episode in RUNS:
        limit = _limit(span_s)
        work = ctx.workdir / f"loop-delay-{speed:g}x"
        out = work / "report.json"
        config = SimConfig(
            start_unix_ns=time.time_ns(), seed=SEED, overload=parse_overload(episode)
        )
        t0 = time.perf_counter()
        rc = run_demo(
            trace=SHARED_TRACE,
            sim_config=config,
            speedup=speed,
            partitions=1,
            workdir=work,
            bootstrap=None,
            limit=limit,
            json_out=out,
        )
        wall = time.perf_counter() - t0
        cmd = (
            f"tailguard demo --speedup {speed:g} --overload {episode} --seed {SEED} "
            f"--limit {limit} --json {out}"
        )
        sec.commands.append(cmd)
        if rc != 0 or not out.exists():
            sec.figures.append(Figure(f"{speed:g}x: the demo failed (exit {rc})", None, "s"))
            continue
        ld = orjson.loads(out.read_bytes()).get("loop_delay") or {}
        samples = sorted(ld.get("samples_ms") or [])
        p50, p99 = quantile(samples, 0.5), quantile(samples, 0.99)
        sec.figures += [
            Figure(f"{speed:g}x: P50 evidence -> applied", _s(p50), "s", note="event time"),
            Figure(f"{speed:g}x: P99 evidence -> applied", _s(p99), "s", note="event time"),
            Figure(f"{speed:g}x: max", _s(samples[-1] if samples else None), "s"),
            Figure(f"{speed:g}x: decisions applied", len(samples), "decisions"),
            Figure(
                f"{speed:g}x: P50 / P99 in wall time (÷ {speed:g})",
                None if p50 is None else p50 / speed / 1000,
                "s",
                note=f"P99 {p99 / speed / 1000:.2f} s" if p99 is not None else "",
            ),
        ]
        sec.text.append(
            f"{speed:g}x: {len(samples)} decisions over {span_s} s of trace in {wall:.0f} s of "
            "wall time; delays (s, event time), sorted: "
            + ", ".join(f"{x / 1000:.1f}" for x in samples)
            + "."
        )
    sec.text.append(
        "Delay = the simulator's clock at the first arrival a simulated gateway decided "
        "under the directive - the decision's `as_of_unix_ms` (the end of the latest 10 s "
        "window it read): both the simulator's event time, one clock. It includes the "
        "window grace (5 s, event time), Kafka, the worker's flush (250 ms), the "
        "controller's decision clock, the control topic and the client's poll, the last "
        "four in wall time times the speed factor; the demo's pacer stops the simulated "
        "clock until every decision on the traffic 25 s old is in force at the gateways, "
        "so at any speed the delay stays within 30 s of event time (5 s between its marks "
        "+ 25 s), a slower machine only taking longer."
    )
    return sec


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000
