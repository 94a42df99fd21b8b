"""Reads of ``lifecycle_events`` (the raw events as received, with their Kafka
coordinates)."""

from __future__ import annotations

from typing import Any

from pipeline.adapters.store import Store

Row = tuple[Any, ...]


def of_request(store: Store, request_id: str) -> list[Row]:
    """``(kind, host, ts_unix_ns)`` of the events kept for a request, in time order
    (``PREWHERE`` on the sorting key's first column: FINAL merges its rows only, see
    ``requests.last_attempt``)."""
    return store.query_rows(
        "SELECT kind, host, ts_unix_ns FROM "
        f"{store.database}.lifecycle_events FINAL PREWHERE request_id = {{rid:String}} "
        "ORDER BY ts_unix_ns, kind",
        {"rid": request_id},
    )


def read_inflight(
    store: Store, topic: str, starts: dict[int, int], ttl_ms: int
) -> dict[int, list[tuple[int, str]]]:
    """Per partition, the ``gateway.received`` events (offset, JSON) a worker that starts
    reading it at ``starts[partition]`` must hold again: those from before that offset
    (the commit does not wait for a lone received, see ``StreamProcessor.safe_offsets``)
    within the in-flight TTL of the partition's newest stored event. Requests already
    recorded are included: after a crash their other events may be read again, and
    must find their received."""
    if not starts:
        return {}
    db = store.database
    rows = store.query_rows(
        "WITH bounds AS (SELECT source_partition AS p, max(ts_unix_ns) AS hi "
        f"FROM {db}.lifecycle_events WHERE source_topic = {{t:String}} "
        "AND source_partition IN {ps:Array(UInt16)} GROUP BY p) "
        "SELECT DISTINCT e.source_partition, e.source_offset, e.payload "
        f"FROM {db}.lifecycle_events AS e INNER JOIN bounds AS b ON e.source_partition = b.p "
        "WHERE e.source_topic = {t:String} AND e.kind = 'gateway.received' "
        "AND e.ts_unix_ns >= b.hi - {ttl:Int64} "
        "ORDER BY e.source_partition, e.source_offset",
        {"t": topic, "ps": sorted(starts), "ttl": ttl_ms * 1_000_000},
    )
    out: dict[int, list[tuple[int, str]]] = {}
    for p, off, payload in rows:
        if int(off) < starts[int(p)]:
            out.setdefault(int(p), []).append((int(off), payload))
    return out
