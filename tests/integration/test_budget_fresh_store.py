"""A fresh store, one replayed hour: no 30-day or monthly budget is declared spent.

``tailguard simulate`` (one hour of the shared trace, at normal load and with a
10-minute x4 overload) and ``tailguard replay`` run in process under the shipped
default spec. Then the same overload under that spec with every window made
``rolling: 1h``: each budget event fires once, at the evaluation an exact
computation over the replay's own closed windows says (allowance of the windows seen,
projected over the hour: pipeline/core/budget.py, docs/budgets.md).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.app.replay import replay_file
from pipeline.cli import main
from pipeline.core.budget import BUDGET_EVENTS, HOUR_MS, min_observed_ms
from pipeline.settings import Settings
from pipeline.shipped import DEFAULT_SLO_SPEC
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.policy import load_policy_file
from pipeline.spec.slo import load_spec
from tests.measurement_fixtures import hourly_spec

pytestmark = [pytest.mark.integration, pytest.mark.long(50)]

LIMIT = 20_600  # requests of the shared trace: about an hour (3,570 simulated s)
OVERLOAD = "1200:1800:4"  # arrivals x4 from minute 20 to minute 30


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fresh")
    out = {}
    for name, overload in (("normal", "none"), ("overload", OVERLOAD)):
        path = d / f"{name}.jsonl"
        args = ["simulate", "--limit", str(LIMIT), "--overload", overload, "--out", str(path)]
        assert main(args) == 0
        out[name] = path
    return out


def _replay(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["replay", str(path), "--no-store", "--json", *extra]) == 0
    summary: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return summary


@pytest.mark.parametrize("load", ["normal", "overload"])
def test_a_fresh_hour_spends_no_long_budget(
    traces: dict[str, Path], capsys: pytest.CaptureFixture[str], load: str
) -> None:
    summary = _replay(traces[load], capsys)
    budgets = summary["budgets"]
    assert {b["window"] for b in budgets.values()} == {"rolling 30d", "calendar month"}
    assert summary["budget_events"] == []
    for slo, b in budgets.items():
        assert b["allowance_basis"] == "projected", slo
        assert b["remaining_fraction"] > 0, slo
        # an hour seen of 30 d (720 h) or of a month (>= 672 h)
        assert b["allowed"] >= 672 * b["observed_allowed"] * 0.999, slo
    if load == "overload":
        # the overload did burn: on the traffic seen, three budgets are overspent
        spent = [s for s, b in budgets.items() if b["consumed"] > b["observed_allowed"] > 0]
        assert len(spent) >= 3, budgets


def _hourly_spec(tmp: Path) -> Path:
    spec = tmp / "slo-hourly.yaml"
    spec.write_text(hourly_spec(DEFAULT_SLO_SPEC))
    return spec


def _exact_events(result: Any, rearm: float) -> list[tuple[str, str, int]]:
    """Budget events by brute force over the replay's closed windows: at every evaluation
    (each base window's end, minus the controller's budget lag) the windows starting in
    the last hour, their allowance projected over the hour, the events' hysteresis."""
    counts: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    starts = []
    for w in result.windows:
        starts.append(w.start_ms)
        if w.slos is None:
            continue
        for r in w.slos.rows():
            if r.kind != "slo":
                continue
            c = counts[r.slo][w.start_ms]
            c[0] += r.total - r.good  # bad
            c[1] += round(1 - r.objective, 12) * r.total  # allowed
    first = min(starts)
    size = result.windows[0].size_ms
    lag = result.control.controller.config.budget_lag_ms
    ends = sorted({s + size for s in starts})
    floor = min_observed_ms(HOUR_MS)
    out = []
    for slo, by_start in sorted(counts.items()):
        armed = {k: True for k, _ in BUDGET_EVENTS}
        for end in ends:
            now = end - lag
            if now <= first:
                continue
            inside = [c for s, c in by_start.items() if now - HOUR_MS <= s < now]
            bad = sum(c[0] for c in inside)
            allowed = sum(c[1] for c in inside)
            observed = min(HOUR_MS, now - first)
            if observed < HOUR_MS:
                allowed = allowed * HOUR_MS / max(observed, floor)
            if allowed <= 0:
                continue
            fraction = bad / allowed
            for kind, threshold in BUDGET_EVENTS:
                if armed[kind] and fraction >= threshold - 1e-9:
                    armed[kind] = False
                    out.append((slo, kind, now))
                elif not armed[kind] and fraction < threshold - rearm:
                    armed[kind] = True
    return sorted(out)


def test_a_rolling_hour_is_spent_once_at_the_exact_evaluation(
    traces: dict[str, Path], tmp_path: Path
) -> None:
    spec_path = _hourly_spec(tmp_path)
    settings = Settings()
    rules = load_burn_rules_file()
    result = replay_file(
        traces["overload"],
        settings.join_config(),
        spec=load_spec(spec_path.read_text()),
        window_config=settings.window_config(),
        clock_config=settings.clock_config(),
        policy=load_policy_file(settings.policy_file) if settings.policy_file else None,
        burn_rules=rules,
        queue_capacity=settings.queue_capacity,
    )
    assert result.control is not None
    got = sorted((e["slo"], e["kind"], e["at_ms"]) for e in result.control.events)
    want = _exact_events(result, rules.budget_events.rearm_margin)
    assert got == want
    # each SLO whose hour was spent: 80 % then exhausted, once each, during the overload
    per = defaultdict(list)
    for slo, kind, at in got:
        per[slo].append((kind, at))
    assert len(per) >= 3, got
    start = min(w.start_ms for w in result.windows)
    for slo, events in per.items():
        kinds = [k for k, _ in events]
        assert sorted(kinds) == sorted(set(kinds)), (slo, events)  # at most once each
        for _, at in events:
            assert start + 20 * 60_000 < at <= start + 60 * 60_000, (slo, events)


def test_the_report_shows_the_budget_the_replay_tracked(
    traces: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``tailguard report`` on the stored replay: each SLO's budget left is over its own
    window (30 days, the month) with the same projected allowance as the replay's budget
    tracker, not over the report's hour (which read -5,426 % before)."""
    from pipeline.adapters.store import open_store
    from pipeline.app.report import read_report
    from pipeline.settings import DEFAULT_SLO_SPEC, Settings
    from pipeline.spec.slo import load_spec_file

    store_dir = tmp_path / "store"
    capsys.readouterr()
    assert main(["replay", str(traces["overload"]), "--store", str(store_dir), "--json"]) == 0
    summary: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    store = open_store(Settings(store_dir=store_dir))
    try:
        report = read_report(store, spec=load_spec_file(DEFAULT_SLO_SPEC))
    finally:
        store.close()
    for name, b in summary["budgets"].items():
        row = report.slos[name]
        assert row["budget_basis"] == "projected", name
        assert row["budget_window"] in ("30d", "month"), name
        assert row["budget_remaining"] == pytest.approx(b["remaining_fraction"], abs=0.002), name
        assert row["budget_remaining"] > 0, name
