"""glibc malloc tuning (pipeline.adapters.malloc): large blocks go back to the system.

Each case runs in a fresh interpreter: the tuning is process-wide."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.adapters.malloc import malloc_stats
from tests.paths import REPO

# Free a large mmapped block, then allocate a smaller large one: with glibc's dynamic
# threshold the second comes from the heap (kept by the process once freed); with the
# tuning it is mmapped (given back when freed).
_SCRIPT = """
import sys
from pipeline.adapters.malloc import malloc_stats, tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
first = bytearray(8 << 20)
del first
second = bytearray(4 << 20)
print(malloc_stats()["mmapped"])
"""


def _mmapped_after_churn(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(out.stdout)


@pytest.mark.skipif(malloc_stats() is None, reason="needs glibc's mallinfo2")
@pytest.mark.parametrize(
    ("mode", "mmapped"),
    [("default", False), ("tuned", True)],
)
def test_a_large_block_after_a_freed_larger_one_is_mmapped_only_when_tuned(
    mode: str, mmapped: bool
) -> None:
    assert (_mmapped_after_churn(mode) >= 4 << 20) is mmapped
