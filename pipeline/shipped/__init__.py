"""Files shipped with the package, found with :mod:`importlib.resources`.

One source of truth: the repository's top-level ``specs/``, ``sql/`` and ``data/``
directories. This package holds symbolic links to them (``specs``, ``sql``, ``data``), so a
checkout and an editable install read the top-level files through the links, and a wheel
holds copies of them (``[tool.setuptools.package-data]`` in pyproject.toml; the build
follows the links). Nothing here reads a file: these are the paths the CLI and the
settings start from.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Final


def shipped_path(*parts: str) -> Path:
    """The path of a shipped file (a wheel is installed unpacked, so it is a real file)."""
    found = files(__name__).joinpath(*parts)
    if not isinstance(found, Path):  # a zip import: not how pip installs a wheel
        raise TypeError(f"tailguard's shipped files must be on a file system, got {found!r}")
    return found.resolve()  # in a checkout: the top-level file itself, not the link


SPECS_DIR: Final = shipped_path("specs")
SQL_DIR: Final = shipped_path("sql")  # versioned ClickHouse migrations
DEFAULT_SLO_SPEC: Final = SPECS_DIR / "slo-default.yaml"  # streaming LLM SLOs
EXAMPLE_SLO_SPEC: Final = SPECS_DIR / "slo-example.yaml"  # the source documents' contract tiers
DEFAULT_POLICY: Final = SPECS_DIR / "policy-default.yaml"
EXAMPLE_POLICY: Final = SPECS_DIR / "policy-example.yaml"  # their circuit-breaker table as written
# The static levels shipped before capacity-aware admission: the backtest's baseline.
STATIC_POLICY: Final = SPECS_DIR / "policy-static-levels.yaml"
DEFAULT_BURN_RULES: Final = SPECS_DIR / "burn-rules.yaml"
EXAMPLE_CONTRACT: Final = SPECS_DIR / "contract-example.yaml"
DEFAULT_TRACE: Final = shipped_path("data", "azure-llm-2023", "conv.csv")  # the demo's trace
