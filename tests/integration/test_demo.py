"""The demo end to end on the shared trace, checked against an exact computation."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from pipeline.app.demo import run_demo
from pipeline.cli import DEFAULT_TRACE
from pipeline.core.sketch import DEFAULT_RELATIVE_ACCURACY, QuantileSketch
from producers.simulator.model import SimConfig

pytestmark = [pytest.mark.integration, pytest.mark.long(80)]


def _ranked(values: list[float], q: float) -> float:
    """The value of rank ``q * (n - 1)``: the one a sketch's quantile is within its
    relative accuracy of (DDSketch's rank convention)."""
    s = sorted(values)
    return s[int(q * (len(s) - 1))]


def _sketched(values: list[float], q: float) -> float:
    """What the report states: the quantile of a sketch of every value (the windows'
    sketches merged; docs/report.md), within the sketch's relative accuracy of exact."""
    sk = QuantileSketch()
    sk.add_many(values)
    return sk.quantile(q)


def _expected_from_events(path: Path) -> dict:
    """Independent of the pipeline's join: straight from the emitted events."""
    by_kind: dict[str, dict[str, dict]] = defaultdict(dict)
    for line in path.read_bytes().splitlines():
        msg = orjson.loads(line)
        for ev in msg if isinstance(msg, list) else [msg]:
            by_kind[ev["kind"]][ev["request_id"]] = ev
    done, fin = by_kind["gateway.completed"], by_kind["engine.finished"]
    series = {
        "gateway_total_ms": [e["total_ms"] for e in done.values()],
        "queue_ms": [e["queue_ms"] for e in fin.values()],
        "inference_ms": [e["inference_ms"] for e in fin.values()],
        "engine_e2e_ms": [e["e2e_ms"] for e in fin.values()],
    }
    return {
        "requests": len(set(done) | set(fin)),
        "aborts": sum(1 for e in done.values() if e["outcome"] == "client_abort"),
        "boundaries": {
            k: {"count": len(v), "p50": _sketched(v, 0.5), "p99": _sketched(v, 0.99)}
            for k, v in series.items()
        },
        "ranked": {k: {"p50": _ranked(v, 0.5), "p99": _ranked(v, 0.99)} for k, v in series.items()},
    }


def test_demo_reports_every_request_of_the_shared_trace_exactly(kafka, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    report_path = tmp_path / "report.json"
    rc = run_demo(
        trace=DEFAULT_TRACE,
        sim_config=SimConfig(start_unix_ns=time.time_ns(), seed=7),
        speedup=None,
        partitions=4,
        workdir=tmp_path / "demo",
        bootstrap=kafka.bootstrap_servers,
        tee_jsonl=events,
        json_out=report_path,
    )
    assert rc == 0
    report = orjson.loads(report_path.read_bytes())
    expected = _expected_from_events(events)

    assert report["requests"] >= 19_000
    assert report["requests"] == expected["requests"]
    assert report["by_outcome"].get("client_abort", 0) == expected["aborts"]
    for name, want in expected["boundaries"].items():
        assert report["boundaries"][name] == want, name
        for q, exact in expected["ranked"][name].items():  # the sketch's guarantee
            got = report["boundaries"][name][q]
            assert abs(got - exact) <= DEFAULT_RELATIVE_ACCURACY * exact, (name, q, got, exact)
