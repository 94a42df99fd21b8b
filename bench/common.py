"""Shared benchmark machinery: the broker, preloading, the raw consumer, worker runs.

Everything here measures real processes on the real broker: a local KRaft
Kafka (:class:`tools.dev.kafka_local.LocalKafka`) and ``tailguard
worker`` subprocesses with their embedded ClickHouse (chDB) stores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from bench.data import Workload, end_margin_ns, events, messages, sentinels
from pipeline.adapters.kafka_admin import ensure_topics
from pipeline.processes import stop_process
from pipeline.settings import Settings
from producers.emit import BatchPolicy

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 8
# Bench workers time out partial joins after 2 s (as the integration tests do):
# the run ends once every request is resolved, and a 15 s wall-clock wait for
# the last client aborts would be measured as processing time.
BENCH_JOIN_TIMEOUT_MS = 2_000


def new_settings(bootstrap: str, workdir: Path, name: str, **over: Any) -> Settings:
    """Settings with run-scoped topics and group; the production defaults otherwise."""
    run = f"{name}-{uuid.uuid4().hex[:6]}"
    base: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "store_dir": workdir / f"store-{run}",
        "group_id": f"bench-{run}",
        "lifecycle_topic": f"bench.lc.{run}",
        "engine_stats_topic": f"bench.stats.{run}",
        "dlq_topic": f"bench.dlq.{run}",
        "summaries_topic": f"bench.summaries.{run}",
        "control_topic": f"bench.control.{run}",
        "ledger_topic": f"bench.ledger.{run}",
        "topic_partitions": PARTITIONS,
        "join_timeout_ms": BENCH_JOIN_TIMEOUT_MS,
    }
    base.update(over)
    s = Settings(**base)
    ensure_topics(s)
    return s


def for_group(s: Settings, workdir: Path, name: str) -> Settings:
    """The same lifecycle topic, a fresh consumer group (reads the topic again from the
    start) with its own ledger topic: the ledger is per lifecycle topic, so a group reading
    it again would otherwise take what an earlier run counted as counted already."""
    run = f"{name}-{uuid.uuid4().hex[:6]}"
    out = s.model_copy(
        update={"group_id": f"bench-{run}", "store_dir": workdir / f"store-{run}",
                "ledger_topic": f"bench.ledger.{run}"}
    )  # fmt: skip
    ensure_topics(out)
    return out


# --- preloading ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Preloaded:
    topic: str
    events: int  # lifecycle events of the data (the end-of-input requests not included)
    requests: int  # distinct requests of the data
    messages: int
    bytes: int
    data_end: dict[int, int]  # per partition: the offset after its last data message
    end_requests: int  # the complete requests after the data that end the input
    produce_s: float
    events_per_message: float

    @property
    def requests_expected(self) -> int:
        """What a worker that read everything stores: every request of the data and
        every end-of-input request (complete requests, joined like any other)."""
        return self.requests + self.end_requests


def producer_config(settings: Settings) -> dict[str, Any]:
    return settings.kafka_config() | {
        "linger.ms": 50,
        "batch.size": 1_000_000,
        "compression.type": "lz4",  # what producers/emit.py's KafkaSink uses
        "queue.buffering.max.messages": 200_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "message.max.bytes": 2_000_000,
    }


def send(prod: Producer, topic: str, partition: int, value: bytes) -> None:
    """Produce, waiting for room in the producer's queue (never drops)."""
    while True:
        try:
            prod.produce(topic, value, partition=partition)
            break
        except BufferError:
            prod.poll(0.05)
    prod.poll(0)


def _produce_all(
    p: Producer, topic: str, items: Iterator[tuple[int, bytes, int]]
) -> tuple[int, int, int]:
    n_msgs = n_events = n_bytes = 0
    for part, value, n in items:
        send(p, topic, part, value)
        n_msgs += 1
        n_events += n
        n_bytes += len(value)
    left = p.flush(120)
    if left:
        raise RuntimeError(f"{left} messages not delivered to {topic}")
    return n_msgs, n_events, n_bytes


