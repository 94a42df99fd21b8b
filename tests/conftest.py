from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_fixture import (  # the real local broker (see tests/kafka_fixture.py)
    ENV_EXTERNAL_BOOTSTRAP,
    PRIVATE_BROKER_MARK,
    SHARED_BROKER_KEY,
    SharedBroker,
    _session_kafka,  # noqa: F401  (fixture)
    kafka,  # noqa: F401  (fixture)
)

try:  # (the vLLM test environment has no hypothesis)
    from hypothesis import settings as hypothesis_settings
except ImportError:  # pragma: no cover
    pass
else:
    # Hypothesis fails an example slower than 200 ms by default: a timed assert, which a
    # loaded machine (the suite's own parallel modules) fails. Tests never time themselves.
    hypothesis_settings.register_profile("tailguard", deadline=None)
    hypothesis_settings.load_profile("tailguard")

UNIT = Path(__file__).parent / "unit"
_SHARED = pytest.StashKey[SharedBroker]()  # the xdist controller's broker


def _wants_shared_broker(config: pytest.Config) -> bool:
    """The xdist controller of a run that may need a broker: not a worker, not serial, no
    external cluster, and not only unit tests named (they need none)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return False
    if os.environ.get(ENV_EXTERNAL_BOOTSTRAP, "").strip():
        return False
    paths = [Path(config.invocation_params.dir, a.split("::")[0]).resolve() for a in config.args]
    return not paths or not all(p == UNIT or UNIT in p.parents for p in paths)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", PRIVATE_BROKER_MARK)
    if _wants_shared_broker(config):
        config.stash[_SHARED] = SharedBroker()


def pytest_unconfigure(config: pytest.Config) -> None:
    shared = config.stash.get(_SHARED, None)
    if shared is not None:
        shared.stop()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: each worker learns the shared broker's directory."""
    shared = node.config.stash.get(_SHARED, None)
    if shared is not None:
        node.workerinput[SHARED_BROKER_KEY] = str(shared.dir)


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
