"""Serving side: DirectiveStore, ControlClient (fake consumer), ASGI middleware."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError

from pipeline.contract.control_signal import (
    DEFAULT_MAX_TTL_MS,
    Actions,
    Decision,
    Keyring,
    RejectReason,
    SignalIssuer,
    UnsignedSignal,
    encode,
    sign,
)
from producers.admission import MIN_BURST_TOKENS
from producers.asgi_control import (
    ControlMiddleware,
    Scope,
    hash_admits,
    spread_admits,
)
from producers.control_client import (
    NORMAL,
    Accepted,
    ControlClient,
    Directive,
    DirectiveStore,
    Rejected,
)
from tests.gateway_fixtures import overloaded

T0 = 1_700_000_000_000
KEY1 = b"k" * 32
KEY2 = b"z" * 32
KR = Keyring({"k1": KEY1}, "k1")


def _decision(level: int, **actions: Any) -> Decision:
    return Decision(
        level=level,
        phase="normal" if level == 0 else "degraded",
        actions=Actions(**actions),
    )


def _issuer(kr: Keyring = KR) -> SignalIssuer:
    return SignalIssuer(kr, heartbeat_ms=10_000)  # ttl 30 s


# --------------------------------------------------------------------------- store


def test_default_is_level_0() -> None:
    store = DirectiveStore(KR)
    assert store.current("m", T0) == NORMAL
    assert store.current("*", T0).level == 0
    assert all(v == 0 for v in store.counters().values())


def test_accepts_and_serves_a_directive() -> None:
    store = DirectiveStore(KR)
    s = _issuer().issue("m", _decision(2, shed_priorities_at_or_above=2), T0)
    res = store.apply(encode(s), T0 + 1)
    assert isinstance(res, Accepted)
    d = store.current("m", T0 + 1)
    assert (d.level, d.scope, d.seq, d.actions.shed_priorities_at_or_above) == (2, "m", 1, 2)
    assert store.current("other", T0 + 1) == NORMAL
    assert store.counters()["accepted"] == 1


def _forged_bad_sig() -> bytes:
    return encode(_issuer(Keyring({"k1": KEY2}, "k1")).issue("m", _decision(3), T0))


def _forged_unknown_kid() -> bytes:
    return encode(_issuer(Keyring({"evil": KEY1}, "evil")).issue("m", _decision(3), T0))


def _tampered() -> bytes:
    obj = orjson.loads(encode(_issuer().issue("m", _decision(1), T0)))
    obj["level"] = 3
    return orjson.dumps(obj)


@pytest.mark.parametrize(
    ("raw", "now", "counter", "reason"),
    [
        (_forged_bad_sig(), T0, "forged", RejectReason.BAD_SIGNATURE),
        (_forged_unknown_kid(), T0, "forged", RejectReason.UNKNOWN_KID),
        (_tampered(), T0, "forged", RejectReason.BAD_SIGNATURE),
        (b"{not json", T0, "malformed", RejectReason.MALFORMED),
        (None, T0, "malformed", RejectReason.MALFORMED),
        (encode(_issuer().issue("m", _decision(1), T0)), T0 + 30_000, "expired",
         RejectReason.EXPIRED),
        (encode(_issuer().issue("m", _decision(1), T0 + 60_000)), T0, "not_yet_valid",
         RejectReason.NOT_YET_VALID),
    ],
)  # fmt: skip
def test_rejections_are_counted_and_change_nothing(
    raw: bytes | None, now: int, counter: str, reason: RejectReason
) -> None:
    store = DirectiveStore(KR)
    res = store.apply(raw, now)
    assert isinstance(res, Rejected)
    assert res.reason is reason
    c = store.counters()
    assert c[counter] == 1
    assert c["accepted"] == 0
    if counter == "forged":
        assert c[reason.value] == 1
    assert store.current("m", now) == NORMAL


def test_replayed_and_stale_are_counted() -> None:
    store = DirectiveStore(KR)
    iss = _issuer()
    s1 = encode(iss.issue("m", _decision(1), T0))
    s2 = encode(iss.issue("m", _decision(2), T0 + 1))
    assert isinstance(store.apply(s2, T0 + 2), Accepted)
    r = store.apply(s2, T0 + 3)
    assert isinstance(r, Rejected)
    assert r.reason is RejectReason.REPLAYED
    r = store.apply(s1, T0 + 3)
    assert isinstance(r, Rejected)
    assert r.reason is RejectReason.STALE
    c = store.counters()
    assert (c["accepted"], c["replayed"], c["stale"]) == (1, 1, 1)
    assert store.current("m", T0 + 3).level == 2  # the stale L1 did not win


def test_newer_signal_replaces_even_when_less_strict() -> None:
    store = DirectiveStore(KR)
    iss = _issuer()
    store.apply(encode(iss.issue("m", _decision(3), T0)), T0)
    store.apply(encode(iss.issue("m", _decision(0), T0 + 1)), T0 + 1)
    assert store.current("m", T0 + 2).level == 0  # recovery is a signal too


def test_expiry_fails_open_and_counts_once() -> None:
    store = DirectiveStore(KR)
    store.apply(encode(_issuer().issue("m", _decision(2), T0)), T0)
    assert store.current("m", T0 + 29_999).level == 2
    for _ in range(3):
        assert store.current("m", T0 + 30_000) == NORMAL
    c = store.counters()
    assert (c["expired"], c["failed_open"]) == (1, 1)
    assert store.sweep(T0 + 40_000) == 0


def test_sweep_counts_expiries_nobody_read() -> None:
    store = DirectiveStore(KR)
    iss = _issuer()
    store.apply(encode(iss.issue("a", _decision(1), T0)), T0)
    store.apply(encode(iss.issue("b", _decision(0), T0)), T0)
    assert store.sweep(T0 + 10_000) == 0
    assert set(store.snapshot(T0 + 10_000)) == {"a", "b"}
    assert store.sweep(T0 + 30_000) == 2
    c = store.counters()
    assert (c["expired"], c["failed_open"]) == (2, 1)  # an L0 expiring relaxes nothing
    assert store.snapshot(T0 + 30_000) == {}


def test_heartbeats_keep_the_directive_and_a_dead_controller_fails_open() -> None:
    store = DirectiveStore(KR)
    iss = _issuer()
    store.apply(encode(iss.issue("m", _decision(1), T0)), T0)
    now = T0
    for _ in range(6):
        now += 10_000
        for s in iss.due_heartbeats(now):
            assert isinstance(store.apply(encode(s), now), Accepted)
        assert store.current("m", now + 9_999).level == 1
    # the controller dies: no more heartbeats
    assert store.current("m", now + 29_999).level == 1
    assert store.current("m", now + 30_000).level == 0
    assert store.counters()["failed_open"] == 1


def test_expired_directive_replaced_by_a_new_signal_is_counted() -> None:
    store = DirectiveStore(KR)
    iss = _issuer()
    store.apply(encode(iss.issue("m", _decision(2), T0)), T0)
    store.apply(encode(iss.issue("m", _decision(1), T0 + 40_000)), T0 + 40_000)
    assert store.current("m", T0 + 40_000).level == 1
    assert store.counters()["expired"] == 1


def test_seq_reset_after_expiry_is_accepted() -> None:
    store = DirectiveStore(KR)
    store.apply(encode(SignalIssuer(KR, initial_seqs={"m": 50}).issue("m", _decision(1), T0)), T0)
    fresh = SignalIssuer(KR)  # lost its counters
    early = store.apply(encode(fresh.issue("m", _decision(2), T0 + 1_000)), T0 + 1_000)
    assert isinstance(early, Rejected)
    assert early.reason is RejectReason.STALE
    late = store.apply(encode(fresh.issue("m", _decision(2), T0 + 31_000)), T0 + 31_000)
    assert isinstance(late, Accepted)
    assert store.counters()["seq_resets"] == 1


@pytest.mark.parametrize(
    ("model_level", "star_level", "want_level", "want_scope"),
    [
        (None, None, 0, None),
        (None, 2, 2, "*"),
        (1, None, 1, "m"),
        (1, 2, 2, "*"),  # fleet-wide L2 is not relaxed by the model's L1
        (3, 1, 3, "m"),  # the model's L3 applies under a fleet-wide L1
        (0, 2, 2, "*"),  # a model-specific L0 does not lift a fleet-wide L2
        (2, 0, 2, "m"),
        (2, 2, 2, "m"),  # tie: the more specific directive
    ],
)
def test_star_vs_model_precedence(
    model_level: int | None, star_level: int | None, want_level: int, want_scope: str | None
) -> None:
    store = DirectiveStore(KR)
    iss = _issuer()
    if model_level is not None:
        store.apply(encode(iss.issue("m", _decision(model_level, retry_after_s=1), T0)), T0)
    if star_level is not None:
        store.apply(encode(iss.issue("*", _decision(star_level, retry_after_s=2), T0)), T0)
    d = store.current("m", T0 + 1)
    assert (d.level, d.scope) == (want_level, want_scope)
    assert store.current("other-model", T0 + 1).level == (star_level or 0)
    assert store.current("*", T0 + 1).level == (star_level or 0)


def test_star_expiry_leaves_the_model_directive() -> None:
    store = DirectiveStore(KR)
    iss = SignalIssuer(KR, heartbeat_ms=10_000, ttl_ms=60_000)
    store.apply(encode(iss.issue("m", _decision(1), T0)), T0)
    store.apply(encode(_issuer().issue("*", _decision(3), T0)), T0)
    assert store.current("m", T0 + 1).level == 3
    assert store.current("m", T0 + 30_000).level == 1


# --------------------------------------------------------------------------- max_ttl

YEAR_MS = 365 * 86_400_000


def _long_lived(level: int = 3, *, seq: int = 1, issued: int = T0, ttl: int = YEAR_MS) -> bytes:
    """A correctly signed signal with a long expiry, as an issuer configured with a
    longer max_ttl_ms than the client's (or another implementation) signs it."""
    unsigned = UnsignedSignal.model_validate(
        {**_decision(level).model_dump(), "scope": "m", "seq": seq,
         "issued_at_unix_ms": issued, "expires_at_unix_ms": issued + ttl}
    )  # fmt: skip
    return encode(sign(unsigned, KR, max_ttl_ms=ttl))


