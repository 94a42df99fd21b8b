"""Benchmark workloads: the simulator's events on the shared Azure trace, folded and tiled.

One simulator run over ``data/azure-llm-2023/conv.csv`` gives one hour of
realistic lifecycle events (19,366 requests, ~58k events). A benchmark needs
millions of events at a chosen event-time density, so the run is *folded*:

* every request keeps its own events, durations and inter-event gaps (one
  shift per request, applied to ``ts_unix_ns`` and ``arrival_unix_ns``);
* request starts are folded modulo ``span_ms`` (the hour's requests all start
  within one span), and the span repeats: request *instance* ``i`` starts in
  span ``i`` and carries the request id ``<template id>.<i>``;
* instance ``i`` replays the simulator run of seed ``i % seeds``, so
  neighbouring spans differ (priorities, tenants, latencies).

The event-time density is one template per span (``rate_ev_s`` picks the
span). Events come out in non-decreasing ``ts_unix_ns`` order, like a live
producer's; every instance is complete (the stream ends after the last
instance's last event).

Messages use the producers' batching (:class:`producers.emit.Batcher`'s
format and policy; :class:`DictBatcher` is the same thing over dicts with
precomputed partitions, checked byte-for-byte against it in the tests).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from pipeline.contract.codec import event_to_dict
from pipeline.contract.partitioning import partition_for
from producers.emit import BatchPolicy
from producers.simulator import SimConfig, Simulator, read_trace

REPO: Final = Path(__file__).resolve().parents[1]
TRACE: Final = REPO / "data" / "azure-llm-2023" / "conv.csv"
BASE_NS: Final = 1_700_000_000_000_000_000  # trace offset 0 of every template
_NS_PER_MS: Final = 1_000_000

Event = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Template:
    """One simulator run's lifecycle events (engine.stats left out)."""

    seed: int
    events: tuple[Event, ...]  # in ts order
    requests: int

    @property
    def n_events(self) -> int:
        return len(self.events)


@functools.cache
def template(seed: int, trace: Path = TRACE, limit: int | None = None) -> Template:
    rows = read_trace(trace)
    if limit is not None:
        rows = rows[:limit]
    sim = Simulator(
        rows, SimConfig(start_unix_ns=BASE_NS, seed=seed, request_id_prefix=f"s{seed}-")
    )
    events = tuple(event_to_dict(e) for e in sim.events() if e.kind != "engine.stats")
    return Template(seed, events, len({e["request_id"] for e in events}))


@dataclass(frozen=True, slots=True)
class _Entry:
    r_ns: int  # position inside the span
    q: int  # spans after its request's start span
    shift_ns: int  # add (instance start of span) to get the event's ts
    event: Event


