"""Issue 49 item 1: the lifecycle topic deleted while traffic flows, then created again
(at once, or once the worker has noticed the deletion), and the stream goes on on the new
topic. What the worker had read from the old topic and not yet written out (open
windows, requests waiting for their partner) is finished, not dropped: every request
the broker acknowledged is stored once, and the windows, SLO counts and rollups count
each one once (what ``../shared/tools/store-check`` compares).

Before the fix the state was dropped at the rebalance: the requests of the open windows
stayed in ``requests`` but in no window, and the requests waiting for their partner were
never written.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.adapters.store import open_store
from pipeline.contract.codec import encode_batch
from pipeline.contract.events import Event
from pipeline.contract.partitioning import partition_for
from pipeline.settings import Settings
from tests.ceilings import ceiling
from tests.integration.faults import (
    assert_exactly_once,
    lifecycle_events,
    log_has,
    wait_for,
)
from tests.integration.harness import WorkerProcess, make_settings
from tests.integration.test_fault_topic_cycles import Stream, _stored
from tools.dev.fault_checks import rollup_drift

pytestmark = [pytest.mark.integration, pytest.mark.long(90)]

PARTITIONS = 2
REQUESTS_PER_MESSAGE = 4  # ~100 messages/s (the Stream's pace): ~400 requests/s
SPLIT_EVERY = 5  # every 5th request: its engine events in a message of their own ...
PARTNER_LAG = 40  # ... this many messages (~0.4 s) later: it waits for its partner
NO_PARTNER_EVERY = 4  # and every 4th of those has no engine side at all (gateway-only)
FIRST_S = 8.0  # the stream's time on the first topic
SECOND_S = 4.0  # and on the new one
MESSAGE_INTERVAL_S = 0.01  # the Stream's pace
WINDOW_MS, GRACE_MS = 2000, 1000  # short windows: some close before the deletion


def _live(events: list[Event], start_ns: int, span_s: float) -> list[Event]:
    """``events`` with their times moved and squeezed into ``span_s`` from ``start_ns``:
    sent at the Stream's pace, their event time runs with the wall clock, as live
    traffic's does (the windows open at the deletion are the last seconds')."""
    lo = min(ev.ts_unix_ns for ev in events)
    hi = max(ev.ts_unix_ns for ev in events)
    k = span_s * 1e9 / max(hi - lo, 1)

    def at(ns: int) -> int:
        return start_ns + int((ns - lo) * k)

    out = []
    for ev in events:
        update = {"ts_unix_ns": at(ev.ts_unix_ns)}
        for name in ("arrival_unix_ns", "cold_start_unix_ns"):
            v = getattr(ev, name, None)
            if v is not None:
                update[name] = at(v)
        out.append(ev.model_copy(update=update))
    return out


def _messages(events: list[Event]) -> list[tuple[int, list[str], bytes]]:
    """(partition, request ids, value) in time order: whole requests per message, except
    that every ``SPLIT_EVERY``-th request's engine events come ``PARTNER_LAG`` messages
    after its gateway events, or never (so some wait for their partner when the topic
    goes; those are named with the gateway message: that is when the broker acknowledged
    the request)."""
    by_request: dict[str, list[Event]] = defaultdict(list)
    for ev in events:
        by_request[ev.request_id].append(ev)
    open_: dict[int, list[Event]] = defaultdict(list)
    ids: dict[int, list[str]] = defaultdict(list)
    later: dict[int, list[tuple[int, Event]]] = defaultdict(list)  # due message -> events
    out: list[tuple[int, list[str], bytes]] = []
    for i, (rid, evs) in enumerate(by_request.items()):
        p = partition_for(rid, PARTITIONS)
        if i % SPLIT_EVERY == 0:
            open_[p].extend(e for e in evs if e.kind.startswith("gateway."))
            if i % (SPLIT_EVERY * NO_PARTNER_EVERY):  # (else no engine side: a partial)
                for e in evs:
                    if not e.kind.startswith("gateway."):
                        later[len(out) + PARTNER_LAG].append((p, e))
        else:
            open_[p].extend(evs)
        ids[p].append(rid)
        if len(ids[p]) == REQUESTS_PER_MESSAGE:
            out.append((p, ids.pop(p), encode_batch(open_.pop(p))))
            for q, e in later.pop(len(out) - 1, []):
                out.append((q, [], encode_batch([e])))
    for due in sorted(later):
        for q, e in later[due]:
            out.append((q, [], encode_batch([e])))
    return out


def _boundaries_differ(s: Settings) -> dict[str, tuple[int, int]]:
    """store-check's first part: per boundary, the all-traffic window count against the
    requests with a value for it (``requests`` FINAL), where they differ."""
    store = open_store(s)
    try:
        db, out = s.database, {}
        for (b,) in store.query_rows(
            f"SELECT DISTINCT boundary FROM {db}.window_sketches WHERE boundary != '__slo__'"
        ):
            w = store.query_rows(
                f"SELECT sum(count) FROM {db}.window_sketches WHERE boundary = '{b}' "
                "AND model = '*' AND priority = '*' AND ctx_bucket = '*'"
            )[0][0]
            r = store.query_rows(f"SELECT count({b}) FROM {db}.requests FINAL")[0][0]
            if int(w or 0) != int(r):
                out[b] = (int(w or 0), int(r))
        drift = rollup_drift(store)
        out.update({k: (v[0], v[-1]) for k, v in drift.items()})
        return out
    finally:
        store.close()


def _delete(a: AdminClient, topic: str) -> None:
    a.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)
    wait_for(lambda: topic not in a.list_topics(timeout=10).topics, "the deletion", 30, 0.02)


def _create(a: AdminClient, topic: str) -> None:
    deadline = time.monotonic() + ceiling(30)
    while True:  # the broker may still be removing the old one
        try:
            new = NewTopic(topic, PARTITIONS, 1)
            a.create_topics([new], operation_timeout=30)[topic].result(timeout=30)
            break
        except KafkaException:
            assert time.monotonic() < deadline, "the topic could not be created again"
            time.sleep(0.05)

    def ready() -> bool:
        t = a.list_topics(timeout=10).topics.get(topic)
        return t is not None and len(t.partitions or {}) == PARTITIONS

    wait_for(ready, "the new topic's partitions", 30, 0.02)


@pytest.mark.parametrize("noticed_first", [False, True], ids=["at-once", "after-noticed"])
def test_a_topic_deleted_midstream_loses_nothing_read(
    kafka, tmp_path: Path, noticed_first: bool
) -> None:
    s = make_settings(
        kafka.bootstrap_servers,
        tmp_path,
        topic_partitions=PARTITIONS,
        topic_check_interval_ms=500,
        window_size_ms=WINDOW_MS,
        window_grace_ms=GRACE_MS,
    )
    n = int((FIRST_S + SECOND_S) / MESSAGE_INTERVAL_S * REQUESTS_PER_MESSAGE)
    events = lifecycle_events(n, seed=49)
    span_s = len(_messages(events)) * MESSAGE_INTERVAL_S
    messages = _messages(_live(events, time.time_ns() + 2 * 10**9, span_s))
    first = int(len(messages) * FIRST_S / (FIRST_S + SECOND_S))
    stream = Stream(s, messages)
    a = AdminClient(s.kafka_config())
    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        # The worker reads the first topic as it comes, and the topic goes while it
        # holds open windows and requests waiting for their partner.
        stream.running.set()
        wait_for(lambda: stream.sent >= first, "the first topic's stream", 60, 0.02)
        stream.hold()
        on_old = set(stream.delivered)
        # (most of it written: the worker keeps up; the rest waits in open state)
        wait_for(lambda: len(_stored(s)) >= 0.8 * len(on_old), "the worker reading", 60, 0.05)
        _delete(a, s.lifecycle_topic)
        if noticed_first:
            wait_for(lambda: log_has(worker, "was deleted:"), "the worker noticing", 60)
        _create(a, s.lifecycle_topic)
        t0 = time.monotonic()
        stream.running.set()
        wait_for(lambda: stream.sent >= len(messages), "the new topic's stream", 60, 0.02)
        stream.hold()
        want = set(stream.delivered)
        worker.wait_caught_up(120)  # every window of the new topic closed and written
        took = time.monotonic() - t0
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()
        stream.close()
    log_text = worker.log_path.read_text(errors="replace")
    finished = re.findall(r"finished from topic \S+'s generation \S+: (.*)", log_text)
    store = open_store(s)
    try:
        corrections = store.query_rows(
            f"SELECT count() FROM {s.database}.window_sketches "
            "WHERE boundary = '__slo__' AND correction = 1"
        )[0][0]
    finally:
        store.close()
    print(
        f"{len(on_old)} requests acknowledged on the old topic, {len(want)} in all; "
        f"caught up {took:.1f}s after the recreation; finished: {finished}; "
        f"{corrections} corrections"
    )
    assert stream.failed == 0
    assert finished, log_text[-3000:]
    # Acknowledged on the old topic past where the worker's reading stopped (its log's
    # "read up to offsets"): deleted before anyone read them, as Kafka loses a deleted
    # topic's messages; a busy machine's worker may be a few messages behind at the
    # deletion. Everything read is stored once; what was never read is a short tail.
    # The old topic's reading is where its first finish says, partition by partition: a
    # state built after it from the new topic's messages (fetched at the old positions
    # before the worker moved to the new topic) may be finished too, and says where
    # that reading stood (a clean-clone CI run, session 36).
    read_to: dict[str, int] = {}  # partition -> the first offset not read
    for line in finished:
        for p, offset in json.loads(line.split("read up to offsets ")[1]).items():
            read_to.setdefault(p, offset)

    def never_read_at(p: int, offset: int) -> bool:
        return offset >= read_to.get(str(p), math.inf)

    never_read = {r for r in on_old if never_read_at(*stream.acked_at[r])}
    print(f"acknowledged on the old topic, never read: {len(never_read)} {sorted(never_read)[:8]}")
    assert len(never_read) <= 0.05 * len(on_old), "the worker was far behind at the deletion"
    assert_exactly_once(s, want - never_read)
    assert not _boundaries_differ(s)
    assert "partitions []" not in log_text
