"""A :class:`~pipeline.adapters.flush.FlushWriter` over fakes, for the unit tests of the
flush's order and of its yielding: no store (every write the test looks at is patched),
retries that run once, dead rows dropped."""

from __future__ import annotations

from typing import Any

from pipeline.adapters.flush import FlushWriter


def fake_writer(**ports: Any) -> FlushWriter:
    """``ports``: the ledger, the controller feed (``told``), ... as the test wants them."""
    return FlushWriter(
        object(),  # type: ignore[arg-type]  # the store: every write is faked
        "g",
        "t",
        0.01,
        retry=lambda fn, what: (fn(), 0)[1],
        dead_rows=lambda dead: None,
        **ports,
    )