def test_the_default_max_ttl_fits_the_issuers_cadence() -> None:
    """5 minutes: ten times the default ttl (3 heartbeats of 10 s)."""
    assert DEFAULT_MAX_TTL_MS == 300_000 == 10 * 3 * SignalIssuer(KR).heartbeat_ms
    assert DirectiveStore(KR).max_ttl_ms == DEFAULT_MAX_TTL_MS


def test_a_365_day_signal_is_enforced_for_max_ttl_only(caplog: pytest.LogCaptureFixture) -> None:
    store = DirectiveStore(KR)
    raw = _long_lived()
    with caplog.at_level(logging.WARNING, logger="producers.control_client"):
        res = store.apply(raw, T0 + 1)
    assert isinstance(res, Accepted)
    assert res.signal.expires_at_unix_ms == T0 + YEAR_MS  # kept as signed
    assert res.directive.expires_at_unix_ms == T0 + DEFAULT_MAX_TTL_MS
    assert store.counters()["clamped"] == 1
    assert "more than max_ttl_ms 300000" in caplog.text
    assert store.current("m", T0 + DEFAULT_MAX_TTL_MS - 1).level == 3
    assert store.current("m", T0 + DEFAULT_MAX_TTL_MS) == NORMAL  # not a year later
    assert store.current("m", T0 + YEAR_MS - 1) == NORMAL
    counts = store.counters()
    assert (counts["expired"], counts["failed_open"]) == (1, 1)


