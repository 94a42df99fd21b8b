"""Every Kafka topic tailguard reads or writes, with the module that defines its bytes.

One table for maintainers and tests (``tests/unit/test_topics.py`` checks it against the
settings, the modules and ARCHITECTURE.md). Topic names are the defaults; each can be
renamed by its setting (``pipeline/kafka_settings.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipeline.contract.events import (
    CONTROL_TOPIC,
    DLQ_TOPIC,
    ENGINE_STATS_TOPIC,
    LEDGER_TOPIC,
    LIFECYCLE_TOPIC,
    SUMMARIES_TOPIC,
)

__all__ = ["TOPICS", "Topic"]


@dataclass(frozen=True, slots=True)
class Topic:
    name: str  # the default name
    setting: str  # the KafkaSettings field that renames it
    format: str  # the module of pipeline.contract that defines its messages
    key: str  # what a message's key is
    what: str


TOPICS: Final = (
    Topic(
        LIFECYCLE_TOPIC, "lifecycle_topic", "pipeline.contract.events",
        "request id (murmur2 partitioning: pipeline.contract.partitioning)",
        "lifecycle events of contract v1, one event or a JSON array of them per message "
        "(decoded by pipeline.contract.wire, dead letters by pipeline.contract.codec)",
    ),
    Topic(
        ENGINE_STATS_TOPIC, "engine_stats_topic", "pipeline.contract.events",
        "engine host", "engine.stats events (queue depth, batch, KV cache, GPU memory)",
    ),
    Topic(
        DLQ_TOPIC, "dlq_topic", "pipeline.contract.codec",
        "none", "dead letters: the bytes as received, the reason and the source position "
        "in headers (DeadLetter)",
    ),
    Topic(
        SUMMARIES_TOPIC, "summaries_topic", "pipeline.contract.summary",
        "none", "internal, workers -> the controller: window summaries (v2), engine stats "
        "samples and progress marks",
    ),
    Topic(
        LEDGER_TOPIC, "ledger_topic", "pipeline.contract.ledger",
        "none (partition = source partition)", "internal: the requests each window insert "
        "counted, per source partition, and the offset they account for",
    ),
    Topic(
        CONTROL_TOPIC, "control_topic", "pipeline.contract.control_signal",
        "scope (compacted)", "signed control directives, one current per scope",
    ),
)  # fmt: skip
