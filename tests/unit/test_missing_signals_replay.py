"""Issue 47 item 5 through the backtest core: the same simulated overload (the first 6000
requests of the shared trace, ~18 min, arrivals x4 from minute 2 to 7) fed to the
controller with (a) gateway events only, (b) gateway + ``engine.finished`` (no
``engine.stats``: engines without our plugin), (c) every event. The directives are
applied by the simulated gateways, as in ``tailguard backtest``.

The queue is measured on the simulator's own ``engine.stats`` (generated in every case,
fed to the pipeline only in (c)): it is *gone* at the end of the episode or at the last
sample with half a batch waiting after it, whichever is later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest

from pipeline.app.replay import _ControlRun
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file
from tests.overload_replay import (
    EPISODE_S,
    START_MS,
    at_s,
    back_at_l0_s,
    entered_and_left,
    replay_overload,
)

pytestmark = pytest.mark.long(30)

GATEWAY_ONLY = frozenset({"engine.stats", "engine.finished"})
NO_STATS = frozenset({"engine.stats"})
EVERYTHING: frozenset[str] = frozenset()


@dataclass
class Run:
    transitions: list[dict[str, Any]]
    notices: list[dict[str, Any]]
    queue_gone_s: dict[str, float] = field(default_factory=dict)


@cache
def _run(dropped: frozenset[str]) -> Run:
    """The tailguard loop over the short trace, with the event kinds ``dropped`` never
    reaching the pipeline (they still happen in the simulator)."""
    replayed = replay_overload(
        "missing",
        lambda spec, wc, gateways: _ControlRun.build(  # the backtest's (the worker's) loop
            load_policy_file(DEFAULT_POLICY_PATH),
            spec,
            None,
            wc,
            queue_capacity=64,
            gateway_instances=gateways,
        ),
        lambda ev: None if ev.kind in dropped else ev,
    )
    control = replayed.control
    return Run(control.transitions, control.notices, replayed.queue_gone_s)


CASES = [GATEWAY_ONLY, NO_STATS, EVERYTHING]
IDS = ["gateway-only", "no-engine-stats", "all-events"]


@pytest.mark.parametrize("dropped", CASES, ids=IDS)
def test_enters_during_the_episode_and_is_back_at_l0_after_the_queue(
    dropped: frozenset[str],
) -> None:
    """Before issue 47 the stats-less run held L1, then L2, to the end of the run:
    "waiting for exit: queue.depth_ratio unknown"; the gateway-only run opened nothing."""
    run = _run(dropped)
    for scope, gone_s in run.queue_gone_s.items():
        line, entered_t, last_t = entered_and_left(run.transitions, scope)
        assert last_t - gone_s <= 600, (scope, gone_s, line)  # the matrix's 10 minutes
        # no half-open or L0 inside the episode once entered (item 4)
        assert not [t for t, lv, ph in line if entered_t < t < EPISODE_S[1] and ph != "degraded"]


NO_ENGINE_FINISHED = "no engine.finished: served counted at the gateways"


@pytest.mark.parametrize(
    ("dropped", "texts"),
    [
        (NO_STATS, ["queue.depth_ratio unknown since", "[no engine.stats: "]),
        (
            GATEWAY_ONLY,
            ["queue.depth_ratio unknown since", "[no engine.stats: ", NO_ENGINE_FINISHED],
        ),
    ],
    ids=["no-engine-stats", "gateway-only"],
)
def test_the_leaving_reason_names_the_missing_signal(
    dropped: frozenset[str], texts: list[str]
) -> None:
    left = [t for t in _run(dropped).transitions if t["phase"] == "half_open"]
    assert left
    for t in left:
        for text in texts:
            assert text in t["reason"], t["reason"]


@pytest.mark.parametrize("dropped", CASES, ids=IDS)
def test_back_at_l0_within_5_minutes_after_the_queue(dropped: frozenset[str]) -> None:
    """Issue 47's done-when: back at L0 <= 5 minutes after the queue is gone, whatever
    is missing."""
    run = _run(dropped)
    assert run.queue_gone_s
    for scope, gone_s in run.queue_gone_s.items():
        assert back_at_l0_s(run.transitions, scope) - gone_s <= 300, (scope, gone_s)


def test_gateway_only_is_alerted_until_the_demand_shows_load() -> None:
    """Gateway events only: no queue time, no engine stats, so the queue's share of a
    burn cannot be measured. Until the demand is 1.5x what the gateways have seen
    answered, whether the burn is load-caused is unknown: no level opens (an unknown
    entry never fires) and each model's burn is reported as a notice naming what is
    missing; from there the level opens (the entry test above)."""
    run = _run(GATEWAY_ONLY)
    first = min(at_s(t["ts_unix_ns"]) for t in run.transitions if t["level"] > 0)
    noticed = {
        n["model"]
        for n in run.notices
        if EPISODE_S[0] <= (n["now_ms"] - START_MS) / 1000 < first
        and "load-caused unknown: no engine events" in n["text"]
    }
    assert noticed == set(run.queue_gone_s)
