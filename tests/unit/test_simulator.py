"""Unit tests of the load simulator (trace reader, pure model, paced runner)."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.contract.codec import SourceRef, decode_message, encode_batch
from pipeline.contract.events import (
    EngineFinished,
    EngineStats,
    Event,
    GatewayCompleted,
    GatewayReceived,
)
from producers.simulator.model import (
    ModelConfig,
    OverloadEpisode,
    SimConfig,
    Simulator,
    engine_hosts,
    simulate,
)
from producers.simulator.run import run_simulation
from producers.simulator.trace import TraceRequest, parse_timestamp_ns, read_trace
from tests.paths import SHARED_TRACE
from tests.sim_fixtures import NO_STATS_MS, START_NS, exact_config


@pytest.fixture(scope="module")
def shared_trace() -> list[TraceRequest]:
    return read_trace(SHARED_TRACE)


def _head(trace: Sequence[TraceRequest], seconds: float) -> list[TraceRequest]:
    return [t for t in trace if t.arrival_offset_ms < seconds * 1000.0]


def _pct(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    assert xs, "no values"
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _write_csv(path: Path, rows: Sequence[str]) -> Path:
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(r + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------------
# trace
# ---------------------------------------------------------------------------


def test_parse_timestamp_keeps_seven_fractional_digits() -> None:
    a = parse_timestamp_ns("2023-11-16 18:15:46.6805900")
    b = parse_timestamp_ns("2023-11-16 18:15:46.6805901")
    assert b - a == 100  # 1e-7 s
    assert a == 1_700_158_546_680_590_000  # taken as UTC


def test_read_trace_offsets_sorted_and_precise(tmp_path: Path) -> None:
    path = _write_csv(
        tmp_path / "t.csv",
        [
            "2023-11-16 18:15:47.0000000,10,2",
            "2023-11-16 18:15:46.0000000,100,20",
            "2023-11-16 18:15:46.0000001,200,30",
        ],
    )
    trace = read_trace(path)
    assert [t.context_tokens for t in trace] == [100, 200, 10]
    assert trace[0] == TraceRequest(0.0, 100, 20)
    assert trace[1].arrival_offset_ms == pytest.approx(0.0001, abs=1e-9)
    assert trace[2].arrival_offset_ms == pytest.approx(1000.0)


def test_shared_trace_figures(shared_trace: list[TraceRequest]) -> None:
    assert len(shared_trace) == 19_366
    offsets = [t.arrival_offset_ms for t in shared_trace]
    assert offsets[0] == 0.0
    assert offsets == sorted(offsets)
    assert 3400_000 < offsets[-1] < 3600_000
    assert max(t.context_tokens for t in shared_trace) == 14_050
    assert max(t.generated_tokens for t in shared_trace) == 1_000


@pytest.mark.parametrize(
    ("rows", "line", "needle"),
    [
        (["2023-11-16 18:15:46.6805900,10,2", "2023-11-16 18:15:4x.1,1,1"], 3, "timestamp"),
        (["2023-11-16 18:15:46.6805900,ten,2"], 2, "ContextTokens"),
        (["2023-11-16 18:15:46.6805900,10,-2"], 2, "GeneratedTokens is negative"),
        (["2023-11-16 18:15:46.6805900,10"], 2, "columns"),
        (["2023-11-16 18:15:46.68059001234,10,2"], 2, "fractional"),
        (["16/11/2023 18:15:46,10,2"], 2, "timestamp"),
    ],
)
def test_read_trace_malformed_row_names_file_and_line(
    tmp_path: Path, rows: list[str], line: int, needle: str
) -> None:
    path = _write_csv(tmp_path / "bad.csv", rows)
    with pytest.raises(ValueError, match=needle) as info:
        read_trace(path)
    assert f"{path}:{line}:" in str(info.value)


def test_read_trace_bad_header(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("TIMESTAMP,Tokens\n2023-11-16 18:15:46.6805900,1\n")
    with pytest.raises(ValueError, match=r"h\.csv:1: header lacks column\(s\) ContextTokens"):
        read_trace(path)


# ---------------------------------------------------------------------------
# config validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"start_unix_ns": 0}, "start_unix_ns"),
        ({"rate_scale": 0.0}, "rate_scale"),
        ({"stream_fraction": 1.5}, "stream_fraction"),
        ({"priority_weights": (0.0, 0.0, 0.0, 0.0)}, "priority_weights"),
        ({"gateway_pre_ms": (4.0, 1.0)}, "gateway_pre_ms"),
        ({"engine_skew_ms": (("nope-0", 1.0),)}, "engine_skew_ms"),
        ({"max_queue_ms": -1.0}, "max_queue_ms"),
        ({"stats_interval_ms": 0.0}, "stats_interval_ms"),
        ({"models": ()}, "models"),
    ],
)
def test_config_validation_names_the_field(changes: dict[str, object], field: str) -> None:
    kwargs: dict[str, object] = {"start_unix_ns": START_NS, **changes}
    with pytest.raises(ValueError, match=field):
        SimConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"engines": 0}, "engines"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"weight": 0.0}, "weight"),
    ],
)
def test_model_config_validation(changes: dict[str, object], field: str) -> None:
    base = {
        "name": "m",
        "weight": 1.0,
        "engines": 1,
        "max_concurrency": 4,
        "prefill_ms_per_token": 0.1,
        "decode_base_ms": 5.0,
        "decode_ms_per_seq": 0.5,
    }
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{**base, **changes})  # type: ignore[arg-type]


def test_overload_validation() -> None:
    with pytest.raises(ValueError, match="end_offset_s"):
        OverloadEpisode(10.0, 5.0)


# ---------------------------------------------------------------------------
# event invariants
# ---------------------------------------------------------------------------


def _check_invariants(events: list[Event], sim: Simulator, config: SimConfig) -> Counter[str]:
    """Assert every contract and consistency rule; return the outcome counts."""
    ts = [e.ts_unix_ns for e in events]
    assert ts == sorted(ts), "events out of time order"
    ids = [e.event_id for e in events]
    assert len(ids) == len(set(ids)), "duplicate event ids"
    for e in events:
        assert isinstance(e, GatewayReceived | GatewayCompleted | EngineFinished | EngineStats)

    # The wire round trip accepts every event unchanged (in messages of 200 events).
    for i in range(0, len(events), 200):
        decoded = decode_message(encode_batch(events[i : i + 200]), SourceRef("t", 0, i))
        assert decoded.dead == []
        assert decoded.events == events[i : i + 200]

    skew = sim.engine_skew_ms
    by_req: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if isinstance(e, EngineStats):
            assert e.request_id == ""
            assert e.host in skew
            assert e.host.startswith(e.model + "-")
            assert (
                e.num_running <= next(m for m in config.models if m.name == e.model).max_concurrency
            )
        else:
            by_req[e.request_id].append(e)
    assert len(by_req) == sim.summary.requests

    outcomes: Counter[str] = Counter()
    for rid, evs in by_req.items():
        kinds = Counter(e.kind for e in evs)
        assert kinds["gateway.received"] == 1, rid
        assert kinds["gateway.completed"] == 1, rid
        rec = next(e for e in evs if isinstance(e, GatewayReceived))
        done = next(e for e in evs if isinstance(e, GatewayCompleted))
        fin = [e for e in evs if isinstance(e, EngineFinished)]
        outcomes[done.outcome] += 1
        assert rec.host == done.host
        assert rec.model == done.model
        assert rec.host in config.gateway_hosts
        # gateway durations are from the gateway clock
        assert done.ts_unix_ns - rec.ts_unix_ns == pytest.approx(done.total_ms * 1e6, abs=2)
        if done.ttfb_ms is not None:
            assert done.ttfb_ms <= done.total_ms
        if done.outcome == "ok":
            assert done.http_status == 200
            assert len(fin) == 1, rid
            f = fin[0]
            assert f.host in skew
            assert f.model == rec.model
            assert f.inference_ms == pytest.approx(f.prefill_ms + f.decode_ms, abs=1e-6)
            assert f.e2e_ms == pytest.approx(f.queue_ms + f.inference_ms, abs=1e-6)
            assert done.total_ms >= f.e2e_ms
            assert done.output_tokens == f.output_tokens
            assert f.prompt_tokens == rec.prompt_tokens
            assert f.cached_tokens < max(f.prompt_tokens, 1)
            assert f.priority == rec.priority
            assert f.finish_reason == (
                "length" if f.output_tokens == config.max_output_tokens else "stop"
            )
            # engine durations are from the engine clock
            assert f.ts_unix_ns - f.arrival_unix_ns == pytest.approx(f.e2e_ms * 1e6, abs=2)
            # across clocks only the skew and the gateway's pre-processing separate them
            gap_ms = (f.arrival_unix_ns - rec.ts_unix_ns) / 1e6 - skew[f.host]
            assert config.gateway_pre_ms[0] - 1e-3 <= gap_ms <= config.gateway_pre_ms[1] + 1e-3
            post_ms = done.total_ms - f.e2e_ms - gap_ms
            assert config.gateway_post_ms[0] - 1e-3 <= post_ms <= config.gateway_post_ms[1] + 1e-3
            if rec.stream:
                assert done.ttfb_ms is not None
                assert done.ttfb_ms <= done.total_ms
            else:
                assert done.ttfb_ms == done.total_ms
        else:
            assert fin == [], f"{rid}: {done.outcome} but the engine reported it"
            if done.outcome == "client_abort":
                assert done.http_status == 0
                # a client stop mid-stream had its first byte; a patience abort had none
                assert (done.ttfb_ms is None) == (done.output_tokens == 0)
            else:
                assert done.outcome == "rejected"
                assert done.http_status == 503
                assert config.max_queue_ms is not None
                assert done.total_ms >= config.max_queue_ms
    s = sim.summary
    assert (outcomes["ok"], outcomes["client_abort"], outcomes["rejected"]) == (
        s.ok,
        s.client_aborts,
        s.rejected,
    )
    assert sum(s.events_by_kind.values()) == len(events)
    return outcomes


SCENARIOS: dict[str, dict[str, object]] = {
    "default": {},
    "impatient": {
        "patience_median_ms": 4_000.0,
        "patience_sigma": 0.5,
        "stream_stop_fraction": 0.2,
    },
    "overload-queue-timeout": {
        "overload": OverloadEpisode(60.0, 240.0, 3.0),
        "max_queue_ms": 2_000.0,
    },
    "fast-and-skewed": {
        "rate_scale": 2.5,
        "engine_skew_ms": (("llama-3-8b-0", -40.0), ("llama-3-70b-1", 25.0)),
        "stream_fraction": 0.3,
        "max_output_tokens": 300,
    },
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_events_satisfy_the_contract(shared_trace: list[TraceRequest], name: str) -> None:
    config = SimConfig(start_unix_ns=START_NS, seed=7, **SCENARIOS[name])  # type: ignore[arg-type]
    sim = Simulator(_head(shared_trace, 300), config)
    events = list(sim.events())
    outcomes = _check_invariants(events, sim, config)
    assert outcomes["ok"] > 0
    if name == "impatient":
        assert outcomes["client_abort"] > 50
    if name == "overload-queue-timeout":
        assert outcomes["rejected"] > 0
    if name == "fast-and-skewed":
        assert sim.engine_skew_ms["llama-3-8b-0"] == -40.0
        assert any(isinstance(e, EngineFinished) and e.finish_reason == "length" for e in events)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(
            st.floats(0, 20_000, allow_nan=False),
            st.integers(0, 3_000),
            st.integers(0, 400),
        ),
        min_size=1,
        max_size=40,
    ),
    seed=st.integers(0, 2**32),
    max_queue_ms=st.one_of(st.none(), st.floats(0, 500)),
    patience=st.one_of(st.none(), st.floats(1, 3_000)),
    stop=st.floats(0, 1),
)
def test_invariants_hold_for_any_small_trace(
    rows: list[tuple[float, int, int]],
    seed: int,
    max_queue_ms: float | None,
    patience: float | None,
    stop: float,
) -> None:
    trace = sorted((TraceRequest(*r) for r in rows), key=lambda t: t.arrival_offset_ms)
    config = SimConfig(
        start_unix_ns=START_NS,
        seed=seed,
        max_queue_ms=max_queue_ms,
        patience_median_ms=patience,
        patience_min_ms=1.0,
        stream_stop_fraction=stop,
        stats_interval_ms=250.0,
        models=(
            ModelConfig("tiny", 1.0, 1, 2, 0.05, 5.0, 1.0, 4_096),
            ModelConfig("big", 1.0, 2, 3, 0.1, 10.0, 2.0, 8_192),
        ),
    )
    sim = Simulator(trace, config)
    _check_invariants(list(sim.events()), sim, config)


def test_deterministic_per_seed(shared_trace: list[TraceRequest]) -> None:
    trace = _head(shared_trace, 120)
    base = SimConfig(start_unix_ns=START_NS, seed=11)
    a = [e.model_dump() for e in simulate(trace, base)]
    b = [e.model_dump() for e in simulate(trace, base)]
    c = [e.model_dump() for e in simulate(trace, dataclasses.replace(base, seed=12))]
    assert a == b
    assert a != c


def test_overload_replicas_have_distinct_ids(shared_trace: list[TraceRequest]) -> None:
    trace = _head(shared_trace, 60)
    config = SimConfig(start_unix_ns=START_NS, overload=OverloadEpisode(10.0, 20.0, 3.0))
    received = [e for e in simulate(trace, config) if isinstance(e, GatewayReceived)]
    in_window = sum(1 for t in trace if 10_000 <= t.arrival_offset_ms < 20_000)
    replicas = [e.request_id for e in received if "-x" in e.request_id]
    assert len(received) == len(trace) + 2 * in_window
    assert len(replicas) == 2 * in_window
    assert len({e.request_id for e in received}) == len(received)


def test_stats_cover_every_engine_each_interval(shared_trace: list[TraceRequest]) -> None:
    trace = _head(shared_trace, 60)
    config = SimConfig(start_unix_ns=START_NS, stats_interval_ms=500.0)
    stats = [e for e in simulate(trace, config) if isinstance(e, EngineStats)]
    per_host = Counter(e.host for e in stats)
    assert set(per_host) == set(engine_hosts(config.models))
    assert len(set(per_host.values())) == 1
    assert next(iter(per_host.values())) >= 60_000 / 500
    assert any(e.kv_cache_usage > 0 for e in stats)
    rates = [e.prefix_cache_hit_rate for e in stats if e.prefix_cache_hit_rate is not None]
    assert rates
    assert 0.6 < sum(rates) / len(rates) < 1.0


# ---------------------------------------------------------------------------
# the required shape
# ---------------------------------------------------------------------------


def _gateway_totals(trace: Sequence[TraceRequest], config: SimConfig) -> list[float]:
    return [e.total_ms for e in simulate(trace, config) if isinstance(e, GatewayCompleted)]


def test_p99_rises_steeply_once_saturated(shared_trace: list[TraceRequest]) -> None:
    trace = _head(shared_trace, 900)
    p50: dict[float, float] = {}
    p99: dict[float, float] = {}
    for scale in (0.01, 0.25, 1.0, 3.0):
        cfg = SimConfig(start_unix_ns=START_NS, rate_scale=scale, stats_interval_ms=NO_STATS_MS)
        totals = _gateway_totals(trace, cfg)
        p50[scale], p99[scale] = _pct(totals, 0.5), _pct(totals, 0.99)
    # well below saturation the median stays near the unloaded latency (rate 0.01)
    assert p50[0.25] <= 1.15 * p50[0.01]
    assert p50[1.0] <= 1.6 * p50[0.01]
    assert p99[0.25] <= p99[1.0] <= p99[3.0]
    # past saturation queues grow: the tail explodes
    assert p99[3.0] >= 5 * p99[0.25]
    assert p50[3.0] >= 10 * p50[1.0]


def test_overload_episode_raises_p99_inside_it(shared_trace: list[TraceRequest]) -> None:
    trace = _head(shared_trace, 900)
    config = SimConfig(
        start_unix_ns=START_NS,
        stats_interval_ms=NO_STATS_MS,
        overload=OverloadEpisode(start_offset_s=300.0, end_offset_s=600.0, factor=3.0),
    )
    received: dict[str, int] = {}
    totals: dict[str, float] = {}
    for e in simulate(trace, config):
        if isinstance(e, GatewayReceived):
            received[e.request_id] = e.ts_unix_ns
        elif isinstance(e, GatewayCompleted):
            totals[e.request_id] = e.total_ms

    def window(lo_s: float, hi_s: float) -> list[float]:
        lo, hi = START_NS + int(lo_s * 1e9), START_NS + int(hi_s * 1e9)
        return [totals[r] for r, ts in received.items() if lo <= ts < hi]

    before, during = window(0, 300), window(300, 600)
    assert len(during) > 2.5 * len(before)
    assert _pct(during, 0.99) >= 4 * _pct(before, 0.99)
    assert _pct(during, 0.5) >= 10 * _pct(before, 0.5)


def test_full_trace_is_moderately_loaded(shared_trace: list[TraceRequest]) -> None:
    # Its speed (the whole trace in under 6 s) is measured by `./tg bench --only simulator`.
    config = SimConfig(start_unix_ns=START_NS)
    sim = Simulator(shared_trace, config)
    totals = [e.total_ms for e in sim.events() if isinstance(e, GatewayCompleted)]
    s = sim.summary
    assert len(totals) == s.requests == 19_366
    assert 0.003 < s.client_aborts / s.requests < 0.02
    assert 1_000 < _pct(totals, 0.99) < 10_000
    for model in config.models:
        hosts = [h for h in s.engine_mean_running if h.startswith(model.name + "-")]
        util = sum(s.engine_mean_running[h] for h in hosts) / len(hosts) / model.max_concurrency
        assert 0.3 < util < 0.7, (model.name, util)


# ---------------------------------------------------------------------------
# runner
# ---------------------------------------------------------------------------


class _ListSink:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.ticks = 0
        self.flushed = 0

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def tick(self) -> None:
        self.ticks += 1

    def flush(self, timeout_s: float = 10.0) -> int:
        self.flushed += 1
        return 0

    def close(self) -> None:
        pass


def test_run_simulation_paces_and_flushes(tmp_path: Path) -> None:
    path = _write_csv(
        tmp_path / "t.csv",
        [
            "2023-11-16 18:15:46.0000000,50,3",
            "2023-11-16 18:15:46.5000000,60,4",
            "2023-11-16 18:15:47.0000000,70,5",
        ],
    )
    sink = _ListSink()
    config = SimConfig(start_unix_ns=START_NS, patience_median_ms=None, stream_stop_fraction=0.0)
    summary = run_simulation(path, config, sink, speedup=10.0, progress=False)
    assert summary.requests == 3
    assert summary.ok == 3
    assert summary.events_sent == len(sink.events) == sum(summary.events_by_kind.values())
    assert summary.events_by_kind["engine.finished"] == 3
    assert sink.flushed == 1
    assert summary.undelivered == 0
    assert sink.ticks > 0
    assert summary.simulated_s >= 1.0
    assert summary.wall_s >= summary.simulated_s / 10.0 * 0.9
    assert [e.ts_unix_ns for e in sink.events] == sorted(e.ts_unix_ns for e in sink.events)


def test_run_simulation_unpaced_matches_the_model(tmp_path: Path) -> None:
    path = _write_csv(tmp_path / "t.csv", ["2023-11-16 18:15:46.0000000,50,3"])
    sink = _ListSink()
    config = SimConfig(start_unix_ns=START_NS)
    summary = run_simulation(path, config, sink, speedup=None, progress=True)
    assert sink.events == list(simulate(read_trace(path), config))
    assert summary.events_sent == len(sink.events)
    with pytest.raises(ValueError, match="speedup"):
        run_simulation(path, config, sink, speedup=0.0)


# ---------------------------------------------------------------------------
# single-request timing: the engine formula, exactly
# ---------------------------------------------------------------------------

ONE_MODEL = (ModelConfig("m", 1.0, 1, 4, 0.5, 10.0, 2.0, 10_000),)


@pytest.mark.parametrize(("prompt", "generated"), [(100, 1), (1_000, 50), (3, 400)])
def test_unloaded_request_follows_the_iteration_formula(prompt: int, generated: int) -> None:
    config = exact_config(models=ONE_MODEL, prefix_hit_fraction=0.0)
    events = list(simulate([TraceRequest(0.0, prompt, generated)], config))
    fin = next(e for e in events if isinstance(e, EngineFinished))
    step_ms = 10.0 + 2.0  # one running sequence
    assert fin.queue_ms == 0.0
    assert fin.cached_tokens == 0
    assert fin.prefill_ms == pytest.approx(step_ms + 0.5 * prompt)
    assert fin.decode_ms == pytest.approx(step_ms * (generated - 1))
    assert fin.output_tokens == generated


@pytest.mark.parametrize(
    ("stream", "outcome", "ttfb_is_none"),
    [(False, "client_abort", True), (True, "ok", False)],
)
def test_patience_is_for_the_first_byte(stream: bool, outcome: str, ttfb_is_none: bool) -> None:
    # 400 tokens take ~4.8 s; the client waits 1 s for its first byte.
    config = SimConfig(
        start_unix_ns=START_NS,
        models=ONE_MODEL,
        stream_fraction=1.0 if stream else 0.0,
        patience_median_ms=1_000.0,
        patience_sigma=0.0,
        stream_stop_fraction=0.0,
    )
    events = list(simulate([TraceRequest(0.0, 10, 400)], config))
    done = next(e for e in events if isinstance(e, GatewayCompleted))
    assert done.outcome == outcome
    assert (done.ttfb_ms is None) == ttfb_is_none
    if outcome == "client_abort":
        assert done.total_ms == pytest.approx(1_000.0)
        assert not any(isinstance(e, EngineFinished) for e in events)
    stats = [e for e in events if isinstance(e, EngineStats)]
    assert stats[-1].num_running + stats[-1].num_waiting <= 1


def test_abort_frees_the_engine_slot() -> None:
    # One slot; the first request's client leaves after 1 s, the second then runs at once.
    model = (ModelConfig("m", 1.0, 1, 1, 0.0, 10.0, 0.0, 10_000),)
    config = exact_config(
        models=model, stream_fraction=0.0, patience_median_ms=1_000.0, patience_sigma=0.0
    )
    trace = [TraceRequest(0.0, 10, 1_000), TraceRequest(100.0, 10, 1)]
    events = list(simulate(trace, dataclasses.replace(config, patience_median_ms=None)))
    slow = next(e for e in events if isinstance(e, EngineFinished) and e.output_tokens == 1)
    assert slow.queue_ms > 9_000  # without aborts it waits for all 1000 tokens
    events = list(simulate(trace, config))
    fin = [e for e in events if isinstance(e, EngineFinished)]
    assert len(fin) == 1
    assert fin[0].output_tokens == 1
    assert fin[0].queue_ms < 1_000  # admitted at the first iteration boundary after the abort
