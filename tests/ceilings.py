"""How long a test waits for a condition before it calls the condition false.

Every wait in the tests polls the condition it asserts and returns as soon as it holds;
the ceiling only decides when a test gives up, so a generous one costs a passing test
nothing. The figures written in the tests are what the condition takes on a quiet
2-core machine with room to spare; a shared CI runner, or a second suite on the same
cores, can be several times slower (issue 49: two fault tests failed so). Each wait
multiplies its figure by ``TG_TEST_CEILING_SCALE`` (default 4): raise it on a machine
slower still; never lower a figure in a test to make a suite faster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Final


def _scale() -> float:
    raw = os.environ.get("TG_TEST_CEILING_SCALE", "4")
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"TG_TEST_CEILING_SCALE: not a number: {raw!r}") from None
    if not value >= 1.0:
        raise SystemExit(f"TG_TEST_CEILING_SCALE: must be >= 1, got {raw!r}")
    return value


CEILING_SCALE: Final = _scale()


def ceiling(timeout_s: float) -> float:
    """The ceiling of a wait written as ``timeout_s`` in a test."""
    return timeout_s * CEILING_SCALE


def wait_for(fn: Callable[[], Any], what: str, timeout_s: float = 20.0, poll_s: float = 0.1) -> Any:
    """``fn()``'s first truthy value, polled every ``poll_s`` (it observes another process:
    its state is only readable so); an AssertionError naming ``what`` past the ceiling of
    ``timeout_s``."""
    deadline = time.monotonic() + ceiling(timeout_s)
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll_s)
