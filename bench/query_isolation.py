"""The writer's flush latency with and without heavy queries on the read-only port.

One embedded engine, as in a worker: the writer (this process's main thread) flushes a
slice of the simulated workload every ``--interval-s`` (``write_requests`` and
``write_raw_messages``, ~10,000 events: about one second of a busy worker's traffic),
and the query port (:class:`~pipeline.adapters.query_server.QueryServer`, the worker's
limits from :class:`~pipeline.settings.Settings`) serves clickhouse-connect over HTTP.
Phases alternate: ``quiet`` (no query) and ``heavy`` (a client thread sends hostile
queries back to back: ``SELECT arrayMap(x -> x, range(100000000))``, one block of 10^8
numbers, and a 10-fold cross join of ``requests``, ~10^40 rows in blocks). Reported per
phase: the flushes' wall-time p50 / p99 / max, and each heavy query's answer (code and
seconds).

    PYTHONPATH=$PWD python bench/query_isolation.py [--rounds 2] [--flushes 60]
        [--max-execution-s 10]

Not part of ``./tg bench`` (it takes minutes). Another process's load moves both phases.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.store_speed import workload
from pipeline.adapters import store as st
from pipeline.adapters.query_server import HOST, QueryLimits, QueryServer
from pipeline.settings import Settings

MEMORY_BOMB = "SELECT arrayMap(x -> x, range(100000000))"
TIME_BOMB = "SELECT count() FROM " + ", ".join(f"requests AS t{i}" for i in range(10))
_CODE_RE = re.compile(r"(?i)code: (\d+)")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def hostile(port: int, token: str, seconds: float) -> None:
    """The hostile client (a process of its own, as ``tailguard sql`` is, reading the
    answers as raw bytes, as curl does): heavy queries back to back for ``seconds``, one
    line per answer on stdout."""
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        sql = (MEMORY_BOMB, TIME_BOMB)[i % 2]
        i += 1
        t0 = time.monotonic()
        request = urllib.request.Request(
            f"http://{HOST}:{port}/", data=sql.encode(), headers={"X-ClickHouse-Key": token}
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as resp:  # noqa: S310 (127.0.0.1)
                while resp.read(1 << 20):
                    pass
            code = "ok"
        except urllib.error.HTTPError as exc:
            code = exc.headers.get("X-ClickHouse-Exception-Code", str(exc.code))
        kind = "memory" if sql is MEMORY_BOMB else "time"
        print(json.dumps([kind, code, time.monotonic() - t0]), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="quiet + heavy phases, each")
    ap.add_argument("--flushes", type=int, default=60, help="flushes per phase")
    ap.add_argument("--interval-s", type=float, default=0.5, help="flush period")
    ap.add_argument("--chunks", type=int, default=6, help="slices of the workload")
    ap.add_argument("--max-execution-s", type=int, default=10)
    ap.add_argument(
        "--old-lock",
        action="store_true",
        help="queries hold the writer's lock, as before issue 37 (for comparison)",
    )
    ap.add_argument("--hostile", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.hostile:
        hostile(int(args.hostile[0]), sys.stdin.readline().strip(), float(args.hostile[1]))
        return 0
    records, kept, _windows, n = workload(1)
    k = args.chunks
    rec = [records[i::k] for i in range(k)]
    kep = [kept[i::k] for i in range(k)]
    s = Settings()
    limits = QueryLimits.from_settings(s)
    limits = QueryLimits(
        max_execution_time_s=args.max_execution_s,
        max_memory_bytes=limits.max_memory_bytes,
        max_threads=limits.max_threads,
    )
    tmp = Path(tempfile.mkdtemp(prefix="tailguard-query-isolation-"))
    phases: dict[str, list[float]] = {"quiet": [], "heavy": []}
    answers: list[Any] = []
    try:
        store = st.open_store(s.model_copy(update={"store_dir": tmp / "store"}))
        st.migrate(store, raw_ttl_days=3650)  # the workload's events are from 2025
        server = QueryServer(tmp / "store", store.lock, limits=limits).start(publish=False)
        own_lock = server.session._lock
        if args.old_lock:
            server.session._lock = store.lock
        try:
            j = 0
            for _ in range(args.rounds):
                for phase in ("quiet", "heavy"):
                    child = None
                    if phase == "heavy":
                        child = subprocess.Popen(
                            [sys.executable, "-m", "bench.query_isolation", "--hostile",
                             str(server.port), str(args.flushes * args.interval_s)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                        )  # fmt: skip
                        assert child.stdin is not None
                        child.stdin.write(server.token + "\n")  # not on its command line
                        child.stdin.close()
                        server.session.busy.wait(30)  # its first query runs
                    next_t = time.monotonic()
                    for _ in range(args.flushes):
                        t0 = time.monotonic()
                        st.write_requests(store, rec[j % k])
                        st.write_raw_messages(store, s.lifecycle_topic, kep[j % k])
                        phases[phase].append(time.monotonic() - t0)
                        j += 1
                        next_t += args.interval_s
                        time.sleep(max(0.0, next_t - time.monotonic()))  # the flush period
                    if child is not None:
                        assert child.stdout is not None
                        out = child.stdout.read()
                        child.wait()
                        answers.extend(tuple(json.loads(line)) for line in out.splitlines())
            # nothing lost nor mixed up by the concurrent sessions: every request and event
            stored = store.query_rows(
                "SELECT (SELECT count() FROM tailguard.requests FINAL), "
                "(SELECT count() FROM tailguard.lifecycle_events FINAL)"
            )[0]
        finally:
            server.session._lock = own_lock
            server.stop()
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{n // k} events a flush ({len(rec[0])} requests), every {args.interval_s} s; "
        f"port limits: {limits.settings()}"
    )
    for phase, xs in phases.items():
        print(
            f"{phase:5s}: {len(xs)} flushes, p50 {statistics.median(xs) * 1000:.0f} ms, "
            f"p99 {_pct(xs, 0.99) * 1000:.0f} ms, max {max(xs) * 1000:.0f} ms"
        )
    print(
        f"stored: {stored[0]} requests of {len(records)}, {stored[1]} events of {n}"
        + (" (queries held the writer's lock)" if args.old_lock else "")
    )
    ratio = _pct(phases["heavy"], 0.99) / _pct(phases["quiet"], 0.99)
    print(f"p99 heavy / quiet: {ratio:.2f}")
    for kind in ("memory", "time"):
        got = [(c, t) for kd, c, t in answers if kd == kind]
        if got:
            codes = sorted({c for c, _ in got})
            secs = [t for _, t in got]
            print(
                f"{kind} bomb: {len(got)} sent, answers {codes}, "
                f"{min(secs):.2f}-{max(secs):.2f} s each"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
