"""Capacity-aware admission (pipeline.core.admission) and the load gate and coherent exit
of the policy engine (pipeline.core.policy): transition tables (issue 35)."""

from __future__ import annotations

import pytest
import yaml

from pipeline.core.admission import AdmissionConfig, AdmissionControl, ModelLoad
from pipeline.core.policy import PolicyEngine
from pipeline.shipped import DEFAULT_POLICY, STATIC_POLICY
from pipeline.spec.policy import ControlPolicy, load_policy_file

# --------------------------------------------------------------------------- #
# Admission rate: one row per step (served rps, waiting, batch, active) -> (rule, rate)
# --------------------------------------------------------------------------- #


def _load(served: float, waiting: int, batch: int = 16, demand: float = 0.0) -> ModelLoad:
    return ModelLoad(served_rps=served, waiting=waiting, batch=batch, demand_rps=demand)


ADMISSION_TABLE = [
    # (served, waiting, active) -> (rule, rate): capacity learnt from saturated windows
    pytest.param(
        [(4.0, 0, False), (8.0, 80, True)],
        [("off", None), ("entry", 8.0 - (80 - 8) / 10)],
        id="entry drains the excess queue within drain_s",
    ),
    pytest.param(
        [(8.0, 0, True), (4.0, 12, True)],
        [("entry", 8.0), ("decrease", min(8.0 - 4 / 10, 0.8 * 8.0))],
        id="a growing queue: multiplicative decrease",
    ),
    pytest.param(
        [(8.0, 80, True), (8.0, 100, True)],
        [("entry", 0.8), ("decrease", 0.8 * 8.0)],
        id="a growing queue past drain_s: one decrease below what is served, not the floor",
    ),
    pytest.param(
        [(5.47, 0, True), (10.2, 40, True)],
        [("entry", 5.47), ("decrease", min(10.2 - 32 / 10, 0.8 * 5.47))],
        id="a backoff above the floor: from the rate in force, whatever the engines served",
    ),
    pytest.param(
        # issue 47's burst, llama-3-8b: entry at the capacity served before it (nothing
        # queued), then a window read before the rate and the cut-off were in force
        [(5.47, 0, True), (10.2, 136, True), (10.2, 0, True)],
        [("entry", 5.47), ("decrease", 0.8 * 10.2), ("increase", 0.8 * 10.2 + 0.05 * 10.2)],
        id="a burst's stale queue: one decrease below what the engines served, not the floor",
    ),
    pytest.param(
        [(8.0, 120, True), (8.0, 60, True)],
        [("entry", 0.4), ("drain", 8.0 - 52 / 10)],
        id="from the floor, a queue still long: what drains the rest within drain_s",
    ),
    pytest.param(
        [(8.0, 40, True), (8.0, 20, True)],
        [("entry", 8.0 - 32 / 10), ("drain", 8.0 - 32 / 10)],
        id="a queue shrinking: held at the rate that made it shrink",
    ),
    pytest.param(
        [(8.0, 120, True), (8.0, 20, True)],
        [("entry", 0.4), ("drain", 0.8 * 8.0)],
        id="a queue shrinking from the floor: one decrease below capacity, not the floor",
    ),
    pytest.param(
        [(8.0, 120, True), (8.0, 60, True), (8.0, 20, True), (8.0, 0, True)],
        [
            ("entry", 0.4),
            ("drain", 8.0 - 52 / 10),
            ("drain", 8.0 - 52 / 10),
            ("increase", 8.0 - 52 / 10 + 0.05 * 8.0),
        ],
        id="a burst's queue drains: out of the floor at once, not by additive increase",
    ),
    pytest.param(
        [(8.0, 120, True), (8.0, 0, True), (8.0, 0, True)],
        [("entry", 0.4), ("increase", 0.8 * 8.0), ("increase", 0.8 * 8.0 + 0.05 * 8.0)],
        id="from the floor to a healthy queue at once: one decrease below capacity",
    ),
    pytest.param(
        [(8.0, 40, True), (8.0, 0, True), (8.0, 0, True)],
        [("entry", 4.8), ("increase", 4.8 + 0.05 * 8.0), ("increase", 4.8 + 0.1 * 8.0)],
        id="healthy: additive increase",
    ),
    pytest.param(
        [(8.0, 80, True), (2.0, 0, False), (2.0, 0, True)],
        [("entry", 0.8), ("off", None), ("entry", 8.0)],
        id="capacity remembered across a healthy period",
    ),
]


