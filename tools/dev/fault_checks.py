"""What the fault tests and the chaos run (``./tg bench --only chaos``) check, in one place.

* :func:`exactly_once` — per expected request id: lost, extra, twice in ``requests``, and
  the window totals (``__slo__`` rows, a window written twice, the rollups' totals);
* :func:`boundary_counts` — per boundary, the all-traffic window count against the
  requests that have the value, and the rollups (what ``../shared/tools/store-check``
  prints, check 1);
* :func:`rollup_drift` — where a rollup differs from its source (store-check, check 2);
* :func:`read_all`, :func:`dead_letters` — every message of a topic, the DLQ's letters.

The store functions take an open store (one process per data directory: open it after
the worker stopped). ``python -m tools.dev.fault_checks STORE_DIR --ids FILE`` prints
all three checks as JSON (the chaos run calls it in a subprocess, chDB holding one data
directory per process), with ``missing_read``: the missing requests whose raw events
the store holds (the worker read them, and wrote no record), and ``missing_read_kinds``:
how many of those by the kinds of their events stored (``gateway.received`` alone: the
join drops a lone received, as at its TTL).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from pipeline.adapters.store import Store
from pipeline.settings import Settings

ALL = "model = '*' AND priority = '*' AND ctx_bucket = '*'"


def exactly_once(store: Store, request_ids: set[str], slo: str | None = None) -> dict[str, Any]:
    """How ``requests`` and the window totals compare with ``request_ids`` (the requests
    that should be stored, each once): ids ``missing``, ``extra`` and ``twice`` (lists), the
    ``__slo__`` rows' sum of records (``window_total``), ``windows`` / ``windows_distinct``
    (equal unless a window was written twice), ``latency_1m_total`` (all traffic, boundary
    ``gateway_total_ms``) and, when ``slo`` is given, that SLO's ``slo_1m_total``."""
    db = store.database
    rows = store.query_rows(f"SELECT request_id, count() FROM {db}.requests FINAL GROUP BY 1")
    got: dict[str, int] = {str(r): int(c) for r, c in rows}
    total, windows, distinct = store.query_rows(
        "SELECT sum(records), countIf(correction = 0), "
        "uniqExactIf((partition, window_start), correction = 0) "
        f"FROM {db}.window_sketches WHERE boundary = '__slo__'"
    )[0]
    mv_total = store.query_rows(
        f"SELECT sum(records) FROM {db}.latency_1m "
        "WHERE model = '*' AND boundary = 'gateway_total_ms'"
    )[0][0]
    out: dict[str, Any] = {
        "expected": len(request_ids),
        "stored": len(got),
        "missing": sorted(request_ids - got.keys()),
        "extra": sorted(got.keys() - request_ids),
        "twice": sorted(rid for rid, c in got.items() if c != 1),
        "window_total": int(total or 0),
        "windows": int(windows or 0),
        "windows_distinct": int(distinct or 0),
        "latency_1m_total": int(mv_total or 0),
    }
    if slo is not None:
        out["slo_1m_total"] = int(
            store.query_rows(
                f"SELECT sum(total) FROM {db}.slo_1m WHERE slo = {{s:String}}", {"s": slo}
            )[0][0]
            or 0
        )
    return out


def boundary_counts(store: Store) -> dict[str, tuple[int, int, int, int]]:
    """Per boundary: (windows, requests, latency_1m, latency_1h) — the all-traffic count of
    the window sketches, the requests (``FINAL``) that have the value, and the two latency
    rollups. Equal on every boundary when every stored request is in exactly one window."""
    db = store.database
    out: dict[str, tuple[int, int, int, int]] = {}
    for (b,) in store.query_rows(
        f"SELECT DISTINCT boundary FROM {db}.window_sketches WHERE boundary != '__slo__' "
        "ORDER BY boundary"
    ):
        where = f"boundary = '{b}' AND {ALL}"
        w, m, h = (
            int(store.query_rows(f"SELECT sum(count) FROM {db}.{t} WHERE {where}")[0][0] or 0)
            for t in ("window_sketches", "latency_1m", "latency_1h")
        )
        r = int(store.query_rows(f"SELECT count({b}) FROM {db}.requests FINAL")[0][0] or 0)
        out[str(b)] = (w, r, m, h)
    return out


