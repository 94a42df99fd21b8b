"""A correctly signed signal with a 365-day expiry on the real control topic is enforced
for ``max_ttl`` only: by a client that read it while it ran, and by clients started later
that read it from the compacted topic (time passed in: the clients' clocks)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pipeline.contract.control_signal import (
    DEFAULT_MAX_TTL_MS,
    Decision,
    Keyring,
    UnsignedSignal,
    encode,
    message_key,
    sign,
)
from producers.control_client import NORMAL, ControlClient
from tests.integration.harness import make_settings

pytestmark = pytest.mark.integration

KR = Keyring({"k1": b"k" * 32}, "k1")
YEAR_MS = 365 * 86_400_000


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def test_a_365_day_signal_on_the_topic_lives_max_ttl(kafka, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    issued = int(time.time() * 1000)
    decision = Decision(level=3, phase="degraded")
    unsigned = UnsignedSignal.model_validate(
        {**decision.model_dump(), "scope": "m", "seq": 1,
         "issued_at_unix_ms": issued, "expires_at_unix_ms": issued + YEAR_MS}
    )  # fmt: skip
    signal = sign(unsigned, KR, max_ttl_ms=YEAR_MS)  # an issuer configured for a year
    producer = Producer({"bootstrap.servers": s.bootstrap_servers})
    producer.produce(s.control_topic, encode(signal), key=message_key(signal))
    assert producer.flush(30) == 0

    def client(now_ms: int) -> tuple[ControlClient, Clock]:
        clock = Clock(now_ms)
        c = ControlClient({"bootstrap.servers": s.bootstrap_servers}, s.control_topic, KR, clock)
        c.start()
        assert c.wait_caught_up(30)
        return c, clock

    running, clock = client(issued + 1)
    try:
        assert running.directive("m").level == 3
        assert running.counters()["clamped"] == 1
        clock.ms = issued + DEFAULT_MAX_TTL_MS - 1
        assert running.directive("m").level == 3
        clock.ms = issued + DEFAULT_MAX_TTL_MS  # the year it claims is not waited for
        assert running.directive("m") == NORMAL
        assert running.counters()["failed_open"] == 1
    finally:
        running.stop()
    later, _ = client(issued + DEFAULT_MAX_TTL_MS - 60_000)  # a fresh client, within the cap
    try:
        assert later.directive("m").level == 3
        assert later.counters()["clamped"] == 1
    finally:
        later.stop()
    fresh, _ = client(issued + DEFAULT_MAX_TTL_MS + 1)  # a fresh client after it
    try:
        assert fresh.directive("m") == NORMAL
        counters = fresh.counters()
        assert (counters["messages"], counters["accepted"], counters["expired"]) == (1, 0, 1)
    finally:
        fresh.stop()
