"""The demo: local Kafka -> simulator -> worker -> embedded ClickHouse -> report.

Everything it starts it stops (broker and worker by PID), also on Ctrl-C.

The loop's delay: closed loop, the simulated gateways
(:class:`producers.simulator.gate.ControlClientGate`) record for every new decision the
simulator's clock at the first arrival decided under it minus the decision's
``as_of_unix_ms`` (the end of the latest window it read). Both are the simulator's
event time (the clock that stamped the evidence): at a speed factor ``s`` the trip
(engine -> Kafka -> worker -> window close -> summary -> controller -> control topic ->
gateway) would take ``s`` times its wall time, so the closed loop's pacer (:class:`_Pacer`)
stops the simulated clock until the trip is done: the delay stays within the pacer's
bound (``bound_ms``, 30 s) on any machine, a busy one only takes longer. Printed in
*what happened*, and in ``--json``'s ``"loop_delay"``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import deque
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from rich.console import Console

from pipeline.core.control import decision_clock
from pipeline.processes import stop_process
from pipeline.settings import Settings
from producers.control_keys import generate_secret_b64
from producers.emit import BatchPolicy, EventSink, JsonlSink, KafkaSink, open_kafka_sink
from producers.simulator.model import EPISODE_SHAPES, EpisodeShape, OverloadEpisode, SimConfig

if TYPE_CHECKING:
    from pipeline.adapters.kafka_admin import GroupProgress
    from pipeline.contract.summary import Progress

DEMO_JOIN_TIMEOUT_MS = 5_000
DEMO_WINDOW_GRACE_MS = 5_000  # the last windows close this long after the input ends
# Commit often: the closed loop paces the simulator by the worker's committed offsets.
DEMO_FLUSH_INTERVAL_MS = 250


def parse_overload(text: str | None) -> OverloadEpisode | None:
    """``--overload``: ``none``/``off``, ``START_S:END_S:FACTOR`` (a step) or
    ``SHAPE:START_S:END_S:FACTOR`` with SHAPE step, ramp or burst."""
    if not text or text.strip().lower() in ("none", "off"):
        return None
    parts = text.strip().split(":")
    name = parts.pop(0).strip().lower() if len(parts) == 4 else "step"
    shapes: dict[str, EpisodeShape] = {s: s for s in EPISODE_SHAPES}
    try:
        shape = shapes[name]
        start_s, end_s, factor = (float(x) for x in parts)
    except (KeyError, ValueError):
        raise SystemExit(
            "--overload must look like [step|ramp|burst:]START_S:END_S:FACTOR "
            f"(e.g. 600:1200:3 or ramp:600:1200:3) or none, got {text!r}"
        ) from None
    try:
        return OverloadEpisode(
            start_offset_s=start_s, end_offset_s=end_s, factor=factor, shape=shape
        )
    except ValueError as exc:
        raise SystemExit(f"invalid --overload: {exc}") from None


def sim_config_from_args(args: argparse.Namespace) -> SimConfig:
    overload = parse_overload(getattr(args, "overload", None))
    restarts: list[tuple[str, float]] = []
    for item in getattr(args, "restart", None) or ():
        host, _, offset_s = item.rpartition(":")
        try:
            restarts.append((host, float(offset_s) * 1000.0))
        except ValueError:
            raise SystemExit(
                "--restart must look like ENGINE_HOST:OFFSET_S, e.g. llama-3-8b-0:900, "
                f"got {item!r}"
            ) from None
    try:
        return SimConfig(
            start_unix_ns=time.time_ns(),
            seed=args.seed,
            rate_scale=args.rate_scale,
            overload=overload,
            engine_restarts=tuple(restarts),
            scheduling=getattr(args, "scheduling", None) or "fcfs",
        )
    except ValueError as exc:
        raise SystemExit(f"invalid simulator settings: {exc}") from None


class _Tee:
    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = sinks

    def emit(self, event: Any) -> None:
        for s in self.sinks:
            s.emit(event)

    def tick(self) -> None:
        for s in self.sinks:
            tick = getattr(s, "tick", None)
            if tick is not None:
                tick()

    def flush(self, timeout_s: float = 10.0) -> int:
        return sum(s.flush(timeout_s) for s in self.sinks)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def kafka_sink(settings: Settings) -> KafkaSink:
    """The simulator's sink: waits for the topics, then applies back pressure (never drops)."""
    from pipeline.adapters.kafka_admin import wait_partitions

    topics = [settings.lifecycle_topic, settings.engine_stats_topic]
    return open_kafka_sink(
        settings,
        service="simulator",
        on_full="block",
        partitions=wait_partitions(settings, topics),
        policy=BatchPolicy(),
    )


