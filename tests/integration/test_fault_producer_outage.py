"""Issue 12 item 5: a broker outage at 1,000 requests/s loses nothing at the gateway producer
(the shipped settings: nothing expires in librdkafka's queue, a full queue holds the batch in
hand, the bounded buffer alone decides drops), and every event is on the topic once the
broker is back (counted against the producer's own list).

The outage lasts ``OUTAGE_S`` (30 s; ``TAILGUARD_TEST_OUTAGE_S`` sets it, 180 for the 3
minutes of issue 12, measured at 186 s in docs/reliability.md). What makes 30 s equivalent to
3 minutes: a waiting event is lost only by a timer, and this outage outlasts every timer of
the producer several times over. ``message.timeout.ms`` is 0 (shipped: never expires);
librdkafka's request timers, 30 s (``request.timeout.ms``) and 60 s (``socket.timeout.ms``)
by default, are set here to 5 s and 10 s (``SHORT_TIMERS``), so each fires during the
outage as it would during 3 minutes; the reconnect backoff reaches its 2 s cap
(``reconnect.backoff.max.ms``, shipped) and the sink's metadata retry (1 s) repeats. The
metadata refresh (``topic.metadata.refresh.interval.ms``, 5 min) is longer than 3 minutes
too, so it fired in neither. Memory is not the equivalence: at 2,000 events/s the 256 MiB
queue holds ~8 minutes (docs/measurement.md), so it fills in neither outage.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import orjson
import pytest

from producers.emit import open_kafka_sink
from tests.factories import completed, received
from tests.integration.faults import rss_bytes, wait_for
from tests.integration.harness import make_settings, read_all

pytestmark = [pytest.mark.integration, pytest.mark.private_broker, pytest.mark.long(65)]

RATE = 1_000  # gateway requests/s: 2,000 events/s (received + completed)
BEFORE_S = 5.0
OUTAGE_S = float(os.environ.get("TAILGUARD_TEST_OUTAGE_S", "30"))
AFTER_S = 5.0
# librdkafka's request timers, shortened so that each fires during the outage (docstring)
SHORT_TIMERS = {"request.timeout.ms": 5_000, "socket.timeout.ms": 10_000}


def test_a_broker_outage_longer_than_every_producer_timer_at_1000_requests_per_s_loses_nothing(
    kafka, tmp_path: Path
) -> None:
    if not kafka.can_restart:
        pytest.skip("needs the local broker (stopped and started by the test)")
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    sink = open_kafka_sink(s, service="gateway", extra_config=SHORT_TIMERS)  # else shipped
    wait_for(lambda: sink.partitions_known, "the partition counts", 30)
    phase = {"down_at": 0.0, "up_at": 0.0}
    errors: list[BaseException] = []

    def outage() -> None:
        try:
            kafka.local.stop()
            phase["down_at"] = time.monotonic()
            time.sleep(OUTAGE_S)  # the outage itself, not synchronisation
            kafka.local.start()
            phase["up_at"] = time.monotonic()
        except BaseException as exc:
            errors.append(exc)

    rss0 = rss_bytes(os.getpid())
    peak_queue = peak_rss = 0
    n = 0
    t0 = time.monotonic()
    breaker = threading.Thread(target=outage, name="outage", daemon=True)
    while True:
        now = time.monotonic()
        if not breaker.is_alive() and phase["up_at"] == 0.0 and now - t0 >= BEFORE_S:
            breaker.start()
        if phase["up_at"] and now - phase["up_at"] >= AFTER_S:
            break
        assert not errors, errors
        due = int((now - t0) * RATE)
        while n < due:  # each request: arrival, then completion 120 ms later (gateway clock)
            rid = f"o-{n}"
            t_ms = n * 1000 / RATE
            sink.emit(received(rid, t_ms, eid=f"{rid}:r"))
            sink.emit(completed(rid, t_ms + 120, eid=f"{rid}:c"))
            n += 1
        if n % 2000 < 10:
            peak_queue = max(peak_queue, len(sink._producer))
            peak_rss = max(peak_rss, rss_bytes(os.getpid()))
        time.sleep(0.005)  # pacing
        assert time.monotonic() - t0 < BEFORE_S + OUTAGE_S + 120, "broker did not come back"
    down_s = phase["up_at"] - phase["down_at"]
    left = sink.flush(timeout_s=120)
    c = sink.counters
    sink.close(timeout_s=10)
    max_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{n} requests ({2 * n} events) at {RATE}/s; broker down {down_s:.0f}s; "
        f"peak librdkafka queue {peak_queue} messages; process RSS +"
        f"{(peak_rss - rss0) / 2**20:.0f} MiB (max RSS {max_rss_mib:.0f} MiB); "
        f"sent {c.events_sent}, dropped {c.events_dropped}, failed {c.events_failed}"
    )
    longest_timer_s = max(SHORT_TIMERS.values()) / 1000
    assert down_s >= OUTAGE_S > 2 * longest_timer_s, (down_s, OUTAGE_S, longest_timer_s)
    assert left == 0
    assert (c.events_dropped, c.events_failed, c.events_sent) == (0, 0, 2 * n)

    seen: set[str] = set()
    for msg in read_all(s, s.lifecycle_topic, timeout_s=120):
        doc = orjson.loads(msg.value())
        # A message is an array of events, or one event alone (producers/emit.py sends a
        # batch of one as the bare object: on a loaded machine the 50 ms flush can find one).
        for ev in doc if isinstance(doc, list) else [doc]:
            seen.add(ev["event_id"])
    expected = {f"o-{i}:{k}" for i in range(n) for k in "rc"}
    assert seen == expected, f"{len(expected - seen)} events missing"
