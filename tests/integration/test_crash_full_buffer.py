"""test_crash with a small buffer: every flush is started by the batch that fills it and
runs behind the next batches (``FlushBehind.after_batch``); a SIGKILL then lands while
flushes overlap processing. Its own module, so that the parallel suite runs it beside the
timer variant."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_crash import sigkill_then_restart

pytestmark = [pytest.mark.integration, pytest.mark.long(90)]


def test_sigkill_with_flushes_behind_the_batches_then_restart_is_exactly_once(
    kafka, tmp_path: Path
) -> None:
    sigkill_then_restart(kafka, tmp_path, flush_max_rows=1_000)