def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    c = Consumer(settings.kafka_config() | {"group.id": f"bench-probe-{uuid.uuid4().hex[:6]}"})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in md.partitions
        }
    finally:
        c.close()


def preload(settings: Settings, workload: Workload, policy: BatchPolicy) -> Preloaded:
    """Produce the workload, then the requests that end the input, to the lifecycle topic.

    The end: on every partition, complete requests from every host of the data, stamped
    just past the data's last window + grace (:func:`bench.data.sentinels`): every
    partition's event-time clock moves on and closes its last windows, and the offset
    committed then reaches the end of the data, with no wall-clock wait."""
    topic = settings.lifecycle_topic
    start_ns = time.time_ns() - 24 * 3600 * 10**9  # a day ago: all of it is backlog
    newest = [start_ns]

    def tracked() -> Iterator[tuple[str, int, dict[str, Any]]]:
        for item in events(workload, start_ns):
            newest[0] = item[1]  # in time order: the last one is the newest
            yield item

    p = Producer(producer_config(settings))
    t0 = time.perf_counter()
    n_msgs, n_events, n_bytes = _produce_all(p, topic, messages(tracked(), PARTITIONS, policy))
    produce_s = time.perf_counter() - t0
    data_end = end_offsets(settings, topic)
    win = settings.window_config()
    margin_ns = end_margin_ns(win.size_ms, win.grace_ms)
    max_ahead_ns = settings.clock_config().max_ahead_ms * 1_000_000
    if margin_ns >= max_ahead_ns:
        raise ValueError(
            f"the end of input ({margin_ns / 1e9:.0f} s past the data) would be out of the "
            f"event-time clock's range ({max_ahead_ns / 1e9:.0f} s)"
        )
    quorum = settings.clock_config().quorum
    sent = sentinels(PARTITIONS, newest[0] + margin_ns, quorum, workload.templates())
    _produce_all(p, topic, iter(sent))
    return Preloaded(
        topic,
        n_events,
        workload.n_requests,
        n_msgs,
        n_bytes,
        data_end,
        sum(n for _, _, n in sent) // 3,
        produce_s,
        n_events / max(1, n_msgs),
    )


# --- the raw limit ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RawResult:
    events: int
    messages: int
    seconds: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds


