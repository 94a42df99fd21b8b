"""Traffic made messy on purpose, and an exact check of a store against its requests.

Disorder (pure functions over event dicts, in stream order; seeded):
skewed host clocks, requests stamped in the future, duplicates at random
positions, partners far apart, producers that hold events back, and the file
layouts a replay must not care about. :func:`store_mismatches` compares what a
store's window tables hold with an exact computation over ``requests`` FINAL:
per boundary, per (window, key, boundary), and per (window, SLO).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from pipeline.adapters.store import REQUEST_COLUMNS, Store, record_from_row
from pipeline.core.record import BOUNDARIES, RequestRecord
from pipeline.core.skew import offset_bucket, offset_ms
from pipeline.core.slo import SLOEvaluator, SLOMatcher
from pipeline.core.window_counts import count_key, skew_key
from pipeline.core.windows import record_key, window_start
from pipeline.spec.slo import SLOSpec

HOUR_NS = 3_600_000_000_000
YEAR_NS = 365 * 24 * HOUR_NS
MS_NS = 1_000_000

Event = dict[str, Any]


def _shift(e: Event, delta_ns: int) -> Event:
    e = dict(e)
    e["ts_unix_ns"] += delta_ns
    if "arrival_unix_ns" in e:
        e["arrival_unix_ns"] += delta_ns
    return e


def skew_host(events: list[Event], host: str, delta_ms: int) -> list[Event]:
    """Every event of ``host`` stamped by a clock ``delta_ms`` off."""
    return [_shift(e, delta_ms * MS_NS) if e["host"] == host else e for e in events]


def stamp_request(events: list[Event], request_id: str, delta_ns: int) -> list[Event]:
    """Every event of one request stamped ``delta_ns`` off (a host's clock jumped)."""
    return [_shift(e, delta_ns) if e["request_id"] == request_id else e for e in events]


def duplicate(events: list[Event], share: float, seed: int) -> list[Event]:
    """Copies of ``share`` of the events inserted at random positions after the original."""
    rng = random.Random(seed)
    out = list(events)
    n = len(events)
    for i in sorted(rng.sample(range(n), int(n * share)), reverse=True):
        j = rng.randint(i + 1, len(out))
        out.insert(j, events[i])
    return out


def delay(events: list[Event], pick: Any, hold_ms: int) -> list[Event]:
    """Events for which ``pick(e)`` is true reach the stream ``hold_ms`` of event time
    later than they were made (a producer holding them, a partner far behind)."""
    keyed = []
    for i, e in enumerate(events):
        at = e["ts_unix_ns"] + (hold_ms * MS_NS if pick(e) else 0)
        keyed.append((at, i, e))
    # stream order: by the moment each event reaches the broker
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [e for _, _, e in keyed]


def write_layout(path: Path, events: list[Event], layout: str, seed: int = 0) -> None:
    """``lines``: one event per line; ``arrays``: JSON arrays of 1-50 events;
    ``stats``: one per line with every engine.stats line repeated 3 times around."""
    rng = random.Random(seed)
    with path.open("wb") as fh:
        if layout == "lines":
            for e in events:
                fh.write(orjson.dumps(e) + b"\n")
        elif layout == "arrays":
            i = 0
            while i < len(events):
                k = rng.randint(1, 50)
                fh.write(orjson.dumps(events[i : i + k]) + b"\n")
                i += k
        elif layout == "stats":
            for e in events:
                fh.write(orjson.dumps(e) + b"\n")
                if e["kind"] == "engine.stats":
                    for _ in range(2):
                        fh.write(orjson.dumps(e) + b"\n")
        else:
            raise ValueError(layout)


# --- the store against an exact count -----------------------------------------------


def final_records(store: Store) -> list[RequestRecord]:
    names = [n for n, _ in REQUEST_COLUMNS]
    rows = store.query_rows(f"SELECT {', '.join(names)} FROM {store.database}.requests FINAL")
    return [record_from_row(row) for row in rows]


def store_mismatches(
    store: Store, spec: SLOSpec | None, window_ms: int = 10_000, topic: str | None = None
) -> list[str]:
    """Every difference between the store's windows and an exact count over requests."""
    db = store.database
    where = "" if topic is None else f" AND source_topic = '{topic}'"
    recs = final_records(store)
    bad: list[str] = []
    # per (window, key, boundary): values counted
    exact: dict[tuple[int, str, str, str, str], int] = defaultdict(int)
    for r in recs:
        start = window_start(r.end_unix_ns // MS_NS, window_ms)
        model, prio, ctx = record_key(r)
        for b in BOUNDARIES:
            if getattr(r, b) is not None:
                exact[(start, model, prio, ctx, b)] += 1
                exact[(start, "*", "*", "*", b)] += 1
    stored = {
        (int(s), m, p, c, b): int(n)
        for s, m, p, c, b, n in store.query_rows(
            "SELECT toUnixTimestamp64Milli(window_start) AS s, model, priority, ctx_bucket, "
            f"boundary, sum(count) FROM {db}.window_sketches WHERE boundary != '__slo__'{where} "
            "GROUP BY s, model, priority, ctx_bucket, boundary HAVING sum(count) != 0"
        )
    }
    for k in sorted(set(exact) | set(stored)):
        if exact.get(k, 0) != stored.get(k, 0):
            bad.append(f"window/key/boundary {k}: store {stored.get(k, 0)} exact {exact.get(k, 0)}")
    if spec is None:
        return bad
    per_window: dict[int, SLOEvaluator] = {}
    for r in recs:
        start = window_start(r.end_unix_ns // MS_NS, window_ms)
        ev = per_window.get(start)
        if ev is None:
            ev = per_window[start] = SLOEvaluator(spec)
        ev.add(r)
    exact_slo: dict[tuple[int, str], tuple[int, int]] = {}
    for start, ev in per_window.items():
        for name, c in ev.counts().items():
            if c.total:
                exact_slo[(start, name)] = (c.total, c.good)
    stored_slo = {
        (int(s), slo): (int(t), int(g))
        for s, slo, t, g in store.query_rows(
            "SELECT toUnixTimestamp64Milli(window_start) AS s, slo, sum(total), sum(good) "
            f"FROM {db}.slo_windows WHERE kind = 'slo'{where} GROUP BY s, slo "
            "HAVING sum(total) != 0 OR sum(good) != 0"
        )
    }
    for k in sorted(set(exact_slo) | set(stored_slo)):
        if exact_slo.get(k) != stored_slo.get(k):
            bad.append(f"window/slo {k}: store {stored_slo.get(k)} exact {exact_slo.get(k)}")
    return bad


def _stored(v: Any) -> str:
    return "" if v is None else str(v)


def _nonzero(keys: list[int], counts: list[int]) -> dict[int, int]:
    return {int(k): int(n) for k, n in zip(keys, counts, strict=True) if n}


def count_mismatches(
    store: Store, spec: SLOSpec | None, window_ms: int = 10_000, topic: str | None = None
) -> list[str]:
    """Every difference between the report's counts the windows hold (``sql/0018``) and an
    exact count over requests: per window and key the requests, per window and host pair
    the clock offsets' 0.1 ms buckets, and (with the ``spec``) per window, SLO and model
    its measured bad requests (their sums within 1e-9 relative)."""
    db = store.database
    where = "" if topic is None else f" AND w.source_topic = '{topic}'"
    recs = final_records(store)
    exact: dict[tuple[Any, ...], int] = defaultdict(int)
    skew: dict[tuple[Any, ...], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in recs:
        start = window_start(r.end_unix_ns // MS_NS, window_ms)
        exact[(start, *map(_stored, count_key(r)))] += 1
        offset = offset_ms(r)
        if offset is not None:
            skew[(start, *skew_key(r))][offset_bucket(offset)] += 1
    rows = "FROM {db}.window_sketches AS w ARRAY JOIN w.{col} AS {a} WHERE w.boundary = '__slo__'"
    stored = {
        (int(s), *key[:-1]): int(key[-1])
        for s, *key in store.query_rows(
            "SELECT toUnixTimestamp64Milli(w.window_start) AS s, c.source, c.outcome, c.model, "
            "c.priority, c.control_mode, c.control_verdict, sum(c.requests) "
            + rows.format(db=db, col="request_counts", a="c")
            + where
            + " GROUP BY s, c.source, c.outcome, c.model, c.priority, c.control_mode, "
            "c.control_verdict HAVING sum(c.requests) != 0"
        )
    }
    bad = [
        f"window/key {k}: store {stored.get(k, 0)} exact {exact.get(k, 0)}"
        for k in sorted(set(exact) | set(stored))
        if exact.get(k, 0) != stored.get(k, 0)
    ]
    stored_skew = {
        (int(s), str(m), str(g), str(e)): _nonzero(*buckets)
        for s, m, g, e, buckets in store.query_rows(
            "SELECT toUnixTimestamp64Milli(w.window_start) AS s, k.model, k.gateway_host, "
            "k.engine_host, sumMap(k.offset_buckets, k.counts) "
            + rows.format(db=db, col="clock_skew", a="k")
            + where
            + " GROUP BY s, k.model, k.gateway_host, k.engine_host"
        )
    }
    for k in sorted(set(skew) | set(stored_skew)):
        if dict(skew.get(k, {})) != stored_skew.get(k, {}):
            bad.append(f"window/host pair {k}: offsets differ")
    if spec is None:
        return bad
    matchers = [(s.name, s.boundary, SLOMatcher(s)) for s in spec.slos]
    split: dict[tuple[Any, ...], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for r in recs:
        start = window_start(r.end_unix_ns // MS_NS, window_ms)
        for name, boundary, m in matchers:
            if m.measured_bad(r):
                acc = split[(start, name, r.model)]
                acc[0] += 1
                acc[1] += r.queue_ms or 0.0
                acc[2] += getattr(r, boundary)
    stored_split = {
        (int(s), str(slo), str(m)): [int(n), float(q), float(x)]
        for s, slo, m, n, q, x in store.query_rows(
            "SELECT toUnixTimestamp64Milli(w.window_start) AS s, b.slo, b.model, "
            "sum(b.bad_measured) AS n, sum(b.bad_queue_ms), sum(b.bad_ms) "
            + rows.format(db=db, col="slo_bad", a="b")
            + where
            + " GROUP BY s, b.slo, b.model HAVING n != 0"
        )
    }
    for k in sorted(set(split) | set(stored_split)):
        e, g = split.get(k, [0, 0.0, 0.0]), stored_split.get(k, [0, 0.0, 0.0])
        if e[0] != g[0] or any(
            abs(a - b) > 1e-9 * max(abs(a), abs(b), 1.0) for a, b in zip(e[1:], g[1:], strict=True)
        ):
            bad.append(f"window/slo/model {k}: store {g} exact {e}")
    return bad


def slo_totals(store: Store) -> dict[str, tuple[int, int]]:
    """Per SLO over everything: (total, good) from the hourly rollup."""
    return {
        name: (int(t), int(g))
        for name, t, g in store.query_rows(
            f"SELECT slo, sum(total), sum(good) FROM {store.database}.slo_1h "
            "WHERE kind = 'slo' GROUP BY slo"
        )
    }


def assert_store_is_exact(
    store: Store, spec: SLOSpec | None, slos: Mapping[str, Mapping[str, int]]
) -> None:
    """The store's windows equal an exact count over ``requests`` (:func:`store_mismatches`),
    and its hourly SLO totals are the replay's (``slos``: ``replay --json``'s)."""
    assert store_mismatches(store, spec) == []
    assert count_mismatches(store, spec) == []
    totals = slo_totals(store)
    for name, want in slos.items():
        assert totals.get(name, (0, 0)) == (want["total"], want["good"]), name


def merge_stores(settings: list[Any], into: Path) -> None:
    """The union of several workers' embedded stores in one store (``into``): every
    request row and every window row, as if they had written to one server."""
    from pipeline.adapters.store import WINDOW_COLUMNS, migrate, open_store
    from pipeline.settings import Settings

    tables = {
        "requests": [n for n, _ in REQUEST_COLUMNS],
        "window_sketches": [n for n, _ in WINDOW_COLUMNS],
    }
    types = {
        "requests": [t for _, t in REQUEST_COLUMNS],
        "window_sketches": [t for _, t in WINDOW_COLUMNS],
    }
    rows: dict[str, list[tuple[Any, ...]]] = {t: [] for t in tables}
    for s in settings:
        store = open_store(s)
        try:
            for t, cols in tables.items():
                rows[t] += store.query_rows(f"SELECT {', '.join(cols)} FROM {s.database}.{t}")
        finally:
            store.close()
    target = open_store(Settings(store_dir=into))
    try:
        migrate(target)
        for t, cols in tables.items():
            if rows[t]:
                columns = [list(c) for c in zip(*rows[t], strict=True)]
                target.insert_columns(t, columns, cols, types[t])
    finally:
        target.close()
