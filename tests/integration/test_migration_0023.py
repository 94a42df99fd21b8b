"""Migration 0023 (``latency_1m``'s sketch bins as plain arrays, in granules of 1,024
rows, issue 53) upgrades a store written before it: the minute rollup holds the same
counts and bins after it (merged by ``sumMap`` of its arrays, as ``sumMapMerge`` merged
its states), its view fills it from the windows written after, the report's and the
dashboards' minute reads answer as before, and the rollup repair finds nothing to set
right (the checks of 0019's test, on the minute rollup)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_migration_0019 import assert_bins_become_arrays

pytestmark = pytest.mark.integration


def test_0023_keeps_the_minute_rollup_as_arrays(tmp_path: Path) -> None:
    assert_bins_become_arrays(tmp_path, "0023_latency_1m_plain_bins", "latency_1m", 1024)
