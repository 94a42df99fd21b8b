"""Issue 11 on the real broker: live traffic made messy on purpose, a restart, a second
worker joining and leaving; the store equals an exact count over `requests` throughout.

Disorder: one request stamped an hour ahead and one a year ahead, one gateway 5 minutes
slow and one 30 s fast, 1 % duplicates at random positions, 3 % of partners up to the
join timeout apart, one engine's producer holding its events 60 s (event time).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson
import pytest

from pipeline.adapters.store import open_store
from pipeline.contract.codec import event_to_dict
from pipeline.contract.partitioning import partition_for
from pipeline.settings import EXAMPLE_SLO_SPEC, Settings
from pipeline.spec.slo import load_spec_file
from tests.ceilings import ceiling
from tests.disorder import (
    HOUR_NS,
    YEAR_NS,
    delay,
    duplicate,
    merge_stores,
    skew_host,
    stamp_request,
    store_mismatches,
)
from tests.integration.faults import after, flush, lifecycle_events, producer, send
from tests.integration.harness import WorkerProcess, caught_up_worker, make_settings, read_all
from tests.measurement_fixtures import START_NS

pytestmark = [pytest.mark.integration, pytest.mark.long(150)]
SPEC = load_spec_file(EXAMPLE_SLO_SPEC)  # the spec the harness's workers evaluate


def _messy(n: int, seed: int, start_ns: int, prefix: str) -> tuple[list[dict], set[str]]:
    """Simulated requests made messy (see the module doc); returns the events in the order
    they reach the broker and the ids of the two requests stamped ahead."""
    evs = [
        event_to_dict(e) for e in lifecycle_events(n, seed=seed, prefix=prefix, start_ns=start_ns)
    ]
    rids = sorted({e["request_id"] for e in evs})
    ahead = {rids[n // 3], rids[n // 2]}
    evs = delay(evs, lambda e: e["kind"] == "engine.finished" and hash(e["request_id"]) % 33 == 0,
                1_900)  # fmt: skip  # partners up to the (test) join timeout apart
    evs = delay(evs, lambda e: e["host"].endswith("8b-1"), 60_000)  # a producer holding 60 s
    evs = stamp_request(evs, rids[n // 3], HOUR_NS)
    evs = stamp_request(evs, rids[n // 2], YEAR_NS)
    hosts = sorted({e["host"] for e in evs if e["kind"].startswith("gateway")})
    evs = skew_host(evs, hosts[0], -300_000)
    evs = skew_host(evs, hosts[1], 30_000)
    return duplicate(evs, 0.01, seed=seed), ahead


def _produce(s: Settings, events: list[dict], per_message: int = 50) -> None:
    """Batched like the producers (per partition, in order), as JSON arrays."""
    prod = producer(s)
    open_: dict[int, list[dict]] = {}
    for e in events:
        p = partition_for(e["request_id"], s.topic_partitions)
        buf = open_.setdefault(p, [])
        buf.append(e)
        if len(buf) >= per_message:
            send(prod, s.lifecycle_topic, p, orjson.dumps(buf))
            open_[p] = []
    for p, buf in open_.items():
        if buf:
            send(prod, s.lifecycle_topic, p, orjson.dumps(buf))
    flush(prod)


def _check(s: Settings, expect_requests: int) -> None:
    store = open_store(s)
    try:
        assert store_mismatches(store, SPEC) == []
        n = store.query_rows(f"SELECT count() FROM {s.database}.requests FINAL")[0][0]
        assert n == expect_requests
    finally:
        store.close()


def test_messy_live_traffic_then_restart(kafka, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path, join_timeout_ms=2000)
    first, ahead1 = _messy(2000, seed=21, start_ns=START_NS, prefix="a-")
    with caught_up_worker(s, tmp_path / "w1.log", timeout_s=180):
        _produce(s, first)
    _check(s, 2000 - len(ahead1))
    dead = read_all(s, s.dlq_topic)
    reasons = {dict(m.headers())["tailguard.reason"].decode() for m in dead}
    assert any(r.startswith("ts_out_of_range") for r in reasons), reasons
    assert len(dead) == 6  # the two requests stamped ahead, three events each

    # A restart, then more traffic (later, same disorder): nothing is blind, nothing twice.
    start2 = after(list(lifecycle_events(1, seed=21, prefix="x-")), gap_s=600)
    second, ahead2 = _messy(1500, seed=22, start_ns=start2, prefix="b-")
    with caught_up_worker(s, tmp_path / "w2.log", timeout_s=180):
        _produce(s, second)
    _check(s, 2000 + 1500 - len(ahead1) - len(ahead2))
    store = open_store(s)
    try:
        # windows of the second stretch were counted as they closed, not as corrections
        finals, corrected = store.query_rows(
            "SELECT sumIf(records, correction = 0), sumIf(records, correction = 1) "
            f"FROM {s.database}.window_sketches WHERE boundary = '__slo__' "
            "AND window_start >= fromUnixTimestamp64Nano({t:Int64})",
            {"t": start2},
        )[0]
        assert finals > 0.9 * (1500 - 2)
        assert corrected < 0.1 * finals
    finally:
        store.close()


def test_a_second_worker_joins_and_leaves_mid_window(kafka, tmp_path: Path) -> None:
    """Worker A runs; B joins while traffic flows (rebalance: partitions move to B
    mid-window), then B leaves with SIGTERM (they move back). Each has its own embedded
    store (chDB: one process per store); the ledger topic tells a worker what the other
    counted, so the union of both stores equals the exact count."""
    # inflight TTL 30 s: a duplicate gateway.received re-read after a takeover, of a request
    # the other worker completed, waits that long alone (and holds the commit back)
    s = make_settings(kafka.bootstrap_servers, tmp_path, join_timeout_ms=2000,
                      inflight_ttl_ms=30_000)  # fmt: skip
    sb = s.model_copy(update={"store_dir": tmp_path / "b" / "store"})
    events, ahead = _messy(3000, seed=31, start_ns=START_NS, prefix="c-")
    third = len(events) // 3
    with caught_up_worker(s, tmp_path / "a.log", timeout_s=180) as a:
        _produce(s, events[:third])
        _wait_log(a, "resuming at offset")
        b = WorkerProcess(sb, tmp_path / "b.log")
        try:
            _wait_log(b, "resuming at offset")  # B holds partitions: the group rebalanced
            _produce(s, events[third : 2 * third])
            _wait_log(b, "records=", after="resuming at offset")
        finally:
            assert b.stop(sig=signal.SIGTERM) == 0  # B leaves: A takes its partitions back
        _produce(s, events[2 * third :])
    union = tmp_path / "union"
    merge_stores([s, sb], union)
    _check(s.model_copy(update={"store_dir": union}), 3000 - len(ahead))


def _wait_log(w: WorkerProcess, text: str, after: str | None = None, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + ceiling(timeout_s)
    while True:
        log = w.log_tail(1_000_000)
        if after is not None:
            log = log[log.find(after) :] if after in log else ""
        if text in log:
            return
        assert w.alive(), w.log_tail()
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{w.log_tail()}"
        time.sleep(0.2)