def simulate_to(
    trace: Path,
    config: SimConfig,
    *,
    jsonl: Path | None = None,
    settings: Settings | None = None,
    tee_jsonl: Path | None = None,
    speedup: float | None = None,
    limit: int | None = None,
    progress: bool = True,
    gate: Any = None,
    pace: Any = None,
) -> dict[str, Any]:
    from producers.simulator.run import run_simulation

    sinks: list[EventSink] = []
    if jsonl is not None:
        sinks.append(JsonlSink(jsonl))
    if settings is not None:
        sinks.append(kafka_sink(settings))
    if tee_jsonl is not None:
        sinks.append(JsonlSink(tee_jsonl))
    sink = _Tee(*sinks)
    try:
        summary = run_simulation(
            trace,
            config,
            sink,
            speedup=speedup or None,
            progress=progress,
            limit=limit,
            gate=gate,
            pace=pace,
        )
    finally:
        sink.close()
    out: dict[str, Any] = orjson.loads(orjson.dumps(summary, default=_default))
    return out


def _default(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}
    raise TypeError(type(obj).__name__)


class _Pacer:
    """Closed loop: directives must reach the simulated gateways while the traffic they
    are about is still arriving, whatever the machine's speed. A worker at 60x on a busy
    machine falls minutes of event time behind, and its controller with it; bounded in
    wall time, in messages or in committed offsets (which in-flight requests hold back by
    their duration) the loop's delay in event time grew with the load: 40-100 s measured,
    more in the CI run that failed the closed-loop test.

    So the bound is a barrier in *simulated time*, on the whole trip. Every ``every_s`` of
    simulated time the pacer takes a mark (the simulated clock ``T``), which then passes
    three stages, each read when the one before it is met:

    1. the controller's decision clock passed ``T``: the pacer reads the worker's
       ``Progress`` messages on the summaries topic itself into a
       :class:`~pipeline.core.control.DecisionClock` built as the controller's (each
       partition's clock, and its close horizon: a window a pending join holds open
       holds the decisions back);
    2. the controller took the summaries topic past that message (its decisions are
       published; Faust commits what it took every flush interval);
    3. the gateways' control client read the control topic to its end as of stage 2.

    The simulator waits while its oldest mark not through stage 3 is more than
    ``max_lag_s`` of simulated time old. Marks advance side by side (one slow trip holds
    the simulator once, not per mark), so a decision on the windows up to ``T`` reaches
    the gateways by ``T + every_s + max_lag_s`` of simulated time on any machine; only
    the wall time it takes grows with the load. Sparse traffic holds the clocks back in
    event time (a host's clock needs a quorum of its events per partition): a wait in
    which, for ``settle_s`` of wall time, the clocks move no faster than twice wall time
    (the worker has nothing left to process) while the mark waits for the decision clock
    ends, and the bound widens to that mark's age + two checks (``widened``; ``bound_ms``:
    the widest used) until a trip fits the base lag again. A wait gives up after
    ``ceiling_s`` of wall time (``gave_up``: the delay then was not bounded)."""

    def __init__(
        self,
        settings: Settings,
        worker: subprocess.Popen[bytes],
        client: Any = None,
        *,
        max_lag_s: float = 25.0,
        every_s: float = 5.0,
        poll_s: float = 0.05,
        ceiling_s: float = 120.0,
        settle_s: float = 10.0,
    ) -> None:
        self.settings = settings
        self.worker = worker
        self.client = client  # the gateways' ControlClient (its read offsets: stage 3)
        self.base_lag_ns = self.max_lag_ns = self.widest_lag_ns = int(max_lag_s * 1e9)
        self.every_ns = int(every_s * 1e9)
        self.poll_s = poll_s
        self.ceiling_s = ceiling_s
        self.settle_s = settle_s
        self.next_check_ns: int | None = None
        self._now_ns = 0  # the simulated clock at the last check
        self.waited_s = 0.0
        self.gave_up = 0
        self.widened = 0  # waits ended because only wall time could move the clocks
        # [simulated ts_unix_ns, stage (0-2), what that stage waits for], oldest first
        self._marks: deque[list[int]] = deque()
        # the controller's decision clock as the worker tells it, and (summaries offset
        # after the telling message, the decision clock's target then), in order
        self._clock = decision_clock(
            settings.window_size_ms,
            settings.window_grace_ms,
            partitions=settings.topic_partitions,
            decision_delay_ms=settings.control_decision_delay_ms,
        )
        self._told: deque[tuple[int, int]] = deque()
        self._stack = ExitStack()
        self._probe: Any = None
        self._reader: Any = None

    @property
    def bound_ms(self) -> float:
        """The most a decision took to reach the gateways, in simulated time (ms), plus
        the wait for the next arrival to apply it: ``every_s + max_lag_s``, the lag
        widened where the traffic's own sparseness held the clocks back (``widened``)."""
        return (self.every_ns + self.widest_lag_ns) / 1e6

    def close(self) -> None:
        self._stack.close()

    def _progress(self, topic: str) -> GroupProgress:
        """The worker group's committed offsets and the topic's end (one open consumer)."""
        if self._probe is None:
            from pipeline.adapters.kafka_admin import group_progress_probe

            self._probe = self._stack.enter_context(group_progress_probe(self.settings))
        return self._probe(topic)  # type: ignore[no-any-return]

    def _read_told(self) -> None:
        """Read the summaries topic's new messages into the decision clock."""
        if self._reader is None:
            from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

            conf = self.settings.kafka_config() | {
                "group.id": f"tailguard-demo-pacer-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
            self._reader = Consumer(conf)
            self._stack.callback(self._reader.close)
            tp = TopicPartition(self.settings.summaries_topic, 0, OFFSET_BEGINNING)
            self._reader.assign([tp])
        from pipeline.contract.summary import Progress, decode_summary

        for msg in self._reader.consume(num_messages=10_000, timeout=0):
            if msg.error() is not None:
                continue
            try:
                s = decode_summary(msg.value())
            except (ValueError, KeyError, TypeError):
                continue  # the controller drops it too
            if isinstance(s, Progress):
                self.told(s, msg.offset() + 1)

    def told(self, progress: Progress, next_offset: int) -> None:
        """A ``Progress`` read (``next_offset``: the summaries offset after it): the
        decision clock's new target, noted where it moved."""
        self._clock.progress(progress.partition, progress.horizon_ms, progress.clock_ms)
        target = self._clock.target_ms()
        if target is not None and (not self._told or target > self._told[-1][1]):
            self._told.append((next_offset, target))

    def _told_past(self, target_ms: int) -> int | None:
        """The summaries offset after the first message by which the decision clock
        reached ``target_ms``; None while not yet told. Targets come in order."""
        while self._told and self._told[0][1] < target_ms:
            self._told.popleft()
        return self._told[0][0] if self._told else None

    def _client_read(self) -> int:
        """How far the gateways' client has read the control topic (its offsets, summed)."""
        return sum(self.client.read_offsets().values()) if self.client is not None else 0

    def __call__(self, ts_unix_ns: int) -> None:
        if self.next_check_ns is not None and ts_unix_ns < self.next_check_ns:
            return
        self.next_check_ns = ts_unix_ns + self.every_ns
        self._now_ns = ts_unix_ns
        started = time.monotonic()
        t_ms = ts_unix_ns // 1_000_000
        # decisions are made at window boundaries: the last one at or before T
        self._marks.append([ts_unix_ns, 0, t_ms - t_ms % self.settings.window_size_ms])
        self._advance()
        seen: deque[tuple[float, int]] = deque()  # (wall, the partitions' lowest clock)
        while (
            self._marks
            and self._marks[0][0] <= ts_unix_ns - self.max_lag_ns
            and self.worker.poll() is None
        ):
            now = time.monotonic()
            if now - started > self.ceiling_s:
                self.gave_up += 1
                self._marks.clear()
                break
            idle = self._only_wall_time_moves(seen, now)
            if idle and self._marks[0][1] == 0:  # (the controller or client: only speed)
                # The clocks lag the traffic by its own sparseness (a host's clock needs
                # a quorum of its events per partition: pipeline.core.eventtime), not
                # by the worker's speed: waiting would only let wall time pass on top
                # of them. Bound the lag at this mark's age (and two checks) from now on.
                self.widened += 1
                self.max_lag_ns = ts_unix_ns - self._marks[0][0] + 2 * self.every_ns
                self.widest_lag_ns = max(self.widest_lag_ns, self.max_lag_ns)
                break
            time.sleep(self.poll_s)
            self._advance()
        self.waited_s += time.monotonic() - started

    def _only_wall_time_moves(self, seen: deque[tuple[float, int]], now: float) -> bool:
        """Over the last ``settle_s`` of this wait the partitions' clocks moved at most
        twice as fast as wall time: the worker has nothing left to process (processing
        moves them tens of times faster; a caught-up partition moves at wall time)."""
        clock = self._clock
        parts = range(self.settings.topic_partitions)
        lowest = min(max(clock.clocks.get(p, 0), clock.horizons.get(p, 0)) for p in parts)
        seen.append((now, lowest))
        while len(seen) > 1 and now - seen[1][0] >= self.settle_s:
            seen.popleft()
        wall_s = now - seen[0][0]
        return wall_s >= self.settle_s and lowest - seen[0][1] < 2_000 * wall_s

    def _advance(self) -> None:
        """Move every mark through the stages it has met; drop the marks through all."""
        s = self.settings
        self._read_told()
        summaries: GroupProgress | None = None
        control_end: int | None = None
        for mark in self._marks:
            if mark[1] == 0:
                offset = self._told_past(mark[2])
                if offset is None:
                    break  # later marks wait for later clocks
                mark[1:] = [1, offset]
            if mark[1] == 1:
                summaries = summaries or self._progress(s.summaries_topic)
                if summaries.committed < mark[2]:
                    break  # in order: later marks wait for later offsets
                if control_end is None:
                    control_end = self._progress(s.control_topic).end
                mark[1:] = [2, control_end]
            if mark[1] == 2:
                if self._client_read() < mark[2]:
                    break
                mark[1] = 3
        while self._marks and self._marks[0][1] == 3:
            through_ns = self._marks.popleft()[0]
            if self._now_ns - through_ns <= self.base_lag_ns:
                self.max_lag_ns = self.base_lag_ns  # a trip within the base lag again


def run_demo(
    *,
    trace: Path,
    sim_config: SimConfig,
    speedup: float | None,
    partitions: int,
    workdir: Path,
    bootstrap: str | None,
    limit: int | None = None,
    tee_jsonl: Path | None = None,
    json_out: Path | None = None,
    wait_timeout_s: float = 600.0,
    closed_loop: bool = True,
    settings_overrides: dict[str, Any] | None = None,
) -> int:
    """``settings_overrides``: worker settings over the demo's (tests: a shorter window,
    another policy)."""
    from pipeline.adapters.kafka_admin import ensure_topics

    console = Console(stderr=True)
    workdir = workdir.resolve()
    for stale in (workdir / "store", workdir / "kafka"):
        if stale.exists():
            shutil.rmtree(stale)
    workdir.mkdir(parents=True, exist_ok=True)
    keys = workdir / "control-keys.json"  # a throwaway key for this demo's signals
    run_id = uuid.uuid4().hex[:8]

    with ExitStack() as stack:
        bootstrap, topic_suffix = _broker(stack, console, workdir, bootstrap, run_id)
        fields = _demo_fields(
            workdir, keys, bootstrap, run_id=run_id, topic_suffix=topic_suffix,
            partitions=partitions, sim_config=sim_config,
        )  # fmt: skip
        settings = Settings(**(fields | (settings_overrides or {})))
        ensure_topics(settings)
        console.print(f"Kafka at {bootstrap}; topics ready ({partitions} partitions)")
        worker = _start_worker(stack, console, settings, workdir)
        gate, pace = _closed_loop(stack, settings, keys, worker) if closed_loop else (None, None)
        label = "as fast as possible" if not speedup else f"at {speedup:g}x"
        loop = "closed loop: gateways apply directives" if closed_loop else "open loop"
        console.print(f"simulating {trace} {label} ({loop})")
        summary = simulate_to(
            trace,
            sim_config,
            settings=settings,
            tee_jsonl=tee_jsonl,
            speedup=speedup,
            limit=limit,
            gate=gate,
            pace=pace,
        )
        if gate is not None:
            summary["gateways"] = _gateways_summary(gate, pace)
        console.print(f"simulator: {summary}")
        if not _wait_caught_up(console, settings, worker, workdir, wait_timeout_s):
            return 1
        rc = stop_process(worker, 30.0)
        console.print(f"worker caught up and stopped (exit {rc})")

    _print_report(settings, summary, sim_config, speedup=speedup, gate=gate, json_out=json_out)
    return 0


def _broker(
    stack: ExitStack, console: Console, workdir: Path, bootstrap: str | None, run_id: str
) -> tuple[str, str]:
    """The Kafka to use and the topics' suffix: a local broker started for the demo (its
    own topics), or the one given (topics of this run only)."""
    if bootstrap is not None:  # never mix with data already on a shared cluster
        return bootstrap, f".demo-{run_id}"
    from pipeline.adapters.local_kafka import KafkaLocalError, LocalKafka

    console.print("[bold]starting a local Apache Kafka broker[/] (jars fetched once into .cache/)")
    try:
        kafka = stack.enter_context(LocalKafka(workdir / "kafka"))
    except KafkaLocalError as exc:
        raise SystemExit(f"tailguard demo: {exc}\n(or pass --bootstrap HOST:PORT)") from None
    return kafka.bootstrap_servers, ""


def _demo_fields(
    workdir: Path,
    keys: Path,
    bootstrap: str,
    *,
    run_id: str,
    topic_suffix: str,
    partitions: int,
    sim_config: SimConfig,
) -> dict[str, Any]:
    """The worker's settings for the demo (a new control key written to ``keys``)."""
    keys.write_bytes(orjson.dumps({"active": "demo", "keys": {"demo": generate_secret_b64()}}))
    keys.chmod(0o600)
    return {
        "control_enabled": True,
        "control_keys_file": keys,
        "bootstrap_servers": bootstrap,
        "store_dir": workdir / "store",
        "topic_partitions": partitions,
        "group_id": f"tailguard-demo-{run_id}",
        "lifecycle_topic": f"tailguard.lifecycle{topic_suffix}",
        "engine_stats_topic": f"tailguard.engine-stats{topic_suffix}",
        "dlq_topic": f"tailguard.dlq{topic_suffix}",
        "summaries_topic": f"tailguard.summaries{topic_suffix}",
        "control_topic": f"tailguard.control{topic_suffix}",
        "join_timeout_ms": DEMO_JOIN_TIMEOUT_MS,
        "window_grace_ms": DEMO_WINDOW_GRACE_MS,
        "flush_interval_ms": DEMO_FLUSH_INTERVAL_MS,
        # the simulated gateways each take their share of an admission rate
        "gateway_instances": len(sim_config.gateway_hosts),
    }


def _start_worker(
    stack: ExitStack, console: Console, settings: Settings, workdir: Path
) -> subprocess.Popen[bytes]:
    """``tailguard worker`` in its own process (stopped when the stack closes)."""
    env = dict(os.environ) | settings.to_env()
    worker_log = (workdir / "worker.log").open("wb")
    stack.callback(worker_log.close)
    worker = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "worker"],
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stack.callback(stop_process, worker, 30.0)
    console.print(f"worker started (pid {worker.pid}, log {workdir / 'worker.log'})")
    return worker