def raw_limit(settings: Settings, pre: Preloaded) -> RawResult:
    """confluent-kafka consume + orjson decode of the data, nothing else (one process)."""
    c = Consumer(
        settings.kafka_config()
        | {
            "group.id": f"bench-raw-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    loads = orjson.loads
    try:
        c.assign([TopicPartition(pre.topic, p, 0) for p in pre.data_end])
        remaining = {p: end for p, end in pre.data_end.items() if end > 0}
        n_events = n_msgs = 0
        t0: float | None = None
        while remaining:
            batch = c.consume(5000, timeout=1.0)
            if t0 is None and batch:
                t0 = time.perf_counter()
            for msg in batch:
                if msg.error():
                    continue
                part, off = msg.partition() or 0, msg.offset() or 0
                end = remaining.get(part)
                if end is None or off >= end:
                    continue  # the end-of-input requests
                doc = loads(msg.value() or b"null")
                n_events += len(doc) if isinstance(doc, list) else 1
                n_msgs += 1
                if off + 1 >= end:
                    del remaining[part]
        assert t0 is not None
        return RawResult(n_events, n_msgs, time.perf_counter() - t0)
    finally:
        c.close()


# --- worker processes --------------------------------------------------------------

_LOG_TS = re.compile(rb"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
FIRST_BATCH_MARK = b"resuming at offset"  # logged when a partition's first batch arrives


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _stat_cpu_seconds(stat: str) -> float:
    """User + system CPU seconds of a ``/proc/.../stat`` line (fields after the name)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None) -> float | None:
    """User + system CPU time of a process (all its threads), or of its thread ``tid``
    (the main thread's id is the process's)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        return _stat_cpu_seconds(Path(path).read_text())
    except OSError:
        return None


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """User + system CPU time of a process's threads, summed per thread name (``comm``);
    a thread that has exited is gone from it. In a worker: the main thread is the event
    loop; ``Unknown`` is the writer thread (chDB renames a thread that runs its queries:
    seen on 2026-12-05 by naming the writer with ``prctl`` and reading its name back after a
    write), with the part of each insert chDB runs on it; ``ThreadPool`` chDB's query
    pipeline threads; ``MergeMutate`` its background merges of parts; ``python`` other
    Python threads (Faust's consumer thread); ``rdk:*`` librdkafka's."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if tid == str(pid):
            name = "main"
        out[name] = out.get(name, 0.0) + _stat_cpu_seconds(stat)
    return out


class Worker:
    """One ``tailguard worker`` process (``python -m pipeline.cli worker``)."""

    def __init__(
        self,
        settings: Settings,
        log_path: Path,
        *,
        module: str = "pipeline.cli",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.command = f"{Path(sys.executable).name} -m {module} worker"
        self.proc = spawn(
            [module, "worker"], dict(os.environ) | settings.to_env() | dict(env or {}), self._log
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def first_batch_time(self) -> float | None:
        """Wall time (epoch s) of the first 'partition N: resuming at offset' line."""
        try:
            with self.log_path.open("rb") as fh:
                for line in fh:
                    if FIRST_BATCH_MARK in line:
                        m = _LOG_TS.match(line)
                        if m:
                            dt = datetime.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S,%f")
                            return dt.timestamp()
        except OSError:
            return None
        return None

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self, timeout_s: float = 60.0) -> int:
        rc = stop_process(self.proc, timeout_s)
        self._log.close()
        return rc


def spawn(args: list[str], env: Mapping[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``python -m ARGS...`` in the repository, output (both streams) to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", *args], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
    )


class CommitWatcher:
    """Committed offsets of a group, per partition (never joins the group)."""

    def __init__(self, settings: Settings, topic: str, partitions: list[int]) -> None:
        self._c = Consumer(
            settings.kafka_config() | {"group.id": settings.group_id, "enable.auto.commit": False}
        )
        self._tps = [TopicPartition(topic, p) for p in partitions]

    def committed(self) -> dict[int, int]:
        for _ in range(50):
            try:
                return {tp.partition: tp.offset for tp in self._c.committed(self._tps, timeout=10)}
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
                time.sleep(0.2)
        raise RuntimeError("committed offsets unavailable")

    def close(self) -> None:
        self._c.close()


@dataclass(slots=True)
class WorkerRunResult:
    workers: int
    events: int
    seconds: float  # first batch consumed -> every data offset committed
    requests_expected: int
    requests_stored: int  # distinct request ids over every worker's store
    request_rows: int  # rows (more than requests_stored: written twice, e.g. after a rebalance)
    rss_peak_bytes: int
    cpu_s: float  # worker CPU seconds from its first batch to the end (start-up excluded)
    dead_letters: int  # messages the run put on the dead-letter topic
    logs: list[Path] = field(default_factory=list)
    # worker CPU seconds before its first batch: imports, store migrations, the app
    # (~2-3 s, paid once; counted per event it would depress a short run's figure)
    startup_cpu_s: float = 0.0
    # of cpu_s, the main thread's: the event loop (Faust, the consumer, the whole core),
    # which holds the GIL while it computes; chDB's threads and librdkafka's are others
    loop_cpu_s: float = 0.0
    # of cpu_s, per thread name (thread_cpu_seconds), one worker's (the first)
    threads_cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds


def stored_request_ids(settings: Settings) -> tuple[set[str], int]:
    """Distinct request ids and row count in a (stopped) worker's embedded store;
    a subprocess because chDB holds one data directory per process."""
    code = (
        "import sys;from pipeline.adapters.store import open_store;"
        "from pipeline.settings import Settings;"
        "s=Settings(store_dir=sys.argv[1]);st=open_store(s);"
        "rows=st.query_rows('SELECT request_id FROM tailguard.requests');"
        "sys.stdout.write(chr(10).join(r[0] for r in rows));st.close()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(settings.store_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    lines = [ln for ln in out.stdout.split("\n") if ln]
    return set(lines), len(lines)


def run_workers(
    settings: Settings,
    pre: Preloaded,
    n_workers: int,
    workdir: Path,
    *,
    timeout_s: float = 1200.0,
    module: str = "pipeline.cli",
    env: Mapping[str, str] | None = None,
    stop_after_s: float | None = None,
) -> WorkerRunResult:
    """Start ``n_workers`` in one group on the preloaded topic and time them to the end.

    Measured: from the first batch any worker consumed (its log line) to the
    moment every partition's committed offset reaches the data's end (all
    records, windows and checkpoints written). ``stop_after_s``: stop that long
    after the first batch instead (profiling runs).
    """
    workers = []
    for i in range(n_workers):
        s = settings.model_copy(update={"store_dir": Path(f"{settings.store_dir}-{i}")})
        log = workdir / f"{settings.group_id}-{i}.log"
        workers.append(Worker(s, log, module=module, env=env))
    watcher = CommitWatcher(settings, pre.topic, sorted(pre.data_end))
    dlq_before = sum(end_offsets(settings, settings.dlq_topic).values())
    deadline = time.monotonic() + timeout_s
    rss_peak = 0
    cpu: dict[int, float] = {}
    cpu_at_first: dict[int, float] = {}  # CPU when its first batch was seen (polled)
    loop: dict[int, float] = {}  # the same, of the main thread (the event loop)
    loop_at_first: dict[int, float] = {}
    threads_at_first: dict[str, float] = {}
    threads: dict[str, float] = {}
    try:
        while True:
            for w in workers:
                if not w.alive():
                    raise RuntimeError(f"worker exited early:\n{w.log_tail()}")
                rss_peak = max(rss_peak, rss_bytes(w.proc.pid) or 0)
                pid = w.proc.pid
                cpu[pid] = cpu_seconds(pid) or cpu.get(pid, 0.0)
                loop[pid] = cpu_seconds(pid, pid) or loop.get(pid, 0.0)
                if w is workers[0]:
                    threads = thread_cpu_seconds(pid) or threads
                if pid not in cpu_at_first and w.first_batch_time() is not None:
                    cpu_at_first[pid] = cpu[pid]
                    loop_at_first[pid] = loop[pid]
                    if w is workers[0]:
                        threads_at_first = dict(threads)
            now = time.time()
            if stop_after_s is not None:
                firsts = [t for w in workers if (t := w.first_batch_time()) is not None]
                if firsts and now - min(firsts) >= stop_after_s:
                    done_at = now
                    break
            else:
                committed = watcher.committed()
                if all(committed.get(p, -1) >= end for p, end in pre.data_end.items()):
                    done_at = now
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"workers did not finish in {timeout_s:.0f} s:\n{workers[0].log_tail()}"
                )
            time.sleep(0.1)
    finally:
        watcher.close()
        for w in workers:
            w.stop()
    firsts = [t for w in workers if (t := w.first_batch_time()) is not None]
    if not firsts:
        raise RuntimeError("no worker logged its first batch")
    ids: set[str] = set()
    rows = 0
    if stop_after_s is None:
        for w in workers:
            got, n = stored_request_ids(w.settings)
            ids |= got
            rows += n
    return WorkerRunResult(
        n_workers,
        pre.events,
        done_at - min(firsts),
        pre.requests_expected,
        len(ids),
        rows,
        rss_peak,
        sum(cpu.values()) - sum(cpu_at_first.values()),
        sum(end_offsets(settings, settings.dlq_topic).values()) - dlq_before,
        [w.log_path for w in workers],
        startup_cpu_s=sum(cpu_at_first.values()),
        loop_cpu_s=sum(loop.values()) - sum(loop_at_first.values()),
        threads_cpu_s={
            n: c - threads_at_first.get(n, 0.0)
            for n, c in sorted(threads.items(), key=lambda x: -x[1])
            if c - threads_at_first.get(n, 0.0) > 0
        },
    )
