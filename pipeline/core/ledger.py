"""The ledger: which requests the store's windows count, by partition and offset.

Every insert of windows (and corrections) carries, per source partition, the requests
it counted (request id -> version, :func:`pipeline.core.windows.ledger_code`) and the
offset ``through`` below which that partition's input is accounted for. A worker that
takes a partition over resumes at the committed offset ``C`` and re-reads what follows;
every request it rebuilds from there that some window already counts is in the entries
with ``through > C``, so it is not counted again (``pipeline.core.processor``).

A topic generation that ends (the topic deleted, or deleted and created again) is
finished by the worker that held it (``StreamProcessor.finish``): its open windows are
written with ``through`` = :data:`ENDED_THROUGH`, which records that generation as ended.
Offsets of a later generation start again at 0 and say nothing about the ended one, so a
reader counts an entry written before the partition's last end mark by time only (within
``memory_ms`` of the newest window: a request of it whose events reappear on the new
topic meanwhile is not counted again), never by its ``through``; entries after the mark
are read as before. Without the mark a new generation read from offset 0 took every
entry of the old one (all ``through > 0``) for one it may re-read.

The ledger lives in two places: on the ``__slo__`` row of each window insert (atomic with
the counts: what one store needs) and on the ``tailguard.ledger`` topic (partition =
source partition), which is what workers with separate stores share. The topic's wire
format is ``pipeline.contract.ledger``; this module holds what the ledger means; pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Protocol

from pipeline.contract.ledger import LedgerEntry

CODE_BITS: Final = 5  # a ledger code: see pipeline.core.windows.ledger_code
CODE_MASK: Final = (1 << CODE_BITS) - 1
# Set on the code of a version a window took back (a partial replaced by its upgrade): the
# store counts no version of that request until the replacing add is written.
RETRACTED: Final = 16


# The ``through`` of the windows that finish an ended topic generation (its end mark).
ENDED_THROUGH: Final = -1


def pack(code: int, end_ms: int) -> int:
    """A ledger code with the end of the window that counted it (what a worker seeds its
    memory of resolved requests with: see ``StreamProcessor.init_partition``)."""
    return code | (max(end_ms, 0) << CODE_BITS)


def unpack(packed: int) -> tuple[int, int]:
    """``(code, end_ms)`` of :func:`pack`."""
    return packed & CODE_MASK, packed >> CODE_BITS


def code_order(code: int) -> int:
    """How far a ledger code's version is (higher replaces): its revision, then
    superseded (``pipeline.core.record.store_version``), then taken back."""
    return 4 * (code & 3) + 2 * ((code >> 3) & 1) + ((code >> 4) & 1)


def merge_versions(into: dict[str, int], more: Mapping[str, int]) -> None:
    """Keep, per request, the furthest version (:func:`code_order`)."""
    if into.keys().isdisjoint(more):  # the common case: no request in both (one C call)
        into.update(more)
        return
    for rid, code in more.items():
        have = into.get(rid)
        if have is None or code_order(code & CODE_MASK) > code_order(have & CODE_MASK):
            into[rid] = code


class CountedWindow(Protocol):
    """What :func:`ledger_entries` reads of a closed window."""

    @property
    def partition(self) -> int: ...
    @property
    def start_ms(self) -> int: ...
    @property
    def size_ms(self) -> int: ...
    @property
    def ledger(self) -> Mapping[str, int]: ...


def ledger_entries(
    topic: str, windows: Iterable[CountedWindow], through: Mapping[int, int]
) -> list[LedgerEntry]:
    """One entry per source partition for the windows of one store insert: the furthest
    version of each request among them (:func:`merge_versions`: a window taking a
    partial back may come after the one adding its upgrade)."""
    per: dict[int, dict[str, int]] = {}
    ends: dict[int, int] = {}
    for w in windows:
        if w.ledger:
            merge_versions(per.setdefault(w.partition, {}), w.ledger)
            ends[w.partition] = max(ends.get(w.partition, 0), w.start_ms + w.size_ms)
    return [LedgerEntry(topic, p, through.get(p, 0), v, ends[p]) for p, v in per.items()]


def counted_since(
    entries: Iterable[LedgerEntry], topic: str, partition: int, from_offset: int, memory_ms: int
) -> dict[str, int]:
    r"""What the entries (in the order they were written) say is counted for one
    partition: every request written past ``from_offset`` (it may be re-read) since the
    partition's last end mark (:data:`ENDED_THROUGH`: earlier entries are of a generation
    that ended), and every request counted within ``memory_ms`` of the newest window (a
    duplicate of it may still come: the previous owner would have remembered it).
    Values are :func:`pack`\ ed."""
    mine = [e for e in entries if e.topic == topic and e.partition == partition]
    if not mine:
        return {}
    since = max(e.end_ms for e in mine) - memory_ms
    ended = max((i for i, e in enumerate(mine) if e.through == ENDED_THROUGH), default=-1)
    out: dict[str, int] = {}
    for i, e in enumerate(mine):
        if (i > ended and e.through > from_offset) or e.end_ms >= since:
            merge_versions(out, {rid: pack(code, e.end_ms) for rid, code in e.versions.items()})
    return out
