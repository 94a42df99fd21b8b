"""The measurement core on simulated events from the shared trace (replay, no I/O but files)."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from pipeline.app.replay import ReplayResult, replay_file
from pipeline.core.sketch import exact_quantile_lower
from pipeline.spec.slo import load_spec
from tests.measurement_fixtures import load_events, simulate_jsonl

# CPU-bound replays of the shared trace (~50 s in all): started first under xdist
pytestmark = pytest.mark.long(50)

QS = (0.5, 0.9, 0.95, 0.99)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    path = tmp_path_factory.mktemp("sim") / "events.jsonl"
    skews = simulate_jsonl(path)
    return path, skews


# Replays of the simulation that several tests read, run once for the module (each is
# seconds of CPU; a replay is a pure function of the file and its arguments).
@pytest.fixture(scope="module")
def sim_summary(sim) -> dict:
    path, _ = sim
    return replay_file(path).summary()


@pytest.fixture(scope="module")
def clean_example(sim) -> ReplayResult:
    path, _ = sim
    return replay_file(path, spec=load_spec(Path("specs/slo-example.yaml").read_text()))


def _expected_boundaries(events: list[dict]) -> dict[str, list[float]]:
    """Every boundary straight from the events, independent of the join code."""
    done = {e["request_id"]: e for e in events if e["kind"] == "gateway.completed"}
    fin = {e["request_id"]: e for e in events if e["kind"] == "engine.finished"}
    out: dict[str, list[float]] = defaultdict(list)
    for e in done.values():
        out["gateway_total_ms"].append(e["total_ms"])
        if e.get("ttfb_ms") is not None:
            out["gateway_ttfb_ms"].append(e["ttfb_ms"])
    for rid, f in fin.items():
        for k in ("queue_ms", "prefill_ms", "decode_ms", "inference_ms"):
            out[k].append(f[k])
        out["engine_e2e_ms"].append(f["e2e_ms"])
        out["ttft_engine_ms"].append(f["queue_ms"] + f["prefill_ms"])
        if f["output_tokens"] >= 2:
            out["tpot_ms"].append(f["decode_ms"] / (f["output_tokens"] - 1))
        if rid in done:
            out["gateway_overhead_ms"].append(done[rid]["total_ms"] - f["e2e_ms"])
    streamed = {e["request_id"] for e in events if e["kind"] == "gateway.received" and e["stream"]}
    for rid, c in done.items():
        # gateway only (no engine event): a streamed request's TPOT from first to last
        # byte over the tokens after the first, on the gateway's clock
        n = c.get("output_tokens") or 0
        if rid not in fin and rid in streamed and c.get("ttfb_ms") is not None and n >= 2:
            out["tpot_ms"].append(max(0.0, c["total_ms"] - c["ttfb_ms"]) / (n - 1))
    return out


def test_every_boundary_quantile_is_within_one_percent_of_exact(sim, sim_summary) -> None:
    path, _ = sim
    summary = sim_summary
    expected = _expected_boundaries(load_events(path))
    assert summary["requests"] >= 19_000
    assert set(expected) == set(summary["boundaries"])
    for name, values in expected.items():
        got = summary["boundaries"][name]
        assert got["count"] == len(values), name
        values.sort()
        for q, key in zip(QS, ("p50", "p90", "p95", "p99"), strict=True):
            exact = exact_quantile_lower(values, q)
            assert got[key] == pytest.approx(exact, rel=0.01, abs=1e-9), (name, key)


def _shuffled(
    events: list[dict], seed: int, displacement_ms: float, dup_share: float
) -> list[dict]:
    """Each event displaced by up to ``displacement_ms`` of event time; some sent twice."""
    rng = random.Random(seed)
    noisy = events + [e for e in events if rng.random() < dup_share]
    keyed = [
        (e["ts_unix_ns"] / 1e6 + rng.uniform(0, displacement_ms), i, e) for i, e in enumerate(noisy)
    ]
    keyed.sort()
    return [e for _, _, e in keyed]


def _write(path: Path, events: list[dict]) -> None:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))


def _window_totals(res: ReplayResult) -> dict[int, int]:
    return {w.start_ms: w.records.get(("*", "*", "*"), 0) for w in res.windows}


@pytest.mark.parametrize("seed", [1, 2])
def test_shuffled_order_with_duplicates_gives_identical_results(
    sim, clean_example: ReplayResult, tmp_path: Path, seed: int
) -> None:
    path, _ = sim
    spec = load_spec(Path("specs/slo-example.yaml").read_text())
    events = load_events(path)
    noisy = tmp_path / "noisy.jsonl"
    _write(noisy, _shuffled(events, seed, displacement_ms=10_000, dup_share=0.01))
    clean = clean_example
    dirty = replay_file(noisy, spec=spec)
    a, b = clean.summary(), dirty.summary()
    for key in ("requests", "boundaries", "slos", "blended", "outcomes"):
        assert a[key] == b[key], key
    assert dirty.counters["join"]["duplicates"] > 0
    # Displacement stays inside the grace period: windows are identical too.
    assert _window_totals(clean) == _window_totals(dirty)
    assert sum(_window_totals(dirty).values()) == a["requests"]
    assert dirty.summary()["windows"]["corrected_records"] == 0


SPEC = """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: gw-1s, boundary: gateway_total_ms, threshold_ms: 1000, objective: 0.9}
  - {name: queue-100, boundary: queue_ms, threshold_ms: 100, objective: 0.95}
  - name: prio0-compute
    boundary: inference_ms
    threshold_ms: 2000
    objective: 0.99
    window: {rolling: 30d}
    filter: {priority: [0]}
