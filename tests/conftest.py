from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.kafka_fixture import kafka  # noqa: F401  (session fixture: the real local broker)


def _order(item: pytest.Item) -> float:
    """The `long` ones first, longest first."""
    mark = item.get_closest_marker("long")
    return -float(mark.args[0]) if mark else 0.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`./tg test` runs it): the modules marked `long` first, longest
    first.

    Workers take whole modules in collection order (``--dist loadfile``), so a module that
    waits for minutes by design (a trace at 1x, a store outage) started last would be the
    suite's tail. Only the order changes, and only under xdist: every test still runs.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    items.sort(key=_order)  # stable: the others keep their order


@pytest.fixture(params=["python", "native"])
def core_impl(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each implementation of the core's hot path selected in turn (``pipeline.core.
    native``; the native one skipped where tailguard_native is not built): for tests of
    what differs between them outside the core (the embedded store's insert formats)."""
    from pipeline.core import native

    if request.param == "native" and native.NATIVE is None:
        pytest.skip("tailguard_native is not built")
    before = native.active().name
    native.select(request.param)
    try:
        yield request.param
    finally:
        native.select(before)