@pytest.mark.parametrize(
    ("now", "want"),
    [
        (T0 + 1, 3),  # a fresh client within max_ttl of the issue: enforced, clamped
        (T0 + DEFAULT_MAX_TTL_MS - 1, 3),
        (T0 + DEFAULT_MAX_TTL_MS, 0),  # from then on: expired, whatever it claims
        (T0 + 86_400_000, 0),
        (T0 + YEAR_MS - 1, 0),
    ],
)
def test_a_fresh_client_reading_the_long_signal_later(now: int, want: int) -> None:
    """A client started at ``now`` reads the compacted topic's (only) signal."""
    store = DirectiveStore(KR)
    res = store.apply(_long_lived(), now)
    assert store.current("m", now).level == want
    if want == 0:
        assert isinstance(res, Rejected)
        assert res.reason is RejectReason.EXPIRED
        assert "max_ttl_ms 300000" in res.detail
    else:
        assert store.current("m", T0 + DEFAULT_MAX_TTL_MS) == NORMAL


def test_max_ttl_is_configurable_on_the_client() -> None:
    store = DirectiveStore(KR, max_ttl_ms=60_000)
    store.apply(_long_lived(), T0)
    assert store.current("m", T0 + 59_999).level == 3
    assert store.current("m", T0 + 60_000) == NORMAL
    # a signal within the cap is left as it is
    wide = DirectiveStore(KR, max_ttl_ms=YEAR_MS)
    wide.apply(_long_lived(), T0)
    assert wide.current("m", T0 + YEAR_MS - 1).level == 3
    assert wide.counters()["clamped"] == 0
    client = ControlClient({}, "t", KR, max_ttl_ms=60_000)
    assert client.store.max_ttl_ms == 60_000
    with pytest.raises(ValueError, match="max_ttl_ms"):
        DirectiveStore(KR, max_ttl_ms=0)


