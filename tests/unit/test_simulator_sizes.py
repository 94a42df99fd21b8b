"""The simulator stays readable (issue 52): no class of producers/simulator/ over 350
lines, no function over 120 (the 709-line ``Simulator`` was split into its state,
engines, gateways and run loop)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import REPO
from tests.unit.test_module_sizes import MAX_CLASS_LINES, long_classes

SIMULATOR = REPO / "producers" / "simulator"
MAX_FUNCTION_LINES = 120


def long_functions(root: Path, limit: int) -> dict[str, int]:
    """``{"module:function": lines}`` of the functions under ``root`` over ``limit``."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return found


def test_no_class_of_the_simulator_is_too_long() -> None:
    found = long_classes(SIMULATOR, MAX_CLASS_LINES, SIMULATOR)
    assert not found, f"classes over {MAX_CLASS_LINES} lines: {found}; split them"


def test_no_function_of_the_simulator_is_too_long() -> None:
    found = long_functions(SIMULATOR, MAX_FUNCTION_LINES)
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: {found}; split them"


def test_the_function_scan_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n")
    assert long_functions(tmp_path, 5) == {"m.py:f": 6}
    assert long_functions(tmp_path, 6) == {}
