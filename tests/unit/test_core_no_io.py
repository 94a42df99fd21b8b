"""pipeline/core is pure: no module under it imports (directly) something that does I/O.

An AST scan of every module of pipeline/core: an ``import``/``from ... import`` of a
module on the list below (or a submodule of one), or a call of ``open(...)``, fails
the test; imports under ``if TYPE_CHECKING:`` never run and do not count. Files,
environment and brokers belong to pipeline/spec (spec files) and pipeline/adapters.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO

CORE = REPO / "pipeline" / "core"

IO_MODULES = frozenset(
    {
        "os",
        "pathlib",
        "io",
        "socket",
        "subprocess",
        "shutil",
        "tempfile",
        "glob",
        "yaml",
        "confluent_kafka",
        "faust",
        "aiokafka",
        "chdb",
        "clickhouse_connect",
        "requests",
        "urllib",
        "http",
    }
)

# Modules that still do I/O, each with the work that removes it (none: the control
# signal's key files and os.environ moved to producers/control_keys.py).
KNOWN_EXCEPTIONS: dict[str, str] = {}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def io_uses(source: str) -> list[str]:
    """``"line N: import os"``-style findings for one module's source."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in IO_MODULES:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 0 and mod.split(".")[0] in IO_MODULES:
                found.append(f"line {node.lineno}: from {mod} import ...")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "open"
        ):
            found.append(f"line {node.lineno}: open(...)")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def _core_modules() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


@pytest.mark.parametrize("path", _core_modules(), ids=lambda p: p.relative_to(CORE).as_posix())
def test_core_module_does_no_io(path: Path) -> None:
    name = path.relative_to(CORE).as_posix()
    found = io_uses(path.read_text(encoding="utf-8"))
    if name in KNOWN_EXCEPTIONS:
        assert found, f"{name} no longer does I/O: remove it from KNOWN_EXCEPTIONS"
        return
    assert not found, f"pipeline/core/{name} does I/O: " + "; ".join(found)


def test_known_exceptions_exist() -> None:
    names = {p.relative_to(CORE).as_posix() for p in _core_modules()}
    assert set(KNOWN_EXCEPTIONS) <= names


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os", ["line 1: import os"]),
        ("import os.path as p", ["line 1: import os.path"]),
        ("from pathlib import Path", ["line 1: from pathlib import ..."]),
        ("import yaml", ["line 1: import yaml"]),
        ("from urllib.request import urlopen", ["line 1: from urllib.request import ..."]),
        ("import confluent_kafka", ["line 1: import confluent_kafka"]),
        ("def f():\n    import chdb\n", ["line 2: import chdb"]),
        ("x = open('f')", ["line 1: open(...)"]),
        ("def f():\n    with open('f') as fh:\n        pass\n", ["line 2: open(...)"]),
        ("import math\nfrom collections import OrderedDict", []),
        ("from . import os", []),  # a relative import of a sibling named os
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pathlib import Path\n", []),
        ("if TYPE_CHECKING:\n    pass\nelse:\n    import os\n", ["line 4: import os"]),
        ("import typing\nif typing.TYPE_CHECKING:\n    import io\n", []),
        ("f.open('x')", []),  # a method named open is not the builtin
    ],
)
def test_scan_finds_io(source: str, expected: list[str]) -> None:
    assert io_uses(source) == expected
