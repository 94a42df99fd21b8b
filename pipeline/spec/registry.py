"""The kinds of tailguard/v1 file, found by module: ``tailguard validate`` dispatches here.

Every module of :mod:`pipeline.spec` that defines ``SPEC_KIND`` (a :class:`SpecKind`)
is a kind; a new kind is one new module, nothing else to edit.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

import yaml

DEFAULT_KIND: Final = "SLOSpec"  # a file without a readable kind is validated as a spec


@dataclass(frozen=True, slots=True)
class SpecKind:
    """One ``kind:`` and how ``tailguard validate`` checks a file of it:
    ``validate(path)`` -> ``(ok, message)``, the message printed as is."""

    name: str
    validate: Callable[[str | Path], tuple[bool, str]]


@cache
def kinds() -> dict[str, SpecKind]:
    """Every kind, by name (imports the modules of :mod:`pipeline.spec` once)."""
    import pipeline.spec as package

    found: dict[str, SpecKind] = {}
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        kind = getattr(importlib.import_module(info.name), "SPEC_KIND", None)
        if isinstance(kind, SpecKind):
            if kind.name in found:
                raise RuntimeError(f"spec kind {kind.name!r} defined twice ({info.name})")
            found[kind.name] = kind
    return found


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
