"""The ledger topic's wire format (``tailguard.ledger``): which requests a store insert's
windows counted, per source partition, with the offset ``through`` below which that
partition's input is accounted for. What the ledger means and how workers use it:
``pipeline.core.ledger``. Pure (orjson only).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import orjson

__all__ = ["LEDGER_VERSION", "MAX_IDS_PER_MESSAGE", "LedgerEntry", "decode_ledger", "encode_ledger"]

LEDGER_VERSION: Final = 1
MAX_IDS_PER_MESSAGE: Final = 20_000  # ~0.5 MB of JSON: under the broker's 1 MB default


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One message of the ledger topic: ``{"v": 1, "topic", "partition", "through",
    "ids": [...], "versions": [...]}`` (ids and versions side by side)."""

    topic: str
    partition: int
    through: int
    versions: Mapping[str, int]
    end_ms: int = 0  # the latest window end these requests were counted in


def encode_ledger(entry: LedgerEntry) -> Iterator[bytes]:
    """The entry as one or more messages (at most ``MAX_IDS_PER_MESSAGE`` ids each)."""
    ids = list(entry.versions)
    versions = list(entry.versions.values())  # (in the ids' order: one C call, no lookups)
    for i in range(0, max(len(ids), 1), MAX_IDS_PER_MESSAGE):
        yield orjson.dumps(
            {
                "v": LEDGER_VERSION,
                "topic": entry.topic,
                "partition": entry.partition,
                "through": entry.through,
                "end_ms": entry.end_ms,
                "ids": ids[i : i + MAX_IDS_PER_MESSAGE],
                "versions": versions[i : i + MAX_IDS_PER_MESSAGE],
            }
        )


def decode_ledger(raw: bytes) -> LedgerEntry:
    """Raises ValueError/KeyError/TypeError on a malformed message (an internal topic)."""
    d = orjson.loads(raw)
    if d.get("v") != LEDGER_VERSION:
        raise ValueError(f"unsupported ledger version {d.get('v')!r}")
    ids, versions = d["ids"], d["versions"]
    if len(ids) != len(versions):
        raise ValueError("ids and versions differ in length")
    return LedgerEntry(
        str(d["topic"]), int(d["partition"]), int(d["through"]),
        {str(i): int(v) for i, v in zip(ids, versions, strict=True)}, int(d.get("end_ms", 0)),
    )  # fmt: skip
