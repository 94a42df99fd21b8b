"""Chaos: steady traffic through the real producer while the worker, the broker, the store
and the lifecycle topic fail at seeded random moments; at the end, exact checks.

    ./tg bench --only chaos                                # 30 minutes, 300 requests/s, seed 1
    ./tg bench --only chaos --minutes 120 --seed 7 --rate 500
    ./tg bench --only chaos --faults kill,broker,store,disk     # those kinds only

Traffic: the simulator's events (the shipped trace, its arrivals compressed to ``--rate``
requests/s, the engines multiplied to match so that they run as loaded as on the plain
trace; one simulation after the other, each with its own request-id prefix), event time =
now, paced into the project's Kafka producer (:func:`producers.emit.open_kafka_sink`,
blocking when full). Which requests were acknowledged comes from the producer's own
delivery callbacks (every delivered message's events, per request). A malformed message
(three kinds in turn) is produced every minute on a raw producer; its position (topic id,
partition, offset) comes from its delivery report.

Faults (``--seed`` fixes their order, moments and lengths): SIGKILL of the worker (one
per 6 minutes; every other one right after the worker committed), then a restart;
the broker stopped (SIGTERM) and started again; the store unwritable (the worker's
injected-outage flag file, ``TAILGUARD_FAULT_STORE_OUTAGE_FILE``); the store's disk full (a
size-limited tmpfs holds the store and is shrunk to 6 MiB free: needs root to mount;
skipped and said so otherwise); the lifecycle topic deleted and created again (at once or
up to 20 s later). Each fault fires when the producer's acknowledged requests reach its
planned share of the run *and* the worker has caught up after the previous fault (its
committed offsets reached the topic's end at that fault's end); each one's figures: when,
how long it was held, how long until the group's committed offsets reached the end
offsets of the fault's end, the peak lag. At the end: traffic stops, the producer is
flushed, and the time to drain (every partition committed to its end) is measured; the
worker is stopped (SIGTERM) and its store checked (:mod:`tools.dev.fault_checks`):
every acknowledged request stored exactly once, the windows' totals equal the requests on
every boundary, every rollup equals its source, one dead letter per bad position.
Every process started here (broker, workers) is stopped by its PID on the way out, on
failure and on Ctrl-C / SIGTERM too; the tmpfs is unmounted.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.common import REPO, Worker, new_settings, producer_config, send
from bench.context import Context
from bench.results import Figure, Section, at_most, register
from pipeline.adapters.kafka_admin import ensure_topics, topic_id
from pipeline.cli import DEFAULT_TRACE
from pipeline.contract.codec import DLQ_OFFSET, DLQ_PARTITION, DLQ_TOPIC_ID
from pipeline.contract.events import Event
from pipeline.settings import Settings
from producers.emit import open_kafka_sink
from producers.simulator.model import DEFAULT_MODELS, SimConfig, Simulator
from producers.simulator.trace import read_trace
from tools.dev.fault_checks import dead_letters
from tools.dev.kafka_local import LocalKafka

KINDS = ("kill", "broker", "store", "disk", "topic")
DEFAULTS: dict[str, Any] = {"minutes": 30.0, "rate": 300.0, "seed": 1, "faults": ",".join(KINDS)}
QUICK_MINUTES = 3.0
BAD_EVERY_S = 60.0
BAD_KINDS = (b"not json {", b'{"v": 1, "kind": "gateway.completed"}', b'"a string"')
DISK_LEFT_BYTES = 6 * 1024 * 1024  # what a full disk leaves free (the measured disk-full run's)
TMPFS_MIB_PER_MIN = 80  # the store's tmpfs per minute of traffic (1 GiB at least; 5 minutes
# at 300 requests/s wrote ~30 MiB/min): a cap, tmpfs takes memory only for what is written
RECOVERY_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 600.0
QUIET = {"log_level": 2}  # the bench's own clients: no librdkafka line per refused connect
BIT = {"gateway.received": 1, "gateway.completed": 2, "engine.finished": 4}


# --- the producers' own record of what was acknowledged -----------------------------------


@dataclass
class Acks:
    """Per request, the lifecycle kinds the broker acknowledged, from delivery callbacks
    (called on the producers' threads); ``generation`` counts the topic's deletions so far."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    kinds: dict[str, int] = field(default_factory=dict)
    gen_of: dict[str, int] = field(default_factory=dict)  # first completed/finished ack's
    requests: int = 0  # with a gateway.completed or engine.finished acknowledged
    events_acked: int = 0
    events_failed: int = 0
    generation: int = 0
    acked_in_gen: dict[int, int] = field(default_factory=dict)
    bad: list[tuple[str, int, int]] = field(default_factory=list)  # (topic id, part, offset)
    bad_failed: int = 0
    topic_id: str = ""

    def delivered(self, err: Any, msg: Any, lifecycle: str) -> None:
        if msg is None or msg.topic() != lifecycle:
            return
        try:
            doc = orjson.loads(msg.value() or b"null")
        except orjson.JSONDecodeError:
            return
        items = doc if isinstance(doc, list) else [doc]
        with self.lock:
            if err is not None:
                self.events_failed += len(items)
                return
            gen = self.generation
            self.acked_in_gen[gen] = self.acked_in_gen.get(gen, 0) + len(items)
            for d in items:
                bit = BIT.get(d.get("kind", ""), 0)
                if not bit:
                    continue
                self.events_acked += 1
                rid = d["request_id"]
                before = self.kinds.get(rid, 0)
                self.kinds[rid] = before | bit
                if bit != 1 and not before & 6:
                    self.requests += 1
                    self.gen_of[rid] = gen

    def bad_delivered(self, err: Any, msg: Any) -> None:
        with self.lock:
            if err is not None:
                self.bad_failed += 1
            else:
                self.bad.append((self.topic_id, msg.partition(), msg.offset()))

    def expected(self) -> set[str]:
        """Requests with a ``gateway.completed`` or ``engine.finished`` acknowledged: each is
        stored (complete, or partial after the join timeout) exactly once."""
        with self.lock:
            return {rid for rid, k in self.kinds.items() if k & 6}


def track_deliveries(sink: Any, acks: Acks, lifecycle: str) -> None:
    """Hear the sink's delivery reports too (its counters are kept as they are)."""
    own = sink._on_delivery  # the sink's per-message callback factory

    def on_delivery(n: int) -> Callable[[Any, Any], None]:
        cb = own(n)

        def both(err: Any, msg: Any) -> None:
            cb(err, msg)
            acks.delivered(err, msg, lifecycle)

        return both

    sink._on_delivery = on_delivery


# --- traffic ----------------------------------------------------------------------------------


def simulated_events(rate: float, seed: int, start_ns: int) -> Iterator[Event]:
    """The simulator's events, forever, at ``rate`` requests/s from ``start_ns``: the trace
    compressed to that rate with its engines multiplied to match, one simulation after the
    other (each with its own seed and request-id prefix), merged in time order."""
    trace = read_trace(REPO / DEFAULT_TRACE)
    span_ms = trace[-1].arrival_offset_ms + 1.0
    scale = rate / (len(trace) / (span_ms / 1000))
    models = tuple(replace(m, engines=m.engines * math.ceil(scale)) for m in DEFAULT_MODELS)
    seg_ns = int(span_ms / scale * 1e6)
    heap: list[tuple[int, int, Event, Iterator[Event]]] = []
    seq = 0
    k = 0
    while True:
        if not heap or heap[0][0] >= start_ns + k * seg_ns - 5 * 10**9:
            sim = Simulator(
                trace,
                SimConfig(
                    start_unix_ns=start_ns + k * seg_ns,
                    models=models,
                    rate_scale=scale,
                    seed=seed * 100_000 + k,
                    request_id_prefix=f"chaos{seed}-{k}-",
                    stats_interval_ms=5_000.0,
                ),
            )
            it = iter(sim.events())
            if (ev := next(it, None)) is not None:
                heapq.heappush(heap, (ev.ts_unix_ns, seq, ev, it))
                seq += 1
            k += 1
            continue
        _, _, ev, it = heapq.heappop(heap)
        yield ev
        if (nxt := next(it, None)) is not None:
            heapq.heappush(heap, (nxt.ts_unix_ns, seq, nxt, it))
            seq += 1


@dataclass
class Traffic:
    settings: Settings
    rate: float
    seed: int
    acks: Acks
    stop: threading.Event = field(default_factory=threading.Event)
    bad_paused: threading.Event = field(default_factory=threading.Event)
    received: int = 0  # gateway.received events handed to the producer
    error: BaseException | None = None
    sink: Any = None
    bad_producer: Producer | None = None
    started: float = 0.0
    stopped: float = 0.0

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run(self) -> None:
        s = self.settings
        lifecycle = s.lifecycle_topic
        self.sink = open_kafka_sink(s, service="chaos-bench", on_full="block", extra_config=QUIET)
        track_deliveries(self.sink, self.acks, lifecycle)
        self.bad_producer = Producer(
            producer_config(s) | QUIET | {"linger.ms": 5, "on_delivery": self.acks.bad_delivered}
        )
        rng = random.Random(self.seed)
        next_bad = time.monotonic() + BAD_EVERY_S / 2
        n_bad = 0
        self.started = time.monotonic()
        for ev in simulated_events(self.rate, self.seed, time.time_ns() + 10**9):
            while (ahead := ev.ts_unix_ns - time.time_ns()) > 0:
                if self.stop.is_set():
                    break
                time.sleep(min(ahead / 1e9, 0.02))
            if self.stop.is_set():
                break
            self.sink.emit(ev)
            if ev.kind == "gateway.received":
                self.received += 1
            if time.monotonic() >= next_bad and not self.bad_paused.is_set():
                next_bad += BAD_EVERY_S
                send(
                    self.bad_producer,
                    lifecycle,
                    rng.randrange(s.topic_partitions),
                    BAD_KINDS[n_bad % len(BAD_KINDS)],
                )
                n_bad += 1
            self.bad_producer.poll(0)
        self.stopped = time.monotonic()

    def finish(self, timeout_s: float = 300.0) -> int:
        """Flush both producers until everything is acknowledged (or ``timeout_s``); the
        events still undelivered."""
        left = 0
        deadline = time.monotonic() + timeout_s
        if self.bad_producer is not None:
            self.bad_producer.flush(max(1.0, deadline - time.monotonic()))
        if self.sink is not None:
            while (left := self.sink.flush(10.0)) and time.monotonic() < deadline:
                pass
        return left

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close(5.0)
            self.sink = None


# --- the fault schedule -----------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    kind: str  # kill, broker, store, disk, topic
    at_s: float  # planned moment (s after traffic started): the trigger is rate x at_s acks
    hold_s: float  # how long the fault is held (kill: until the restart)
    after_commit: bool = False  # kill: right after the worker committed


def plan(minutes: float, seed: int, only: tuple[str, ...] = KINDS) -> list[Planned]:
    """The faults of a run (of the kinds in ``only``): their order, moments and lengths
    from ``seed``. Between 10 % and 80 % of the run, one per slot (each at a random point
    of its own slot)."""
    rng = random.Random(seed)
    kills = max(1, round(minutes / 6))
    kinds = ["kill"] * kills + ["broker", "store", "disk", "topic"]
    kinds = [k for k in kinds if k in only]
    if not kinds:
        return []
    rng.shuffle(kinds)
    span = minutes * 60 * 0.7
    slot = span / len(kinds)
    out = []
    n_kill = 0
    for i, kind in enumerate(kinds):
        at = minutes * 60 * 0.1 + slot * (i + rng.uniform(0.1, 0.6))
        if kind == "kill":
            out.append(Planned(kind, at, rng.uniform(0.0, 5.0), after_commit=n_kill % 2 == 0))
            n_kill += 1
        elif kind == "topic":
            out.append(Planned(kind, at, rng.choice([0.0, rng.uniform(0.0, 20.0), 20.0])))
        else:
            out.append(Planned(kind, at, rng.uniform(20.0, 40.0)))
    return out


@dataclass
class Done:
    planned: Planned
    at_s: float = float("nan")  # when it fired (s after traffic started)
    acked_at: int = 0
    held_s: float = float("nan")
    recovered_s: float | None = None  # fault end -> committed >= end offsets at fault end
    peak_lag: int = 0
    notes: list[str] = field(default_factory=list)


# --- the group's progress ---------------------------------------------------------------------


class Progress:
    """Committed offsets of the worker group and end offsets, per partition, on one consumer
    that never joins the group; None while the broker does not answer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.lifecycle_topic
        self._c = Consumer(
            settings.kafka_config()
            | QUIET
            | {"group.id": settings.group_id, "enable.auto.commit": False}
        )
        self.tps = [TopicPartition(self.topic, p) for p in range(settings.topic_partitions)]

    def sample(self) -> tuple[dict[int, int], dict[int, int]] | None:
        try:
            committed = {
                tp.partition: max(tp.offset, 0) for tp in self._c.committed(self.tps, timeout=3)
            }
            ends = {
                tp.partition: self._c.get_watermark_offsets(tp, timeout=3)[1] for tp in self.tps
            }
        except KafkaException:
            return None
        return committed, ends

    def close(self) -> None:
        self._c.close()


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _log_count(path: Path, since: int, text: str) -> int:
    try:
        with path.open("rb") as fh:
            fh.seek(since)
            return fh.read().count(text.encode())
    except OSError:
        return 0


# --- the run ----------------------------------------------------------------------------------


class Chaos:
    def __init__(self, ctx: Context, minutes: float, rate: float, seed: int) -> None:
        self.minutes, self.rate, self.seed = minutes, rate, seed
        self.dir = ctx.workdir / "chaos"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed * 7919)
        self.acks = Acks()
        self.kafka: LocalKafka | None = None
        self.mount: Path | None = None
        self.mount_note = ""
        self.mount_bytes = 0
        self.kinds: tuple[str, ...] = KINDS
        self.worker: Worker | None = None
        self.traffic: Traffic | None = None
        self.thread: threading.Thread | None = None
        self.progress: Progress | None = None
        self.done: list[Done] = []
        self.findings: list[str] = []
        self.loads: list[float] = []
        self.last: tuple[dict[int, int], dict[int, int]] | None = None
        self.t0 = 0.0
        self.settings: Settings | None = None
        # faults whose end offsets the group has not committed yet: (fault, test, its end)
        self.pending: list[tuple[Done, Callable[[], bool], float]] = []
        self.gate: Callable[[], bool] = lambda: True  # may the next fault fire

    # -- processes --

    def _mount_tmpfs(self) -> Path:
        where = self.dir / "storefs"
        where.mkdir(exist_ok=True)
        self.mount_bytes = max(1024, round(self.minutes * TMPFS_MIB_PER_MIN)) * 2**20
        size = f"{self.mount_bytes // 2**20}m"
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=700", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode == 0:
            self.mount = where
        else:
            self.mount_note = (
                f"the disk-full fault was skipped: mounting a {size} tmpfs for the store "
                f"failed ({(r.stderr or r.stdout).strip()}; it needs root)"
            )
        return where

    def _remount(self, size: int) -> None:
        assert self.mount is not None
        subprocess.run(
            ["mount", "-o", f"remount,size={-(-size // 4096) * 4096}", str(self.mount)],
            check=True,
            capture_output=True,
        )

    def _start_worker(self) -> Worker:
        assert self.settings is not None
        self.worker = Worker(self.settings, self.dir / "worker.log")
        return self.worker

    def _stop_all(self) -> None:
        if self.traffic is not None:
            self.traffic.stop.set()
        if self.thread is not None:
            self.thread.join(60)
        if self.traffic is not None:
            self.traffic.close()
        if self.worker is not None:
            self.worker.stop(30)
        if self.progress is not None:
            self.progress.close()
        if self.kafka is not None:
            self.kafka.stop()
        if self.mount is not None:
            subprocess.run(["umount", str(self.mount)], check=False, capture_output=True)
            self.mount = None

    # -- waiting --

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def tick(self, rec: Done | None = None) -> None:
        """One look at the world: the group's progress (peak lag), the worker, the load."""
        assert self.progress is not None
        got = self.progress.sample()
        if got is not None:
            self.last = got
            lag = sum(max(0, got[1][p] - got[0].get(p, 0)) for p in got[1])
            if rec is not None:
                rec.peak_lag = max(rec.peak_lag, lag)
            now = time.monotonic()
            for item in list(self.pending):
                r, caught_up, t_end = item
                r.peak_lag = max(r.peak_lag, lag)
                if caught_up():
                    r.recovered_s = now - t_end
                    self.pending.remove(item)
                elif now - t_end > RECOVERY_TIMEOUT_S:
                    self.findings.append(
                        f"{r.planned.kind} at {r.at_s:.0f} s: the group did not commit to the "
                        f"fault's end offsets within {RECOVERY_TIMEOUT_S:.0f} s"
                    )
                    self.pending.remove(item)
        if self.traffic is not None and self.traffic.error is not None:
            raise RuntimeError("the traffic thread failed") from self.traffic.error
        if self.worker is not None and not self.worker.alive():
            rc = self.worker.proc.returncode
            self.findings.append(
                f"the worker exited by itself (status {rc}) at {self.elapsed():.0f} s; restarted"
            )
            self.worker.stop()
            self._start_worker()
        with contextlib.suppress(OSError):
            self.loads.append(os.getloadavg()[0])

    def wait(self, pred: Callable[[], bool], timeout_s: float, rec: Done | None = None) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            self.tick(rec)
            if pred():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def hold(self, seconds: float, rec: Done | None = None) -> None:
        end = time.monotonic() + seconds
        self.wait(lambda: time.monotonic() >= end, seconds + 1, rec)

    def caught_up_to(
        self, ends: dict[int, int], since: dict[int, int] | None = None
    ) -> Callable[[], bool]:
        """The group committed at least ``ends`` on every partition (and, with ``since``,
        something other than ``since`` there: a new generation's offsets)."""

        def pred() -> bool:
            if self.last is None:
                return False
            committed = self.last[0]
            if since is not None and any(committed.get(p) == since.get(p) for p in ends):
                return False
            return all(committed.get(p, 0) >= e for p, e in ends.items())

        return pred

    def fresh_ends(self, rec: Done | None = None) -> dict[int, int]:
        """The end offsets now (waiting for the broker to answer)."""
        assert self.progress is not None
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while (got := self.progress.sample()) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not answer for {RECOVERY_TIMEOUT_S:.0f} s")
            self.tick(rec)
            time.sleep(0.5)
        self.tick(rec)
        return dict(got[1])

    # -- faults --

    def fire(self, p: Planned) -> Done:
        rec = Done(p, at_s=self.elapsed(), acked_at=self.acks.requests)
        log = self.dir / "worker.log"
        mark = _log_size(log)
        since: dict[int, int] | None = None
        t = time.monotonic()
        if p.kind == "kill":
            assert self.worker is not None
            if p.after_commit:
                before = dict(self.last[0]) if self.last else {}
                ok = self.wait(lambda: self.last is not None and self.last[0] != before, 60, rec)
                rec.notes.append(
                    "right after a commit" if ok else "no commit seen in 60 s: killed anyway"
                )
            t = time.monotonic()
            self.worker.proc.send_signal(signal.SIGKILL)
            self.worker.proc.wait()
            self.worker.stop()
            self.worker = None  # not restarted by tick() meanwhile
            self.hold(p.hold_s, rec)
            self._start_worker()
            rec.notes.append(f"restarted {p.hold_s:.1f} s after the SIGKILL")
        elif p.kind == "broker":
            assert self.kafka is not None
            self.kafka.stop()
            stop_s = time.monotonic() - t
            self.hold(p.hold_s, rec)
            t1 = time.monotonic()
            self.kafka.start()
            rec.notes.append(
                f"stop (SIGTERM) took {stop_s:.1f} s, start {time.monotonic() - t1:.1f} s; "
                f"down {time.monotonic() - t:.1f} s"
            )
        elif p.kind == "store":
            assert self.settings is not None
            flag = self.settings.fault_store_outage_file
            assert flag is not None
            flag.touch()
            self.hold(p.hold_s, rec)
            flag.unlink()
            rec.notes.append(
                f"{_log_count(log, mark, 'ClickHouse ')} failed writes retried (worker log)"
            )
        elif p.kind == "disk":
            if self.mount is None:
                rec.notes.append(self.mount_note)
                rec.held_s = 0.0
                return rec
            # The tmpfs shrunk to what the store uses + 6 MiB, then given its size back: a
            # full disk that takes no memory (a filler file on tmpfs would).
            st = os.statvfs(self.mount)
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            self._remount(used + DISK_LEFT_BYTES)
            st = os.statvfs(self.mount)
            left = st.f_bavail * st.f_frsize
            self.hold(p.hold_s, rec)
            self._remount(self.mount_bytes)
            rec.notes.append(
                f"the store's tmpfs shrunk to its {used / 2**20:.0f} MiB + "
                f"{left / 2**20:.1f} MiB free; "
                f"{_log_count(log, mark, 'NOT_ENOUGH_SPACE')} NOT_ENOUGH_SPACE in the worker log"
            )
        elif p.kind == "topic":
            rec.notes += self._topic_fault(p, rec)
            since = dict(self.last[0]) if self.last else None
        rec.held_s = time.monotonic() - t
        self.recover(rec, since)
        return rec

    def recover(self, rec: Done, since: dict[int, int] | None = None) -> None:
        """From now, watch (in :meth:`tick`) for the group committing the end offsets of now;
        the next fault waits only for the worker to commit something after now."""
        ends = self.fresh_ends(rec)
        then = dict(self.last[0]) if self.last else {}
        self.pending.append((rec, self.caught_up_to(ends, since), time.monotonic()))
        self.gate = lambda: self.last is not None and self.last[0] != then

    def _topic_fault(self, p: Planned, rec: Done) -> list[str]:
        s = self.settings
        assert s is not None
        assert self.traffic is not None
        a = AdminClient(s.kafka_config() | QUIET)
        self.traffic.bad_paused.set()
        for r, _, _ in self.pending:  # their end offsets are the deleted topic's
            r.notes.append("its catch-up not measured: the topic was deleted first")
        self.pending.clear()
        notes = []
        before = self.last
        at_risk = (
            sum(max(0, before[1][q] - before[0].get(q, 0)) for q in before[1]) if before else 0
        )
        log = self.dir / "worker.log"
        mark = _log_size(log)
        t = time.monotonic()
        a.delete_topics([s.lifecycle_topic])[s.lifecycle_topic].result(timeout=30)
        self.wait(lambda: s.lifecycle_topic not in a.list_topics(timeout=10).topics, 60, rec)
        with self.acks.lock:  # acknowledged from now on: the new topic's
            self.acks.generation += 1
            gen = self.acks.generation
        seen = self.wait(lambda: _log_count(log, mark, "was deleted:") > 0, 60, rec)
        noticed = time.monotonic() - t
        self.hold(p.hold_s, rec)
        ensure_topics(s)
        self.acks.topic_id = topic_id(a, s.lifecycle_topic) or ""
        recreated = time.monotonic() - t
        self.wait(lambda: self.acks.acked_in_gen.get(gen, 0) > 0, 120, rec)
        self.traffic.bad_paused.clear()
        notes.append(
            f"{at_risk:,} messages acknowledged but not committed at the deletion; "
            + (f"the worker logged it after {noticed:.1f} s" if seen else "not logged in 60 s")
            + f"; created again {recreated:.1f} s after the deletion, first acknowledgement "
            f"on it {time.monotonic() - t:.1f} s after"
        )
        return notes

    # -- the whole run --

    def run(self, sec: Section) -> None:
        schedule = plan(self.minutes, self.seed, self.kinds)
        self.kafka = LocalKafka(self.dir / "kafka", heap="1g").start()
        store_root = self._mount_tmpfs()
        s = new_settings(
            self.kafka.bootstrap_servers,
            store_root,
            "chaos",
            fault_store_outage_file=self.dir / "store-outage",
        )
        self.settings = s
        a = AdminClient(s.kafka_config() | QUIET)
        self.acks.topic_id = topic_id(a, s.lifecycle_topic) or ""
        self._start_worker()
        assert self.worker is not None
        sec.commands.append(f"{self.worker.command}  # {s.group_id}, store {s.store_dir}")
        self.progress = Progress(s)
        self.traffic = Traffic(s, self.rate, self.seed, self.acks)
        self.thread = threading.Thread(target=self.traffic.run, name="chaos-traffic", daemon=True)
        self.t0 = time.monotonic()
        self.thread.start()
        end_at = self.minutes * 60
        # the steady delay from produced to committed (windows close after size + grace)
        base = Done(Planned("baseline", 0, 0))
        self.wait(lambda: self.acks.requests > 0, 120, base)
        self.hold(min(10.0, end_at / 10), base)
        self.recover(base)
        self.gate = lambda: base.recovered_s is not None
        for p in schedule:
            trigger = int(p.at_s * self.rate)

            def due(trigger: int = trigger) -> bool:
                ready = self.acks.requests >= trigger and self.gate()
                return ready or self.elapsed() >= end_at

            self.wait(due, end_at + 60)
            if self.elapsed() >= end_at:
                rec = Done(p)
                rec.notes.append("not reached before the traffic's end")
                self.done.append(rec)
                continue
            print(f"[bench]   chaos: {p.kind} at {self.elapsed():.0f} s", file=sys.stderr)
            self.done.append(self.fire(p))
        self.wait(lambda: self.elapsed() >= end_at, end_at + 60)
        self.traffic.stop.set()
        self.thread.join(120)
        traffic_s = (self.traffic.stopped or time.monotonic()) - self.traffic.started
        left = self.traffic.finish()
        drain = Done(Planned("drain", 0, 0))
        ends = self.fresh_ends(drain)
        t = time.monotonic()
        drained = self.wait(self.caught_up_to(ends), DRAIN_TIMEOUT_S, drain)
        drain_s = time.monotonic() - t
        assert self.worker is not None
        rc = self.worker.stop(60)
        self.worker = None
        baseline_s = float("nan") if base.recovered_s is None else base.recovered_s
        self._check(
            sec,
            traffic_s=traffic_s,
            left=left,
            drained=drained,
            drain_s=drain_s,
            baseline_s=baseline_s,
            rc=rc,
            schedule=schedule,
        )

    def _check(
        self,
        sec: Section,
        *,
        traffic_s: float,
        left: int,
        drained: bool,
        drain_s: float,
        baseline_s: float,
        rc: int,
        schedule: list[Planned],
    ) -> None:
        s = self.settings
        assert self.traffic is not None
        assert s is not None
        expected = self.acks.expected()
        sink = self.traffic.sink
        dropped = sink.counters.events_dropped if sink is not None else 0
        ids_file = self.dir / "acknowledged.txt"
        ids_file.write_text("\n".join(sorted(expected)))
        out = subprocess.run(
            [sys.executable, "-m", "tools.dev.fault_checks", str(s.store_dir), "--ids",
             str(ids_file)],
            cwd=REPO, capture_output=True, text=True, check=True, timeout=1200,
        )  # fmt: skip
        doc = json.loads(out.stdout)
        eo, bounds, drift = doc["exactly_once"], doc["boundaries"], doc["rollup_drift"]
        missing = eo["missing"]
        old_gen = sum(1 for rid in missing if self.acks.gen_of.get(rid, 0) < self.acks.generation)
        letters = dead_letters(s, 60)
        per_pos: dict[tuple[str, int, int], int] = {}
        for letter in letters:
            if DLQ_OFFSET in letter:
                key = (
                    letter.get(DLQ_TOPIC_ID, ""),
                    int(letter[DLQ_PARTITION]),
                    int(letter[DLQ_OFFSET]),
                )
                per_pos[key] = per_pos.get(key, 0) + 1
        bad = self.acks.bad
        one_each = sum(1 for pos in bad if per_pos.get(pos, 0) == 1)
        no_letter_old = sum(
            1 for pos in bad if per_pos.get(pos, 0) == 0 and pos[0] != self.acks.topic_id
        )
        unmatched = sum(c for pos, c in per_pos.items() if pos not in set(bad))
        diff_bounds = {b: v for b, v in bounds.items() if len(set(v)) > 1}
        stored = eo["stored"]
        sec.figures += [
            Figure(
                "requests acknowledged by the broker (delivery callbacks)",
                len(expected),
                "",
                note=f"{traffic_s / 60:.1f} min of traffic: "
                f"{self.traffic.received / traffic_s:,.0f} requests/s handed to the producer "
                f"(target {self.rate:,.0f}); {self.acks.events_acked:,} lifecycle events "
                f"acknowledged, {self.acks.events_failed:,} failed (delivery errors), "
                f"{dropped:,} dropped by the producer, {left:,} undelivered at the end",
            ),
            at_most(
                "acknowledged requests missing from `requests`",
                len(missing),
                "",
                0,
                f"{old_gen} of them acknowledged on a generation of the topic that was then "
                f"deleted; {len(doc['missing_read'])} read by the worker (their raw events are "
                f"in the store); e.g. {', '.join(missing[:3])}"
                if missing
                else "",
            ),
            at_most("requests stored more than once", len(eo["twice"]), "", 0),
            at_most(
                "requests stored that were never acknowledged",
                len(eo["extra"]),
                "",
                0,
                ", ".join(eo["extra"][:3]),
            ),
            at_most(
                "window totals (`__slo__` records) minus stored requests",
                abs(eo["window_total"] - stored),
                "",
                0,
                f"{eo['window_total']:,} in windows, {stored:,} stored",
            ),
            at_most("windows written twice", eo["windows"] - eo["windows_distinct"], "", 0),
            at_most(
                "boundaries whose windows ≠ requests or rollups",
                len(diff_bounds),
                "",
                0,
                "; ".join(f"{b} windows/requests/1m/1h {v}" for b, v in diff_bounds.items())
                or f"{len(bounds)} boundaries equal",
            ),
            at_most(
                "rollups differing from their source",
                len(drift),
                "",
                0,
                "; ".join(f"{k} {v}" for k, v in drift.items()),
            ),
            Figure(
                "bad positions with exactly one dead letter",
                one_each,
                "",
                f"= {len(bad)}",
                one_each == len(bad),
                f"{len(bad)} malformed messages acknowledged ({self.acks.bad_failed} failed); "
                f"{len(letters)} letters, {unmatched} at no bad position; of the positions "
                f"without a letter, {no_letter_old} on a deleted generation of the topic",
            ),
            Figure(
                "time to drain (traffic stopped → every partition committed to its end)",
                drain_s,
                "s",
                f"≤ {DRAIN_TIMEOUT_S:.0f} s",
                drained,
                f"steady delay produced → committed before the faults: {baseline_s:.0f} s "
                "(windows close after size + grace)",
            ),
            Figure("worker exit status at the end (SIGTERM)", rc, "", "= 0", rc == 0),
        ]
        rows = ["| fault | at | acked then | held | caught up after | peak lag | notes |",
                "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
        for d in self.done:
            rec_s = "n/a" if d.recovered_s is None else f"{d.recovered_s:.1f} s"
            at = "—" if math.isnan(d.at_s) else f"{d.at_s / 60:.1f} min"
            held = "—" if math.isnan(d.held_s) else f"{d.held_s:.1f} s"
            rows.append(
                f"| {d.planned.kind} | {at} | {d.acked_at:,} | {held} | {rec_s} | "
                f"{d.peak_lag:,} | {'; '.join(d.notes)} |"
            )
        loads = sorted(self.loads)
        sec.text += [
            f"Traffic: the simulator's events at {self.rate:,.0f} requests/s through "
            f"`open_kafka_sink` for {self.minutes:g} min, seed {self.seed}, faults "
            f"{', '.join(self.kinds) or 'none'}; one malformed "
            f"message every {BAD_EVERY_S:.0f} s. Faults ({len(schedule)}, in seeded order; "
            "'caught up after': from the fault's end until the group committed the end "
            "offsets of that moment, which takes the steady delay above at least; the next "
            "fault waits for its trigger and for the worker to commit after the previous "
            "fault's end, not for that catch-up, so faults may overlap; 'peak lag': messages "
            "produced and not committed, from the fault's start to its catch-up):",
            "\n".join(rows),
            f"Load average (1 min) during the run: min {loads[0]:.1f}, median "
            f"{loads[len(loads) // 2]:.1f}, max {loads[-1]:.1f} on {os.cpu_count()} cores "
            "shared with other engineers' work."
            if loads
            else "",
        ]
        if self.mount_note:
            sec.text.append(self.mount_note)
        if self.findings:
            sec.text.append("Found: " + "; ".join(self.findings) + ".")
        sc = REPO.parent / "shared" / "tools" / "store-check"
        if sc.exists():
            r = subprocess.run(
                [str(sc), str(s.store_dir)],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
                env=dict(os.environ, TG=str(Path(sys.executable).with_name("tailguard"))),
            )
            sec.profiles.append((f"store-check (exit {r.returncode})", r.stdout + r.stderr))


@register(
    "chaos", "Chaos: faults at random under steady traffic, then exact checks", 90, opt_in=True
)
def run(ctx: Context) -> Section:
    opts = {**DEFAULTS, **ctx.shared.get("chaos", {})}
    if ctx.mode == "quick" and "minutes" not in ctx.shared.get("chaos", {}):
        opts["minutes"] = QUICK_MINUTES
    sec = Section("chaos", "Chaos: faults at random under steady traffic, then exact checks")
    kinds = tuple(k.strip() for k in str(opts["faults"]).split(",") if k.strip())
    if unknown := set(kinds) - set(KINDS):
        raise ValueError(f"--faults: unknown {sorted(unknown)}; known: {', '.join(KINDS)}")
    chaos = Chaos(ctx, float(opts["minutes"]), float(opts["rate"]), int(opts["seed"]))
    chaos.kinds = kinds

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM: stop everything on the way out

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        chaos.run(sec)
    finally:
        chaos._stop_all()
        signal.signal(signal.SIGTERM, old)
    return sec
