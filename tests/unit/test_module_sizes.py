"""Sizes that keep the layout readable (issue 38): no module of pipeline/adapters/ (its
packages included) over 600 lines, no class of pipeline/ over 350, at most six modules
loose at pipeline/ top level.

Each known exception names the work that removes it; an exception that no longer holds
is reported, so that the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from tests.paths import REPO

PIPELINE = REPO / "pipeline"
ADAPTERS = PIPELINE / "adapters"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 350

# path relative to pipeline/ -> the work that removes it
KNOWN_LONG_MODULES: dict[str, str] = {}
# "path:Class" relative to pipeline/ -> the work that removes it
KNOWN_LONG_CLASSES: dict[str, str] = {}


def long_modules(root: Path, limit: int, base: Path = PIPELINE) -> dict[str, int]:
    """``{module: lines}`` of the modules under ``root`` longer than ``limit`` lines (the
    module's path relative to ``base``)."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found[path.relative_to(base).as_posix()] = lines
    return found


def long_classes(root: Path, limit: int, base: Path = PIPELINE) -> dict[str, int]:
    """``{"module:Class": lines}`` of the classes under ``root`` longer than ``limit``."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found[f"{path.relative_to(base).as_posix()}:{node.name}"] = lines
    return found


# The scans of the tree, once per process and only when a test runs: at collection time
# (a parameter's value) every xdist worker parsed all of pipeline/ (~1 CPU s each).
@cache
def _long_adapter_modules() -> dict[str, int]:
    return long_modules(ADAPTERS, MAX_MODULE_LINES)


@cache
def _long_pipeline_classes() -> dict[str, int]:
    return long_classes(PIPELINE, MAX_CLASS_LINES)


@pytest.mark.parametrize(
    ("scan", "known", "what"),
    [
        (_long_adapter_modules, KNOWN_LONG_MODULES, "modules"),
        (_long_pipeline_classes, KNOWN_LONG_CLASSES, "classes"),
    ],
)
def test_nothing_new_is_too_long(
    scan: Callable[[], dict[str, int]], known: dict[str, str], what: str
) -> None:
    new = {name: n for name, n in scan().items() if name not in known}
    assert not new, f"{what} over the limit (lines): {new}; split them"


def test_every_known_exception_still_holds() -> None:
    """A known exception that was split is taken off its list."""
    stale = set(KNOWN_LONG_MODULES) - set(_long_adapter_modules())
    stale |= set(KNOWN_LONG_CLASSES) - set(_long_pipeline_classes())
    assert not stale, f"no longer over the limit, take them off the lists: {sorted(stale)}"


def test_the_check_sees_a_long_module_and_class(tmp_path: Path) -> None:
    """The scan itself: a module over the limit and a class over it are found."""
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    (tmp_path / "m.py").write_text(f"class C:\n{body}\n\n\ny = 1\n")
    assert long_modules(tmp_path, 8, tmp_path) == {"m.py": 9}
    assert long_modules(tmp_path, 9, tmp_path) == {}
    assert long_classes(tmp_path, 5, tmp_path) == {"m.py:C": 6}
    assert long_classes(tmp_path, 6, tmp_path) == {}


MAX_LOOSE_MODULES = 6  # pipeline/*.py: the CLI, its settings and the package marker


def test_few_modules_loose_at_the_top_level() -> None:
    """The user's verbs live in pipeline/app/, the layers in their packages: at most six
    modules directly under pipeline/ (issue 38)."""
    loose = sorted(p.name for p in PIPELINE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose
