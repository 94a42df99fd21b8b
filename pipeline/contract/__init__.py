"""Every wire format of tailguard (pure: pydantic, msgspec and orjson only).

* ``events``, ``codec``, ``wire``, ``partitioning``: the lifecycle and stats events
  (contract v1) on ``tailguard.lifecycle`` / ``tailguard.engine-stats``;
* ``control_signal``: the signed directives on ``tailguard.control``;
* ``summary`` (with ``sketch``): window summaries, stats samples and progress on
  ``tailguard.summaries``;
* ``boundaries``: the boundary names and context buckets that rows and summaries share.

The package namespace re-exports the event contract.
"""

from pipeline.contract.codec import (
    DeadLetter,
    Decoded,
    SourceRef,
    decode_message,
    encode_batch,
    encode_event,
)
from pipeline.contract.events import (
    DLQ_TOPIC,
    ENGINE_STATS_TOPIC,
    LIFECYCLE_TOPIC,
    EngineFinished,
    EngineStats,
    Event,
    GatewayCompleted,
    GatewayReceived,
    LifecycleEvent,
    json_schema,
)
from pipeline.contract.partitioning import murmur2, partition_for

__all__ = [
    "DLQ_TOPIC",
    "ENGINE_STATS_TOPIC",
    "LIFECYCLE_TOPIC",
    "DeadLetter",
    "Decoded",
    "EngineFinished",
    "EngineStats",
    "Event",
    "GatewayCompleted",
    "GatewayReceived",
    "LifecycleEvent",
    "SourceRef",
    "decode_message",
    "encode_batch",
    "encode_event",
    "json_schema",
    "murmur2",
    "partition_for",
]
