"""Unit tests of the simulator's control surfaces (issue 35): engine scheduling policy,
overload episode shapes, and the gates' completion hook."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pytest

from pipeline.app.demo import parse_overload, sim_config_from_args
from pipeline.cli import build_parser
from pipeline.contract.events import EngineFinished, Event, GatewayCompleted, GatewayReceived
from producers.simulator.gate import Completion, GatewayGate, directive_of
from producers.simulator.model import ModelConfig, OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import TraceRequest, read_trace
from tests.paths import SHARED_TRACE
from tests.sim_fixtures import NO_STATS_MS, START_NS, exact_config

ONE_SLOT = (ModelConfig("m", 1.0, 1, 1, 0.0, 10.0, 0.0, 1_000_000),)


@pytest.fixture(scope="module")
def shared_trace() -> list[TraceRequest]:
    return read_trace(SHARED_TRACE)


def _events(trace: Sequence[TraceRequest], config: SimConfig, gate: Any = None) -> list[Event]:
    return list(Simulator(trace, config, gate).events())


# ---------------------------------------------------------------------------
# scheduling policy
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"scheduling": "lifo"}, "scheduling"),
        ({"overload": None, "scheduling": ""}, "scheduling"),
    ],
)
def test_scheduling_validation(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SimConfig(start_unix_ns=START_NS, **changes)  # type: ignore[arg-type]


def test_scheduling_defaults_to_fcfs() -> None:
    assert SimConfig(start_unix_ns=START_NS).scheduling == "fcfs"


def _admission_key(scheduling: str) -> Any:
    if scheduling == "priority":
        return lambda f: (f.priority, f.arrival_unix_ns)
    return lambda f: (f.arrival_unix_ns,)


@pytest.mark.parametrize("scheduling", ["fcfs", "priority"])
def test_engine_admits_in_the_policy_order(scheduling: str) -> None:
    # One engine, one slot, 60 requests arriving while the first runs: each admission
    # takes the first waiting request in the policy's order.
    config = exact_config(
        models=ONE_SLOT,
        stats_interval_ms=NO_STATS_MS,
        priority_weights=(0.25, 0.25, 0.25, 0.25),
        scheduling=scheduling,  # type: ignore[arg-type]
    )
    trace = [TraceRequest(i * 5.0, 10, 5) for i in range(60)]
    fin = [e for e in _events(trace, config) if isinstance(e, EngineFinished)]
    assert len(fin) == 60
    assert len({f.priority for f in fin}) == 4
    key = _admission_key(scheduling)
    sched = {f.request_id: f.arrival_unix_ns + round(f.queue_ms * 1e6) for f in fin}
    inversions = 0
    for a in fin:
        for b in fin:
            # b was waiting when a was admitted, and was admitted after a
            if b.arrival_unix_ns < sched[a.request_id] < sched[b.request_id]:
                assert key(a) <= key(b), (a.request_id, b.request_id)
            if a.arrival_unix_ns < b.arrival_unix_ns and sched[a.request_id] > sched[b.request_id]:
                inversions += 1
    # priority scheduling overtakes earlier arrivals; fcfs never does
    assert (inversions > 0) == (scheduling == "priority")


def test_priority_scheduling_shortens_priority_0_queues(shared_trace: list[TraceRequest]) -> None:
    base = SimConfig(start_unix_ns=START_NS, seed=2, rate_scale=3.0, patience_median_ms=None)
    trace = shared_trace[:3_000]
    queue: dict[str, dict[int, float]] = {}
    for scheduling in ("fcfs", "priority"):
        cfg = dataclasses.replace(base, scheduling=scheduling)
        by_prio: dict[int, list[float]] = defaultdict(list)
        for e in _events(trace, cfg):
            if isinstance(e, EngineFinished):
                by_prio[e.priority].append(e.queue_ms)
        queue[scheduling] = {p: sum(v) / len(v) for p, v in by_prio.items()}
    assert queue["priority"][0] < 0.5 * queue["fcfs"][0]
    assert queue["priority"][3] > queue["fcfs"][3]  # the wait moves to the lowest class


# ---------------------------------------------------------------------------
# overload episode shapes
# ---------------------------------------------------------------------------

EVERY_100_MS = [TraceRequest(i * 100.0, 20, 1) for i in range(1_000)]  # 100 s at 10 req/s
EPISODE_S = (20.0, 80.0)  # 600 arrivals inside


def _arrivals(shape: str, factor: float = 3.0) -> dict[str, float]:
    config = SimConfig(
        start_unix_ns=START_NS,
        patience_median_ms=None,
        stats_interval_ms=NO_STATS_MS,
        overload=OverloadEpisode(*EPISODE_S, factor=factor, shape=shape),  # type: ignore[arg-type]
    )
    return {
        e.request_id: (e.ts_unix_ns - START_NS) / 1e6
        for e in _events(EVERY_100_MS, config)
        if isinstance(e, GatewayReceived)
    }


@pytest.mark.parametrize(
    ("shape", "replicas_lo", "replicas_hi", "max_offset_ms"),
    [
        ("step", 1_200, 1_200, 500.0),  # 600 arrivals x 2 extra copies
        ("burst", 1_200, 1_200, 0.0),  # the same, at the same instant
        ("ramp", 520, 680, 500.0),  # mean extra copies 1 (x1 rising to x3): ~600
    ],
)
def test_episode_shapes_replicate_inside_the_episode(
    shape: str, replicas_lo: int, replicas_hi: int, max_offset_ms: float
) -> None:
    got = _arrivals(shape)
    replicas = {rid: t for rid, t in got.items() if "-x" in rid}
    assert replicas_lo <= len(replicas) <= replicas_hi
    offsets = [t - got[rid.split("-x")[0]] for rid, t in replicas.items()]
    assert all(0.0 <= o <= max_offset_ms + 1e-6 for o in offsets)
    if max_offset_ms == 0.0:
        assert set(offsets) == {0.0}  # a thundering herd
    else:
        assert max(offsets) > 0.0
    originals = {got[rid.split("-x")[0]] for rid in replicas}
    assert all(EPISODE_S[0] * 1000 <= t < EPISODE_S[1] * 1000 for t in originals)


def test_ramp_density_rises_across_the_episode() -> None:
    got = _arrivals("ramp")
    t_of = [got[rid.split("-x")[0]] / 1000.0 for rid in got if "-x" in rid]
    thirds = [sum(1 for t in t_of if 20 + 20 * k <= t < 40 + 20 * k) for k in range(3)]
    # expected extra copies per third: 200 x (1/3, 1, 5/3) ~ 67, 200, 333
    assert thirds[0] < thirds[1] < thirds[2]
    assert thirds[2] > 3 * thirds[0]


@pytest.mark.parametrize(
    ("shape", "offset_s", "factor"),
    [
        ("step", 19.999, 1.0),
        ("step", 20.0, 3.0),
        ("step", 79.9, 3.0),
        ("step", 80.0, 1.0),
        ("burst", 50.0, 3.0),
        ("ramp", 20.0, 1.0),
        ("ramp", 50.0, 2.0),
        ("ramp", 80.0, 1.0),  # the ramp ends: x1 again
    ],
)
def test_episode_factor_at(shape: str, offset_s: float, factor: float) -> None:
    ep = OverloadEpisode(*EPISODE_S, factor=3.0, shape=shape)  # type: ignore[arg-type]
    assert ep.factor_at(offset_s * 1000.0) == pytest.approx(factor)


def test_episode_shape_validation() -> None:
    with pytest.raises(ValueError, match="shape"):
        OverloadEpisode(1.0, 2.0, shape="wave")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("600:1200:3", OverloadEpisode(600.0, 1200.0, 3.0)),
        ("step:600:1200:3", OverloadEpisode(600.0, 1200.0, 3.0)),
        ("ramp:600:1200:2.5", OverloadEpisode(600.0, 1200.0, 2.5, shape="ramp")),
        ("BURST:0:60:5", OverloadEpisode(0.0, 60.0, 5.0, shape="burst")),
        ("none", None),
        ("off", None),
        (None, None),
    ],
)
def test_parse_overload(text: str | None, want: OverloadEpisode | None) -> None:
    assert parse_overload(text) == want


@pytest.mark.parametrize("text", ["600:1200", "wave:1:2:3", "a:b:c", "ramp:1:2:3:4", "10:5:2"])
def test_parse_overload_rejects(text: str) -> None:
    with pytest.raises(SystemExit, match="overload"):
        parse_overload(text)


def test_cli_flags_reach_the_sim_config() -> None:
    args = build_parser().parse_args(
        ["backtest", "--scheduling", "priority", "--overload", "burst:60:120:4"]
    )
    cfg = sim_config_from_args(args)
    assert cfg.scheduling == "priority"
    assert cfg.overload == OverloadEpisode(60.0, 120.0, 4.0, shape="burst")
    assert sim_config_from_args(build_parser().parse_args(["backtest"])).scheduling == "fcfs"


# ---------------------------------------------------------------------------
# the gates' completion hook
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class RecordingGate(GatewayGate):
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def on_complete(self, done: Completion) -> None:
        self.calls.append(dataclasses.asdict(done))


def _shedding(gate: GatewayGate) -> GatewayGate:
    gate.set("*", directive_of(2, "active", {"shed_priorities_at_or_above": 3}))
    return gate


def test_on_complete_once_per_admitted_request(shared_trace: list[TraceRequest]) -> None:
    config = SimConfig(
        start_unix_ns=START_NS,
        seed=5,
        rate_scale=3.0,
        max_queue_ms=4_000.0,  # 503s
        patience_median_ms=8_000.0,  # client aborts
        stats_interval_ms=NO_STATS_MS,
    )
    trace = shared_trace[:1_500]
    gate = _shedding(RecordingGate())
    events = _events(trace, config, gate)
    completed = {
        e.request_id: e for e in events if isinstance(e, GatewayCompleted) and e.http_status != 429
    }
    assert {c["request_id"] for c in gate.calls} == set(completed)
    assert len(gate.calls) == len(completed)  # once each
    outcomes = {c["outcome"] for c in gate.calls}
    assert outcomes == {"ok", "client_abort", "rejected"}
    for c in gate.calls:
        e = completed[c["request_id"]]
        assert (c["gateway"], c["model"], c["outcome"]) == (e.host, e.model, e.outcome)
        assert (c["ttfb_ms"], c["total_ms"]) == (e.ttfb_ms, e.total_ms)
        assert c["t_ms"] == pytest.approx((e.ts_unix_ns - START_NS) / 1e6, abs=1e-3)
        assert c["priority"] < 3  # priority 3 was shed, never admitted
    # the hook changes no event
    assert _events(trace, config, _shedding(GatewayGate())) == events
