"""``tailguard backtest``: four loops side by side on a short, real trace (the first 6000
requests of the shared Azure trace, ~18 min, arrivals x4 from minute 2 to 7)."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

import pytest

from pipeline.app.backtest import LOOPS, render_text, run_backtest
from pipeline.cli import BACKTEST_START_UNIX_NS, DEFAULT_TRACE, main
from pipeline.settings import DEFAULT_SLO_SPEC
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file
from pipeline.spec.slo import load_spec_file
from producers.enforcement import Modes
from producers.simulator.gate import GatewayGate, directive_of
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace

# CPU-bound backtests (~45 s in all): started first under xdist
pytestmark = pytest.mark.long(45)

LIMIT = 6000


@cache
def _trace() -> tuple[Any, ...]:
    return tuple(read_trace(DEFAULT_TRACE)[:LIMIT])


@cache
def _backtest() -> dict[str, Any]:
    config = SimConfig(
        start_unix_ns=BACKTEST_START_UNIX_NS, seed=1, overload=OverloadEpisode(120, 420, 4.0)
    )
    bt = run_backtest(
        _trace(), config, load_spec_file(DEFAULT_SLO_SPEC), load_policy_file(DEFAULT_POLICY_PATH)
    )
    return bt.to_json()


def test_json_shape() -> None:
    doc = json.loads(json.dumps(_backtest()))
    assert {"open_loop", "closed_loop", "runs", "loops", "scheduling"} <= set(doc)
    assert doc["loops"] == ["open", "static", "aimd", "tailguard"]
    assert doc["scheduling"] == "fcfs"
    for run in doc["runs"].values():
        assert isinstance(run["requests"], int)
        for v in run["slos"].values():
            assert {"total", "good", "compliance"} <= set(v)
        assert set(run["time_at_level_s"]) == {"0", "1", "2", "3"}
        assert isinstance(run["shed"], dict)
        assert run["goodput_rps"] is not None
        assert {"first_action_s", "back_at_l0_s", "levels_before", "goodput_rps"} <= set(
            run["episode"]
        )
        for c in run["control"]:
            assert {"ts_unix_ns", "scope", "level", "reason"} <= set(c)


def test_admission_protects_priority_0_and_beats_the_baselines() -> None:
    """The overload episode: tailguard's admission turns away no priority-0 request,
    serves priority 0 far better than no control and than both baselines, and its
    goodput is at least the best baseline's."""
    runs = _backtest()["runs"]
    o, c = runs["open"], runs["tailguard"]
    assert o["shed"] == {}
    assert o["retries"] == 0
    assert c["shed"].get("0", 0) == 0  # priority 0 is never turned away
    assert c["retries"] > 0  # clients retried the 429s (backoff, at most 3)
    for slo in ("ttft-stream", "gold-ttft"):
        ours = c["by_priority"]["0"]["slos"][slo]
        assert ours >= o["by_priority"]["0"]["slos"][slo] + 0.10, slo
        for base in ("static", "aimd"):
            assert ours > runs[base]["by_priority"]["0"]["slos"][slo], (slo, base)
    best = max(runs[b]["episode"]["goodput_rps"] for b in ("open", "static", "aimd"))
    assert c["episode"]["goodput_rps"] >= best
    assert c["episode"]["first_action_s"] is not None
    assert c["episode"]["first_action_s"] <= 30
    assert c["episode"]["levels_before"] == 0


def test_every_scope_enters_and_returns_to_l0() -> None:
    for loop in ("open", "tailguard"):
        run = _backtest()["runs"][loop]
        by_scope: dict[str, list[int]] = {}
        for t in run["control"]:
            by_scope.setdefault(t["scope"], []).append(t["level"])
        assert by_scope
        for levels in by_scope.values():
            assert levels[0] == 1
            assert levels[-1] == 0


def test_logical_figures_count_each_client_request_once() -> None:
    """Per logical request (issue 47): in every loop each arrival of the trace (replicas
    included: the open loop's requests, no retries there) is one logical request, made of
    every attempt of the run; without retries it is its attempt, figure for figure."""
    runs = _backtest()["runs"]
    arrivals = runs["open"]["requests"]
    assert runs["open"]["retries"] == 0
    assert runs["tailguard"]["retries"] > 0  # the case has retries
    for run in runs.values():
        lg = run["logical"]
        assert lg["all"]["requests"] == arrivals
        assert lg["all"]["attempts"] == run["requests"]
        assert lg["all"]["retried"] <= run["retries"]
        assert lg["all"]["never_served"] <= run["outcomes"].get("rejected", 0)
        assert lg["all"]["latency"]["final_only"] == 0  # a client retries on its gateway
        assert sum(p["requests"] for p in lg["by_priority"].values()) == arrivals
        assert {"episode", "episode_by_priority"} <= set(lg)
    for name, v in runs["open"]["slos"].items():
        assert runs["open"]["logical"]["all"]["slos"][name]["total"] == v["total"]
        assert runs["open"]["logical"]["all"]["slos"][name]["good"] == v["good"]


