"""The one partition hash every tailguard producer uses.

``partition_for(request_id, n)`` is Apache Kafka's default partitioner for
keyed records: ``(murmur2(utf8(key)) & 0x7fffffff) % n`` (the Java client's
``Utils.murmur2``; librdkafka calls it ``murmur2_random``). A batch producer
groups events by this partition, and a single-event message may instead be
sent with ``key=request_id`` through any client configured with that
partitioner: both routes put every event of a request on the same partition.
"""

from __future__ import annotations

from typing import Final

_M: Final = 0x5BD1E995
_SEED: Final = 0x9747B28C
_MASK32: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 (as a signed Java int)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    n4 = length // 4
    for i in range(n4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    rem = length % 4
    tail = n4 * 4
    if rem == 3:
        h ^= data[tail + 2] << 16
    if rem >= 2:
        h ^= data[tail + 1] << 8
    if rem >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(request_id: str, num_partitions: int) -> int:
    """Partition of a request's events on a topic with ``num_partitions`` partitions."""
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    return (murmur2(request_id.encode("utf-8")) & 0x7FFFFFFF) % num_partitions
