"""The controller's /metrics over HTTP, scraped and parsed with prometheus_client's
OpenMetrics parser: its error ratios and budget equal what the store holds (chDB).

(A real Prometheus scrapes /metrics in tests/integration/test_prometheus_rules.py.)
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from pipeline.adapters.prometheus import MetricsServer
from pipeline.adapters.store import open_store
from tests.control_fixtures import replayed_controller

pytestmark = pytest.mark.integration

OPENMETRICS = "application/openmetrics-text; version=1.0.0"  # what Prometheus asks for

WINDOWS = {"5m": 300_000, "30m": 1_800_000, "1h": 3_600_000, "6h": 21_600_000}


def test_metrics_equal_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, settings, shell = replayed_controller(tmp_path, capsys, seed=9, limit=4000)
    store = open_store(settings)
    try:
        assert shell.load_history(store) > 0
        now = int(
            store.query_rows(
                "SELECT toUnixTimestamp64Milli(max(window_start)) + 10000 "
                "FROM tailguard.slo_windows"
            )[0][0]
        )
        stored: dict[tuple[str, str], float | None] = {}
        for label, ms in WINDOWS.items():
            for slo, total, good in store.query_rows(
                "SELECT slo, sum(total), sum(good) FROM tailguard.slo_windows "
                "WHERE kind = 'slo' AND toUnixTimestamp64Milli(window_start) >= {lo:Int64} "
                "AND toUnixTimestamp64Milli(window_start) < {hi:Int64} GROUP BY slo",
                {"lo": now - ms, "hi": now},
            ):
                stored[(slo, label)] = 1 - int(good) / int(total) if int(total) else None
    finally:
        store.close()
    book = shell.controller.book
    assert book is not None
    budgets = book.evaluate(now)
    shell.metrics.publish(budgets, {"*": 1}, {})

    server = MetricsServer(shell.metrics, "127.0.0.1", 0)
    try:
        r = httpx.get(server.url, timeout=10, headers={"Accept": OPENMETRICS})
    finally:
        server.close()
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    got: dict[tuple[str, str, str, str], float] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            key = (s.name, s.labels.get("slo", ""), s.labels.get("scope", ""))
            got[(*key, s.labels.get("window", ""))] = s.value

    slos = {st.slo for st in budgets if st.total}
    assert slos
    compared = 0
    for (slo, label), want in stored.items():
        if slo not in slos or want is None:
            continue
        value = 1 - got[("tailguard_slo_compliance_ratio", slo, "*", label)]
        assert value == pytest.approx(want, rel=1e-9, abs=1e-12), (slo, label)
        compared += 1
    assert compared >= len(slos)
    for st in budgets:
        if st.remaining_fraction is not None:
            name = "tailguard_slo_error_budget_remaining_projected_ratio"
            assert got[(name, st.slo, "*", "")] == pytest.approx(st.remaining_fraction)
    assert got[("tailguard_control_level", "", "*", "")] == 1