def test_matrix_has_the_per_logical_request_rows() -> None:
    """tools/dev/backtest_matrix.py (the README/docs tables): the per-logical-request rows
    with the run's figures, one cell per loop."""
    from tools.dev.backtest_matrix import table

    doc = _backtest()
    md = table("t", doc).splitlines()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md if line.startswith("| ")}
    want = [f"{r['logical']['all']['never_served']:,}" for r in doc["runs"].values()]
    assert rows["never served (final attempt refused/failed)"].split(" | ")[1:] == [
        *want[:-1],
        want[-1] + " |",
    ]
    assert "ttft-stream, episode, per logical request" in rows
    assert "worst SLO vs no control, per logical request (points)" in rows


def test_render_text_side_by_side() -> None:
    from pipeline.app.backtest import Backtest

    doc = _backtest()
    text = render_text(Backtest(doc["runs"]))
    header = text.splitlines()[1]
    for title in ("no control", "static levels", "AIMD limiter", "tailguard"):
        assert title in header
    assert "priority 3" in text
    assert "FCFS" in text.splitlines()[0]
    assert "per logical request" in text
    assert "never served" in text


def test_cli_json(capsys: Any) -> None:
    rc = main(["backtest", "--limit", "1500", "--overload", "none", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["open_loop"]["requests"] == doc["closed_loop"]["requests"] == 1500
    assert doc["closed_loop"]["control"] == []  # normal load: L0 throughout
    assert doc["closed_loop"]["shed"] == {}


def test_a_burn_that_is_not_load_caused_alerts_and_sheds_nothing(tmp_path: Any) -> None:
    """Normal load, an SLO on whole-response time <= 400 ms for chat: it burns because
    answers are long, not because of load. tailguard notices it and sheds nothing; its
    SLOs are exactly open loop's (the static levels shed and make the others worse)."""
    from pipeline.app.backtest import run_loop
    from pipeline.spec.slo import SLOSpec

    spec = SLOSpec.model_validate(
        {
            "apiVersion": "tailguard/v1",
            "kind": "SLOSpec",
            "slos": [
                {"name": "chat-total-400", "boundary": "gateway_total_ms",
                 "threshold_ms": 400, "objective": 0.99, "window": {"rolling": "30d"}},
                {"name": "ttft-stream", "boundary": "gateway_ttfb_ms", "threshold_ms": 2000,
                 "objective": 0.99, "window": {"rolling": "30d"}, "filter": {"stream": True}},
            ],
        }
    )  # fmt: skip
    config = SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=1)
    policy = load_policy_file(DEFAULT_POLICY_PATH)
    trace = _trace()[:3000]
    o = run_loop(trace, config, spec, policy, loop="open")
    c = run_loop(trace, config, spec, policy, loop="tailguard")
    assert c["shed"] == {}
    assert c["control"] == []
    for name in ("chat-total-400", "ttft-stream"):
        assert c["slos"][name]["compliance"] == o["slos"][name]["compliance"]
    assert c["notices"], "the burn is alerted"
    assert "not load-caused" in c["notices"][0]["text"]
    assert "compute" in c["notices"][0]["text"]


def _shed_all(retry_after_s: int, modes: Modes) -> tuple[Simulator, list[Any]]:
    trace = read_trace(DEFAULT_TRACE)[:50]
    gate = GatewayGate(modes=modes)
    gate.set(
        "*",
        directive_of(
            1, "degraded", {"shed_priorities_at_or_above": 0, "retry_after_s": retry_after_s}
        ),
    )
    sim = Simulator(trace, SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=3), gate)
    return sim, [e for e in sim.events() if e.kind == "gateway.completed"]


NO_BUDGET = Modes(retry_budget_ratio=100.0)  # the client's own behaviour alone


@pytest.mark.parametrize(
    ("retry_after_s", "modes", "completed", "retries"),
    [
        (2, NO_BUDGET, 50 * 3, 100),  # first try + 2 retries (the OpenAI SDK's default)
        (300, NO_BUDGET, 50, 0),  # Retry-After over 120 s: the SDK does not retry
        # the budget: 50 first tries over 26 s at one gateway invite max(3, 0.2 x firsts)
        # retries per 10 s (priority 0 always); the rest are told x-should-retry: false
        (2, Modes(), 50 + 31, 31),
    ],
    ids=["two-retries", "retry-after-over-120s", "budget-stops-the-rest"],
)
def test_simulated_clients_retry_as_the_openai_sdk(
    retry_after_s: int, modes: Modes, completed: int, retries: int
) -> None:
    sim, done = _shed_all(retry_after_s, modes)
    assert all(e.http_status == 429 and e.outcome == "rejected" for e in done)
    assert (len(done), sim.retries) == (completed, retries)


