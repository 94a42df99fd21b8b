"""The kinds of tailguard/v1 file, found by module: ``tailguard validate`` dispatches here.

Every module of :mod:`pipeline.spec` that defines ``SPEC_KIND`` (a :class:`Kind`: a
:class:`~pipeline.spec.loader.SpecFormat`, or a :class:`SpecKind` for a kind with its
own way of validating) is a kind; a new kind is one new module, nothing else to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

import yaml

DEFAULT_KIND: Final = "SLOSpec"  # a file without a readable kind is validated as a spec


@runtime_checkable
class Kind(Protocol):
    """A ``kind:`` and how ``tailguard validate`` checks a file of it."""

    @property
    def name(self) -> str: ...

    def validate(self, path: str | Path) -> tuple[bool, str]:
        """``(ok, message)``, the message printed as is."""
        ...


@dataclass(frozen=True, slots=True)
class SpecKind:
    """One ``kind:`` and how ``tailguard validate`` checks a file of it:
    ``validate(path)`` -> ``(ok, message)``, the message printed as is."""

    name: str
    validate: Callable[[str | Path], tuple[bool, str]]


def discover(package_name: str) -> dict[str, Kind]:
    """The kinds the modules of a package define (``SPEC_KIND``), by name."""
    package = importlib.import_module(package_name)
    found: dict[str, Kind] = {}
    for info in pkgutil.iter_modules(package.__path__, package_name + "."):
        kind = getattr(importlib.import_module(info.name), "SPEC_KIND", None)
        if isinstance(kind, Kind):
            if kind.name in found:
                raise RuntimeError(f"spec kind {kind.name!r} defined twice ({info.name})")
            found[kind.name] = kind
    return found


@cache
def kinds() -> dict[str, Kind]:
    """Every kind of :mod:`pipeline.spec`, by name (its modules are imported once)."""
    return discover("pipeline.spec")


def kind_of(path: Path) -> str:
    """The ``kind:`` a file declares; :data:`DEFAULT_KIND` when it cannot be read (the
    spec loader then reports why)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return DEFAULT_KIND  # let the SLO validator report it
    return str(doc.get("kind", DEFAULT_KIND)) if isinstance(doc, dict) else DEFAULT_KIND


def validate_path(path: Path) -> tuple[bool, str]:
    """``tailguard validate FILE``: ``(ok, message)`` from the validator of its kind
    (an unknown kind is validated as an SLO spec, which names the kinds it accepts)."""
    known = kinds()
    kind = known.get(kind_of(path), known[DEFAULT_KIND])
    return kind.validate(path)