def test_after_a_clamped_expiry_a_restarted_issuer_is_accepted() -> None:
    """The replay guard keeps the clamped expiry: an issuer that lost its counters is
    obeyed again max_ttl after the long signal, not a year after."""
    store = DirectiveStore(KR)
    store.apply(_long_lived(seq=50), T0)
    later = T0 + DEFAULT_MAX_TTL_MS + 1
    fresh = SignalIssuer(KR).issue("m", _decision(1), later)  # seq 1 < 50
    assert isinstance(store.apply(encode(fresh), later), Accepted)
    assert store.current("m", later).level == 1


def test_clamped_signals_are_logged_once_a_minute_per_scope(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = DirectiveStore(KR)
    with caplog.at_level(logging.WARNING, logger="producers.control_client"):
        for i in range(10):  # heartbeats of a misconfigured issuer, every 10 s
            store.apply(_long_lived(seq=i + 1, issued=T0 + i * 10_000), T0 + i * 10_000)
    assert store.counters()["clamped"] == 10
    assert caplog.text.count("more than max_ttl_ms") == 2  # at T0 and T0 + 60 s


def test_keyring_rotation_at_run_time() -> None:
    store = DirectiveStore(KR)
    rotated = KR.with_key("k2", KEY2, activate=True)
    s = encode(_issuer(rotated).issue("m", _decision(1), T0))
    r = store.apply(s, T0)
    assert isinstance(r, Rejected)
    assert r.reason is RejectReason.UNKNOWN_KID
    store.set_keyring(KR.with_key("k2", KEY2))
    assert isinstance(store.apply(s, T0), Accepted)
    store.set_keyring(rotated.retire("k1"))
    old = store.apply(encode(_issuer().issue("x", _decision(1), T0)), T0)
    assert isinstance(old, Rejected)
    assert old.reason is RejectReason.UNKNOWN_KID


def test_concurrent_writer_and_readers() -> None:
    store = DirectiveStore(KR)
    iss = _issuer()
    raws = [encode(iss.issue("m", _decision(1 + i % 3), T0 + i)) for i in range(400)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                d = store.current("m", T0 + 500)
                assert d.level in (0, 1, 2, 3)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    for raw in raws:
        store.apply(raw, T0 + 500)
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    assert store.counters()["accepted"] == 400
    assert store.current("m", T0 + 500).seq == 400


# --------------------------------------------------------------------------- client


@dataclass
class FakeMsg:
    value_: bytes | None = None
    partition_: int = 0
    offset_: int = 0
    error_: KafkaError | None = None
    topic_: str = "tailguard.control"

    def error(self) -> KafkaError | None:
        return self.error_

    def value(self) -> bytes | None:
        return self.value_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def topic(self) -> str:
        return self.topic_


@dataclass
class FakeTopic:
    partitions: dict[int, object]
    error: object = None


@dataclass
class FakeMetadata:
    topics: dict[str, FakeTopic]


@dataclass
class FakeConsumer:
    config: dict[str, Any]
    partitions: int = 2
    metadata_failures: int = 0
    queue: deque[FakeMsg] = field(default_factory=deque)
    assigned: list[tuple[str, int, int]] = field(default_factory=list)
    closed: bool = False
    polls: int = 0

    def list_topics(self, topic: str, timeout: float) -> FakeMetadata:
        if self.metadata_failures > 0:
            self.metadata_failures -= 1
            return FakeMetadata({})
        return FakeMetadata({topic: FakeTopic(dict.fromkeys(range(self.partitions)))})

    def incremental_assign(self, tps: list[Any]) -> None:
        self.assigned += [(tp.topic, tp.partition, tp.offset) for tp in tps]

    def poll(self, timeout: float) -> FakeMsg | None:
        self.polls += 1
        if self.queue:
            return self.queue.popleft()
        time.sleep(min(timeout, 0.005))
        return None

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def _wait(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def _eof(p: int) -> FakeMsg:
    return FakeMsg(partition_=p, error_=KafkaError(KafkaError._PARTITION_EOF))


def test_client_consumes_from_the_beginning_and_catches_up() -> None:
    made: list[FakeConsumer] = []
    iss = _issuer()

    def factory(conf: dict[str, Any]) -> FakeConsumer:
        c = FakeConsumer(conf)
        c.queue.extend(
            [
                FakeMsg(encode(iss.issue("m", _decision(1), T0)), 0, 0),
                FakeMsg(encode(iss.issue("m", _decision(2), T0 + 1)), 0, 1),
                FakeMsg(None, 1, 0),  # tombstone: ignored
                FakeMsg(b"garbage", 1, 1),
                FakeMsg(error_=KafkaError(KafkaError._TRANSPORT)),
                _eof(0),
            ]
        )
        made.append(c)
        return c

    clock = Clock(T0 + 2)
    client = ControlClient(
        {"bootstrap.servers": "x:9092", "enable.partition.eof": True},
        "tailguard.control",
        KR,
        clock,
        consumer_factory=factory,
    )
    client.start()
    try:
        _wait(lambda: not made[0].queue)
        assert not client.caught_up  # partition 1 has not reached its end yet
        made[0].queue.append(_eof(1))
        assert client.wait_caught_up(5.0)
        # how far it read, per partition: past every message, accepted, rejected or not a
        # signal at all (what a caller compares with the topic's end)
        assert client.read_offsets() == {0: 2, 1: 2}
        c = made[0]
        assert c.assigned == [
            ("tailguard.control", 0, OFFSET_BEGINNING),
            ("tailguard.control", 1, OFFSET_BEGINNING),
        ]
        assert client.directive("m").level == 2
        counters = client.counters()
        assert counters["accepted"] == 2
        assert counters["tombstones"] == 1
        assert counters["malformed"] == 1
        assert counters["consumer_errors"] == 1
        assert counters["messages"] == 4
        clock.ms = T0 + 60_000
        assert client.directive("m") == NORMAL  # expired: fail open
    finally:
        client.stop()
    assert made[0].closed
    assert not client.running


def test_client_config_defaults_and_overrides() -> None:
    seen: list[dict[str, Any]] = []

    def factory(conf: dict[str, Any]) -> FakeConsumer:
        seen.append(conf)
        return FakeConsumer(conf)

    a = ControlClient({"bootstrap.servers": "b:1"}, "t", KR, consumer_factory=factory)
    b = ControlClient({"bootstrap.servers": "b:1"}, "t", KR, consumer_factory=factory)
    c = ControlClient(
        {"bootstrap.servers": "b:1", "group.id": "mine", "sasl.password": "s3cret"},
        "t",
        KR,
        consumer_factory=factory,
    )
    for client in (a, b, c):
        client.start()
        client.stop()
    assert seen[0]["group.id"].startswith("tailguard-control-")
    assert seen[0]["group.id"] != seen[1]["group.id"]
    assert seen[0]["enable.auto.commit"] is False
    assert seen[0]["enable.partition.eof"] is True
    assert seen[0]["auto.offset.reset"] == "earliest"
    assert seen[2]["group.id"] == "mine"
    assert seen[2]["sasl.password"] == "s3cret"


def test_client_retries_missing_metadata() -> None:
    made: list[FakeConsumer] = []

    def factory(conf: dict[str, Any]) -> FakeConsumer:
        made.append(FakeConsumer(conf, metadata_failures=1))
        return made[-1]

    client = ControlClient({}, "t", KR, consumer_factory=factory)
    client.start()
    try:
        _wait(lambda: bool(made[0].assigned), timeout=10.0)
        assert client.counters()["metadata_errors"] == 1
    finally:
        client.stop()


def test_client_never_raises_into_the_request_path() -> None:
    class Broken(DirectiveStore):
        def current(self, scope: str, now_ms: int) -> Directive:
            raise RuntimeError("boom")

    client = ControlClient({}, "t", store=Broken(KR))
    assert client.directive("m") == NORMAL
    assert client.counters()["errors"] == 1
    bad_clock = ControlClient({}, "t", KR, clock=lambda: float("nan"))
    assert bad_clock.directive("m") == NORMAL


def test_client_apply_raw_and_requires_keys() -> None:
    client = ControlClient({}, "t", KR, Clock(T0))
    res = client.apply_raw(encode(_issuer().issue("*", _decision(1), T0)))
    assert isinstance(res, Accepted)
    assert client.directive("any-model").level == 1
    with pytest.raises(ValueError, match="keyring"):
        ControlClient({}, "t")


def test_client_start_twice_raises() -> None:
    client = ControlClient({}, "t", KR, consumer_factory=FakeConsumer)
    client.start()
    try:
        with pytest.raises(RuntimeError):
            client.start()
    finally:
        client.stop()


# --------------------------------------------------------------------------- middleware


@dataclass
class Result:
    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    app_scope: Scope | None = None
    app_calls: int = 0


def _http_scope(headers: dict[str, str] | None = None, path: str = "/v1/completions") -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }


def _call(mw_factory: Callable[[Any], ControlMiddleware], scope: Scope) -> Result:
    result = Result()

    async def app(s: Scope, receive: Any, send: Any) -> None:
        result.app_calls += 1
        result.app_scope = s
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg: Any) -> None:
        if msg["type"] == "http.response.start":
            result.status = msg["status"]
            result.headers = dict(msg["headers"])
        else:
            result.body += msg.get("body", b"")

    asyncio.run(mw_factory(app)(scope, receive, send))
    return result


def _directive(level: int, phase: str | None = None, **actions: Any) -> Directive:
    return Directive(
        level=level,
        phase=phase or ("normal" if level == 0 else "degraded"),  # type: ignore[arg-type]
        actions=Actions(**actions),
        scope="m",
    )


def _mw(d: Directive, seen: list[str] | None = None) -> Callable[[Any], ControlMiddleware]:
    def directives(scope: str) -> Directive:
        if seen is not None:
            seen.append(scope)
        return d

    return lambda app: ControlMiddleware(app, directives)


SHED: dict[str, Any] = {"shed_priorities_at_or_above": 2, "retry_after_s": 17}


@pytest.mark.parametrize(
    ("directive", "headers", "status"),
    [
        (_directive(1, **SHED), {"x-vllm-priority": "2", "x-tailguard-session": "s"}, 429),
        (_directive(1, **SHED), {"x-vllm-priority": "3", "x-tailguard-session": "s"}, 429),
        (_directive(1, **SHED), {"x-vllm-priority": "1", "x-tailguard-session": "s"}, 200),
        # no (or no integer) priority: the default tier 2, as the gateway records it
        (_directive(1, **SHED), {"x-tailguard-session": "s"}, 429),
        (_directive(1, **SHED), {"x-vllm-priority": "high", "x-tailguard-session": "s"}, 429),
        (_directive(1, shed_priorities_at_or_above=3), {"x-tailguard-session": "s"}, 200),
        (_directive(1, shed_priorities_at_or_above=0), {"x-tailguard-session": "s"}, 429),
        (_directive(1, reject_new_sessions=True), {"x-vllm-priority": "1"}, 429),
        (_directive(1, reject_new_sessions=True), {"x-vllm-priority": "3"}, 429),
        # priority 0 (real-time) keeps opening sessions; the default tier does not
        (_directive(1, reject_new_sessions=True), {"x-vllm-priority": "0"}, 200),
        (_directive(1, reject_new_sessions=True), {}, 429),
        (
            _directive(3, shed_priorities_at_or_above=1, reject_new_sessions=True),
            {"x-vllm-priority": "0"},
            200,
        ),
        (
            _directive(1, reject_new_sessions=True),
            {"x-vllm-priority": "2", "x-tailguard-session": "abc"},
            200,
        ),
        (_directive(1), {"x-vllm-priority": "3"}, 200),  # no action named
        (_directive(0, **SHED, reject_new_sessions=True), {"x-vllm-priority": "3"}, 200),
    ],
)
def test_middleware_shedding_table(
    directive: Directive, headers: dict[str, str], status: int
) -> None:
    r = _call(_mw(directive), _http_scope(headers))
    assert r.status == status
    if status == 429:
        assert r.app_calls == 0
        # spread over the last half of the directive's Retry-After (enforcement.py)
        full = directive.actions.retry_after_s
        assert -(-full // 2) <= int(r.headers[b"retry-after"]) <= full
        body = orjson.loads(r.body)
        assert body["error"] == "overloaded"
        assert body["level"] == directive.level
        assert body["reason"] in ("shed_priority", "new_session")
        assert r.headers[b"content-type"] == b"application/json"
        assert int(r.headers[b"content-length"]) == len(r.body)
    else:
        assert r.app_calls == 1
        assert r.body == b"ok"


def test_middleware_shed_body_and_counters() -> None:
    mws: list[ControlMiddleware] = []

    def factory(app: Any) -> ControlMiddleware:
        mws.append(ControlMiddleware(app, lambda _s: _directive(2, **SHED)))
        return mws[-1]

    r = _call(factory, _http_scope({"x-vllm-priority": "2"}))
    assert r.status == 429
    retry_after = int(r.headers[b"retry-after"])
    assert 9 <= retry_after <= 17  # the directive's 17 s, spread over its last half
    assert orjson.loads(r.body) == overloaded("shed_priority", 2, retry_after)
    assert mws[0].counters["shed_priority"] == 1


def test_middleware_level_0_passes_the_same_scope_untouched() -> None:
    scope = _http_scope({"x-vllm-priority": "3", "x-tailguard-max-context-tokens": "999"})
    before = [tuple(h) for h in scope["headers"]]
    r = _call(_mw(_directive(0)), scope)
    assert r.status == 200
    assert r.app_scope is scope
    assert [tuple(h) for h in scope["headers"]] == before


def test_middleware_injects_context_cap_and_fallback_headers() -> None:
    d = _directive(1, cap_context_tokens=8192, fallback_model="llama-8b")
    scope = _http_scope(
        {
            "x-tailguard-session": "s",
            "x-tailguard-max-context-tokens": "1000000",  # a client cannot override the cap
            "authorization": "Bearer t",
        }
    )
    r = _call(_mw(d), scope)
    assert r.status == 200
    assert r.app_scope is not None
    sent = r.app_scope["headers"]
    assert (b"x-tailguard-max-context-tokens", b"8192") in sent
    assert (b"x-tailguard-fallback-model", b"llama-8b") in sent
    assert [k for k, _ in sent].count(b"x-tailguard-max-context-tokens") == 1
    assert (b"authorization", b"Bearer t") in sent
    assert scope["headers"][1] == (b"x-tailguard-max-context-tokens", b"1000000")  # not mutated


def test_middleware_looks_up_the_model_or_star() -> None:
    seen: list[str] = []
    _call(_mw(_directive(0), seen), _http_scope({"x-tailguard-model": "llama-70b"}))
    _call(_mw(_directive(0), seen), _http_scope({}))
    _call(_mw(_directive(0), seen), _http_scope({"x-tailguard-model": "  "}))
    assert seen == ["llama-70b", "*", "*"]


def test_middleware_with_a_real_store_end_to_end() -> None:
    client = ControlClient({}, "t", KR, Clock(T0))
    iss = _issuer()
    client.apply_raw(encode(iss.issue("llama", _decision(2, **SHED), T0)))

    def factory(app: Any) -> ControlMiddleware:
        return ControlMiddleware(app, client.directive)

    prio3 = {"x-vllm-priority": "3", "x-tailguard-session": "s"}
    assert _call(factory, _http_scope({"x-tailguard-model": "llama", **prio3})).status == 429
    assert _call(factory, _http_scope({"x-tailguard-model": "other", **prio3})).status == 200


HALF: dict[str, Any] = {
    "shed_priorities_at_or_above": 1,
    "admit_fraction": 0.25,
    "retry_after_s": 3,
}


def test_half_open_admits_a_deterministic_fraction_by_request_id() -> None:
    d = _directive(1, "half_open", **HALF)

    def statuses() -> list[int | None]:
        return [
            _call(_mw(d), _http_scope({"x-vllm-priority": "2", "x-request-id": f"req-{i}"})).status
            for i in range(2000)
        ]

    first = statuses()
    admitted = first.count(200)
    assert first.count(200) + first.count(429) == 2000
    assert 0.21 * 2000 < admitted < 0.29 * 2000
    assert statuses() == first  # deterministic
    assert [hash_admits(f"req-{i}", 0.25) for i in range(2000)] == [s == 200 for s in first]


def test_half_open_without_request_ids_admits_exactly_the_fraction() -> None:
    d = _directive(1, "half_open", **HALF)
    mw: list[ControlMiddleware] = []

    def factory(app: Any) -> ControlMiddleware:
        if not mw:
            mw.append(ControlMiddleware(app, lambda _s: d))
        mw[0].app = app
        return mw[0]

    statuses = [_call(factory, _http_scope({"x-vllm-priority": "3"})).status for _ in range(100)]
    assert statuses.count(200) == 25
    assert mw[0].counters["half_open_admitted"] == 25
    assert mw[0].counters["shed_priority"] == 75
    # priority 0 is not shed at all in this directive and does not use up admissions
    assert _call(factory, _http_scope({"x-vllm-priority": "0"})).status == 200


@pytest.mark.parametrize(("fraction", "admitted"), [(0.0, 0), (1.0, 50), (0.1, 5), (0.5, 25)])
def test_spread_admits_exactly(fraction: float, admitted: int) -> None:
    assert sum(spread_admits(k, fraction) for k in range(50)) == admitted


def test_half_open_applies_to_new_session_rejection_and_degraded_does_not_admit() -> None:
    half = _directive(1, "half_open", reject_new_sessions=True, admit_fraction=1.0)
    assert _call(_mw(half), _http_scope({"x-vllm-priority": "2"})).status == 200
    degraded = _directive(1, reject_new_sessions=True)
    scope = _http_scope({"x-request-id": "r", "x-vllm-priority": "2"})
    assert _call(_mw(degraded), scope).status == 429


def test_middleware_exception_passes_through_and_counts() -> None:
    mws: list[ControlMiddleware] = []

    def boom(_s: str) -> Directive:
        raise RuntimeError("control broke")

    def factory(app: Any) -> ControlMiddleware:
        mws.append(ControlMiddleware(app, boom))
        return mws[-1]

    scope = _http_scope({"x-vllm-priority": "3"})
    r = _call(factory, scope)
    assert (r.status, r.body, r.app_calls) == (200, b"ok", 1)
    assert r.app_scope is scope
    assert mws[0].counters["errors"] == 1

    def bad_model_of(_s: Scope) -> str | None:
        raise ValueError("bad header")

    r = _call(
        lambda app: ControlMiddleware(app, lambda _s: _directive(3, **SHED), bad_model_of),
        _http_scope({"x-vllm-priority": "3"}),
    )
    assert (r.status, r.app_calls) == (200, 1)


def test_app_exceptions_propagate_and_the_app_runs_once() -> None:
    calls = 0

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal calls
        calls += 1
        raise KeyError("app bug")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    async def send(msg: Any) -> None:
        return None

    mw = ControlMiddleware(app, lambda _s: _directive(1, cap_context_tokens=10))
    with pytest.raises(KeyError):
        asyncio.run(mw(_http_scope(), receive, send))
    assert calls == 1
    assert mw.counters["errors"] == 0


def test_non_http_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def receive() -> dict[str, Any]:
        return {}

    async def send(msg: Any) -> None:
        return None

    def never(_s: str) -> Directive:
        raise AssertionError("must not be asked")

    mw = ControlMiddleware(app, never)
    asyncio.run(mw({"type": "lifespan"}, receive, send))
    asyncio.run(mw({"type": "websocket", "headers": []}, receive, send))
    assert seen == ["lifespan", "websocket"]


def test_middleware_admission_per_scope_split_over_gateways_and_counted() -> None:
    """admit_rps 6 over 3 gateways: this instance admits 2 rps, per directive scope; the
    rejection is a 429 whose Retry-After follows the bucket; priority 0 always passes."""
    now_ms = [0.0]
    by_scope = {
        "m": _directive(1, admit_rps=6.0, admit_gateways=3, retry_after_s=9),
        "*": Directive(level=1, phase="degraded", actions=Actions(admit_rps=1.0), scope="*"),
    }
    mw = ControlMiddleware(
        lambda *_a: None,  # replaced per call below
        lambda scope: by_scope[scope],
        clock_ms=lambda: now_ms[0],
    )

    def factory(app: Any) -> ControlMiddleware:
        mw.app = app
        return mw

    def status(priority: int, model: str | None = "m") -> int | None:
        headers = {"x-vllm-priority": str(priority)}
        if model is not None:
            headers["x-tailguard-model"] = model
        return _call(factory, _http_scope(headers)).status

    burst = int(MIN_BURST_TOKENS)  # a bucket's first tokens (2 rps holds no more)
    assert [status(3) for _ in range(burst + 1)] == [200] * burst + [429]
    assert [status(0) for _ in range(3)] == [200] * 3  # never evicted
    # "*": its own bucket
    assert [status(3, model=None) for _ in range(burst + 1)] == [200] * burst + [429]
    r = _call(factory, _http_scope({"x-vllm-priority": "2", "x-tailguard-model": "m"}))
    assert r.status == 429
    assert r.headers[b"retry-after"] == b"1"  # 2 rps: a token in 0.5 s, not 9 s
    assert orjson.loads(r.body) == overloaded("admission", 1, 1)
    now_ms[0] = 500.0
    assert status(3) == 200  # refilled
    assert mw.counters["admission"] == 3
    assert mw.counters["passed"] == 2 * burst + 3 + 1