def _closed_loop(
    stack: ExitStack, settings: Settings, keys: Path, worker: subprocess.Popen[bytes]
) -> tuple[Any, _Pacer]:
    """The simulated gateways read the control topic through the serving layer's own
    client (signatures, sequence numbers and expiry checked) and apply it; the pacer keeps
    the simulator within reach of the worker."""
    from producers.control_client import ControlClient
    from producers.control_keys import keyring_from_file
    from producers.simulator.gate import ControlClientGate

    client = ControlClient.from_settings(settings, keyring_from_file(keys))
    client.start()
    stack.callback(client.stop)
    pacer = _Pacer(settings, worker, client)
    stack.callback(pacer.close)
    return ControlClientGate(client), pacer


def _gateways_summary(gate: Any, pace: _Pacer | None) -> dict[str, Any]:
    """What the simulated gateways did, for the simulator's summary."""
    return {
        "rejected_429_by_priority": gate.shed_by_priority(),
        "context_capped_by_priority": dict(sorted(gate.capped.items())),
        "half_open_admitted": gate.half_open_admitted,
        "paced_s": round(pace.waited_s, 1) if pace is not None else 0.0,
        # waits that gave up (the loop's delay then was not bounded): 0 in a sound run
        "pace_gave_up": pace.gave_up if pace is not None else 0,
        "pace_bound_ms": pace.bound_ms if pace is not None else None,
        "pace_widened": pace.widened if pace is not None else 0,
        # evidence (window end) -> applied at a simulated gateway, event time
        "loop_delay": gate.loop_delay.summary(),
        # the serving side's view: a directive that expired before its heartbeat
        # came failed open to L0 (a loaded machine delays heartbeats)
        "control_client": {
            k: v
            for k, v in gate.client.counters().items()
            if k in ("accepted", "expired", "failed_open", "stale", "not_yet_valid")
        },
    }