@pytest.mark.parametrize(("steps", "expected"), ADMISSION_TABLE)
def test_admission_table(
    steps: list[tuple[float, int, bool]], expected: list[tuple[str, float | None]]
) -> None:
    ac = AdmissionControl(AdmissionConfig())
    for (served, waiting, active), (rule, rate) in zip(steps, expected, strict=True):
        load = _load(served, waiting)
        ac.observe("m", load)
        got = ac.step("m", load, active=active)
        assert got.rule == rule
        if rate is None:
            assert got.rate_rps is None
        else:
            floor = max(0.05 * (ac.capacity_rps("m") or served), 0.1)
            assert got.rate_rps == pytest.approx(max(rate, floor))


def test_rate_never_below_floor_nor_above_ceiling() -> None:
    ac = AdmissionControl()
    load = _load(10.0, 1000)
    ac.observe("m", load)
    assert ac.step("m", load, active=True).rate_rps == pytest.approx(0.5)  # 5 % of 10
    for _ in range(200):
        ac.step("m", _load(10.0, 0), active=True)
    assert ac.step("m", _load(10.0, 0), active=True).rate_rps == pytest.approx(20.0)  # 2x


# --------------------------------------------------------------------------- #
# The policy engine: load gate and coherent exit (transition tables)
# --------------------------------------------------------------------------- #

S = 10_000  # one evaluation every 10 s


def _run(policy: ControlPolicy, rows: list[dict[str, object]]) -> list[tuple[int, str]]:
    eng = PolicyEngine(policy)
    out = []
    for i, sig in enumerate(rows):
        d = eng.evaluate("m", i * S, sig)  # type: ignore[arg-type]
        out.append((d.level, d.phase))
    return out


HEALTHY = {
    "load.burning": False,
    "load.caused": False,
    "load.demand_ratio": 0.5,
    "queue.depth_ratio": 0.0,
    "gpu_memory_fraction": 0.6,
}
LOADED = {**HEALTHY, "load.burning": True, "load.caused": True, "load.demand_ratio": 2.0}
# Admission works: the queue is short, but the demand is still over capacity.
ADMITTING = {**HEALTHY, "load.demand_ratio": 2.0}


def test_default_policy_enters_only_on_load() -> None:
    policy = load_policy_file(DEFAULT_POLICY)
    assert policy.dynamics.load_gate
    got = _run(policy, [HEALTHY] * 3 + [LOADED])
    assert got == [(0, "normal")] * 3 + [(1, "degraded")]


def test_load_gate_keeps_a_shedding_level_shut_without_load() -> None:
    """The static levels with the gate on: a burn alert alone opens nothing."""
    policy = load_policy_file(STATIC_POLICY)
    gated = policy.model_copy(
        update={"dynamics": policy.dynamics.model_copy(update={"load_gate": True})}
    )
    burning = {"burn.page": True, "load.caused": False}
    eng = PolicyEngine(gated)
    d = eng.evaluate("m", 0, burning)
    assert (d.level, d.phase) == (0, "normal")
    assert "not load-caused" in d.reason
    # the same alert with a load-caused burn opens L1
    d = eng.evaluate("m", S, {"burn.page": True, "load.caused": True})
    assert d.level == 1
    # without the gate (today's static levels) the alert alone opens L1
    assert PolicyEngine(policy).evaluate("m", 0, burning).level == 1


def test_no_half_open_while_the_overload_is_measured() -> None:
    """Admission keeps the queue short (load.burning false) while demand stays over
    capacity: the level holds; it half-opens only once demand is back under capacity
    for the exit's 2 minutes and min_dwell passed, then returns to L0."""
    policy = load_policy_file(DEFAULT_POLICY)
    rows = [LOADED] + [ADMITTING] * 30 + [HEALTHY] * 30
    got = _run(policy, rows)
    assert got[0] == (1, "degraded")
    assert all(x == (1, "degraded") for x in got[1:31]), got[1:31]
    ho = got.index((1, "half_open"))
    assert 31 + 12 <= ho <= 31 + 14  # 2 minutes of exit at 10 s steps
    assert got[-1] == (0, "normal")


