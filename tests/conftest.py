from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest

from tests.kafka_fixture import kafka  # noqa: F401  (session fixture: the real local broker)


def _order(item: pytest.Item) -> tuple[bool, float]:
    """`alone` tests last, then the `long` ones first, longest first."""
    mark = item.get_closest_marker("long")
    return item.get_closest_marker("alone") is not None, -float(mark.args[0]) if mark else 0.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`./tg test` runs it): the modules marked `long` first, longest
    first; those with tests marked `alone` last.

    Workers take whole modules in collection order (``--dist loadfile``), so a module that
    waits for minutes by design (a 3-minute outage, a trace at 1x) started last would be the
    suite's tail. An `alone` test waits for the tests running beside it and holds back the
    others (``_alone_under_xdist``): started early it would wait for the longest ones with
    the other workers idle; last it waits only for the final modules. Only the order
    changes, and only under xdist: every test still runs.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    items.sort(key=_order)  # stable: the others keep their order


@pytest.fixture(autouse=True)
def _alone_under_xdist(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test marked `alone` runs while no other xdist worker runs a test.

    A readers-writer lock over files in the run's temporary directory (shared by its workers
    only): every test holds ``alone.lock`` shared, an `alone` test exclusively; a waiting
    `alone` test holds ``alone.turnstile``, which every test passes first, so the others
    cannot starve it. Blocking ``flock`` calls: the wait is the other tests ending.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    run_dir = tmp_path_factory.getbasetemp().parent  # <basetemp>/popen-gwN -> <basetemp>
    alone = request.node.get_closest_marker("alone") is not None
    with (
        (run_dir / "alone.turnstile").open("a") as turnstile,
        (run_dir / "alone.lock").open("a") as rw,
    ):
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(rw, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # the locks go with the files' closing