def _wait_caught_up(
    console: Console,
    settings: Settings,
    worker: subprocess.Popen[bytes],
    workdir: Path,
    wait_timeout_s: float,
) -> bool:
    """Caught up: every lifecycle message committed, then (control on) every summary
    sent until then taken by the controller, which runs in the same process and may
    trail the lifecycle input by minutes of event time when that input comes as fast
    as possible on a loaded machine: stopped then, the report would lack decisions.
    False (said on the console) when the worker exits or does not catch up in time."""
    from pipeline.adapters.kafka_admin import group_progress

    deadline = time.monotonic() + wait_timeout_s
    last = None
    summaries_end: int | None = None
    while True:
        if worker.poll() is not None:
            tail = (workdir / "worker.log").read_text(errors="replace")[-3000:]
            console.print(f"[red]worker exited with {worker.returncode}[/]\n{tail}")
            return False
        if summaries_end is None:
            prog = group_progress(settings, settings.lifecycle_topic)
            if prog.end > 0 and prog.lag == 0:
                if not settings.control_enabled:
                    return True
                summaries_end = group_progress(settings, settings.summaries_topic).end
                continue
            what = "messages not yet committed"
        else:
            prog = group_progress(settings, settings.summaries_topic)
            if prog.committed >= summaries_end:
                return True
            what = "summaries not yet taken by the controller"
        lag = (prog.end if summaries_end is None else summaries_end) - prog.committed
        if (what, lag) != last:
            console.print(f"waiting for the worker: {lag} {what}")
            last = (what, lag)
        if time.monotonic() > deadline:
            console.print(f"[red]worker did not catch up within {wait_timeout_s:.0f} s[/]")
            return False
        time.sleep(0.5)


