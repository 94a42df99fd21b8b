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
every boundary, every rollup equals its source, one dead letter per bad position; a
deleted topic's requests and bad positions that the worker never read are counted apart,
by where its reading stopped (:mod:`bench.chaos_checks`). Traffic and the producers'
record in :mod:`bench.chaos_traffic`.
Every process started here (broker, workers) is stopped by its PID on the way out, on
failure and on Ctrl-C / SIGTERM too; the tmpfs is unmounted.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.chaos_checks import (
    Ending,
    fault_table,
    figures,
    match_letters,
    read_positions,
    run_text,
    split_missing,
    store_check_profile,
    store_checks,
)
from bench.chaos_traffic import QUIET, Acks, Traffic
from bench.common import Worker, new_settings
from bench.context import Context
from bench.results import Section, register
from pipeline.adapters.kafka_admin import ensure_topics, topic_id
from pipeline.settings import Settings
from tools.dev.fault_checks import dead_letters
from tools.dev.kafka_local import LocalKafka

KINDS = ("kill", "broker", "store", "disk", "topic")
DEFAULTS: dict[str, Any] = {"minutes": 30.0, "rate": 300.0, "seed": 1, "faults": ",".join(KINDS)}
QUICK_MINUTES = 3.0
DISK_LEFT_BYTES = 6 * 1024 * 1024  # what a full disk leaves free (the measured disk-full run's)
TMPFS_MIB_PER_MIN = 80  # the store's tmpfs per minute of traffic (1 GiB at least; 5 minutes
# at 300 requests/s wrote ~30 MiB/min): a cap, tmpfs takes memory only for what is written
RECOVERY_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 600.0


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


class StoreDisk:
    """The store's disk: a size-limited tmpfs at ``where`` (mounting needs root; without
    it the disk-full fault is skipped and ``note`` says why), shrunk to what the store
    uses + ``DISK_LEFT_BYTES`` for the disk-full fault: a full disk that takes no memory
    (a filler file on tmpfs would)."""

    def __init__(self, where: Path, minutes: float) -> None:
        self.where = where
        self.mount: Path | None = None
        self.note = ""
        self.size_bytes = max(1024, round(minutes * TMPFS_MIB_PER_MIN)) * 2**20

    def mount_tmpfs(self) -> Path:
        self.where.mkdir(exist_ok=True)
        size = f"{self.size_bytes // 2**20}m"
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=700", "tmpfs", str(self.where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode == 0:
            self.mount = self.where
        else:
            self.note = (
                f"the disk-full fault was skipped: mounting a {size} tmpfs for the store "
                f"failed ({(r.stderr or r.stdout).strip()}; it needs root)"
            )
        return self.where

    def fill(self) -> tuple[int, int]:
        """Shrink the tmpfs to what is used + DISK_LEFT_BYTES; (bytes used, bytes left)."""
        assert self.mount is not None
        st = os.statvfs(self.mount)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        self._remount(used + DISK_LEFT_BYTES)
        st = os.statvfs(self.mount)
        return used, st.f_bavail * st.f_frsize

    def free(self) -> None:
        self._remount(self.size_bytes)

    def _remount(self, size: int) -> None:
        assert self.mount is not None
        subprocess.run(
            ["mount", "-o", f"remount,size={-(-size // 4096) * 4096}", str(self.mount)],
            check=True,
            capture_output=True,
        )

    def unmount(self) -> None:
        if self.mount is not None:
            subprocess.run(["umount", str(self.mount)], check=False, capture_output=True)
            self.mount = None


# --- the run ----------------------------------------------------------------------------------


class Chaos:
    def __init__(self, ctx: Context, minutes: float, rate: float, seed: int) -> None:
        self.minutes, self.rate, self.seed = minutes, rate, seed
        self.dir = ctx.workdir / "chaos"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed * 7919)
        self.acks = Acks()
        self.kafka: LocalKafka | None = None
        self.disk = StoreDisk(self.dir / "storefs", minutes)
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
        self.disk.unmount()

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
            if self.disk.mount is None:
                rec.notes.append(self.disk.note)
                rec.held_s = 0.0
                return rec
            used, left = self.disk.fill()
            self.hold(p.hold_s, rec)
            self.disk.free()
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
        self.acks.topic_ids[gen] = topic_id(a, s.lifecycle_topic) or ""
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
        store_root = self.disk.mount_tmpfs()
        s = new_settings(
            self.kafka.bootstrap_servers,
            store_root,
            "chaos",
            fault_store_outage_file=self.dir / "store-outage",
        )
        self.settings = s
        a = AdminClient(s.kafka_config() | QUIET)
        self.acks.topic_ids[0] = topic_id(a, s.lifecycle_topic) or ""
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
        sink = self.traffic.sink
        end = Ending(
            traffic_s=traffic_s,
            rate=self.rate,
            received=self.traffic.received,
            events_acked=self.acks.events_acked,
            events_failed=self.acks.events_failed,
            dropped=sink.counters.events_dropped if sink is not None else 0,
            failed=sink.counters.events_failed if sink is not None else 0,
            left=left,
            drained=drained,
            drain_s=drain_s,
            drain_timeout_s=DRAIN_TIMEOUT_S,
            baseline_s=float("nan") if base.recovered_s is None else base.recovered_s,
            rc=rc,
        )
        self._check(sec, end, schedule)

    def _check(self, sec: Section, end: Ending, schedule: list[Planned]) -> None:
        """The store against the producers' record (:mod:`bench.chaos_checks`)."""
        s = self.settings
        assert s is not None
        acks = self.acks
        expected = acks.expected()
        ids_file = self.dir / "acknowledged.txt"
        ids_file.write_text("\n".join(sorted(expected)))
        doc = store_checks(s.store_dir, ids_file)
        log_text = (self.dir / "worker.log").read_text(errors="replace")
        read_to = read_positions(log_text, acks.topic_ids)
        missing = doc["exactly_once"]["missing"]
        lost, never = split_missing(missing, acks.first_terminal, acks.generation, read_to)
        # each one's first terminal event: (generation, partition, offset)
        (self.dir / "lost.txt").write_text(
            "".join(f"{rid} {acks.first_terminal.get(rid)}\n" for rid in lost)
        )
        letters = match_letters(
            acks.bad, dead_letters(s, 60), acks.topic_ids, acks.generation, read_to
        )
        sec.figures += figures(
            end, doc, expected=len(expected), lost=lost, never=never, read_to=read_to,
            letters=letters,
        )  # fmt: skip
        text = run_text(
            self.rate, self.minutes, self.seed,
            kinds=self.kinds, faults=len(schedule), loads=self.loads,
        )  # fmt: skip
        sec.text.append(text)
        sec.text.append(fault_table(self.done))
        sec.text += [n for n in (self.disk.note, self.findings_text()) if n]
        sec.profiles.append(store_check_profile(s.store_dir))

    def findings_text(self) -> str:
        return "Found: " + "; ".join(self.findings) + "." if self.findings else ""


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
