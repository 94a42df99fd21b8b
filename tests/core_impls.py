"""The core's implementations of the join, for tests that run a case through each: the
pure-Python one always, the native one where ``tailguard_native`` is built."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.contract.wire import from_model
from pipeline.core import native
from pipeline.core.join import JoinConfig
from pipeline.core.record import RequestRecord

CORE_IMPLS = [
    native.PYTHON,
    pytest.param(
        native.NATIVE,
        marks=pytest.mark.skipif(native.NATIVE is None, reason="tailguard_native not built"),
    ),
]
CORE_IMPL_IDS = ["python", "native"]


def joined(impl: native.CoreImpl, events: list[Any]) -> list[RequestRecord]:
    """The records ``impl``'s joiner makes of ``events`` (in order), timeouts drained."""
    j = impl.joiner(JoinConfig(timeout_ms=1_000))
    out = [j.add(from_model(e), i) for i, e in enumerate(events)]
    return [r for r in out if r is not None] + j.drain()
