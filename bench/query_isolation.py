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
        [--concurrency N] [--nice N] [--max-execution-s 30] [--long-query-nice N]

``--concurrency 1`` is the port as it was before issue 49 (one query at a time);
``--long-query-nice 0`` the port before its long-query nice (a client's queries after one
that ran ``long_query_s`` at ``long_query_nice``, issue 49's last remainder). An
opt-in section of ``./tg bench`` (``./tg bench --only query_isolation``, ~3 minutes, the
defaults above): the heavy phase's slowest ``report`` and panel answers against issue 49's
target (within 3 s), the answers' codes, what was stored, the bombs and the RSS. Another
process's load moves every figure.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.results import Figure, Section, at_most, register
from bench.store_speed import workload
from pipeline.adapters import store as st
from pipeline.adapters.query_server import HOST, QueryLimits, QueryServer
from pipeline.settings import Settings

if TYPE_CHECKING:
    from bench.context import Context

TITLE = "Query port: report and a dashboard beside a hostile client"
INTERACTIVE_TARGET_S = 3.0  # issue 49: report and a panel answer within 3 s meanwhile
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
        long_query_s=base.long_query_s,
        long_query_nice=(
            base.long_query_nice if args.long_query_nice is None else args.long_query_nice
        ),
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
        f"{limits.queue_wait_s:g} s; after a query of {limits.long_query_s:g} s or more, a "
        f"client's next at nice {limits.long_query_nice}; each query: {limits.settings()}"
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


@dataclass
class Outcome:
    """What one run measured (see the module)."""

    limits: QueryLimits
    flush: str  # what one flush wrote, said
    flushes: dict[str, list[float]] = field(default_factory=dict)  # phase -> seconds
    asked: dict[str, list[Any]] = field(default_factory=dict)  # phase -> (kind, code, s)
    rss: dict[str, list[float]] = field(default_factory=dict)  # phase -> MB samples
    rss_start: float = 0.0
    answers: list[Any] = field(default_factory=list)  # the hostile client's (kind, code, s)
    stored: tuple[int, int] = (0, 0)  # requests, events in the store at the end
    written: tuple[int, int] = (0, 0)

    def interactive(self, phase: str, kind: str) -> list[tuple[str, float]]:
        return [(c, t) for kd, c, t in self.asked[phase] if kd == kind]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="quiet + heavy phases, each")
    ap.add_argument("--flushes", type=int, default=120, help="flushes per phase")
    ap.add_argument("--interval-s", type=float, default=0.5, help="flush period")
    ap.add_argument("--chunks", type=int, default=6, help="slices of the workload")
    ap.add_argument("--max-execution-s", type=int, default=None, help="default: Settings'")
    ap.add_argument("--concurrency", type=int, default=None, help="default: Settings'")
    ap.add_argument("--nice", type=int, default=None, help="default: Settings'")
    ap.add_argument(
        "--long-query-nice",
        type=int,
        default=None,
        help="a client's queries after a long one (default: QueryLimits'; at most --nice: off)",
    )
    ap.add_argument("--hostile", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    ap.add_argument("--interactive", nargs=2, metavar=("DIR", "SECONDS"), help=argparse.SUPPRESS)
    return ap


def measure(args: argparse.Namespace) -> Outcome:
    """The quiet and heavy phases (module docstring), with the limits of ``args``."""
    records, kept, windows, n = workload(1)
    k = args.chunks
    rec = [records[i::k] for i in range(k)]
    kep = [kept[i::k] for i in range(k)]
    s = Settings()
    limits = _limits(args, s)
    tmp = Path(tempfile.mkdtemp(prefix="tailguard-query-isolation-"))
    o = Outcome(
        limits,
        f"{n // k} events a flush ({len(rec[0])} requests), every {args.interval_s} s",
        flushes={"quiet": [], "heavy": []},
        asked={"quiet": [], "heavy": []},
        rss={"quiet": [], "heavy": []},
        written=(len(records), n),
    )
    phase_now = ["quiet"]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            o.rss[phase_now[0]].append(_rss_mb())
            time.sleep(0.05)

    try:
        # the workload's events are from 2025: a retention that keeps them
        update = {"store_dir": tmp / "store", "raw_events_ttl_days": 3650}
        store = st.open_for_writing(s.model_copy(update=update)).store
        st.write_windows(store, windows, s.lifecycle_topic, 0.01, "bench")  # the panel's data
        server = QueryServer(tmp / "store", store.lock, limits=limits).start()
        sampler = threading.Thread(target=sample, daemon=True)
        try:
            o.rss_start = _rss_mb()
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
                        o.flushes[phase].append(time.monotonic() - t0)
                        j += 1
                        next_t += args.interval_s
                        time.sleep(max(0.0, next_t - time.monotonic()))  # the flush period
                    o.asked[phase].extend(_lines(probe))
                    if child is not None:
                        o.answers.extend(_lines(child))
            # nothing lost nor mixed up by the concurrent sessions: every request and event
            row = store.query_rows(
                "SELECT (SELECT count() FROM tailguard.requests FINAL), "
                "(SELECT count() FROM tailguard.lifecycle_events FINAL)"
            )[0]
            o.stored = (int(row[0]), int(row[1]))
        finally:
            sampling.set()
            server.stop()
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return o


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.hostile:
        hostile(int(args.hostile[0]), sys.stdin.readline().strip(), float(args.hostile[1]))
        return 0
    if args.interactive:
        interactive(args.interactive[0], float(args.interactive[1]))
        return 0
    o = measure(args)
    _report(o.limits, o.flush, flushes=o.flushes, asked=o.asked, rss=o.rss, rss_start=o.rss_start)
    print(
        f"stored: {o.stored[0]} requests of {o.written[0]}, {o.stored[1]} events of {o.written[1]}"
    )
    for kind in ("memory", "group", "time"):
        got = [(c, t) for kd, c, t in o.answers if kd == kind]
        if got:
            print(f"hostile {kind}: " + ", ".join(f"{c} after {t:.1f} s" for c, t in got))
    return 0


@register("query_isolation", TITLE, order=97, opt_in=True)
def run(ctx: Context) -> Section:
    """The defaults (one round, 120 flushes a phase): issue 49's target as figures."""
    o = measure(_parser().parse_args([]))
    section = Section("query_isolation", TITLE)
    figs = section.figures
    for kind, what in (("report", "report's reads (open_reader + read_report)"),
                       ("panel", "a dashboard panel (the SLO dashboard's first)")):  # fmt: skip
        got = o.interactive("heavy", kind)
        secs = [t for _, t in got]
        quiet = [t for _, t in o.interactive("quiet", kind)]
        figs.append(
            at_most(
                f"beside the hostile client: {what}, slowest answer",
                max(secs), "s", INTERACTIVE_TARGET_S,
                f"{len(got)} asked; p50 {statistics.median(secs):.2f} s, p90 "
                f"{_pct(secs, 0.9):.2f} s; without it p50 {statistics.median(quiet):.2f} s, "
                f"max {max(quiet):.2f} s",
            )
        )  # fmt: skip
        bad = [c for c, _ in got if c != "ok"]
        figs.append(at_most(f"beside the hostile client: {kind} answers not ok", len(bad), "",
                            0, ", ".join(sorted(set(bad)))))  # fmt: skip
    figs.append(
        Figure("requests and events stored of those written", o.stored[0] + o.stored[1],
               "rows", f"= {sum(o.written):,}", o.stored == o.written,
               f"{o.stored[0]:,} requests of {o.written[0]:,}, {o.stored[1]:,} events of "
               f"{o.written[1]:,}")
    )  # fmt: skip
    for kind in ("memory", "group", "time"):
        got = [(c, t) for kd, c, t in o.answers if kd == kind]
        if got:
            figs.append(
                Figure(f"hostile {kind} queries: the slowest answer", max(t for _, t in got),
                       "s", note=", ".join(f"{c} after {t:.1f} s" for c, t in got))
            )  # fmt: skip
    figs.append(
        Figure("worker RSS: max beside the hostile client − max without",
               max(o.rss["heavy"]) - max(o.rss["quiet"]), "MB",
               note=f"{max(o.rss['quiet']):.0f} → {max(o.rss['heavy']):.0f} MB; "
               f"{o.rss_start:.0f} MB at start")
    )  # fmt: skip
    figs.append(
        Figure("the writer's flush p99 beside the hostile client", _pct(o.flushes["heavy"], 0.99)
               * 1000, "ms", note=f"without it {_pct(o.flushes['quiet'], 0.99) * 1000:.0f} ms; "
               f"{o.flush}")
    )  # fmt: skip
    section.text.append(
        f"The port: {o.limits.concurrency} queries at once, {o.limits.per_client} per client, "
        f"each `{o.limits.settings()}`; a client's queries after one of "
        f"{o.limits.long_query_s:g} s or more at nice {o.limits.long_query_nice}. Quiet, then "
        "heavy: 120 flushes of the writer each (60 s); an interactive client asks every "
        "second for report's reads and a panel; in the heavy phase a hostile client sends "
        "back to back a memory bomb, a 10-fold cross join, a growing `uniqExact` and the "
        "cross join again (module docstring of `bench/query_isolation.py`). The machine is "
        "shared: other processes' load moves every figure (load average before and after, "
        "above)."
    )
    section.commands.append("PYTHONPATH=$PWD python bench/query_isolation.py")
    return section


if __name__ == "__main__":
    raise SystemExit(main())
