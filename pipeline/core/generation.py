"""Topic generations in committed offsets (pure: no I/O).

A Kafka topic deleted and created again under the same name is a new *generation* with
its own id (the broker's topic UUID) and offsets that start again at its first offset.
The classic consumer-group protocol keys committed offsets by topic *name*, so a commit
made for the old generation (a retry in flight through the deletion) can land on the new
one and make a reader skip its first messages. The worker therefore writes the
generation's id into each commit's metadata, and a committed offset whose id is not the
topic's current one is ignored: the partition is read from its first offset.

The metadata also carries, per partition, from when the DLQ is read back when a worker
takes the partition (``dlq_since_ms``, see :mod:`pipeline.core.dead_positions`): dead
letters for positions at or after the committed offset may already be on the DLQ, and
are not produced twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

TAG: Final = "tailguard/1"


@dataclass(frozen=True, slots=True)
class CommitMeta:
    """What a tailguard commit says about the offset it commits."""

    topic_id: str
    # the DLQ holds every letter for a position at or after this offset from this time on
    dlq_since_ms: int | None = None


def commit_metadata(meta: CommitMeta) -> str:
    """The metadata string of a commit (well under the broker's 4096-byte default limit)."""
    text = f"{TAG};topic_id={meta.topic_id}"
    if meta.dlq_since_ms is not None:
        text += f";dlq_since_ms={meta.dlq_since_ms}"
    return text


def parse_commit_metadata(text: str | None) -> CommitMeta | None:
    """The commit's tailguard metadata; None when the commit was not made by tailguard
    (empty metadata: an older version, another tool) or cannot be read."""
    if not text or not text.startswith(TAG + ";"):
        return None
    fields: dict[str, str] = {}
    for part in text[len(TAG) + 1 :].split(";"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    topic_id = fields.get("topic_id")
    if not topic_id:
        return None
    dlq = fields.get("dlq_since_ms")
    try:
        dlq_since_ms = int(dlq) if dlq is not None else None
    except ValueError:
        dlq_since_ms = None
    return CommitMeta(topic_id, dlq_since_ms)


def commit_applies(metadata: str | None, current_topic_id: str | None) -> bool:
    """Whether a committed offset may be resumed from: True for a commit of the topic's
    current generation, and for one without tailguard metadata (nothing to check it
    against: made before this version); False for a commit of another generation, and
    for any tailguard commit while the topic does not exist."""
    meta = parse_commit_metadata(metadata)
    if meta is None:
        return True
    return current_topic_id is not None and meta.topic_id == current_topic_id
