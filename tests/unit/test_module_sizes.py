"""Sizes that keep the code readable: no module of pipeline/adapters/ (its packages
included) over 600 lines (issue 38); no function over 120 lines and no class over 350 in
any shipped module, that is every ``.py`` of the checkout outside ``tests/`` (pipeline/,
producers/, tools/, bench/, setup.py: issue 50); at most six modules loose at pipeline/
top level.

Each known exception names the work that removes it; an exception that no longer holds
is reported, so that the lists only shrink.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

import pytest

from tests.paths import REPO

PIPELINE = REPO / "pipeline"
ADAPTERS = PIPELINE / "adapters"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 350
MAX_FUNCTION_LINES = 120
# Top-level folders of the checkout that ship nothing: the tests, and what builds leave.
NOT_SHIPPED = frozenset({"tests", "build", "dist", "var"})

# path relative to pipeline/ -> the work that removes it
KNOWN_LONG_MODULES: dict[str, str] = {}
# "path:Class" relative to the checkout -> the work that removes it
KNOWN_LONG_CLASSES: dict[str, str] = {}
# "path:function" (a method: "path:Class.method") relative to the checkout -> the work
KNOWN_LONG_FUNCTIONS: dict[str, str] = {}


def shipped_modules(root: Path = REPO) -> list[Path]:
    """Every ``.py`` under ``root`` but the tests' and the builds' (``NOT_SHIPPED`` at the
    top) and those in hidden or generated folders (virtualenvs, caches, ``target``)."""
    found: list[Path] = []
    for folder, subs, files in os.walk(root):
        here = Path(folder)
        subs[:] = sorted(
            d
            for d in subs
            if not d.startswith(".")
            and d not in {"__pycache__", "target"}
            and not d.endswith(".egg-info")
            and not (here == root and d in NOT_SHIPPED)
        )
        found.extend(here / f for f in sorted(files) if f.endswith(".py"))
    return found


def long_modules(root: Path, limit: int, base: Path = PIPELINE) -> dict[str, int]:
    """``{module: lines}`` of the modules under ``root`` longer than ``limit`` lines (the
    module's path relative to ``base``)."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found[path.relative_to(base).as_posix()] = lines
    return found


def _definitions(tree: ast.Module) -> Iterable[tuple[str, ast.AST]]:
    """Every class and function of a module with its qualified name (``C.f``, ``f.g``)."""
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                name += "."
            stack.append((name, child))


Parsed = list[tuple[Path, ast.Module]]
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def parsed(paths: Iterable[Path]) -> Parsed:
    return [(path, ast.parse(path.read_text())) for path in paths]


def long_definitions(
    modules: Parsed, limit: int, kind: type | tuple[type, ...], base: Path = REPO
) -> dict[str, int]:
    """``{"module:Name": lines}`` of the definitions of ``kind`` (``ast.ClassDef``, or
    ``FUNCTIONS``) in ``modules`` longer than ``limit`` lines, decorators left out."""
    found: dict[str, int] = {}
    for path, tree in modules:
        for name, node in _definitions(tree):
            if isinstance(node, kind):
                end = getattr(node, "end_lineno", None)
                lines = (end or 0) - getattr(node, "lineno", 0) + 1
                if lines > limit:
                    found[f"{path.relative_to(base).as_posix()}:{name}"] = lines
    return found


def long_classes(root: Path, limit: int, base: Path = PIPELINE) -> dict[str, int]:
    """``{"module:Class": lines}`` of the classes under ``root`` longer than ``limit``."""
    return long_definitions(parsed(sorted(root.rglob("*.py"))), limit, ast.ClassDef, base)


def long_functions(root: Path, limit: int, base: Path = REPO) -> dict[str, int]:
    """``{"module:function": lines}`` of the functions under ``root`` (methods and nested
    ones included) longer than ``limit`` lines."""
    return long_definitions(parsed(sorted(root.rglob("*.py"))), limit, FUNCTIONS, base)


# The scans of the tree, once per process and only when a test runs: at collection time
# (a parameter's value) every xdist worker parsed the whole tree (~1 CPU s each).
@cache
def _long_adapter_modules() -> dict[str, int]:
    return long_modules(ADAPTERS, MAX_MODULE_LINES)


@cache
def _shipped() -> Parsed:
    return parsed(shipped_modules())


@cache
def _long_shipped_classes() -> dict[str, int]:
    return long_definitions(_shipped(), MAX_CLASS_LINES, ast.ClassDef)


@cache
def _long_shipped_functions() -> dict[str, int]:
    return long_definitions(_shipped(), MAX_FUNCTION_LINES, FUNCTIONS)


SCANS = [
    (_long_adapter_modules, KNOWN_LONG_MODULES, "modules"),
    (_long_shipped_classes, KNOWN_LONG_CLASSES, "classes"),
    (_long_shipped_functions, KNOWN_LONG_FUNCTIONS, "functions"),
]


@pytest.mark.parametrize(("scan", "known", "what"), SCANS)
def test_nothing_new_is_too_long(
    scan: Callable[[], dict[str, int]], known: dict[str, str], what: str
) -> None:
    new = {name: n for name, n in scan().items() if name not in known}
    assert not new, f"{what} over the limit (lines): {new}; split them"


@pytest.mark.parametrize(("scan", "known", "what"), SCANS)
def test_every_known_exception_still_holds(
    scan: Callable[[], dict[str, int]], known: dict[str, str], what: str
) -> None:
    """A known exception that was split is taken off its list."""
    stale = sorted(set(known) - set(scan()))
    assert not stale, f"{what} no longer over the limit, take them off the list: {stale}"


def test_the_check_sees_a_long_module_class_and_function(tmp_path: Path) -> None:
    """The scans themselves: a module, a class, a method and a nested function over the
    limit are found, and nothing at the limit."""
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    (tmp_path / "m.py").write_text(f"class C:\n{body}\n\n\ny = 1\n")
    assert long_modules(tmp_path, 8, tmp_path) == {"m.py": 9}
    assert long_modules(tmp_path, 9, tmp_path) == {}
    assert long_classes(tmp_path, 5, tmp_path) == {"m.py:C": 6}
    assert long_classes(tmp_path, 6, tmp_path) == {}
    lines = "\n".join(f"            x{i} = {i}" for i in range(4))
    (tmp_path / "f.py").write_text(
        f"class D:\n    def f(self):\n        def g():\n{lines}\n\n\nasync def h():\n    pass\n"
    )
    assert long_functions(tmp_path, 4, tmp_path) == {"f.py:D.f": 6, "f.py:D.f.g": 5}
    assert long_functions(tmp_path, 5, tmp_path) == {"f.py:D.f": 6}
    assert long_functions(tmp_path, 6, tmp_path) == {}
    assert long_functions(tmp_path, 1, tmp_path)["f.py:h"] == 2


@pytest.mark.parametrize(
    ("path", "shipped"),
    [
        ("pipeline/core/x.py", True),
        ("producers/simulator/x.py", True),
        ("tools/dev/x.py", True),
        ("bench/x.py", True),
        ("setup.py", True),
        ("tests/unit/x.py", False),
        ("pipeline/tests/x.py", True),  # only the top-level tests/ is left out
        (".venv/lib/x.py", False),
        ("pipeline/__pycache__/x.py", False),
        ("native/target/x.py", False),
        ("var/x.py", False),
    ],
)
def test_the_shipped_modules_are_every_module_outside_tests(
    tmp_path: Path, path: str, shipped: bool
) -> None:
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text("")
    assert (tmp_path / path in shipped_modules(tmp_path)) is shipped


def test_the_repo_scan_covers_every_shipped_folder() -> None:
    """The checkout's own scan reaches producers/, tools/ and bench/ (issue 50), not only
    pipeline/."""
    tops = {p.relative_to(REPO).parts[0] for p in shipped_modules()}
    assert {"pipeline", "producers", "tools", "bench"} <= tops
    assert "tests" not in tops


MAX_LOOSE_MODULES = 6  # pipeline/*.py: the CLI, its settings and the package marker


def test_few_modules_loose_at_the_top_level() -> None:
    """The user's verbs live in pipeline/app/, the layers in their packages: at most six
    modules directly under pipeline/ (issue 38)."""
    loose = sorted(p.name for p in PIPELINE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose
