"""Event contract v1 (pure: pydantic, msgspec and orjson only)."""

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
