"""Which implementation of the core's hot path runs: the native extension or Python.

The extension ``tailguard_native`` (Rust, PyO3; built from ``native/`` by ``./tg``) holds
ports of three pure-Python references that stay in the tree:

* ``PartitionClock``: :class:`pipeline.core.eventtime.PartitionClock`, the per-partition
  event clock the processor calls on every event;
* ``sketch_bump``: the bin update of :meth:`pipeline.core.sketch.QuantileSketch.add_many`
  and ``remove_many`` (the windows' sketch accumulation);
* ``boundary_table``: :func:`pipeline.core.slo.boundary_table`, the records' boundary
  values as the float table the windows and SLO counts of a batch read.

All three give results identical to the references (``tests/unit/test_native_diff.py``
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

from pipeline.core.eventtime import ClockConfig, PartitionClock

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
    sketch_bump: Any  # tailguard_native.sketch_bump, or None for the reference
    boundary_table: Any  # tailguard_native.boundary_table, or None for the reference

    def describe(self) -> str:
        """One line for the start log: which implementation runs, and why."""
        if self.name == "native":
            return f"core hot path: native (tailguard_native {_ext.__version__})"
        why = "forced" if _ext is not None else "tailguard_native not built"
        return f"core hot path: python ({why})"


PYTHON: Final = CoreImpl("python", PartitionClock, None, None)
NATIVE: Final[CoreImpl | None] = (
    CoreImpl("native", _ext.PartitionClock, _ext.sketch_bump, _ext.boundary_table)
    if _ext is not None
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
            raise ValueError(
                "core_impl=native but the tailguard_native extension is not built "
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


def sketch_kernel() -> Callable[..., tuple[int, int, float]] | None:
    """The native sketch kernel when the native implementation is selected, else None."""
    bump: Callable[..., tuple[int, int, float]] | None = _active[0].sketch_bump
    return bump


def table_kernel() -> Callable[[Any, tuple[str, ...]], bytearray] | None:
    """The native boundary table when the native implementation is selected, else None."""
    table: Callable[[Any, tuple[str, ...]], bytearray] | None = _active[0].boundary_table
    return table