def test_escalates_when_admission_does_not_bring_the_burn_down() -> None:
    policy = load_policy_file(DEFAULT_POLICY)
    got = _run(policy, [LOADED] * 40)
    assert got[0] == (1, "degraded")
    # L2 enters on 5 minutes of a load-caused burn (before L1's 10 m max_duration)
    assert got[30] == (2, "degraded")


def test_relapse_from_half_open_on_the_opening_cause() -> None:
    policy = load_policy_file(DEFAULT_POLICY)
    rows = [LOADED] + [HEALTHY] * 13 + [LOADED]
    got = _run(policy, rows)
    assert got[13] == (1, "half_open")
    assert got[14] == (1, "degraded")


def test_opener_still_measured_holds_the_level() -> None:
    """Coherent exit: a level opened by one condition is not left on another's exit."""
    doc = yaml.safe_load(STATIC_POLICY.read_text())
    l1 = doc["levels"][0]
    l1["enter"] = [
        {"signal": "p99.ttft_engine_ms", "op": ">", "value": 5000},
        {"signal": "p99.gateway_ttfb_ms", "op": ">", "value": 2000},
    ]
    l1["exit"] = [{"signal": "p99.ttft_engine_ms", "op": "<", "value": 2500}]
    doc["dynamics"]["min_dwell"] = "10s"
    doc["dynamics"].pop("max_transitions_per_hour")
    policy = ControlPolicy.model_validate(doc)
    opened_by_ttfb = {"p99.ttft_engine_ms": 100.0, "p99.gateway_ttfb_ms": 3000.0}
    got = _run(policy, [opened_by_ttfb] * 3)
    # ttft_engine's exit holds all along, but the first byte that opened L1 is still slow
    assert got == [(1, "degraded")] * 3
    eng = PolicyEngine(policy)
    eng.evaluate("m", 0, opened_by_ttfb)
    d = eng.evaluate("m", S, opened_by_ttfb)
    assert any("p99.gateway_ttfb_ms" in h for h in d.held_because)
    d = eng.evaluate("m", 2 * S, {"p99.ttft_engine_ms": 100.0, "p99.gateway_ttfb_ms": 500.0})
    assert d.phase == "half_open"  # the opener cleared: the exit counts


def test_capacity_never_below_what_was_served_with_nothing_queued() -> None:
    ac = AdmissionControl()
    ac.observe("m", _load(8.0, 80))  # saturated: capacity 8
    ac.observe("m", _load(11.0, 0))  # 11/s served with nothing queued: at least 11
    assert ac.capacity_rps("m") == pytest.approx(11.0)
    ac.observe("m", _load(4.0, 0))  # less traffic says nothing about capacity
    assert ac.capacity_rps("m") == pytest.approx(11.0)


def test_healthy_queue_from_the_slo_sets_the_excess() -> None:
    ac = AdmissionControl()
    load = ModelLoad(served_rps=8.0, waiting=6, batch=16, demand_rps=20.0, healthy_queue=1.0)
    ac.observe("m", load)
    step = ac.step("m", load, active=True)
    assert step.excess_queue == pytest.approx(5.0)  # not max(0, 6 - 8): the SLO's queue


@pytest.mark.parametrize(
    ("split", "queue_inclusive", "share", "text"),
    [
        ((10, 9_000.0, 10_000.0), True, 0.9, "load-caused: 90 %"),
        ((10, 500.0, 10_000.0), True, 0.05, "not load-caused: 95 %"),
        ((0, 0.0, 0.0), True, None, None),
        ((4, 0.0, 900.0), False, 0.0, "its boundary excludes the queue"),
    ],
)
def test_report_load_cause(
    split: tuple[int, float, float], queue_inclusive: bool, share: float | None, text: str | None
) -> None:
    from pipeline.app.report import load_cause

    got = load_cause(split, queue_inclusive)
    assert got["bad_queue_share"] == (None if share is None else pytest.approx(share))
    if text is None:
        assert got["load"] is None
    else:
        assert text in got["load"]
