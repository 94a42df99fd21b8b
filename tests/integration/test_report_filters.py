"""``tailguard report``: every filter filters every table (issue 36), on the real embedded
engine.

The store is built as an operator would: the simulator's events (12 minutes of the shared
trace, arrivals x3 from minute 4 to 8) ``tailguard replay``ed into an embedded store with
an SLO spec of one-hour budget windows (so that the overload exhausts budgets) and one SLO
that selects one model only. Each filter (model, since, until, SLOs, and combinations) is
checked table by table: the request tables and the SLO table against an exact computation
over the events themselves, the control directives and budget events against the
unfiltered report filtered by the documented rule, the chart series against the tables.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from pipeline.app.report import exact_quantile
from pipeline.cli import DEFAULT_TRACE
from pipeline.contract.codec import encode_event
from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOMatcher
from pipeline.spec.slo import SLOSpec, load_spec_file
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace
from tests.integration.harness import REPO
from tests.integration.test_statement import exact_records
from tests.integration.test_tools_cli import tg
from tests.measurement_fixtures import hourly_spec

pytestmark = [pytest.mark.integration, pytest.mark.long(22)]

START_NS = int(dt.datetime(2026, 11, 3, 9, 0, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
MID = "2026-11-03T09:06:00Z"  # a minute edge in the overload
MID_S = START_NS / 1e9 + 360
SMALL, LARGE = "llama-3-8b", "llama-3-70b"
ONLY_SMALL = "small-queue"  # an SLO that selects the small model only
ALL_QUEUE = "all-queue"  # an SLO of every model with an expected volume


def report(built: dict[str, Any], *args: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "report", "--store", str(built["store"]),
         "--json", *args],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, COLUMNS="200", TAILGUARD_SLO_SPEC=str(built["spec_path"])),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out: dict[str, Any] = json.loads(p.stdout)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("report-filters")
    events = tmp / "events.jsonl"
    cfg = SimConfig(
        start_unix_ns=START_NS,
        seed=11,
        overload=OverloadEpisode(start_offset_s=240, end_offset_s=480, factor=3),
    )
    trace = [r for r in read_trace(DEFAULT_TRACE) if r.arrival_offset_ms < 12 * 60_000]
    with events.open("wb") as fh:
        for e in Simulator(trace, cfg).events():
            fh.write(encode_event(e) + b"\n")
    spec_path = tmp / "slo-1h.yaml"
    spec_path.write_text(
        hourly_spec(REPO / "specs" / "slo-example.yaml").replace(
            "\ntiers:",
            f"""
  - name: {ONLY_SMALL}
    boundary: queue_ms
    threshold_ms: 50
    objective: 0.99
    window: {{rolling: 1h}}
    filter: {{model: [{SMALL}]}}
  - name: {ALL_QUEUE}
    boundary: queue_ms
    threshold_ms: 50
    objective: 0.99
    window: {{rolling: 1h}}
    expected_requests: 10000000

