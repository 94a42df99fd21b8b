"""Where the tests find the checkout's own files: its root, the shared trace, the shipped
specs and the unit tests' data."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACE = REPO / "data" / "azure-llm-2023" / "conv.csv"
SPECS = REPO / "specs"
UNIT_TESTDATA = REPO / "tests" / "unit" / "testdata"
