"""Readers and the writer on the query port, with and without a hostile client.

One embedded engine, as in a worker: the writer (this process's main thread) flushes a
slice of the simulated workload every ``--interval-s`` (``write_requests`` and
``write_raw_messages``, ~10,000 events: about one second of a busy worker's traffic),
and the query port (:class:`~pipeline.adapters.query_server.QueryServer`, published
like the worker's, with the limits and caps of :class:`~pipeline.settings.Settings`
unless overridden) serves clickhouse-connect over HTTP. Phases alternate: ``quiet`` and
``heavy``. In both, an interactive client (a process of its own, as the tools are) asks
every second for what ``tailguard report`` reads (``open_reader`` + ``read_report``,
through the discovery file and the port) and for a dashboard panel (the SLO dashboard's
first panel, as Grafana's plugin sends it, from a clickhouse-connect client named
Grafana). In ``heavy`` a hostile client (another process, curl-like, raw HTTP) sends
queries back to back: a memory bomb (``SELECT arrayMap(x -> x, range(100000000))``,
one block of 10^8 numbers), a 10-fold cross join of ``requests`` (~10^40 rows in blocks:
it runs until the time limit), ``uniqExact`` of every pair of request ids (a hash set
that grows until the memory limit), the cross join again. Reported per phase: the flushes' wall
time, the interactive answers' seconds (p50 / max) and codes, the process's RSS (the
"worker's", sampled every 50 ms), each hostile answer's code and seconds, and that every
request and event written is stored.

    PYTHONPATH=$PWD python bench/query_isolation.py [--rounds 1] [--flushes 120]
        [--concurrency N] [--nice N] [--max-execution-s 30]

``--concurrency 1`` is the port as it was before issue 49 (one query at a time). Not part
of ``./tg bench`` (it takes minutes). Another process's load moves every figure.
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
import threading
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
# ~3.7 * 10^8 pairs of request ids into one hash set: it grows until the memory limit
GROUP_BOMB = "SELECT uniqExact(a.request_id, b.request_id) FROM requests AS a, requests AS b"
TIME_BOMB = "SELECT count() FROM " + ", ".join(f"requests AS t{i}" for i in range(10))
HOSTILE = (("memory", MEMORY_BOMB), ("time", TIME_BOMB), ("group", GROUP_BOMB), ("time", TIME_BOMB))
_CODE_RE = re.compile(r"(?i)code: (\d+)")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def hostile(port: int, token: str, seconds: float) -> None:
    """The hostile client: heavy queries back to back for ``seconds``, one line per
    answer on stdout."""
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        kind, sql = HOSTILE[i % len(HOSTILE)]
        i += 1
        t0 = time.monotonic()
        request = urllib.request.Request(
            f"http://{HOST}:{port}/",
            data=sql.encode(),
            headers={"X-ClickHouse-Key": token, "User-Agent": "curl/8.5.0"},
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as resp:  # noqa: S310 (127.0.0.1)
                while resp.read(1 << 20):
                    pass
            code = "ok"
        except urllib.error.HTTPError as exc:
            code = exc.headers.get("X-ClickHouse-Exception-Code", str(exc.code))
        print(json.dumps([kind, code, time.monotonic() - t0]), flush=True)


def panel_sql() -> str:
    """The SLO dashboard's first panel as Grafana's plugin sends it (all time)."""
    from tools.dev.grafana_sql import QueryContext, Variable, interpolate

    path = Path(__file__).parents[1] / "dashboards" / "json" / "tailguard-slo.json"
    model = json.loads(path.read_text())
    variables = {
        v["name"]: Variable(v["name"], v["current"]["value"]) for v in model["templating"]["list"]
    }
    ctx = QueryContext(1_500_000_000_000, int(time.time() * 1000), 60_000, variables)
    return str(interpolate(model["panels"][0]["targets"][0]["rawSql"], ctx))


def interactive(store_dir: str, seconds: float) -> None:
    """The tools and a dashboard: every second, report's reads through a freshly found
    port (as ``tailguard report`` does) and one panel query; one line per answer."""
    import clickhouse_connect

    from pipeline.adapters.query_server import find_live_worker, open_reader
    from pipeline.app.report import read_report
    from pipeline.spec.slo import load_spec_file

    s = Settings(store_dir=Path(store_dir))
    spec = load_spec_file(s.slo_spec) if s.slo_spec else None
    sql = panel_sql()
    live = find_live_worker(s.store_dir)
    assert live is not None
    grafana = None
    end = time.monotonic() + seconds
    next_t = time.monotonic()
    while time.monotonic() < end:
        for kind in ("report", "panel"):
            t0 = time.monotonic()
            try:
                if kind == "report":
                    reader = open_reader(s)
                    try:
                        read_report(reader, None, spec)
                    finally:
                        reader.close()
                else:
                    if grafana is None:  # its connect runs queries too (system.settings)
                        grafana = clickhouse_connect.get_client(
                            host=HOST,
                            port=live.port,
                            compress=False,
                            password=live.token,
                            client_name="Grafana",
                        )
                    grafana.query(sql)
                code = "ok"
            except Exception as exc:
                m = _CODE_RE.search(str(exc))
                code = m.group(1) if m else type(exc).__name__
            print(json.dumps([kind, code, time.monotonic() - t0]), flush=True)
        next_t += 1.0
        time.sleep(max(0.0, next_t - time.monotonic()))
    if grafana is not None:
        grafana.close()


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.query_isolation", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _lines(child: subprocess.Popen[str]) -> list[Any]:
    assert child.stdout is not None
    out = child.stdout.read()
    child.wait()
    return [tuple(json.loads(line)) for line in out.splitlines()]


def _limits(args: argparse.Namespace, s: Settings) -> QueryLimits:
    """The query port's limits: the settings', with the command line's overrides."""
    base = QueryLimits.from_settings(s)
    concurrency = args.concurrency or base.concurrency
    return QueryLimits(
        max_execution_time_s=args.max_execution_s or base.max_execution_time_s,
        max_memory_bytes=base.max_memory_bytes,
        max_result_bytes=base.max_result_bytes,
        max_threads=base.max_threads,
        nice=base.nice if args.nice is None else args.nice,
        concurrency=concurrency,
        per_client=min(base.per_client, concurrency),
        queue_wait_s=base.queue_wait_s,
    )