def rollup_drift(store: Store) -> dict[str, tuple[int, ...]]:
    """What ../shared/tools/store-check compares, where it differs: per boundary the
    all-traffic count of window_sketches, latency_1m and latency_1h; per SLO total and good
    of slo_windows, slo_1m and slo_1h; the report's counts of the windows against their
    hourly rollups (requests, measured bad requests, joined requests with an offset).
    Empty: every rollup equals its source."""
    db = store.database
    out: dict[str, tuple[int, ...]] = {}
    for (b,) in store.query_rows(
        f"SELECT DISTINCT boundary FROM {db}.window_sketches WHERE boundary != '__slo__'"
    ):
        where = f"boundary = '{b}' AND {ALL}"
        counts = tuple(
            int(store.query_rows(f"SELECT sum(count) FROM {db}.{t} WHERE {where}")[0][0])
            for t in ("window_sketches", "latency_1m", "latency_1h")
        )
        if len(set(counts)) > 1:
            out[b] = counts
    for slo, total, good in store.query_rows(
        f"SELECT slo, sum(total), sum(good) FROM {db}.slo_windows GROUP BY slo"
    ):
        sums = [(int(total), int(good))]
        for t in ("slo_1m", "slo_1h"):
            row = store.query_rows(
                f"SELECT sum(total), sum(good) FROM {db}.{t} WHERE slo = {{s:String}}", {"s": slo}
            )[0]
            sums.append((int(row[0]), int(row[1])))
        if len(set(sums)) > 1:
            out[f"slo {slo}"] = tuple(x for s in sums for x in s)
    # the SLO counts of the '__slo__' rows themselves (slo_windows is a view's target too)
    base = store.query_rows(
        f"SELECT sum(v.total) FROM {db}.window_sketches AS w "
        "ARRAY JOIN mapValues(w.slo_counts) AS v WHERE w.boundary = '__slo__'"
    )[0][0]
    spread = store.query_rows(f"SELECT sum(total) FROM {db}.slo_windows")[0][0]
    if int(base or 0) != int(spread or 0):
        out["slo_windows"] = (int(base or 0), int(spread or 0))
    # the report's counts of the '__slo__' rows (sql/0018) and their hourly rollups
    for table, column, value, rolled in (
        ("request_counts_1h", "request_counts", "requests", "requests"),
        ("slo_bad_1h", "slo_bad", "bad_measured", "bad_measured"),
        ("clock_skew_1h", "clock_skew", "arraySum(a.counts)", "joined"),
    ):
        of = value if "(" in value else f"a.{value}"
        ((base,),) = store.query_rows(
            f"SELECT sum({of}) FROM {db}.window_sketches AS w ARRAY JOIN w.{column} AS a "
            "WHERE w.boundary = '__slo__'"
        )
        ((hourly,),) = store.query_rows(f"SELECT sum({rolled}) FROM {db}.{table}")
        if int(base or 0) != int(hourly or 0):
            out[table] = (int(base or 0), int(hourly or 0))
    return out


# --- topics ----------------------------------------------------------------------------


def read_all(settings: Settings, topic: str, timeout_s: float = 30.0) -> list[Any]:
    """Every message currently on ``topic`` (up to the end offsets at call time); raises
    AssertionError when it cannot read to the end within ``timeout_s``."""
    c = Consumer(
        settings.kafka_config()
        | {"group.id": f"reader-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False}
    )
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        ends = {}
        tps = []
        for p in md.partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if hi > lo:
                ends[p] = hi
                tps.append(TopicPartition(topic, p, lo))
        c.assign(tps)
        out = []
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            out.append(msg)
            if (msg.offset() or 0) + 1 >= ends.get(msg.partition(), 0):
                ends.pop(msg.partition(), None)
        assert not ends, f"did not read to the end of {topic}: {ends}"
        return out
    finally:
        c.close()


def dead_letters(settings: Settings, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The DLQ's messages in order: each one's headers (decoded), its ``key`` (text) and its
    ``value`` (the bytes as received)."""
    out = []
    for msg in read_all(settings, settings.dlq_topic, timeout_s):
        letter: dict[str, Any] = {k: (v or b"").decode() for k, v in msg.headers() or []}
        letter["key"] = (msg.key() or b"").decode()
        letter["value"] = msg.value() or b""
        out.append(letter)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="exactly-once, boundary and rollup checks (JSON)")
    ap.add_argument("store_dir", type=Path)
    ap.add_argument("--ids", type=Path, required=True, help="expected request ids, one a line")
    args = ap.parse_args(argv)
    from pipeline.adapters.store import open_store

    ids = {ln for ln in args.ids.read_text().split("\n") if ln}
    store = open_store(Settings(store_dir=args.store_dir))
    try:
        eo = exactly_once(store, ids)
        q = (
            "SELECT request_id, arraySort(groupUniqArray(kind)) "
            f"FROM {store.database}.lifecycle_events GROUP BY request_id"
        )
        raw = {str(r): ",".join(k) for r, k in store.query_rows(q)}
        read = sorted(set(eo["missing"]) & raw.keys())
        kinds: dict[str, int] = {}
        for rid in read:
            kinds[raw[rid]] = kinds.get(raw[rid], 0) + 1
        doc = {
            "exactly_once": eo,
            # of the missing, those the worker had read (their raw events are stored), and
            # how many of them by the kinds of event stored
            "missing_read": read,
            "missing_read_kinds": kinds,
            "boundaries": boundary_counts(store),
            "rollup_drift": rollup_drift(store),
        }
    finally:
        store.close()
    sys.stdout.write(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
