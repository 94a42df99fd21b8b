"""A live worker's memory, part by part: where ``./tg bench --only memory``'s growth goes.

    PYTHONPATH=$PWD .venv/bin/python -m bench.memory_live --minutes 10 --out DIR \\
        [--rate 10000] [--tracemalloc 4] [--resolved-ttl-ms 120000]

The RSS run of :mod:`bench.memory` (its own local broker, a producer at a constant rate
with event times = now, one ``tailguard worker``), with the worker started as
:mod:`bench.memory_worker`: every minute it writes its RSS, glibc's and chDB's memory
figures, its containers' lengths and (``--tracemalloc``) the Python allocations that grew
most, to ``DIR/samples.jsonl``. The RSS is also sampled from outside every 5 s; at the end
a Theil-Sen slope per figure (over the samples from ``--fit-from-min`` on) is printed.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

from bench.common import Worker, new_settings, rss_bytes
from bench.context import QUICK, Context
from bench.memory import RSS_SAMPLE_S, produce_live, theil_sen

MiB = 1024 * 1024


def _slopes(rows: list[dict[str, object]], fit_from_s: float) -> dict[str, float]:
    """MiB (or items) per minute of each numeric figure, Theil-Sen over the fitted rows."""
    fit = [r for r in rows if float(str(r["t_s"])) >= fit_from_s]
    out: dict[str, float] = {}
    if len(fit) < 2:
        return out
    flat: list[dict[str, float]] = []
    for r in fit:
        f: dict[str, float] = {}
        for k, v in r.items():
            if isinstance(v, int | float):
                f[k] = float(v)
            elif isinstance(v, dict):
                f |= {f"{k}.{kk}": float(vv) for kk, vv in v.items() if isinstance(vv, int | float)}
        flat.append(f)
    xs = [f["t_s"] for f in flat]
    for key in flat[-1]:
        if key == "t_s" or not all(key in f for f in flat):
            continue
        out[key] = theil_sen(xs, [f[key] for f in flat])[0] * 60
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=10_000.0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tracemalloc", type=int, default=0, help="frames per traceback; 0: off")
    ap.add_argument("--trace-base-s", type=float, default=180.0)
    ap.add_argument("--resolved-ttl-ms", type=int, default=0, help="0: the join's default")
    ap.add_argument("--fit-from-min", type=float, default=3.0)
    ap.add_argument("--period-s", type=float, default=60.0)
    ap.add_argument("--collect", action="store_true", help="a full gc at each sample")
    ap.add_argument(
        "--keep-insert-contexts", action="store_true", help="the store before its fix (A/B)"
    )
    args = ap.parse_args()

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM: stop the worker and the broker on the way out

    signal.signal(signal.SIGTERM, interrupt)
    args.out.mkdir(parents=True, exist_ok=True)
    samples = args.out / "samples.jsonl"
    env = {
        "TAILGUARD_MEM_SAMPLES": str(samples),
        "TAILGUARD_MEM_PERIOD_S": str(args.period_s),
        "TAILGUARD_MEM_TRACE_BASE_S": str(args.trace_base_s),
        "TAILGUARD_MEM_TRACEMALLOC": str(args.tracemalloc),
    }
    if args.collect:
        env["TAILGUARD_MEM_COLLECT"] = "1"
    if args.keep_insert_contexts:
        env["TAILGUARD_MEM_KEEP_INSERT_CONTEXTS"] = "1"
    if args.resolved_ttl_ms:
        env["TAILGUARD_MEM_RESOLVED_TTL_MS"] = str(args.resolved_ttl_ms)
    ctx = Context("quick", QUICK, args.out)
    stop = threading.Event()
    produced = [0]
    outside: list[tuple[float, int]] = []
    try:
        s = new_settings(ctx.bootstrap(), args.out, "memlive")
        worker = Worker(s, args.out / "worker.log", module="bench.memory_worker", env=env)
        thread = threading.Thread(
            target=produce_live, args=(s, args.rate, stop, produced), daemon=True
        )
        t0 = time.monotonic()
        thread.start()
        try:
            while (el := time.monotonic() - t0) < args.minutes * 60:
                if not worker.alive():
                    raise RuntimeError(f"worker exited:\n{worker.log_tail()}")
                if r := rss_bytes(worker.proc.pid):
                    outside.append((el, r))
                time.sleep(RSS_SAMPLE_S)
        finally:
            stop.set()
            thread.join(60)
            worker.stop()
    finally:
        ctx.close()
    fit = [(t, r / MiB) for t, r in outside if t >= args.fit_from_min * 60]
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line]
    report = {
        "produced_events": produced[0],
        "rss_mib_per_min_outside": theil_sen([t for t, _ in fit], [m for _, m in fit])[0] * 60,
        "per_min_inside": _slopes(rows, args.fit_from_min * 60),
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