def _report(
    limits: QueryLimits,
    flush: str,
    *,
    flushes: dict[str, list[float]],
    asked: dict[str, list[Any]],
    rss: dict[str, list[float]],
    rss_start: float,
) -> None:
    """The limits, then per phase the flushes' times, the RSS and the interactive
    queries' answers. ``flush``: what one flush wrote, said."""
    print(
        f"{flush}; port: {limits.concurrency} at once, {limits.per_client} per client, queue wait "
        f"{limits.queue_wait_s:g} s; each query: {limits.settings()}"
    )
    for phase in ("quiet", "heavy"):
        xs = flushes[phase]
        print(
            f"{phase:5s}: {len(xs)} flushes, p50 {statistics.median(xs) * 1000:.0f} ms, "
            f"p99 {_pct(xs, 0.99) * 1000:.0f} ms, max {max(xs) * 1000:.0f} ms; RSS "
            f"median {statistics.median(rss[phase]):.0f} MB, max {max(rss[phase]):.0f} MB"
        )
        for kind in ("report", "panel"):
            got = [(c, t) for kd, c, t in asked[phase] if kd == kind]
            if got:
                secs = [t for _, t in got]
                codes = {c: sum(1 for cc, _ in got if cc == c) for c, _ in got}
                print(
                    f"       {kind}: {len(got)} asked, answers {codes}, p50 "
                    f"{statistics.median(secs):.2f} s, p90 {_pct(secs, 0.9):.2f} s, "
                    f"max {max(secs):.2f} s"
                )
    print(f"RSS at start {rss_start:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="quiet + heavy phases, each")
    ap.add_argument("--flushes", type=int, default=120, help="flushes per phase")
    ap.add_argument("--interval-s", type=float, default=0.5, help="flush period")
    ap.add_argument("--chunks", type=int, default=6, help="slices of the workload")
    ap.add_argument("--max-execution-s", type=int, default=None, help="default: Settings'")
    ap.add_argument("--concurrency", type=int, default=None, help="default: Settings'")
    ap.add_argument("--nice", type=int, default=None, help="default: Settings'")
    ap.add_argument("--hostile", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    ap.add_argument("--interactive", nargs=2, metavar=("DIR", "SECONDS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.hostile:
        hostile(int(args.hostile[0]), sys.stdin.readline().strip(), float(args.hostile[1]))
        return 0
    if args.interactive:
        interactive(args.interactive[0], float(args.interactive[1]))
        return 0
    records, kept, windows, n = workload(1)
    k = args.chunks
    rec = [records[i::k] for i in range(k)]
    kep = [kept[i::k] for i in range(k)]
    s = Settings()
    limits = _limits(args, s)
    tmp = Path(tempfile.mkdtemp(prefix="tailguard-query-isolation-"))
    flushes: dict[str, list[float]] = {"quiet": [], "heavy": []}
    asked: dict[str, list[Any]] = {"quiet": [], "heavy": []}
    rss: dict[str, list[float]] = {"quiet": [], "heavy": []}
    answers: list[Any] = []
    phase_now = ["quiet"]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            rss[phase_now[0]].append(_rss_mb())
            time.sleep(0.05)

    try:
        # the workload's events are from 2025: a retention that keeps them
        update = {"store_dir": tmp / "store", "raw_events_ttl_days": 3650}
        store = st.open_for_writing(s.model_copy(update=update)).store
        st.write_windows(store, windows, s.lifecycle_topic, 0.01, "bench")  # the panel's data
        server = QueryServer(tmp / "store", store.lock, limits=limits).start()
        sampler = threading.Thread(target=sample, daemon=True)
        try:
            rss_start = _rss_mb()
            sampler.start()
            j = 0
            seconds = str(args.flushes * args.interval_s)
            for _ in range(args.rounds):
                for phase in ("quiet", "heavy"):
                    phase_now[0] = phase
                    child = None
                    if phase == "heavy":
                        child = _child("--hostile", str(server.port), seconds)
                        assert child.stdin is not None
                        child.stdin.write(server.token + "\n")  # not on its command line
                        child.stdin.close()
                        deadline = time.monotonic() + 30
                        while server.pool.in_engine() == 0 and time.monotonic() < deadline:
                            time.sleep(0.01)  # its first query runs
                    probe = _child("--interactive", str(tmp / "store"), seconds)
                    next_t = time.monotonic()
                    for _ in range(args.flushes):
                        t0 = time.monotonic()
                        st.write_requests(store, rec[j % k])
                        st.write_raw_messages(store, s.lifecycle_topic, kep[j % k])
                        flushes[phase].append(time.monotonic() - t0)
                        j += 1
                        next_t += args.interval_s
                        time.sleep(max(0.0, next_t - time.monotonic()))  # the flush period
                    asked[phase].extend(_lines(probe))
                    if child is not None:
                        answers.extend(_lines(child))
            # nothing lost nor mixed up by the concurrent sessions: every request and event
            stored = store.query_rows(
                "SELECT (SELECT count() FROM tailguard.requests FINAL), "
                "(SELECT count() FROM tailguard.lifecycle_events FINAL)"
            )[0]
        finally:
            sampling.set()
            server.stop()
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _report(
        limits, f"{n // k} events a flush ({len(rec[0])} requests), every {args.interval_s} s",
        flushes=flushes, asked=asked, rss=rss, rss_start=rss_start,
    )  # fmt: skip
    print(f"stored: {stored[0]} requests of {len(records)}, {stored[1]} events of {n}")
    for kind in ("memory", "group", "time"):
        got = [(c, t) for kd, c, t in answers if kd == kind]
        if got:
            print(f"hostile {kind}: " + ", ".join(f"{c} after {t:.1f} s" for c, t in got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