def _print_report(
    settings: Settings,
    summary: dict[str, Any],
    sim_config: SimConfig,
    *,
    speedup: float | None,
    gate: Any,
    json_out: Path | None,
) -> None:
    """The report from the demo's store, what happened, and ``--json``'s file."""
    from pipeline.adapters.store import open_store
    from pipeline.app.report import print_wide, read_report, render
    from pipeline.spec.slo import load_spec_file

    store = open_store(settings)
    try:
        spec = load_spec_file(settings.slo_spec) if settings.slo_spec is not None else None
        report = read_report(store, spec=spec)  # with why each SLO burned (load or not)
    finally:
        store.close()
    print_wide(render(report))
    print(story(report.to_json(), summary, sim_config))
    if json_out is not None:
        doc = report.to_json()
        if "gateways" in summary:
            doc["loop_delay"] = {
                "speedup": speedup,
                **summary["gateways"]["loop_delay"],
                "samples_ms": gate.loop_delay.samples() if gate is not None else [],
                # the pacer's bound in simulated time, and waits that gave up on it
                "bound_ms": summary["gateways"]["pace_bound_ms"],
                "pace_gave_up": summary["gateways"]["pace_gave_up"],
                "pace_widened": summary["gateways"]["pace_widened"],
            }
        json_out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def story(report: dict[str, Any], summary: dict[str, Any], config: SimConfig) -> str:
    """The control loop in a few lines: episode, levels, what the gateways did."""
    lines = ["", "what happened:"]
    ep = config.overload
    if ep is not None:
        span = f"{ep.start_offset_s:.0f}-{ep.end_offset_s:.0f}"
        how = {"step": "", "ramp": " (ramp from x1)", "burst": " (replicas at once)"}[ep.shape]
        lines.append(f"  t={span} s: overload, arrivals x{ep.factor:g}{how}")
    for c in report.get("control", []):
        at = datetime.fromisoformat(str(c["event_time"]))
        at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        t_s = at.timestamp() - config.start_unix_ns / 1e9
        lines.append(
            f"  t={t_s:.0f} s: {c['scope']} -> L{c['level']} {c['phase']}: {c['reason'][:140]}"
        )
    g = summary.get("gateways")
    if g is not None:
        lines.append(
            f"  gateways: 429 per priority {g['rejected_429_by_priority']}, context capped "
            f"{g['context_capped_by_priority']}, half-open admitted {g['half_open_admitted']}"
        )
        ld = g.get("loop_delay") or {}
        if ld.get("decisions"):
            lines.append(
                f"  loop delay, evidence (window end) -> applied at a gateway, event time: "
                f"P50 {ld['p50_ms'] / 1000:.1f} s, P99 {ld['p99_ms'] / 1000:.1f} s, max "
                f"{ld['max_ms'] / 1000:.1f} s over {ld['decisions']} decisions"
            )
    if len(lines) == 2:
        lines.append("  no degradation: every level stayed at L0")
    return "\n".join(lines)
