"""The ``worker_checkpoints`` table (informational, for operators): its rows and writer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .inserts import _attr_columns, _insert_columns
from .protocol import Store

CHECKPOINT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("group_id", "String"),
    ("source_topic", "String"),
    ("partition", "UInt16"),
    ("close_horizon_ms", "Int64"),
    ("watermark_ms", "Int64"),
    ("committed_offset", "Int64"),
    ("corrected_records", "UInt64"),
    ("quarantined_events", "UInt64"),
    ("replayed_records", "UInt64"),
)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One ``worker_checkpoints`` row (informational, for operators), less the group and
    topic, which :func:`write_checkpoints` adds."""

    partition: int
    close_horizon_ms: int
    watermark_ms: int
    committed_offset: int
    corrected_records: int = 0
    quarantined_events: int = 0
    replayed_records: int = 0


def write_checkpoints(store: Store, group: str, topic: str, rows: Sequence[Checkpoint]) -> None:
    if not rows:
        return
    n = len(rows)
    columns = [[group] * n, [topic] * n, *_attr_columns(rows, _CHECKPOINT_FIELDS)]
    _insert_columns(store, "worker_checkpoints", CHECKPOINT_COLUMNS, columns)


_CHECKPOINT_FIELDS = tuple(n for n, _ in CHECKPOINT_COLUMNS[2:])
