"""What a partition's windows counted, remembered after the join has forgotten it.

The join remembers a resolved request for ``resolved_ttl_ms`` of event time (ten
minutes by default): within it, a repeated event is a duplicate and a late partner an
upgrade. An event repeated *later* than that (a duplicate at a random position far
down the stream, a producer's retry after a long outage) reaches a join that has
forgotten its request, and it would be counted as a new request: the windows would
then hold it twice while ``requests`` (one row per request id) holds it once.

This archive is the second tier of that memory. Every window a partition closes
carries its ledger (request key -> ledger code, :func:`pipeline.core.windows.
ledger_code`); the archive keeps those codes, compactly, for ``ttl_ms`` of event time
and at most ``max_entries`` requests (the oldest forgotten first). When the join emits
a record for a request it does not remember, and the record is old enough that the
join could have forgotten it (its end at or before the clock less ``resolved_ttl_ms``),
the processor asks the archive; a request found there is handled like one counted by
an earlier owner of the partition (``_PartitionState.window`` in
``pipeline.core.processor``): the same version or an older one is not counted again, a
further one replaces what was counted.

Memory: ~9 bytes a request once frozen (a sorted ``uint64`` hash and a ``uint8``
code), plus a dict for the newest ``FREEZE_AT`` entries; lookups (rare: only for
records that old) are a binary search per generation. Keys are compared by a 64-bit
hash: two request ids that share one (about one chance in 10^7 at 10^6 entries held)
would make the later look counted; ``counted_before_records`` says how often it answered.

Pure: time is passed in, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np
from numpy.typing import NDArray

from pipeline.core.ledger import code_order

__all__ = ["CountedArchive"]

FREEZE_AT: Final = 65_536  # entries gathered in a dict before they become a generation
_M64: Final = (1 << 64) - 1


def _key_hash(key: str) -> int:
    return hash(key) & _M64


class _Generation:
    __slots__ = ("codes", "end_ms", "hashes")

    def __init__(self, entries: Mapping[int, int], end_ms: int) -> None:
        hashes = np.fromiter(entries.keys(), dtype=np.uint64, count=len(entries))
        codes = np.fromiter(entries.values(), dtype=np.uint8, count=len(entries))
        order = np.argsort(hashes, kind="stable")
        self.hashes: NDArray[np.uint64] = hashes[order]
        self.codes: NDArray[np.uint8] = codes[order]
        self.end_ms = end_ms

    def get(self, h: int) -> int | None:
        i = int(np.searchsorted(self.hashes, np.uint64(h)))
        if i < len(self.hashes) and int(self.hashes[i]) == h:
            return int(self.codes[i])
        return None

    def __len__(self) -> int:
        return len(self.hashes)


class CountedArchive:
    """Request key -> the furthest ledger code a closed window counted (see module)."""

    __slots__ = (
        "_buffer", "_buffer_end_ms", "_gens", "_len", "_max", "_ttl_ms", "enabled",
    )  # fmt: skip

    def __init__(self, ttl_ms: int, max_entries: int) -> None:
        if ttl_ms < 0 or max_entries < 0:
            raise ValueError("CountedArchive: ttl_ms and max_entries must be >= 0")
        self._ttl_ms = ttl_ms
        self._max = max_entries
        self._buffer: dict[int, int] = {}
        self._buffer_end_ms = 0
        self._gens: list[_Generation] = []  # oldest first
        self._len = 0  # entries in the generations
        self.enabled = max_entries > 0 and ttl_ms > 0

    def __len__(self) -> int:
        return self._len + len(self._buffer)

    def add(self, ledger: Mapping[str, int], end_ms: int) -> None:
        """The ledger of a window ending at ``end_ms`` (a correction's too)."""
        if not ledger or not self.enabled:
            return
        buf = self._buffer
        hashes = [hash(key) & _M64 for key in ledger]
        if buf.keys().isdisjoint(hashes):  # the common case: one C call
            buf.update(zip(hashes, ledger.values(), strict=True))
        else:
            for h, code in zip(hashes, ledger.values(), strict=True):
                have = buf.get(h)
                if have is None or code_order(code) >= code_order(have):
                    buf[h] = code
        self._buffer_end_ms = max(self._buffer_end_ms, end_ms)
        if len(buf) >= FREEZE_AT:
            self._freeze()

    def get(self, key: str) -> int | None:
        """The furthest code counted for ``key`` that is still remembered, or None."""
        if not self.enabled:
            return None
        h = _key_hash(key)
        code = self._buffer.get(h)
        if code is None:
            for gen in reversed(self._gens):  # newest first: versions only move forward
                code = gen.get(h)
                if code is not None:
                    break
        return code

    def expire(self, now_ms: int) -> None:
        """Event time is ``now_ms``: forget generations whose newest window ended more
        than ``ttl_ms`` before it, and the oldest ones over ``max_entries``."""
        gens = self._gens
        while gens and (gens[0].end_ms + self._ttl_ms <= now_ms or self._len > self._max):
            self._len -= len(gens.pop(0))

    def _freeze(self) -> None:
        if self._buffer:
            self._gens.append(_Generation(self._buffer, self._buffer_end_ms))
            self._len += len(self._gens[-1])
            self._buffer = {}
            self._buffer_end_ms = 0
            while self._gens and self._len > self._max:
                self._len -= len(self._gens.pop(0))
