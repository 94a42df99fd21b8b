"""glibc malloc tuning for the long-running worker (see ``bench/memory_probe.py``).

CPython takes every block over 512 bytes (dict tables, lists, bytes, numpy arrays) from
the C allocator. glibc's defaults suit short programs, not a process that keeps a large,
churning heap for hours:

* its mmap threshold is *dynamic*: freeing a large mmapped block (a resized dict table,
  a flush's encoded rows) raises the threshold to that block's size (up to 32 MiB), so
  later blocks that size come from the heap instead, whose freed space is kept by the
  process (a heap is only trimmed at its top): RSS steps up and never comes back;
* every thread that allocates may get an arena of its own (up to 8 per core), each
  retaining its own free space.

A fixed mmap threshold (which also fixes the trim threshold) gives large blocks back to
the system when they are freed, and two arenas bound the per-thread retention. chDB's
engine allocates with its own jemalloc and is not affected.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Final

log = logging.getLogger(__name__)

# mallopt(3) parameters (malloc.h)
M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8

MMAP_THRESHOLD_BYTES: Final = 128 * 1024  # glibc's initial value, kept fixed
TRIM_THRESHOLD_BYTES: Final = 128 * 1024
ARENA_MAX: Final = 2


def tune_malloc() -> bool:
    """Fix glibc's mmap and trim thresholds and cap its arenas (see the module's doc).
    Returns False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("not glibc: malloc left as it is")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (M_ARENA_MAX, ARENA_MAX),
        )
    )
    if not ok:
        log.warning("mallopt refused a setting: glibc malloc partly tuned")
    return ok


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def malloc_stats() -> dict[str, int] | None:
    """glibc's ``mallinfo2`` over all arenas, in bytes: ``in_use`` (allocated from the
    heaps), ``free`` (free but held in the heaps), ``mmapped`` (large blocks, mmapped one
    by one); None where the C library has no ``mallinfo2`` (not glibc >= 2.33)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    m = fn()
    return {"in_use": m.uordblks, "free": m.fordblks, "mmapped": m.hblkhd}
