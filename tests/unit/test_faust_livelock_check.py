"""Faust's livelock check must not crash the consumer on a partition whose position
aiokafka does not know yet (a reset pending after its topic was recreated): it read
``position``, whose assertion stopped the worker in a CI run of the cycles test."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from pipeline.adapters.faust_wiring import _ConsumerThread


def _thread(state: Any) -> _ConsumerThread:
    t = object.__new__(_ConsumerThread)
    assignment = SimpleNamespace(state_value=lambda _tp: state)
    consumer = SimpleNamespace(
        _fetcher=SimpleNamespace(
            _subscriptions=SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))
        )
    )
    t.__dict__["_ensure_consumer"] = lambda: consumer
    return t


@pytest.mark.parametrize(
    ("valid", "faust_raises", "faust_called"),
    [
        (False, False, False),  # a reset pending: nothing to verify, Faust not asked
        (True, False, True),  # a known position: Faust's own check runs
        (True, True, True),  # reset between the look and Faust's read: skipped, no crash
    ],
)
def test_the_check_skips_a_partition_without_a_position(
    monkeypatch: pytest.MonkeyPatch, valid: bool, faust_raises: bool, faust_called: bool
) -> None:
    calls: list[TP] = []

    def faust_check(self: Any, now: float, tp: TP) -> None:
        calls.append(tp)
        if faust_raises:
            raise AssertionError  # aiokafka's `assert self._position is not None`

    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "verify_event_path", faust_check)
    tp = TP("lc", 0)
    state = SimpleNamespace(has_valid_position=valid)
    assert _thread(state).verify_event_path(1.0, tp) is None
    assert calls == ([tp] if faust_called else [])