tiers:
  blended: {primary: gw-1s, secondary: queue-100, secondary_weight: 0.7, objective: 0.99}
"""


def test_slo_counts_equal_an_exact_count(sim) -> None:
    path, _ = sim
    events = load_events(path)
    res = replay_file(path, spec=load_spec(SPEC))
    got = res.summary()["slos"]
    done = {e["request_id"]: e for e in events if e["kind"] == "gateway.completed"}
    fin = {e["request_id"]: e for e in events if e["kind"] == "engine.finished"}
    prio = {e["request_id"]: e["priority"] for e in events if e["kind"] == "gateway.received"}
    failed = {"error", "timeout", "rejected"}

    gw_good = {r for r, e in done.items() if e["outcome"] not in failed and e["total_ms"] <= 1000}
    assert got["gw-1s"] == {
        "total": len(done),
        "good": len(gw_good),
        "compliance": len(gw_good) / len(done),
    }
    q_good = {
        r
        for r, e in fin.items()
        if e["queue_ms"] <= 100 and done.get(r, {}).get("outcome") not in failed
    }
    assert (got["queue-100"]["total"], got["queue-100"]["good"]) == (len(fin), len(q_good))
    p0 = [r for r in fin if prio.get(r) == 0]
    p0_good = [r for r in p0 if fin[r]["inference_ms"] <= 2000]
    assert (got["prio0-compute"]["total"], got["prio0-compute"]["good"]) == (len(p0), len(p0_good))
    secondary_only = len((q_good - gw_good) & set(done))
    assert res.summary()["blended"]["compliance"] == pytest.approx(
        (len(gw_good) + 0.7 * secondary_only) / len(done)
    )


def test_clock_skew_is_estimated_per_host_pair(sim, sim_summary) -> None:
    _, skews = sim
    report = sim_summary["clock_skew"]
    assert report
    for pair, est in report.items():
        engine = pair.split("->")[1]
        # The simulated gateway spends U(1, 4) ms before and after the engine (symmetric).
        assert est["offset_p50_ms"] == pytest.approx(skews[engine], abs=1.0), pair


def test_replay_reports_serving_signals_per_model_and_engine(sim) -> None:
    path, _ = sim
    serving = replay_file(path, queue_capacity=8).summary()["serving"]
    assert serving["queue_capacity"] == 8
    assert set(serving["models"]) == {"llama-3-8b", "llama-3-70b"}
    for m in serving["models"].values():
        assert 0 < m["queue_compute_ratio"] <= 1
    assert len(serving["engines"]) == 4
    for e in serving["engines"].values():
        assert e["samples"] > 1000
        assert 0 < e["mean_kv_cache_hit_rate"] <= 1
        assert e["max_queue_saturation"] >= 0