tiers:""",
        )
    )
    store = tmp / "store"
    replay = json.loads(
        tg("replay", str(events), "--store", str(store), "--slo", str(spec_path), "--json").stdout
    )
    assert replay["control"], "the overload should move the control level"
    built = {
        "store": store,
        "spec_path": spec_path,
        "spec": load_spec_file(spec_path),
        "records": exact_records(events),
        "replay": replay,
    }
    built["full"] = report(built)
    return built


def _t(text: str) -> float:
    t = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00").replace(" ", "T"))
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def _covers(spec: SLOSpec, name: str, model: str) -> bool:
    tier = spec.tiers.get(name)
    slo = spec.slo(tier.primary if tier else name)
    return slo.filter is None or slo.filter.model is None or model in slo.filter.model


def _selects(spec: SLOSpec, names: list[str], r: RequestRecord) -> bool:
    """Whether any of the named SLOs (a tier: its primary) selects the record's traffic
    (the spec's filter, prompt exclusion and attempts), independently of the core."""
    if not names:
        return True
    for name in names:
        slo = spec.slo(spec.tiers[name].primary if name in spec.tiers else name)
        f = slo.filter
        ok = f is None or (
            (f.model is None or r.model in f.model)
            and (f.priority is None or r.priority in f.priority)
            and (f.ctx_bucket is None or r.ctx_bucket in f.ctx_bucket)
            and (f.tenant is None or r.tenant in f.tenant)
            and (f.stream is None or r.stream is f.stream)
        )
        limit = slo.exclude.prompt_tokens_over if slo.exclude is not None else None
        ok = ok and (limit is None or r.prompt_tokens is None or r.prompt_tokens <= limit)
        ok = ok and not (slo.attempts == "last" and r.superseded)
        if ok:
            return True
    return False


def _scopes(spec: SLOSpec, names: list[str], model: str | None) -> set[str] | None:
    """Control scopes kept (None: all): the model's and the named SLOs' models'."""
    selected: set[str] | None = None
    for name in names:
        slo = spec.slo(spec.tiers[name].primary if name in spec.tiers else name)
        models = slo.filter.model if slo.filter is not None else None
        if models is None:
            selected = None
            break
        selected = (selected or set()) | set(models)
    if model is not None:
        selected = {model} if selected is None or model in selected else set()
    return None if selected is None else selected | {"*", "fleet"}


def _exact_slos(
    spec: SLOSpec, records: list[RequestRecord], model: str | None, slos: list[str]
) -> dict[str, tuple[int, int]]:
    """Per SLO and tier ``(total, good)`` by the core's classifier over the records."""
    out: dict[str, tuple[int, int]] = {}
    for s in spec.slos:
        verdicts = Counter(SLOMatcher(s).classify(r) for r in records)
        out[s.name] = (verdicts["good"] + verdicts["bad"], verdicts["good"])
    for name, tier in spec.tiers.items():
        prim = SLOMatcher(spec.slo(tier.primary))
        v = [prim.classify(r) for r in records]
        out[name] = (sum(x != "skip" for x in v), v.count("good"))
    return {
        k: v
        for k, v in out.items()
        if (not slos or k in slos) and (model is None or _covers(spec, k, model))
    }


# (the filter's arguments, whether the request tables must be narrower than the time
# range alone: the named SLOs select part of the traffic)
FILTERS = [
    pytest.param([], False, id="none"),
    pytest.param(["--model", LARGE], True, id="model-large"),
    pytest.param(["--model", SMALL], True, id="model-small"),
    pytest.param(["--since", MID], False, id="since"),
    pytest.param(["--until", MID], False, id="until"),
    pytest.param(["--slo", "tier3-ttft", "--slo", ONLY_SMALL], True, id="slos"),
    pytest.param(["--slo", ONLY_SMALL], True, id="slo-of-one-model"),
    pytest.param(["--slo", "blended", "--since", MID], False, id="tier-and-since"),
    pytest.param(["--model", LARGE, "--since", MID], True, id="model-and-since"),
    pytest.param(["--model", SMALL, "--until", MID, "--slo", ONLY_SMALL], True, id="all-three"),
]


@pytest.mark.parametrize(("args", "narrower"), FILTERS)
def test_every_filter_filters_every_table(
    built: dict[str, Any], args: list[str], narrower: bool
) -> None:
    spec: SLOSpec = built["spec"]
    model = args[args.index("--model") + 1] if "--model" in args else None
    since = MID_S if "--since" in args else None
    until = MID_S if "--until" in args else None
    slos = [args[i + 1] for i, a in enumerate(args) if a == "--slo"]

    def in_time(t_s: float) -> bool:
        return (since is None or t_s >= since) and (until is None or t_s < until)

    out = report(built, *args)
    full = built["full"]
    records = [
        r
        for r in built["records"]
        if in_time(r.end_unix_ns / 1e9)
        and (model is None or r.model == model)
        and _selects(spec, slos, r)
    ]
    assert records, "every filter keeps some requests"
    in_range = [r for r in built["records"] if in_time(r.end_unix_ns / 1e9)]
    assert (len(records) < len(in_range)) is narrower
    # requests, sources, outcomes, boundaries, clock skew: the filter's requests
    assert out["requests"] == len(records)
    assert out["by_source"] == dict(sorted(Counter(r.source for r in records).items()))
    assert out["by_outcome"] == dict(sorted(Counter(r.outcome for r in records).items()))
    assert out["boundaries"]["gateway_total_ms"]["count"] == sum(
        r.gateway_total_ms is not None for r in records
    )
    joined = sum(
        r.source == "joined"
        and r.gateway_received_unix_ns is not None
        and r.engine_arrival_unix_ns is not None
        and r.gateway_overhead_ms is not None
        for r in records
    )
    assert sum(e["samples"] for e in out["clock_skew"].values()) == joined
    # the SLO table (and blended tiers): exact over the filter's requests
    want = _exact_slos(spec, records, model, slos)
    got = {name: (s["total"], s["good"]) for name, s in out["slos"].items()}
    assert got == want
    if model == LARGE:
        assert ONLY_SMALL not in out["slos"], "an SLO that does not select the model"
    for name, s in out["slos"].items():
        if s["kind"] == "slo":
            # the budget is over the SLO's own window at the end of the last minute
            # shown, whatever the range (the charts' last point agrees, below)
            window = spec.slo(name).window
            assert s["budget_window"] == (window.rolling or window.calendar), name
            assert s["budget_bad"] >= 0, name
    # budget events: of the SLOs kept, the model's, in the time range
    assert full["budget_events"]
    want_events = [
        e
        for e in full["budget_events"]
        if in_time(_t(e["event_time"]))
        and (not slos or e["slo"] in slos)
        and (model is None or _covers(spec, e["slo"], model))
    ]
    assert out["budget_events"] == want_events
    # control directives: the model's scope (and fleet-wide ones), in the time range
    scopes = _scopes(spec, slos, model)
    want_control = [
        c
        for c in full["control"]
        if in_time(_t(c["event_time"])) and (scopes is None or c["scope"] in scopes)
    ]
    assert out["control"] == want_control
    if scopes is not None:
        assert len(want_control) < len([c for c in full["control"] if in_time(_t(c["event_time"]))])
    # the charts follow the tables
    series = out["series"]
    assert set(series["budget_remaining_per_minute"]) <= set(out["slos"])
    for name, points in series["budget_remaining_per_minute"].items():
        assert all(in_time(_t(t)) for t, _ in points)
        assert points[-1][1] == pytest.approx(out["slos"][name]["budget_remaining"])
    for points in series["latency_p99_ms_per_minute"].values():
        assert all(in_time(_t(t)) for t, _ in points)
    if slos:  # recomputed exactly over the selected requests (quantileExact's element)
        per_minute: dict[int, list[float]] = {}
        for r in records:
            if r.gateway_total_ms is not None:
                per_minute.setdefault(r.end_unix_ns // 60_000_000_000, []).append(
                    r.gateway_total_ms
                )
        want_p99 = {
            m * 60.0: exact_quantile(sorted(v), 0.99) for m, v in sorted(per_minute.items())
        }
        got_p99 = {_t(t): v for t, v in series["latency_p99_ms_per_minute"]["gateway_total_ms"]}
        assert got_p99 == pytest.approx(want_p99)
    for scope in series["control_timeline"]:
        assert scopes is None or scope in scopes
    assert out["filters"]["model"] == model
    assert out["filters"]["slos"] == slos
    print(args, out["requests"], got, [(e["slo"], e["event"]) for e in out["budget_events"]])


def test_per_model_slo_counts_add_up_to_the_windows(built: dict[str, Any]) -> None:
    """The recount over each model's requests and the stream's windows agree: summed over
    the models, every SLO's total and good equal the unfiltered (window) table's."""
    full = built["full"]
    per_model = [report(built, "--model", m)["slos"] for m in (SMALL, LARGE)]
    for name, s in full["slos"].items():
        total = sum(p[name]["total"] for p in per_model if name in p)
        good = sum(p[name]["good"] for p in per_model if name in p)
        assert (total, good) == (s["total"], s["good"]), name


@pytest.mark.parametrize(
    ("args", "basis"),
    [
        ((), "expected"),  # all the SLO's traffic: the spec's expected volume
        (("--model", SMALL), "projected"),  # one model: no expected volume of its own
        (("--slo", ALL_QUEUE), "expected"),  # choosing SLOs keeps the scope
    ],
)
def test_expected_requests_budget_the_whole_traffic_only(
    built: dict[str, Any], args: tuple[str, ...], basis: str
) -> None:
    """``expected_requests`` is the SLO's volume over all its traffic (specs/README.md):
    a report filtered to one model projects that model's budget instead of charging it
    against the whole SLO's expected volume (issue 51's note on ``report --model``)."""
    out = built["full"] if not args else report(built, *args)
    assert out["slos"][ALL_QUEUE]["budget_basis"] == basis
