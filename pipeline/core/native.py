"""Which implementation of the core's hot path runs: the native extension or Python.

The extension ``tailguard_native`` (Rust, PyO3; built from ``native/`` by ``./tg``) holds
ports of four pure-Python references that stay in the tree:

* ``Joiner``: :class:`pipeline.core.join.Joiner` (with ``join_state``, ``join_rules`` and
  ``join_timers``): the join per request id, the records it builds (the reference's
  :class:`~pipeline.core.record.RequestRecord` and :class:`~pipeline.core.join_state.
  Emitted`, built from Rust), its timers and resolved memory; the processor takes its
  joiner from here, so the worker, replay and backtest run either without knowing which.
  Its state stays per implementation: a partition's joiner lives and dies with the
  process (a restart or rebalance rebuilds it from the committed offset and the ledger,
  ``StreamProcessor.init_partition``), so nothing of it crosses from one to the other;
* ``PartitionClock``: :class:`pipeline.core.eventtime.PartitionClock`, the per-partition
  event clock the processor calls on every event;
* ``sketch_bump``: the bin update of :meth:`pipeline.core.sketch.QuantileSketch.add_many`
  and ``remove_many`` (the windows' sketch accumulation);
* ``boundary_table``: :func:`pipeline.core.slo.boundary_table`, the records' boundary
  values as the float table the windows and SLO counts of a batch read.

All four give results identical to the references (``tests/unit/test_native_diff.py``
compares them on hypothesis-generated inputs). Where the extension is not built (no Rust
toolchain), the Python references run.

The choice is made once, at start, by the CLI (setting ``core_impl``, see
:func:`select`): ``auto`` takes the extension when it imports, ``python`` forces the
references (differential tests, benches), ``native`` requires the extension (a start
error without it). Until then (a library user, a test) the process runs what ``auto``
picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from pipeline.core.eventtime import ClockConfig, PartitionClock
from pipeline.core.join import JoinConfig, Joiner
from pipeline.core.join_rules import _marks, _repeats, worse_terminal
from pipeline.core.join_state import (
    OFF_SHIFT,
    RESOLVED_EXPIRY_MASK,
    Emitted,
    JoinCounters,
    Received,
)
from pipeline.core.record import RequestRecord

if TYPE_CHECKING:
    from collections.abc import Callable

try:
    import tailguard_native as _ext
except ImportError:  # no Rust toolchain where it was installed: the references run
    _ext = None

CoreImplName = Literal["auto", "python", "native"]
IMPL_NAMES: Final = ("auto", "python", "native")

# The extension module, or None (kept as Any: it has no type stubs)
EXTENSION: Final[Any] = _ext


@dataclass(frozen=True, slots=True)
class CoreImpl:
    """The implementation the core's hot path uses (see the module doc)."""

    name: Literal["python", "native"]
    clock: Callable[[ClockConfig], Any]  # a PartitionClock (either kind)
    joiner: Callable[[JoinConfig], Any]  # a Joiner (either kind)
    sketch_bump: Any  # tailguard_native.sketch_bump, or None for the reference
    boundary_table: Any  # tailguard_native.boundary_table, or None for the reference

    def describe(self) -> str:
        """One line for the start log: which implementation runs, and why."""
        if self.name == "native":
            return f"core hot path: native (tailguard_native {_ext.__version__})"
        if _ext is None:
            why = "tailguard_native not built"
        elif not hasattr(_ext, "Joiner"):
            why = "tailguard_native is older than this tree: rebuild it (./tg)"
        else:
            why = "forced"
        return f"core hot path: python ({why})"


# What the native Joiner builds and calls back: the reference's own classes, its rules that
# compare whole events (rare: conflicting terminal events), and msgspec's astuple (it reads
# a Struct event's fields from one tuple).
_JOIN_HELPERS: Final = (
    RequestRecord, Emitted, Received, JoinCounters, _repeats, _marks, worse_terminal,
    msgspec.structs.astuple,
)  # fmt: skip


def _native_joiner(config: JoinConfig) -> Any:
    return _ext.Joiner(config, _JOIN_HELPERS)


PYTHON: Final = CoreImpl("python", PartitionClock, Joiner, None, None)
NATIVE: Final[CoreImpl | None] = (
    CoreImpl("native", _ext.PartitionClock, _native_joiner, _ext.sketch_bump, _ext.boundary_table)
    if _ext is not None and hasattr(_ext, "Joiner")
    else None
)

_active: list[CoreImpl] = [NATIVE or PYTHON]  # the selection (see select): auto at first


def resolve(requested: CoreImplName) -> CoreImpl:
    """The implementation ``requested`` names; :class:`ValueError` for ``native`` without
    the extension (bad config: raise at start) or an unknown name."""
    if requested == "python":
        return PYTHON
    if requested == "native":
        if NATIVE is None:
            stale = " for this tree (the one installed is older)" if _ext is not None else ""
            raise ValueError(
                f"core_impl=native but the tailguard_native extension is not built{stale} "
                "(./tg builds it with a Rust toolchain; core_impl=auto falls back to python)"
            )
        return NATIVE
    if requested == "auto":
        return NATIVE if NATIVE is not None else PYTHON
    raise ValueError(f"core_impl must be one of {IMPL_NAMES}, got {requested!r}")


def select(requested: CoreImplName) -> CoreImpl:
    """Make ``requested`` the process's implementation (once, at start, by the CLI).

    Both implementations give identical results, so a selection changes the speed of
    what runs after it, never its output.
    """
    impl = resolve(requested)
    _active[0] = impl
    return impl


def active() -> CoreImpl:
    return _active[0]


def join_view(
    joiner: Any,
) -> tuple[list[tuple[Any, ...]], dict[str, tuple[int, bool]], dict[str, int]]:
    """What a joiner (either kind) holds, for the differential tests and probes: its pending
    requests in order as (key, in flight, first offset, deadline ms, wall deadline ms,
    first terminal ms, attempt, retried, conflicts); its resolved memory as key ->
    (expiry ms, events kept); each request id's latest attempt (when more than one)."""
    if not isinstance(joiner, Joiner):
        view: Any = joiner.view()
        return view[0], view[1], view[2]
    timers = joiner._timers
    pending: list[tuple[Any, ...]] = []
    for key, e in joiner._pending.items():
        if isinstance(e, int):
            row = (key, True, e >> OFF_SHIFT, timers.deadline(e), timers.wall_deadline(e), 0, 1,
                   False, 0)  # fmt: skip
        else:
            row = (key, False, e.first_offset, e.deadline_ms, e.wall_deadline_ms, e.terminal_ms,
                   e.attempt, e.retried, e.conflicts)  # fmt: skip
        pending.append(row)
    resolved = {
        key: ((v & RESOLVED_EXPIRY_MASK, False) if isinstance(v, int) else (v.expires_ms, True))
        for key, v in joiner._resolved.items().items()
    }
    return pending, resolved, dict(joiner._attempts)


def sketch_kernel() -> Callable[..., tuple[int, int, float]] | None:
    """The native sketch kernel when the native implementation is selected, else None."""
    bump: Callable[..., tuple[int, int, float]] | None = _active[0].sketch_bump
    return bump


def table_kernel() -> Callable[[Any, tuple[str, ...]], bytearray] | None:
    """The native boundary table when the native implementation is selected, else None."""
    table: Callable[[Any, tuple[str, ...]], bytearray] | None = _active[0].boundary_table
    return table
