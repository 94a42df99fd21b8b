"""The controller shell: summaries topic -> :class:`pipeline.core.control.Controller` ->
signed directives on the compacted control topic, with an audit trail in ClickHouse.

Runs inside the worker that owns the single partition of the summaries topic.
Decisions are made in event time (one evaluation per base window, one window
behind the newest summary so that every partition has reported); signals are
stamped and expire in wall time, and are re-issued every heartbeat so that the
serving side can tell "still degraded" from "controller gone" (see
:mod:`pipeline.contract.control_signal` for the expiry contract: it fails open).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from pydantic import SecretStr

from pipeline.adapters.alerting import AlertDelivery, Webhook
from pipeline.adapters.prometheus import MetricsState
from pipeline.adapters.queries import budget as budget_queries
from pipeline.adapters.store import BudgetEventRow, ClickHouseStore, ControlRow, with_retry
from pipeline.contract.control_signal import (
    ControlSignal,
    Keyring,
    SignalIssuer,
    encode,
    message_key,
    resume_seqs,
)
from pipeline.contract.summary import Progress, StatsSample, WindowSummary, decode_summary
from pipeline.core.alerts import AlertTracker
from pipeline.core.budget import BudgetEvent
from pipeline.core.control import ControlStep, build_control_loop
from pipeline.core.policy import Evaluation
from pipeline.kafka_settings import KafkaSettings
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.policy import load_policy_file
from pipeline.spec.slo import load_spec_file
from producers import control_keys

if TYPE_CHECKING:
    from pipeline.adapters.flush import FlushWriter
    from pipeline.settings import Settings

log = logging.getLogger("tailguard.controller")


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass(frozen=True, slots=True)
class KeySettings:
    """Where the controller's signing keys come from (see :class:`Settings`): a keys file,
    or the keys inline (secret: shown masked). Built once, by :meth:`of`."""

    control_keys_file: Path | None = None
    control_keys: SecretStr | None = None
    control_active_kid: str | None = None

    @classmethod
    def of(cls, settings: Settings) -> KeySettings:
        return settings.narrowed(cls)


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """What the controller shell takes of :class:`Settings` (see there for each field):
    Kafka (``kafka``: the connection and the topics), its keys, the policy, rules and spec
    it loads, the windows it decides on, and where alerts go. Built once, by :meth:`of`;
    secrets are shown masked."""

    kafka: KafkaSettings
    keys: KeySettings
    policy_file: Path | None
    burn_rules_file: Path
    slo_spec: Path | None
    window_size_ms: int
    window_grace_ms: int
    queue_capacity: int
    gateway_instances: int
    control_decision_delay_ms: int
    control_heartbeat_ms: int
    control_max_ttl_ms: int
    alertmanager_url: str | None
    alert_webhook_url: str | None
    alert_webhook_secret: SecretStr | None

    @classmethod
    def of(cls, settings: Settings) -> ControllerSettings:
        return settings.narrowed(cls, kafka=settings.kafka_only(), keys=KeySettings.of(settings))


def load_keyring(keys: KeySettings) -> Keyring:
    """The controller's keys, from its settings only (never the process environment): a
    keys file, or the keys inline (``TAILGUARD_CONTROL_KEYS`` + ``_CONTROL_ACTIVE_KID``)."""
    inline, active = keys.control_keys, keys.control_active_kid
    if inline is not None and active:
        return Keyring.from_env_string(inline.get_secret_value(), active)
    return control_keys.load_keyring(keys.control_keys_file, environ={})


def read_topic(kafka: KafkaSettings, topic: str, timeout_s: float = 10.0) -> list[bytes | None]:
    """Every message value of a (compacted) topic, from the beginning to its end now."""
    c = Consumer(
        kafka.kafka_config()
        | {
            "group.id": f"tailguard-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        md = c.list_topics(topic, timeout=timeout_s).topics[topic]
        tps = []
        for p in md.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            if hi > lo:
                tps.append(TopicPartition(topic, p, lo))
        if not tps:
            return []
        c.assign(tps)
        pending = {tp.partition for tp in tps}
        out: list[bytes | None] = []
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                continue
            out.append(msg.value())
        return out
    finally:
        c.close()


class ControllerShell:
    def __init__(self, settings: ControllerSettings) -> None:
        if settings.policy_file is None:
            raise ValueError("control is enabled but TAILGUARD_POLICY_FILE is unset")
        self.settings = settings
        # Bad policy, rules, spec or keys fail here, at start-up.
        self.policy = load_policy_file(settings.policy_file)
        self.rules = load_burn_rules_file(settings.burn_rules_file)
        self.spec = load_spec_file(settings.slo_spec) if settings.slo_spec else None
        self.keyring = load_keyring(settings.keys)
        # The core's one control loop, the same that drives `replay` and the backtest;
        # when to evaluate: per-partition horizons and clocks.
        self.loop = build_control_loop(
            self.policy,
            self.spec,
            self.rules,
            size_ms=settings.window_size_ms,
            grace_ms=settings.window_grace_ms,
            queue_capacity=settings.queue_capacity,
            gateway_instances=settings.gateway_instances,
            partitions=0,  # of the lifecycle topic, read at start
            decision_delay_ms=settings.control_decision_delay_ms,
        )
        self.controller = self.loop.controller
        self.issuer: SignalIssuer | None = None
        self.producer: Producer | None = None
        self.published = 0
        # What /metrics shows (served by the worker when TAILGUARD_PROMETHEUS_PORT is set)
        self.metrics = MetricsState()
        self.alert_tracker = AlertTracker()
        self.alerts: AlertDelivery | None = None
        if settings.alertmanager_url or settings.alert_webhook_url:
            secret = settings.alert_webhook_secret
            self.alerts = AlertDelivery(
                settings.alertmanager_url,
                Webhook(settings.alert_webhook_url, secret.get_secret_value().encode())
                if settings.alert_webhook_url and secret is not None
                else None,
            )

    def load_history(self, store: ClickHouseStore) -> int:
        """Rebuild the error budgets from ClickHouse after a (re)start; returns windows loaded.

        Behind the newest stored window, as far as
        :meth:`pipeline.core.budget.BudgetBook.retention_ms` says each resolution is
        held: base windows per partition (marked seen, so summaries replayed from the
        topic are not counted twice; 2 h 10 min), then 1-minute rollups (to 1 d 2 h),
        then hourly rollups (the longest SLO or tier window, + 3 h).
        """
        book = self.controller.book
        if book is None or self.spec is None:
            return 0
        ref_ms = budget_queries.newest_window_start_ms(store)
        if ref_ms is None:
            return 0
        base_span, minute_span, hour_span = book.retention_ms()
        fine_from, minute_from = ref_ms - base_span, ref_ms - minute_span
        oldest = ref_ms - hour_span
        n = 0
        for slo, start, size, part, total, good, objective in budget_queries.base_windows(
            store, fine_from
        ):
            # window and corrections together; a repeat of its final summary is ignored
            self.controller.mark_seen(int(part), int(start))
            book.add_window(slo, int(start), int(size), int(total), int(good), objective=objective)
            n += 1
        for table, lo, hi in (("slo_1m", minute_from, fine_from), ("slo_1h", oldest, minute_from)):
            size = budget_queries.ROLLUP_MS[table]
            for slo, start, total, good, objective in budget_queries.rollup_windows(
                store, table, lo, hi
            ):
                book.add_window(slo, int(start), size, int(total), int(good), objective=objective)
                n += 1
        log.info("budgets rebuilt from %d stored windows", n)
        return n

    def start(self) -> None:
        """Resume per-scope sequence numbers from the compacted control topic."""
        from pipeline.adapters.kafka_admin import wait_partitions

        kafka = self.settings.kafka
        lc = kafka.lifecycle_topic
        self.loop.clock.partitions = wait_partitions(kafka, [lc])[lc]
        seqs = resume_seqs(read_topic(kafka, kafka.control_topic), self.keyring)
        self.issuer = SignalIssuer(
            self.keyring,
            heartbeat_ms=self.settings.control_heartbeat_ms,
            initial_seqs=seqs,
            max_ttl_ms=self.settings.control_max_ttl_ms,
        )
        conf = self.settings.kafka.kafka_config() | {"linger.ms": 5, "enable.idempotence": True}
        self.producer = Producer(conf)
        log.info("controller started; resumed sequence numbers for %d scopes", len(seqs))

    def on_summaries(self, raws: list[bytes]) -> tuple[list[ControlRow], list[BudgetEventRow]]:
        """Feed summaries; returns (control_signals rows, budget_events rows) to store."""
        for raw in raws:
            try:
                s = decode_summary(raw)
            except (ValueError, KeyError, TypeError):
                log.exception("bad summary message dropped")
                continue
            if isinstance(s, Progress):
                self.loop.clock.progress(s.partition, s.horizon_ms, s.clock_ms)
            elif isinstance(s, StatsSample | WindowSummary):
                self.loop.add(s)
        control_rows: list[ControlRow] = []
        event_rows: list[BudgetEventRow] = []
        for step in self.loop.step():
            for d in self.loop.announce(step):
                control_rows.append(self.publish(d))
            event_rows.extend(self._event_row(e) for e in step.events)
            self.observe(step)
        return control_rows, event_rows

    def observe(self, step: ControlStep) -> None:
        """After an evaluation: /metrics shows it, alerts that fire or resolved go out."""
        self.metrics.publish(
            step.budgets,
            {d.scope: d.level for d in step.decisions},
            step.signals,
            {d.scope: d.actions.admit_rps for d in step.decisions},
            [(n.model, n.slo) for n in step.notices],
        )
        if self.alerts is not None:
            # startsAt / endsAt in wall time, Alertmanager's clock (event time: annotations)
            wall_ms = int(time.time() * 1000)
            self.alerts.send(
                self.alert_tracker.step(step.budgets, step.now_ms, step.notices, wall_ms=wall_ms)
            )

    def publish(self, d: Evaluation, *, heartbeat: bool = False) -> ControlRow:
        assert self.issuer is not None
        assert self.producer is not None
        now = int(time.time() * 1000)
        # as_of: the evidence's event time (the window end it read), for the loop's delay
        signal = self.issuer.issue(d.scope, d.decision, now, as_of_ms=d.now_ms)
        return self._send(signal, d.now_ms, heartbeat=heartbeat)

    def _send(self, signal: ControlSignal, event_ms: int, *, heartbeat: bool) -> ControlRow:
        assert self.producer is not None
        value = encode(signal)
        self.producer.produce(self.settings.kafka.control_topic, value, key=message_key(signal))
        self.producer.poll(0)
        self.published += 1
        if not heartbeat:
            log.info(
                "control %s: level %d %s (seq %d): %s",
                signal.scope, signal.level, signal.phase, signal.seq, signal.reason,
            )  # fmt: skip
        return ControlRow(
            scope=signal.scope, seq=signal.seq, level=signal.level, phase=signal.phase,
            issued_at=_dt(signal.issued_at_unix_ms), expires_at=_dt(signal.expires_at_unix_ms),
            event_time=_dt(event_ms), reason=signal.reason,
            figures=orjson.dumps(signal.figures).decode(),
            actions=orjson.dumps(signal.actions.model_dump()).decode(),
            notify_customer=signal.notify_customer, budget_exhausted=signal.budget_exhausted,
            heartbeat=heartbeat, kid=signal.kid, signal=value.decode(),
        )  # fmt: skip

    def heartbeats(self) -> list[ControlRow]:
        if self.issuer is None:
            return []
        now = int(time.time() * 1000)
        return [
            self._send(sig, self.loop.clock.next_eval_ms or 0, heartbeat=True)
            for sig in self.issuer.due_heartbeats(now)
        ]

    def close(self) -> None:
        if self.alerts is not None:
            self.alerts.close()

    def flush(self) -> None:
        if self.producer is not None:
            while self.producer.flush(5.0) > 0:
                log.warning("waiting for the control producer to deliver")

    @staticmethod
    def _event_row(e: BudgetEvent) -> BudgetEventRow:
        return _budget_event_row(e.to_json())


class ControlHost:
    """The controller as a worker hosts it: its input (summaries, heartbeats), and the
    audit of what it published (``control_signals``, ``budget_events``), written by the
    flush's writer on the writer thread (``executor``) once the signals are delivered.

    Audit rows leave the pending lists only once written: a write that fails, gives up
    at stop (``sleep`` raises then), or is cancelled before it ran (the controller agent
    stopped while it waited for the writer thread) leaves them to :meth:`write_audit`
    at stop."""

    def __init__(
        self, shell: ControllerShell, executor: Executor, sleep: Callable[[float], None]
    ) -> None:
        self.shell = shell
        self._executor = executor
        self._sleep = sleep
        self._writer: FlushWriter | None = None
        self._lock = threading.Lock()
        self._control: list[ControlRow] = []
        self._events: list[BudgetEventRow] = []

    @property
    def metrics(self) -> MetricsState:
        return self.shell.metrics

    def open(self, store: ClickHouseStore, writer: FlushWriter) -> None:
        """The budgets rebuilt from the store; the control producer started."""
        self._writer = writer
        self.shell.load_history(store)
        self.shell.start()

    async def on_summaries(self, raws: list[bytes]) -> int:
        """The controller's input (this worker owns the summaries partition); the write
        retries its audit took."""
        return await self._audit(*self.shell.on_summaries(raws))

    async def on_heartbeat(self) -> int:
        return await self._audit(self.shell.heartbeats(), [])

    async def _audit(self, control_rows: list[ControlRow], event_rows: list[BudgetEventRow]) -> int:
        if not control_rows and not event_rows:
            return 0
        with self._lock:
            self._control.extend(control_rows)
            self._events.extend(event_rows)

        def write() -> int:
            self.shell.flush()  # the audit says what was delivered
            return self.write_audit()

        return await asyncio.get_running_loop().run_in_executor(self._executor, write)

    def write_audit(self, attempts: int | None = None) -> int:
        """Write the pending audit rows (every signal published so far whose rows are not
        written); the retries it took."""
        writer = self._writer
        if writer is None:
            return 0
        with self._lock:
            control_rows, event_rows = self._control, self._events
            self._control, self._events = [], []
        try:
            return writer.write_audit(
                control_rows,
                event_rows,
                retry=lambda fn, what: with_retry(fn, what, attempts=attempts, sleep=self._sleep),
            )
        except BaseException:
            with self._lock:
                self._control[:0] = control_rows
                self._events[:0] = event_rows
            raise

    def close(self) -> None:
        self.shell.close()


def _budget_event_row(event: dict[str, Any]) -> BudgetEventRow:
    """The ``budget_events`` row of a budget event (its JSON form)."""
    return BudgetEventRow(
        slo=event["slo"],
        event=event["kind"],
        event_time=_dt(int(event["at_ms"])),
        details=orjson.dumps(event).decode(),
    )


def replay_audit_rows(
    decisions: list[Evaluation], events: list[dict[str, Any]]
) -> tuple[list[ControlRow], list[BudgetEventRow]]:
    """Audit rows for what a replay decided (``tailguard replay --store``), so the
    dashboards show a replayed store like a worker's.

    A replay publishes nothing, so its rows are marked: ``kid`` ``"replay"``, no
    signature, issued and expiring at the event time it was decided at, and
    ``seq`` = that event time in ms (it never collides with a controller's counters,
    and a second replay of the same file replaces its own rows).
    """
    control_rows: list[ControlRow] = []
    for d in decisions:
        at = _dt(d.now_ms)
        row = ControlRow(
            scope=d.scope, seq=d.now_ms, level=d.level, phase=d.phase,
            issued_at=at, expires_at=at, event_time=at, reason=d.reason,
            figures=orjson.dumps(dict(d.figures)).decode(),
            actions=orjson.dumps(d.actions.to_json()).decode(),
            notify_customer=d.notify_customer, budget_exhausted=d.budget_exhausted,
            heartbeat=False, kid="replay", signal="",
        )  # fmt: skip
        control_rows.append(row)
    return control_rows, [_budget_event_row(e) for e in events]