def _entries(t: Template, span_ns: int) -> list[_Entry]:
    first: dict[str, int] = {}
    out = []
    for e in t.events:
        rid = e["request_id"]
        ts = e["ts_unix_ns"]
        t0 = first.setdefault(rid, ts)
        folded_start = (t0 - BASE_NS) % span_ns
        x = folded_start + (ts - t0)
        out.append(_Entry(x % span_ns, x // span_ns, folded_start - t0, e))
    out.sort(key=lambda en: en.r_ns)  # stable: a request's events keep their order
    return out


@dataclass(frozen=True, slots=True)
class Workload:
    """``instances`` request instances per seed template, at ``rate_ev_s`` events/s."""

    instances: int
    rate_ev_s: float = 50_000.0
    seeds: int = 4
    trace_limit: int | None = None  # first N trace rows only (tests)

    def templates(self) -> list[Template]:
        return [template(s, TRACE, self.trace_limit) for s in range(self.seeds)]

    @property
    def span_ns(self) -> int:
        per = sum(t.n_events for t in self.templates()) / self.seeds
        return max(1, int(per / self.rate_ev_s * 1e9))

    @property
    def n_events(self) -> int:
        ts = self.templates()
        return sum(ts[i % self.seeds].n_events for i in range(self.instances))

    @property
    def n_requests(self) -> int:
        ts = self.templates()
        return sum(ts[i % self.seeds].requests for i in range(self.instances))


def events(w: Workload, start_ns: int, *, id_width: int = 0) -> Iterator[tuple[str, int, Event]]:
    """``(request_id, ts_unix_ns, event)`` of every instance, in ts order.

    A request id is its template's, ``.`` and the instance number, zero-padded to
    ``id_width`` digits: a long run that keeps many ids (the RSS run) needs ids of one
    length, as a production id format has. Unpadded, every id grows by a character at
    instance 10, 100, 1,000, ... and the strings the join keeps move to the next
    pymalloc size class (16-byte steps), while the previous class's blocks drain for one
    ``resolved_ttl``: arenas grow by that, which is not the worker's growth."""
    span = w.span_ns
    per_seed = [_entries(t, span) for t in w.templates()]
    s_count = w.seeds
    # For cycle c, instance i = c - q uses seed i % S: per residue of c, one merged list.
    lists = []
    for rho in range(s_count):
        parts = [
            [en for en in entries if (rho - en.q) % s_count == seed]
            for seed, entries in enumerate(per_seed)
        ]
        lists.append(list(heapq.merge(*parts, key=lambda en: en.r_ns)))
    max_q = max(en.q for entries in per_seed for en in entries)
    for c in range(w.instances + max_q):
        base = start_ns + c * span
        for en in lists[c % s_count]:
            i = c - en.q
            if i < 0 or i >= w.instances:
                continue
            src = en.event
            rid = f"{src['request_id']}.{i:0{id_width}d}"
            ev = dict(src)
            ev["request_id"] = rid
            ev["event_id"] = f"{rid}:{src['kind']}"
            shift = start_ns + i * span + en.shift_ns
            ev["ts_unix_ns"] = src["ts_unix_ns"] + shift
            arrival = src.get("arrival_unix_ns")
            if arrival is not None:
                ev["arrival_unix_ns"] = arrival + shift
            yield rid, base + en.r_ns, ev


class DictBatcher:
    """:class:`producers.emit.Batcher` over event dicts whose partition is known."""

    def __init__(self, policy: BatchPolicy) -> None:
        self.policy = policy
        self._open: dict[int, tuple[float, list[Event]]] = {}

    def add(self, partition: int, event: Event, now_ms: float) -> list[tuple[int, bytes, int]]:
        b = self._open.get(partition)
        if b is None:
            b = self._open[partition] = (now_ms, [])
        b[1].append(event)
        out = []
        if len(b[1]) >= self.policy.max_events:
            out.append(self._close(partition))
        limit = self.policy.max_delay_ms
        for p, (started, _) in list(self._open.items()):
            if now_ms - started >= limit:
                out.append(self._close(p))
        return out

    def drain(self) -> list[tuple[int, bytes, int]]:
        return [self._close(p) for p in list(self._open)]

    def _close(self, p: int) -> tuple[int, bytes, int]:
        _, items = self._open.pop(p)
        if len(items) == 1:
            return p, orjson.dumps(items[0]), 1
        return p, orjson.dumps(items), len(items)


class Partitioner:
    """The contract's partition of each request id, memoised per request."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._cache: dict[str, int] = {}

    def __call__(self, rid: str) -> int:
        p = self._cache.get(rid)
        if p is None:
            if len(self._cache) > 1_000_000:
                self._cache.clear()
            p = self._cache[rid] = partition_for(rid, self.partitions)
        return p


def messages(
    stream: Iterator[tuple[str, int, Event]], partitions: int, policy: BatchPolicy
) -> Iterator[tuple[int, bytes, int]]:
    """``(partition, value, n_events)`` as a producer emitting at event time would send them."""
    part = Partitioner(partitions)
    batcher = DictBatcher(policy)
    for rid, ts, ev in stream:
        yield from batcher.add(part(rid), ev, ts / _NS_PER_MS)
    yield from batcher.drain()


def end_margin_ns(size_ms: int, grace_ms: int) -> int:
    """How far past the data's newest event the end-of-input requests are stamped: the
    data's last window (it ends at most ``size_ms`` after that event) closes once a
    partition's clock passes its end + ``grace_ms``; 10 s more for the lower median of the
    hosts' marks, which trails the newest event a little."""
    return (size_ms + grace_ms + 10_000) * _NS_PER_MS


def sentinels(
    partitions: int, ts_ns: int, quorum: int, templates: Iterable[Template] | None = None
) -> list[tuple[int, bytes, int]]:
    """Complete requests at ``ts_ns`` that end the input: on every partition, at least
    ``quorum`` events from every host of the data (gateways and engines).

    A partition's event-time clock is the lower median of its hosts' marks, a host's mark
    its ``quorum``-th newest event (:mod:`pipeline.core.eventtime`): these requests move
    every host's mark, and so the clock, to ``ts_ns``, which closes the data's last windows
    when ``ts_ns`` is past them by the grace period (:func:`end_margin_ns`) and within the
    clock's range (``max_event_ahead_ms``). Copies of the data's shortest request per engine
    host (durations, gaps and fields kept; ids ``bench-end-<partition>-<n>``), stored like
    any other request. One message per partition."""
    srcs = list(templates) if templates is not None else [template(0)]
    by_rid: dict[str, list[Event]] = {}
    for t in srcs:
        for e in t.events:
            by_rid.setdefault(e["request_id"], []).append(e)
    complete = [evs for evs in by_rid.values() if len({e["kind"] for e in evs}) == len(evs) == 3]
    gateways = sorted(
        {e["host"] for evs in complete for e in evs if e["kind"] != "engine.finished"}
    )
    shortest: dict[str, list[Event]] = {}  # engine host -> its shortest complete request
    for evs in complete:
        host = next(e["host"] for e in evs if e["kind"] == "engine.finished")
        best = shortest.get(host)
        if best is None or _span_ns(evs) < _span_ns(best):
            shortest[host] = evs
    engines = sorted(shortest)
    per_partition = quorum * max(len(engines), len(gateways))
    rids: dict[int, list[str]] = {p: [] for p in range(partitions)}
    n = 0
    while any(len(v) < per_partition for v in rids.values()):
        rid = f"bench-end-{n}"
        got = rids[partition_for(rid, partitions)]
        if len(got) < per_partition:
            got.append(rid)
        n += 1
    out = []
    for p, ids in rids.items():
        batch = []
        for i, rid in enumerate(ids):
            evs = shortest[engines[i % len(engines)]]
            gateway = gateways[i % len(gateways)]
            t0 = evs[0]["ts_unix_ns"]
            for e in evs:
                ev = dict(e, request_id=rid, event_id=f"{rid}:{e['kind']}")
                if e["kind"] != "engine.finished":
                    ev["host"] = gateway
                ev["ts_unix_ns"] = e["ts_unix_ns"] - t0 + ts_ns
                if "arrival_unix_ns" in ev:
                    ev["arrival_unix_ns"] = e["arrival_unix_ns"] - t0 + ts_ns
                batch.append(ev)
        out.append((p, orjson.dumps(batch), len(batch)))
    return out


def _span_ns(evs: list[Event]) -> int:
    ts = [int(e["ts_unix_ns"]) for e in evs]
    return max(ts) - min(ts)
