"""A month of traffic as the worker would have stored it: records, windows, raw events.

The month benchmark (:mod:`bench.month`) needs a store of 30 days at 20 requests/s
(~52 M requests). Joining 150 M lifecycle events in Python would take most of a day on
this machine, so the traffic is generated as what the join emits instead, hour by hour:

* **records** (:class:`~pipeline.core.record.RequestRecord`, joined, revision 3) drawn
  with numpy from a diurnal arrival process (a weekday/weekend shape, a peak in the
  afternoon UTC), 3 models, priorities 0-3, 6 tenants, streaming and not, prompt and
  output lengths, and a few **overload episodes** (more traffic, long queues, priority-3
  requests rejected with 429, more errors). A request belongs to the hour its *end*
  falls in (its window time), so every hour's windows close within the hour;
* **windows**: the core's own :class:`~pipeline.core.windows.WindowAggregator` per
  partition, with the shipped SLO spec's counts, closed at the hour's end plus grace:
  sketches, SLO counts and ledgers are those a live worker closes (the partition is
  drawn uniformly, as the key hash spreads ids, instead of murmur2 per id: 7 µs each);
* **raw events**: the three lifecycle events of each request of the last
  ``raw_days`` (the table's retention), as the producers send them (one JSON array per
  message), decoded by the contract's codec and kept as the processor keeps them.

Each hour is written through :class:`~pipeline.adapters.flush.FlushWriter` (requests,
then windows with their ledger, then raw events): one flush per hour. Everything is a
pure function of the :class:`MonthRecipe` and the hour (seeded per hour), so a store
built in several sittings is the store built in one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
import orjson

from pipeline.contract.wire import decode_clean
from pipeline.core import windows as windows_core
from pipeline.core.processor import KeptMessage
from pipeline.core.record import BOUNDARIES, RequestRecord
from pipeline.core.sketch import QuantileSketch, SketchColumns, mapping_constants
from pipeline.core.slo import RecordColumns
from pipeline.core.window_counts import RequestCounts
from pipeline.core.windows import (
    ALL_KEY,
    ClosedWindow,
    WindowConfig,
    WindowKey,
    WindowSLOs,
    ledger_code,
)

HOUR_MS: Final = 3_600_000
DAY_MS: Final = 24 * HOUR_MS
MODELS: Final = ("llama-3.1-70b", "mixtral-8x7b", "qwen2.5-7b")
MODEL_SHARE: Final = (0.5, 0.3, 0.2)
# decode speed (ms per output token) and prefill cost (ms per prompt token) per model
MODEL_TPOT_MS: Final = (28.0, 18.0, 11.0)
MODEL_PREFILL_MS_PER_TOKEN: Final = (0.09, 0.05, 0.02)
PRIORITY_SHARE: Final = (0.1, 0.3, 0.4, 0.2)
TENANTS: Final = ("acme", "globex", "initech", "umbrella", "hooli", "stark")
TENANT_SHARE: Final = (0.35, 0.25, 0.15, 0.12, 0.08, 0.05)
GATEWAYS: Final = 4
ENGINES_PER_MODEL: Final = 4
_CTX_EDGES: Final = (512, 4096, 8192, 16385)  # pipeline.contract.boundaries.ctx_bucket
_CTX_NAMES: Final = ("<512", "512-4k", "4k-8k", "8k-16k", ">16k")


@dataclass(frozen=True, slots=True)
class MonthRecipe:
    """What the generated month is a function of (with the migrations: the store's key)."""

    days: int = 30
    rate_per_s: float = 20.0  # mean over the month
    # the lifecycle topic's partitions: 1 for 20 requests/s (the shipped default of 8 writes
    # ~2x the window rows, and the build's windows pass takes that much longer)
    partitions: int = 1
    raw_days: int = 7  # raw events kept (TAILGUARD_RAW_EVENTS_TTL_DAYS default)
    end_ms: int = 0  # the month's end; 0: the last full hour when the store is first built
    seed: int = 53
    # overload episodes: (day, hour of day, minutes, traffic factor)
    episodes: tuple[tuple[int, int, int, float], ...] = (
        (4, 14, 45, 2.5),
        (11, 10, 20, 3.0),
        (19, 16, 90, 1.8),
        (27, 15, 30, 2.5),
    )

    @property
    def start_ms(self) -> int:
        return self.end_ms - self.days * DAY_MS

    @property
    def hours(self) -> int:
        return self.days * 24

    def digest(self) -> str:
        """What the generated data is a function of: this recipe and the generator."""
        text = json.dumps([asdict(self), GENERATOR_VERSION], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# Raise when the generated data changes (the recipe's hash then names another store).
GENERATOR_VERSION: Final = 1


def rate_shape(t_ms: np.ndarray, start_ms: int) -> np.ndarray:
    """Relative request rate at ``t_ms`` (mean ~1 over whole weeks): a diurnal curve
    peaking at 15:00 UTC (0.35x at night, 1.65x at the peak), weekends at 0.7x."""
    hour = (t_ms % DAY_MS) / HOUR_MS
    diurnal = 1.0 + 0.65 * np.cos(2 * np.pi * (hour - 15.0) / 24.0)
    weekday = ((t_ms // DAY_MS) + 4) % 7  # 1970-01-01 was a Thursday: 0 = Monday
    week = np.where(weekday >= 5, 0.7, 1.12)
    return diurnal * week


def episode_factor(recipe: MonthRecipe, t_ms: np.ndarray) -> np.ndarray:
    """Traffic factor of the overload episodes at ``t_ms`` (1 outside them)."""
    out = np.ones(len(t_ms))
    for day, hour, minutes, factor in recipe.episodes:
        lo = recipe.start_ms + day * DAY_MS + hour * HOUR_MS
        out[(t_ms >= lo) & (t_ms < lo + minutes * 60_000)] = factor
    return out


def _uuids(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` random version-4 UUIDs, as text."""
    raw = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    hx = raw.tobytes().hex()
    return [
        f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        for h in (hx[i * 32 : i * 32 + 32] for i in range(n))
    ]


@dataclass(frozen=True, slots=True)
class Hour:
    """One hour's requests (those ending in it), as records, with their partitions."""

    index: int
    start_ms: int
    records: list[RequestRecord]
    partitions: np.ndarray  # per record


def generate_hour(recipe: MonthRecipe, index: int) -> Hour:
    """The requests ending in hour ``index`` of the month (a pure function of both)."""
    rng = np.random.default_rng([recipe.seed, index])
    h0 = recipe.start_ms + index * HOUR_MS
    # arrivals (by end time) per second: Poisson of the shaped rate
    sec = h0 + 1000 * np.arange(3600, dtype=np.int64)
    overload = episode_factor(recipe, sec)
    lam = recipe.rate_per_s * rate_shape(sec, recipe.start_ms) * overload
    counts = rng.poisson(lam)
    n = int(counts.sum())
    end_ms = np.repeat(sec, counts) + rng.integers(0, 1000, n)
    end_ms.sort()
    in_episode = np.repeat(overload > 1.0, counts)
    model = rng.choice(3, n, p=MODEL_SHARE)
    priority = rng.choice(4, n, p=PRIORITY_SHARE)
    tenant = rng.choice(len(TENANTS), n, p=TENANT_SHARE)
    stream = rng.random(n) < 0.8
    prompt = np.clip(rng.lognormal(math.log(900), 1.1, n), 4, 32_000).astype(np.int64)
    output = np.clip(rng.lognormal(math.log(180), 0.9, n), 1, 4096).astype(np.int64)
    cached = (prompt * rng.random(n) * (rng.random(n) < 0.4)).astype(np.int64)
    # latencies (engine clock): queue grows in an episode
    queue = rng.exponential(15.0, n) + np.where(in_episode, rng.exponential(1800.0, n), 0.0)
    per_token = np.asarray(MODEL_PREFILL_MS_PER_TOKEN)[model]
    prefill = (prompt - cached) * per_token * rng.lognormal(0, 0.2, n) + 8.0
    tpot = (
        np.asarray(MODEL_TPOT_MS)[model]
        * rng.lognormal(0, 0.15, n)
        * np.where(in_episode, 1.4, 1.0)
    )
    decode = tpot * (output - 1)
    inference = prefill + decode
    e2e = queue + inference + rng.exponential(0.5, n)
    overhead = rng.lognormal(math.log(3.0), 0.5, n)
    # outcomes: errors, client aborts, and in an episode 429s for priority 3 (no engine)
    u = rng.random(n)
    err_p = np.where(in_episode, 0.02, 0.002)
    rejected = in_episode & (priority == 3) & (u < 0.4)
    error = ~rejected & (u >= 0.4) & (u < 0.4 + err_p)
    abort = ~rejected & ~error & (rng.random(n) < 0.004)
    total = np.where(rejected, overhead, e2e + overhead)
    ttfb = np.where(rejected, overhead, np.where(stream, queue + prefill + 0.7 * overhead, total))
    start_ms = end_ms - total
    start_ns = (start_ms * 1_000_000).astype(np.int64)
    end_ns = (end_ms * 1_000_000).astype(np.int64)
    arrival_ns = start_ns + (overhead * 500_000).astype(np.int64)
    ctx = np.searchsorted(np.asarray(_CTX_EDGES), prompt, side="right")
    gw = rng.integers(0, GATEWAYS, n)
    eng = model * ENGINES_PER_MODEL + rng.integers(0, ENGINES_PER_MODEL, n)
    partitions = rng.integers(0, recipe.partitions, n)
    ids = _uuids(rng, n)

    def col(a: np.ndarray) -> list[Any]:
        return a.tolist()  # type: ignore[no-any-return]

    models = [MODELS[i] for i in col(model)]
    tenants = [TENANTS[i] for i in col(tenant)]
    ctxs = [_CTX_NAMES[i] for i in col(ctx)]
    gws = [f"gw-{i}" for i in col(gw)]
    engs = [f"engine-{i}" for i in col(eng)]
    out: list[RequestRecord] = []
    append = out.append
    rows = zip(
        ids, col(start_ns), col(end_ns), models, col(priority), tenants, ctxs,
        col(rejected), col(error), col(abort), col(stream), gws, engs, col(arrival_ns),
        col(prompt), col(output), col(cached), col(total), col(ttfb), col(e2e), col(queue),
        col(prefill), col(decode), col(inference), col(tpot), col(overhead),
        strict=True,
    )  # fmt: skip
    for (rid, ts, end, m, p, t, cb, rej, er, ab, st, g, e, arr, pt, ot, ct, tot, tfb, e2, q,
         pf, dc, inf, tp, ov) in rows:  # fmt: skip
        if rej:
            rec = RequestRecord(
                rid, "gateway_only", 1, ts, end, m, p, t, cb, "rejected", 429, None, st,
                g, None, ts, None, pt, None, None, None, tot, tfb, None, None, None, None,
                None, None, None, None, control_mode="enforce", control_verdict="shed_priority",
            )  # fmt: skip
            append(rec)
            continue
        outcome, status, finish = (
            ("error", 500, "error") if er else ("client_abort", 499, "abort") if ab
            else ("ok", 200, "stop")
        )  # fmt: skip
        rec = RequestRecord(
            rid, "joined", 3, ts, end, m, p, t, cb, outcome, status, finish, st, g, e, ts,
            arr, pt, ot, ct, 0, tot, tfb, e2, q, pf, dc, inf, q + pf, tp, ov,
        )  # fmt: skip
        append(rec)
    return Hour(index, h0, out, partitions)


def hours(recipe: MonthRecipe, first: int = 0) -> Iterator[Hour]:
    for i in range(first, recipe.hours):
        yield generate_hour(recipe, i)


def hour_windows(
    hour: Hour,
    partitions: int,
    config: WindowConfig,
    slo_factory: Callable[[], WindowSLOs] | None,
) -> list[ClosedWindow]:
    """The closed windows of ``hour`` per partition: what
    :class:`~pipeline.core.windows.WindowAggregator` closes for the same records added
    in order (a test keeps the two equal), built per hour with numpy instead of per cell
    (the aggregator's sketch per (window, key, boundary) cost ~80 µs a cell, 2 h of CPU
    a month at one partition): the same keys (``record_key``, the all-traffic key), the
    sketch's own bucket keys (``QuantileSketch._keys``), per-window SLO counts by the
    core's evaluator (``add_batch``) and ledgers (``ledger_code``)."""
    recs = hour.records
    n = len(recs)
    if n == 0:
        return []
    size = config.size_ms
    cols = RecordColumns(recs)
    end_ms = np.fromiter((r.end_unix_ns // 1_000_000 for r in recs), np.int64, n)
    win = (end_ms - end_ms % size - hour.start_ms) // size  # window index in the hour
    part = hour.partitions % partitions
    labels: dict[WindowKey, int] = {}
    key_of = windows_core.record_key
    kid = np.fromiter((labels.setdefault(key_of(r), len(labels)) for r in recs), np.int64, n)
    keys = [*labels, ALL_KEY]
    n_keys = len(keys)
    cell = (win * partitions + part) * n_keys  # + key: a (window, partition, key) id
    # every record in its key's cell and in the all-traffic key's
    cells = np.concatenate([cell + kid, cell + (n_keys - 1)])
    rows = np.concatenate([np.arange(n), np.arange(n)])
    values = cols.values
    probe = QuantileSketch(config.relative_accuracy)
    consts = mapping_constants(config.relative_accuracy)
    sketches: dict[int, dict[tuple[WindowKey, str], SketchColumns]] = {}
    for j, boundary in enumerate(BOUNDARIES):
        v = values[rows, j]
        ok = ~np.isnan(v)
        c, v = cells[ok], v[ok]
        if not v.size:
            continue
        if (v < -consts.min_indexable).any():
            raise ValueError(f"negative {boundary} in generated records")
        order = np.argsort(c, kind="stable")  # record order within a cell
        c, v = c[order], v[order]
        uniq, start = np.unique(c, return_index=True)
        count = np.diff(np.append(start, c.size))
        total = np.add.reduceat(v, start)
        lo = np.minimum.reduceat(v, start)
        hi = np.maximum.reduceat(v, start)
        zero = v <= consts.min_indexable
        zero_count = np.add.reduceat(zero.astype(np.int64), start)
        bkeys = np.zeros(v.size, dtype=np.int64)
        if (~zero).any():
            bkeys[~zero] = probe._keys(v[~zero])
        # bins: (cell, bucket key) counted, non-zero values only
        bc, bk = c[~zero], bkeys[~zero]
        pair = np.unique(np.stack([bc, bk], axis=1), axis=0, return_counts=True)
        (pairs, pair_counts) = pair
        bin_start = np.searchsorted(pairs[:, 0], uniq, side="left")
        bin_end = np.searchsorted(pairs[:, 0], uniq, side="right")
        pk, pc = pairs[:, 1].tolist(), pair_counts.tolist()
        for cid, cnt, sm, mn, mx, zc, b0, b1 in zip(
            uniq.tolist(), count.tolist(), total.tolist(), lo.tolist(), hi.tolist(),
            zero_count.tolist(), bin_start.tolist(), bin_end.tolist(), strict=True,
        ):  # fmt: skip
            sketches.setdefault(cid // n_keys, {})[(keys[cid % n_keys], boundary)] = SketchColumns(
                cnt, sm, mn, mx, zc, pk[b0:b1], pc[b0:b1], [], []
            )
    # per (window, partition): records per key, SLO counts, ledger
    wp = win * partitions + part
    order = np.argsort(wp, kind="stable")
    group, first = np.unique(wp[order], return_index=True)
    bounds = np.append(first, n).tolist()
    rids = cols.column("request_id")
    codes = [ledger_code(r) for r in recs]
    out: list[ClosedWindow] = []
    for i, g in enumerate(group.tolist()):
        idx = order[bounds[i] : bounds[i + 1]]
        idx_list = idx.tolist()
        per_key = np.bincount(kid[idx], minlength=n_keys - 1).tolist()
        records = {keys[k]: c for k, c in enumerate(per_key) if c}
        records[ALL_KEY] = len(idx_list)
        slos = None
        ones = np.ones(len(idx_list), dtype=np.int64)
        if slo_factory is not None:
            slos = slo_factory()
            slos.add_batch(cols, idx, ones)
        counts = RequestCounts()  # the report's counts, as the aggregator's window counts them
        counts.add_batch(cols, idx, ones)
        w, p = divmod(g, partitions)
        closed = ClosedWindow(
            p, hour.start_ms + w * size, size, records, sketches.get(g, {}), slos,
            False, {rids[k]: codes[k] for k in idx_list}, {}, {}, counts,
        )  # fmt: skip
        out.append(closed)
    out.sort(key=lambda cw: (cw.partition, cw.start_ms))
    return out


# Raw events: what the producers sent for each request of the retained days, one JSON
# array per message (as producers.emit batches them), decoded by the contract's decoder
# and kept as the processor keeps them (``KeptMessage``).
MESSAGE_EVENTS: Final = 64


def record_events(rec: RequestRecord) -> list[dict[str, Any]]:
    """The lifecycle events (wire shape, ``pipeline/contract/wire.py``) of one record."""
    rid, model = rec.request_id, rec.model
    received = {
        "v": 1, "event_id": f"{rid}:gateway.received", "ts_unix_ns": rec.ts_unix_ns,
        "host": rec.gateway_host, "model": model, "request_id": rid,
        "kind": "gateway.received", "priority": rec.priority, "tenant": rec.tenant,
        "prompt_tokens": rec.prompt_tokens, "stream": rec.stream, "client_attempt": 0,
    }  # fmt: skip
    total = rec.gateway_total_ms or 0.0
    completed: dict[str, Any] = {
        "v": 1, "event_id": f"{rid}:gateway.completed",
        "ts_unix_ns": rec.ts_unix_ns + int(total * 1_000_000), "host": rec.gateway_host,
        "model": model, "request_id": rid, "kind": "gateway.completed", "total_ms": total,
        "ttfb_ms": rec.gateway_ttfb_ms, "http_status": rec.http_status,
        "outcome": rec.outcome,
    }  # fmt: skip
    if rec.output_tokens is not None:
        completed["output_tokens"] = rec.output_tokens
    if rec.control_mode is not None:
        completed["control_mode"] = rec.control_mode
        completed["control_verdict"] = rec.control_verdict
    if rec.engine_host is None:
        return [received, completed]
    finished = {
        "v": 1, "event_id": f"{rid}:engine.finished", "ts_unix_ns": rec.end_unix_ns,
        "host": rec.engine_host, "model": model, "request_id": rid,
        "kind": "engine.finished", "arrival_unix_ns": rec.engine_arrival_unix_ns,
        "queue_ms": rec.queue_ms, "prefill_ms": rec.prefill_ms, "decode_ms": rec.decode_ms,
        "inference_ms": rec.inference_ms, "e2e_ms": rec.engine_e2e_ms,
        "prompt_tokens": rec.prompt_tokens, "output_tokens": rec.output_tokens,
        "cached_tokens": rec.cached_tokens, "finish_reason": rec.finish_reason,
        "preemptions": rec.preemptions, "priority": rec.priority,
    }  # fmt: skip
    return [received, finished, completed]


def hour_messages(hour: Hour, partitions: int) -> list[KeptMessage]:
    """The hour's raw events as the processor keeps them: per partition, messages of
    :data:`MESSAGE_EVENTS` events in time order, decoded by ``decode_clean``."""
    per_part: dict[int, list[dict[str, Any]]] = {}
    for rec, p in zip(hour.records, (hour.partitions % partitions).tolist(), strict=True):
        per_part.setdefault(p, []).extend(record_events(rec))
    out: list[KeptMessage] = []
    for p, evs in sorted(per_part.items()):
        evs.sort(key=lambda e: e["ts_unix_ns"])
        for n, i in enumerate(range(0, len(evs), MESSAGE_EVENTS)):
            raw = orjson.dumps(evs[i : i + MESSAGE_EVENTS])
            clean = decode_clean(raw, raws=False)
            if clean is None:
                raise ValueError(f"the decoder refused a generated message: {raw[:200]!r}")
            out.append(KeptMessage(p, hour.index * 1_000_000 + n, clean[0], raw))
    return out