def test_simulated_clients_wait_the_retry_after() -> None:
    _sim, done = _shed_all(2, NO_BUDGET)
    r0 = {e.request_id: e for e in done if e.request_id.startswith("req-000000000")}
    assert [r0[k].control_verdict for k in sorted(r0)] == ["shed_priority"] * 3
    gaps = [
        (r0[f"req-000000000-r{k + 1}"].ts_unix_ns
         - r0["req-000000000" + (f"-r{k}" if k else "")].ts_unix_ns) / 1e9
        for k in range(2)
    ]  # fmt: skip
    # Retry-After 2 s spread over (1, 2] is 2; the SDK waits exactly that (no jitter of its
    # own), plus the gateway's overhead of the next attempt
    for gap in gaps:
        assert 2.0 <= gap <= 2.05


def test_shipped_defaults_are_quiet_on_the_shared_trace_at_normal_load() -> None:
    """Every default SLO meets its objective over the hour and the default policy
    stays at L0 throughout (the issue: the old defaults cried wolf)."""
    from pipeline.app.backtest import run_loop

    spec = load_spec_file(DEFAULT_SLO_SPEC)
    run = run_loop(
        read_trace(DEFAULT_TRACE),
        SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=1),
        spec,
        load_policy_file(DEFAULT_POLICY_PATH),
        loop="open",
    )
    assert run["requests"] == 19_366
    for slo in spec.slos:
        assert run["slos"][slo.name]["compliance"] >= slo.objective, slo.name
    assert run["control"] == []
    assert run["time_at_level_s"]["1"] == run["time_at_level_s"]["2"] == 0


def test_simulator_queue_cutoff_cancels_queued_priorities_never_0() -> None:
    """A directive's queue cut-off: requests of priority >= 1 still queued past their
    priority's cut-off get 503 (and retry); priority 0 is never cut, however long it waits."""
    trace = read_trace(DEFAULT_TRACE)[:3000]
    gate = GatewayGate()
    cuts = [None, 500.0, 500.0, 500.0]
    gate.set("*", directive_of(1, "degraded", {"queue_timeout_ms": cuts, "retry_after_s": 2}))
    cfg = SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=3, rate_scale=4.0)
    sim = Simulator(trace, cfg, gate)
    events = list(sim.events())
    prio = {e.request_id: e.priority for e in events if e.kind == "gateway.received"}
    cut = [e for e in events if e.kind == "gateway.completed" and e.http_status == 503]
    assert cut, "x4 load queues requests past 500 ms: some must be cut"
    assert sim.cutoffs == len(cut)
    assert 0 not in {prio[e.request_id] for e in cut}
    assert any("-r1" in e.request_id for e in events if e.kind == "gateway.received")
    # already queued when the directive lands: past the cut-off cancelled at once, the
    # others when they reach it; priority 0 never
    sim2 = Simulator(trace[:1500], dataclasses.replace(cfg, rate_scale=8.0))
    it = sim2.events()
    seen = [next(it) for _ in range(4000)]
    cancelled = sim2.apply_queue_cutoff("llama-3-8b", cuts, 2)
    rest = list(it)
    prio2 = {e.request_id: e.priority for e in [*seen, *rest] if e.kind == "gateway.received"}
    late = [e for e in rest if e.kind == "gateway.completed" and e.http_status == 503]
    assert cancelled > 0
    assert len(late) >= cancelled
    assert 0 not in {prio2[e.request_id] for e in late}
    assert {e.model for e in late} == {"llama-3-8b"}


def test_window_measures_an_episode_the_trace_already_has() -> None:
    """``--window START:END`` with no overload: the span is reported as the episode
    (goodput, first action, SLOs during it), nothing replicated; an overload wins."""
    from pipeline.app.backtest import run_loop

    spec = load_spec_file(DEFAULT_SLO_SPEC)
    policy = load_policy_file(DEFAULT_POLICY_PATH)
    trace = _trace()[:1500]
    plain = SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=1)
    run = run_loop(trace, plain, spec, policy, loop="open", window_s=(60.0, 120.0))
    bare = run_loop(trace, plain, spec, policy, loop="open")
    assert "episode" not in bare
    assert run["requests"] == bare["requests"]  # nothing replicated
    ep = run["episode"]
    assert (ep["start_s"], ep["end_s"], ep["factor"], ep["shape"]) == (60.0, 120.0, 1.0, "in trace")
    assert ep["goodput_rps"] > 0
    stepped = dataclasses.replace(plain, overload=OverloadEpisode(30, 90, 2.0))
    run = run_loop(trace, stepped, spec, policy, loop="open", window_s=(60.0, 120.0))
    assert (run["episode"]["start_s"], run["episode"]["factor"]) == (30, 2.0)


@pytest.mark.parametrize(
    "argv", [["--help"], ["backtest", "--help"]], ids=["tailguard-help", "backtest-help"]
)
def test_help_names_the_loops_it_runs(argv: list[str], capsys: Any) -> None:
    """What ``--help`` says backtest runs is what it runs: every loop of ``LOOPS`` (issue
    51: it said "twice (open vs closed loop)" beside four loops)."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    (line,) = (s for s in text.split("backtest ")[1:] if "trace through the simulator" in s)
    said = line[: line.index("?") + 1]
    assert "twice" not in said
    for loop in LOOPS:
        assert loop in said, (loop, said)
