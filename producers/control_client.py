"""Serving side of the control topic: verified directives, ready for request handlers.

* :class:`DirectiveStore` (pure, thread-safe): raw message values in, the
  effective :class:`Directive` per model out. Verification and the wire format
  are :mod:`pipeline.contract.control_signal`'s.
* :class:`ControlClient`: a confluent-kafka consumer in a background thread
  that feeds the store from ``tailguard.control``. The only module part that
  touches Kafka (imported lazily in :meth:`ControlClient.start`).

Effective directive of a model (documented rule)
------------------------------------------------
A request for model ``m`` is governed by the live directive of scope ``m`` and
the live directive of scope ``"*"`` (all traffic): the **stricter wins**, i.e.
the one with the higher level; on equal levels the model's own (more specific)
directive wins. Directives are never merged field by field (a merge would be a
directive nobody issued). So a fleet-wide L2 cannot be relaxed by a
model-specific L0, and a model-specific L3 applies under a fleet-wide L1.

Expiry fails open
-----------------
A directive whose ``expires_at_unix_ms`` has passed without a newer valid
signal for its scope is dropped: the scope falls back to level 0 (normal
service) -- see the rationale in :mod:`pipeline.contract.control_signal`. Each
such expiry is counted once, as ``expired`` and, when the directive was
level >= 1 (so service was actually relaxed), as ``failed_open`` too.

Maximum lifetime
----------------
A directive is enforced for at most ``max_ttl_ms`` (default
:data:`~pipeline.contract.control_signal.DEFAULT_MAX_TTL_MS`, 5 minutes) after the
signal's ``issued_at_unix_ms``, whatever expiry it claims: a longer one is clamped,
counted as ``clamped`` and logged (at most once a minute per scope). A client started
later that reads an old signal from the compacted topic applies the same clamp, so a
correctly signed 365-day signal is over ``max_ttl_ms`` after it was issued, for every
client. Set ``max_ttl_ms`` to the issuers' ``TAILGUARD_CONTROL_MAX_TTL_MS``.

Counters
--------
``accepted``; rejections: ``forged`` (= ``unknown_kid`` + ``bad_signature``,
both also counted separately), ``replayed``, ``stale``, ``expired`` (signals
that arrived already expired *plus* directives that expired in place),
``not_yet_valid``, ``malformed``; ``failed_open`` (level >= 1 directives that
expired in place); ``clamped`` (accepted signals whose expiry was cut to
``max_ttl_ms``); ``seq_resets`` (see :class:`~pipeline.contract.control_signal.SequenceGuard`);
``errors`` (internal exceptions, never raised to callers). The client adds
``messages``, ``tombstones``, ``consumer_errors``, ``metadata_errors``.

The loop's delay
----------------
:attr:`ControlClient.loop_delay` (:class:`producers.loop_delay.LoopDelay`): for each new
decision accepted, the client's clock at acceptance (the gateway's wall clock: from then
on its requests are decided under it) minus the signal's ``as_of_unix_ms`` (the end of
the latest window the decision read, event time). Meaningful where event time is the
gateways' wall clock (production); the demo's simulated gateways measure on the
simulator's clock instead (:class:`producers.simulator.gate.GatewayGate`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from pipeline.contract.control_signal import (
    ALL_SCOPES,
    DEFAULT_MAX_SKEW_MS,
    DEFAULT_MAX_TTL_MS,
    Actions,
    ControlSignal,
    Keyring,
    Phase,
    Rejection,
    RejectReason,
    SequenceGuard,
    VerifiedSignal,
    decode_and_verify,
)
from pipeline.contract.events import CONTROL_TOPIC
from pipeline.kafka_settings import EmitterSettings
from producers.enforcement import stricter
from producers.loop_delay import LoopDelay

log = logging.getLogger(__name__)

NO_ACTIONS: Final = Actions()

COUNTER_NAMES: Final = (
    "accepted",
    "forged",
    "unknown_kid",
    "bad_signature",
    "replayed",
    "stale",
    "expired",
    "not_yet_valid",
    "malformed",
    "failed_open",
    "clamped",
    "seq_resets",
    "errors",
)


@dataclass(frozen=True, slots=True)
class Directive:
    """What the serving layer enforces for a request. The default is level 0."""

    level: int = 0
    phase: Phase = "normal"
    actions: Actions = NO_ACTIONS
    scope: str | None = None  # scope of the signal it came from; None = default (no signal)
    seq: int | None = None
    issued_at_unix_ms: int | None = None
    expires_at_unix_ms: int | None = None
    as_of_unix_ms: int | None = None  # the evidence's event time (the loop's delay)
    reason: str = ""
    notify_customer: bool = False
    budget_exhausted: bool = False

    @classmethod
    def from_signal(cls, s: ControlSignal, expires_at_unix_ms: int | None = None) -> Directive:
        """The signal's fields, each by its name; ``expires_at_unix_ms``: the effective
        expiry, when the verifier clamped it."""
        signalled = {f.name: getattr(s, f.name) for f in fields(cls)}
        if expires_at_unix_ms is not None:
            signalled["expires_at_unix_ms"] = expires_at_unix_ms
        return cls(**signalled)


NORMAL: Final = Directive()


@dataclass(frozen=True, slots=True)
class Accepted:
    signal: ControlSignal
    directive: Directive


Rejected = Rejection  # ``reason`` (RejectReason), ``detail``, ``scope``, ``seq``


class DirectiveStore:
    """Verified directives per scope. ``apply`` from one thread, ``current`` from any.

    ``keyring`` may be swapped at run time (:meth:`set_keyring`) for rotation.
    ``max_ttl_ms``: the longest a signal is enforced after it was issued (see the
    module's docstring).
    """

    def __init__(
        self,
        keyring: Keyring,
        *,
        max_skew_ms: int = DEFAULT_MAX_SKEW_MS,
        max_ttl_ms: int = DEFAULT_MAX_TTL_MS,
        max_scopes: int = 10_000,
        allow_seq_reset_after_expiry: bool = True,
    ) -> None:
        if max_ttl_ms < 1:
            raise ValueError(f"max_ttl_ms must be >= 1, got {max_ttl_ms}")
        self._keyring = keyring
        self.max_skew_ms = max_skew_ms
        self.max_ttl_ms = max_ttl_ms
        self._clamp_logged_ms: dict[str, int] = {}  # per scope, bounded like the directives
        self._guard = SequenceGuard(
            max_scopes, allow_reset_after_expiry=allow_seq_reset_after_expiry
        )
        self._max_scopes = max_scopes
        self._directives: dict[str, Directive] = {}
        self._counts: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self._lock = threading.Lock()

    @property
    def keyring(self) -> Keyring:
        return self._keyring

    def set_keyring(self, keyring: Keyring) -> None:
        self._keyring = keyring

    # -- writing
    def apply(self, raw: bytes | None, now_ms: int) -> Accepted | Rejected:
        """Verify one message value; accept it as its scope's directive or count why not."""
        try:
            if raw is None:
                return self._reject(Rejection(RejectReason.MALFORMED, "empty value"))
            res = decode_and_verify(
                raw, self._keyring, now_ms, max_skew_ms=self.max_skew_ms, max_ttl_ms=self.max_ttl_ms
            )
            if not isinstance(res, VerifiedSignal):
                return self._reject(res)
            s = res.signal
            with self._lock:
                verdict = self._guard.admit(s, now_ms, expires_at_unix_ms=res.expires_at_unix_ms)
                if verdict is not None:
                    return self._reject_locked(
                        Rejection(
                            verdict, f"last seq {self._guard.last_seq(s.scope)}", s.scope, s.seq
                        )
                    )
                self._counts["seq_resets"] = self._guard.resets
                old = self._directives.get(s.scope)
                if old is not None:
                    self._expire_if_due_locked(s.scope, old, now_ms)
                d = Directive.from_signal(s, res.expires_at_unix_ms)
                if res.clamped:
                    self._counts["clamped"] += 1
                    self._log_clamp_locked(res, now_ms)
                self._directives[s.scope] = d
                if len(self._directives) > self._max_scopes:
                    # Bounded like the guard: drop the directive expiring first.
                    victim = min(self._directives.items(), key=_expiry_of)[0]
                    self._directives.pop(victim, None)
                self._counts["accepted"] += 1
            return Accepted(s, d)
        except Exception as e:  # never raise into the consumer loop or a handler
            log.exception("control: apply failed")
            with self._lock:
                self._counts["errors"] += 1
            return Rejection(RejectReason.MALFORMED, f"internal error: {type(e).__name__}")

    def _log_clamp_locked(self, res: VerifiedSignal, now_ms: int) -> None:
        s = res.signal
        last = self._clamp_logged_ms.get(s.scope)
        if last is not None and now_ms - last < 60_000:
            return
        if len(self._clamp_logged_ms) >= self._max_scopes:
            self._clamp_logged_ms.clear()
        self._clamp_logged_ms[s.scope] = now_ms
        log.warning(
            "control: signal for %r (seq %d, kid %s) claims to live %d ms, more than "
            "max_ttl_ms %d: enforced until %d only (issued at %d + max_ttl_ms), not %d",
            s.scope,
            s.seq,
            s.kid,
            s.expires_at_unix_ms - s.issued_at_unix_ms,
            self.max_ttl_ms,
            res.expires_at_unix_ms,
            s.issued_at_unix_ms,
            s.expires_at_unix_ms,
        )

    def _reject(self, r: Rejection) -> Rejection:
        with self._lock:
            return self._reject_locked(r)

    def _reject_locked(self, r: Rejection) -> Rejection:
        c = self._counts
        if r.reason in (RejectReason.UNKNOWN_KID, RejectReason.BAD_SIGNATURE):
            c["forged"] += 1
        c[r.reason.value] += 1
        return r

    # -- reading
    def _live_locked(self, scope: str, now_ms: int) -> Directive | None:
        d = self._directives.get(scope)
        if d is None or self._expire_if_due_locked(scope, d, now_ms):
            return None
        return d

    def _expire_if_due_locked(self, scope: str, d: Directive, now_ms: int) -> bool:
        if d.expires_at_unix_ms is None or now_ms < d.expires_at_unix_ms:
            return False
        if self._directives.get(scope) is d:
            del self._directives[scope]
            self._counts["expired"] += 1
            if d.level >= 1:
                self._counts["failed_open"] += 1
                log.warning(
                    "control: directive L%d for %r (seq %s) expired without a newer signal; "
                    "failing open to L0",
                    d.level,
                    scope,
                    d.seq,
                )
        return True

    def current(self, scope: str, now_ms: int) -> Directive:
        """Effective directive for ``scope`` (a model, or ``"*"``). Never raises."""
        try:
            with self._lock:
                own = self._live_locked(scope, now_ms)
                star = self._live_locked(ALL_SCOPES, now_ms) if scope != ALL_SCOPES else None
        except Exception:
            log.exception("control: current() failed; serving normally")
            with self._lock:
                self._counts["errors"] += 1
            return NORMAL
        return stricter(own, star) or NORMAL  # type: ignore[return-value]  # one of the two

    def sweep(self, now_ms: int) -> int:
        """Expire (and count) every directive past its expiry; returns how many."""
        with self._lock:
            return sum(
                self._expire_if_due_locked(scope, d, now_ms)
                for scope, d in list(self._directives.items())
            )

    def snapshot(self, now_ms: int) -> dict[str, Directive]:
        """Live directives per scope (for health/debug endpoints)."""
        self.sweep(now_ms)
        with self._lock:
            return dict(self._directives)

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _metadata_problem(tmd: Any) -> object | None:
    if tmd is None:
        return "topic absent"
    if tmd.error is not None:
        return str(tmd.error)
    if not tmd.partitions:
        return "no partitions"
    return None


def _expiry_of(item: tuple[str, Directive]) -> int:
    return item[1].expires_at_unix_ms or 0


# --------------------------------------------------------------------------- Kafka


@dataclass
class _ClientCounts:
    messages: int = 0
    tombstones: int = 0
    consumer_errors: int = 0
    metadata_errors: int = 0
    errors: int = 0
    last_log: dict[str, float] = field(default_factory=dict)


class ControlClient:
    """Consumes ``topic`` into a :class:`DirectiveStore` on a background thread.

    ``consumer_config`` is a confluent-kafka (librdkafka) config: bootstrap
    servers, security settings, anything else. The client sets, unless given:
    a random ``group.id`` (never joined: partitions are *assigned*, not
    subscribed), ``enable.auto.commit``/``enable.auto.offset.store`` false (no
    commits: every start reads the compacted topic from the beginning, i.e.
    the latest signal per scope), ``enable.partition.eof`` true (to tell when
    it has caught up) and ``auto.offset.reset`` earliest. All partitions of the
    topic are assigned at ``OFFSET_BEGINNING``; partitions added later are
    picked up within ``metadata_refresh_s``. Reconnects are librdkafka's job;
    nothing here raises into a request handler: :meth:`directive` returns
    level 0 on any internal error.

    ``max_ttl_ms``: the longest a directive is enforced after its signal was issued
    (used when no ``store`` is given; a store has its own).

    ``consumer_factory`` (default: ``confluent_kafka.Consumer``) lets tests
    drive the loop with a fake consumer. Tombstones (``null`` values) are
    counted and ignored: they cannot be signed, so they cannot lift a directive.
    """

    @classmethod
    def from_settings(cls, settings: EmitterSettings, keyring: Keyring) -> ControlClient:
        """The serving side's client as every gateway builds it: the settings' Kafka
        connection, control topic and ``control_max_ttl_ms``."""
        return cls(
            settings.kafka_config(),
            topic=settings.control_topic,
            keyring=keyring,
            max_ttl_ms=settings.control_max_ttl_ms,
        )

    def __init__(
        self,
        consumer_config: Mapping[str, Any],
        topic: str = CONTROL_TOPIC,
        keyring: Keyring | None = None,
        clock: Callable[[], float] = time.time,
        *,
        store: DirectiveStore | None = None,
        max_ttl_ms: int = DEFAULT_MAX_TTL_MS,
        poll_timeout_s: float = 0.5,
        metadata_refresh_s: float = 30.0,
        consumer_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if store is None:
            if keyring is None:
                raise ValueError("ControlClient needs a keyring (or a store)")
            store = DirectiveStore(keyring, max_ttl_ms=max_ttl_ms)
        self.store = store
        self.topic = topic
        self._clock = clock
        self.loop_delay = LoopDelay()
        self._conf = dict(consumer_config)
        self._conf.setdefault("group.id", f"tailguard-control-{uuid.uuid4().hex}")
        self._conf.setdefault("enable.auto.commit", False)
        self._conf.setdefault("enable.auto.offset.store", False)
        self._conf.setdefault("enable.partition.eof", True)
        self._conf.setdefault("auto.offset.reset", "earliest")
        self._poll_timeout_s = poll_timeout_s
        self._metadata_refresh_s = metadata_refresh_s
        self._factory = consumer_factory
        self._c = _ClientCounts()
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._assigned: set[int] = set()
        self._eof: set[int] = set()
        self._read_to: dict[int, int] = {}  # partition -> the next offset to read

    # -- request path
    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def directive(self, scope: str) -> Directive:
        """Effective directive for a model (or ``"*"``). Never raises."""
        try:
            return self.store.current(scope, self.now_ms())
        except Exception:
            with self._count_lock:
                self._c.errors += 1
            return NORMAL

    def in_force(self) -> dict[str, Directive]:
        """Every scope's live directive (health pages). Never raises."""
        try:
            return self.store.snapshot(self.now_ms())
        except Exception:
            with self._count_lock:
                self._c.errors += 1
            return {}

    def counters(self) -> dict[str, int]:
        out = self.store.counters()
        c = self._c
        out["messages"] = c.messages
        out["tombstones"] = c.tombstones
        out["consumer_errors"] = c.consumer_errors
        out["metadata_errors"] = c.metadata_errors
        out["errors"] += c.errors
        return out

    def read_offsets(self) -> dict[int, int]:
        """Per partition, the offset after the last message read (or the end seen): what
        a caller compares with the topic's end to know every signal up to it was read."""
        with self._count_lock:
            return dict(self._read_to)

    def apply_raw(self, raw: bytes | None) -> Accepted | Rejected:
        """Apply one message value as if consumed (tests, or another transport)."""
        return self._apply(raw)

    def _apply(self, raw: bytes | None) -> Accepted | Rejected:
        now_ms = self.now_ms()
        res = self.store.apply(raw, now_ms)
        if isinstance(res, Accepted):
            self.loop_delay.applied(res.signal.scope, res.signal.as_of_unix_ms, now_ms)
        return res

    # -- lifecycle
    @property
    def caught_up(self) -> bool:
        """True once every assigned partition has been read to its end once."""
        return self._caught_up.is_set()

    def wait_caught_up(self, timeout_s: float) -> bool:
        return self._caught_up.wait(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Create the consumer (a bad config raises here, at start-up) and start the thread."""
        if self._thread is not None:
            raise RuntimeError("ControlClient already started")
        factory = self._factory
        if factory is None:
            from confluent_kafka import Consumer  # adapter-only import

            factory = Consumer
        self._consumer = factory(dict(self._conf))
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"tailguard-control[{self.topic}]", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout_s)
        self._thread = None

    def __enter__(self) -> ControlClient:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- consumer thread
    def _run(self) -> None:
        consumer = self._consumer
        next_refresh = 0.0
        try:
            while not self._stop.is_set():
                try:
                    mono = time.monotonic()
                    if not self._assigned or mono >= next_refresh:
                        ok = self._refresh_assignment(consumer)
                        next_refresh = mono + (self._metadata_refresh_s if ok else 1.0)
                        if not self._assigned:
                            self._stop.wait(1.0)
                            continue
                    msg = consumer.poll(self._poll_timeout_s)
                    if msg is not None:
                        self._handle(msg)
                    self.store.sweep(self.now_ms())
                except Exception:
                    self._c.errors += 1
                    self._log_limited("loop", "control: consumer loop error", exc=True)
                    self._stop.wait(1.0)
        finally:
            try:
                consumer.close()
            except Exception:
                log.debug("control: consumer close failed", exc_info=True)

    def _refresh_assignment(self, consumer: Any) -> bool:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        try:
            md = consumer.list_topics(self.topic, timeout=5.0)
            tmd = md.topics.get(self.topic)
            problem = _metadata_problem(tmd)
        except Exception as e:
            problem = e
        if problem is not None:
            self._c.metadata_errors += 1
            self._log_limited("metadata", "control: no metadata for %s: %s", self.topic, problem)
            return False
        new = sorted(set(tmd.partitions) - self._assigned)
        if new:
            consumer.incremental_assign(
                [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in new]
            )
            self._assigned.update(new)
            if not self._assigned <= self._eof:
                self._caught_up.clear()
            log.info("control: assigned %s partitions %s from the beginning", self.topic, new)
        return True

    def _handle(self, msg: Any) -> None:
        from confluent_kafka import KafkaError

        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self._note_read(msg.partition(), msg.offset())
                self._eof.add(msg.partition())
                if self._assigned <= self._eof:
                    self._caught_up.set()
                return
            self._c.consumer_errors += 1
            self._log_limited("consumer", "control: consumer error: %s", err)
            return
        self._c.messages += 1
        value = msg.value()
        try:
            self._apply_message(msg, value)
        finally:  # read (applied or rejected): past it
            self._note_read(msg.partition(), msg.offset() + 1)

    def _note_read(self, partition: int, next_offset: int) -> None:
        with self._count_lock:
            if next_offset > self._read_to.get(partition, -1):
                self._read_to[partition] = next_offset

    def _apply_message(self, msg: Any, value: bytes | None) -> None:
        if value is None:
            self._c.tombstones += 1
            return
        res = self._apply(value)
        if isinstance(res, Rejection) and res.reason in (
            RejectReason.UNKNOWN_KID,
            RejectReason.BAD_SIGNATURE,
            RejectReason.MALFORMED,
        ):
            self._log_limited(
                res.reason.value,
                "control: rejected %s[%s]@%s: %s %s",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                res.reason.value,
                res.detail,
            )

    def _log_limited(self, kind: str, fmt: str, *args: Any, exc: bool = False) -> None:
        now = time.monotonic()
        if now - self._c.last_log.get(kind, -1e9) >= 60.0:
            self._c.last_log[kind] = now
            log.warning(fmt, *args, exc_info=exc)
