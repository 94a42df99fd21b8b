"""Issue 47 item 5, "every signal may be missing": what a model's engines serve is
measured from the evidence present. Per window, what its engines reported finished
(``engine.finished``: the queue_ms sketch's count) or, where more, what its gateways saw
answered (outcome ok). So without our plugin (vLLM's own /metrics, or gateway only) the
capacity, the demand ratio a level's exit reads and the queue's wait are known, and the
decisions say which engine evidence they lacked.

Before: served was the engines' own count only; with vLLM's /metrics and no
``engine.finished`` the demand ratio stayed unknown, and a level that turns traffic away
left only at its 15-minute ``max_duration`` (L1 at 130 s, L0 at 1120 s, the queue gone
at 420 s: tests/unit/test_vllm_metrics_control.py).
"""

from __future__ import annotations

import pytest

from pipeline.contract.sketch import SketchColumns
from pipeline.contract.summary import ModelWindow, StatsSample, WindowSummary
from pipeline.core.control import Controller, lacking_evidence
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file

SIZE_MS = 10_000
DEMAND = 120  # requests received per 10 s window: 12/s


def _finished(n: int) -> dict[str, SketchColumns]:
    """The queue_ms sketch of ``n`` requests an engine reported finished (0: none)."""
    return {"queue_ms": SketchColumns(n, 50.0 * n, 50.0, 50.0, 0, [196], [n], [], [])} if n else {}


def _signals(answered: int, engine_finished: int, stats: bool) -> dict[str, object]:
    """Two minutes of 10 s windows of one model, each with ``DEMAND`` requests received,
    ``answered`` answered at the gateways and ``engine_finished`` reported by its engine;
    with ``stats``, a whole batch queued behind the running one (the capacity is learnt
    from saturated windows; without, from what was served with nothing seen queued)."""
    ctl = Controller(load_policy_file(DEFAULT_POLICY_PATH))
    sig: dict[str, object] = {}
    for i in range(12):
        start = i * SIZE_MS
        mw = ModelWindow(DEMAND, _finished(engine_finished), 0, answered)
        ctl.add_window(WindowSummary(0, start, SIZE_MS, {"m": mw}, {}))
        if stats:
            ctl.add_stats(StatsSample("e0", "m", start + SIZE_MS - 1, 16, 16, 0.5, None, None))
        sig = dict(ctl.evaluate(start + SIZE_MS).signals["m"])
    return sig


# (answered at the gateways, finished at the engine, engine.stats) -> demand ratio, wait ms
TABLE = [
    pytest.param(80, 80, True, 1.5, 2000.0, id="every event: 8/s served"),
    pytest.param(80, 0, True, 1.5, 2000.0, id="vLLM's /metrics, no engine.finished"),
    pytest.param(80, 0, False, 1.5, None, id="gateway only"),
    pytest.param(80, 80, False, 1.5, None, id="gateway + engine.finished, no stats"),
    pytest.param(80, 100, True, 1.2, 1600.0, id="the engines finished more (aborts): theirs"),
    pytest.param(0, 0, True, None, 160_000.0, id="nothing served, nothing measured"),
]


@pytest.mark.parametrize(("answered", "finished", "stats", "ratio", "wait_ms"), TABLE)
def test_served_is_measured_from_the_evidence_present(
    answered: int, finished: int, stats: bool, ratio: float | None, wait_ms: float | None
) -> None:
    sig = _signals(answered, finished, stats)
    assert sig["load.demand_ratio"] == (None if ratio is None else pytest.approx(ratio))
    assert sig["queue.wait_ms"] == (None if wait_ms is None else pytest.approx(wait_ms))


LACKING = [
    # (stats, engine.finished, served) -> the text decisions carry ("": nothing lacked)
    (True, True, True, ""),
    (True, False, False, ""),  # nothing served, nothing finished: nothing to say
    (True, False, True, "no engine.finished: served counted at the gateways"),
    (False, True, True, "no engine.stats: queue.depth_ratio, queue.wait_ms unknown"),
    (False, False, True, "no engine.stats: queue.depth_ratio, queue.wait_ms unknown; no "),
]


@pytest.mark.parametrize(("stats", "finished", "served", "text"), LACKING)
def test_decisions_say_which_engine_evidence_they_lack(
    stats: bool, finished: bool, served: bool, text: str
) -> None:
    got = lacking_evidence(stats=stats, engine_finished=finished, served=served)
    assert got.startswith(text) if text else got == ""


# --- gateway only: a burn is load-caused when the demand is far over what is answered ---


def _gateway_only(answered: int, engine_finished: int) -> tuple[object, list[str]]:
    """Two minutes of windows of one model with ``DEMAND`` requests received, ``answered``
    answered, half of the streams' first bytes late (a fast burn), no engine stats:
    ``load.burning`` and the notices at the end."""
    from pipeline.contract.summary import SLOWindowCounts
    from pipeline.settings import DEFAULT_SLO_SPEC
    from pipeline.spec.slo import load_spec_file

    spec = load_spec_file(DEFAULT_SLO_SPEC)
    ctl = Controller(load_policy_file(DEFAULT_POLICY_PATH), spec)
    step = None
    for i in range(12):
        start = i * SIZE_MS
        mw = ModelWindow(DEMAND, _finished(engine_finished), 0, answered)
        slos = {"ttft-stream": SLOWindowCounts(DEMAND, DEMAND // 2, 0.99)}
        ctl.add_window(WindowSummary(0, start, SIZE_MS, {"m": mw}, slos))
        step = ctl.evaluate(start + SIZE_MS)
    assert step is not None
    return step.signals["m"]["load.burning"], [n.text for n in step.notices]


GATEWAY_ONLY = [
    # (answered, finished at an engine) -> (load.burning, a notice's text or None)
    pytest.param(60, 0, True, None, id="demand 2x what is answered: load-caused"),
    pytest.param(80, 0, True, None, id="demand 1.5x: load-caused"),
    pytest.param(
        100,
        0,
        None,
        "load-caused unknown: no engine events",
        id="1.2x: unknown, from its first minute on",
    ),
    pytest.param(60, 60, False, None, id="engine.finished: measured, not this rule"),
]


@pytest.mark.parametrize(("answered", "finished", "burning", "notice"), GATEWAY_ONLY)
def test_gateway_only_burn_is_load_caused_on_demand(
    answered: int, finished: int, burning: bool | None, notice: str | None
) -> None:
    got, notices = _gateway_only(answered, finished)
    assert got is burning
    assert any(notice in t for t in notices) if notice else not notices
