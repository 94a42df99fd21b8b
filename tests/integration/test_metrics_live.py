"""A live worker running the controller serves /metrics (TAILGUARD_PROMETHEUS_PORT) and
posts to a real Alertmanager (TAILGUARD_ALERTMANAGER_URL): the overload of
test_control, scraped at the end and parsed with prometheus_client's parser, checked by
``promtool check metrics``, and scraped throughout by a real Prometheus loaded with the
exported rules: its SLO counters equal the store's, and PromQL's P99 over the native
latency histogram (scraped over protobuf) lies within the sketch's relative accuracy of
the store's P99 of the same windows."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as prometheus_text

from pipeline.adapters.controller import read_topic
from pipeline.adapters.query_server import open_reader
from pipeline.adapters.sketch_sql import quantile_sql
from pipeline.app.rules import export_text, to_yaml
from pipeline.core.prom_rules import ALERTNAME, alertmanager_example
from pipeline.settings import EXAMPLE_SLO_SPEC
from tests.ceilings import ceiling
from tests.control_fixtures import (
    emit_overload,
)
from tests.integration.harness import WorkerProcess, control_settings
from tests.integration.test_native_histograms import NativePrometheus
from tools.dev.alertmanager_local import LocalAlertmanager
from tools.dev.go_server import free_port
from tools.dev.prometheus_local import LocalPrometheus, promtool

pytestmark = [pytest.mark.integration, pytest.mark.long(60)]

FAST_RULES = """
apiVersion: tailguard/v1
kind: BurnRules
rules:
  - {name: page, kind: burn_rate, severity: page, factor: 5, long: 20s, short: 4s,
     min_requests: 20}
  - {name: ticket, kind: burn_rate, severity: ticket, factor: 2, long: 1m, short: 10s}
"""


def _levels(raws: list[bytes]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for raw in raws:
        s = orjson.loads(raw)
        seq = out.setdefault(s["scope"], [])
        if not seq or seq[-1] != s["level"]:
            seq.append(s["level"])
    return out


def test_live_worker_serves_metrics(kafka, tmp_path: Path) -> None:
    port = free_port()
    # the spec's rules, with the burn windows of seconds (the replay runs in
    # seconds of wall time, and Prometheus' rates are over wall time)
    burn = tmp_path / "burn.yaml"
    burn.write_text(FAST_RULES)
    rules = tmp_path / "rules.yaml"
    rules.write_text(export_text(EXAMPLE_SLO_SPEC, burn))  # the worker's spec (harness)
    with (
        LocalAlertmanager(tmp_path / "alertmanager") as am,
        LocalAlertmanager(
            tmp_path / "am-prom", config=to_yaml(alertmanager_example("http://127.0.0.1:9/"))
        ) as am_prom,
        NativePrometheus(
            tmp_path / "prom", targets=[f"127.0.0.1:{port}"], rule_files=[rules],
            alertmanager=am_prom.url.removeprefix("http://"),
        ) as prom,
    ):  # fmt: skip
        s, _ = control_settings(
            kafka.bootstrap_servers, tmp_path, prometheus_port=port, alertmanager_url=am.url
        )
        emit_overload(s)
        worker = WorkerProcess(s, tmp_path / "worker.log")
        try:
            deadline = time.monotonic() + ceiling(240)
            while True:  # until every scope went to L1 and back to L0
                assert worker.alive(), worker.log_tail()
                levels = _levels([r for r in read_topic(s, s.control_topic) if r is not None])
                if len(levels) == 2 and all(v[-1] == 0 and 1 in v for v in levels.values()):
                    break
                assert time.monotonic() < deadline, levels
                time.sleep(1)
            url = f"http://127.0.0.1:{port}/metrics"
            # the counters equal the store's once the windows the worker closed are written
            stored = _wait(lambda: _settled(s, url), "the /metrics counters = the store's")
            _wait(
                lambda: _promql_counts(prom) == stored,
                "Prometheus' scraped counters = the store's",
            )
            # every window the worker counted is in Prometheus' native histogram
            counted = _wait(
                lambda: (
                    (n := _exposed_ttfb_count(url)) > 0
                    and _value(prom, f"histogram_count(sum({TTFB}))") == n
                    and n
                ),
                "Prometheus' native histogram = the worker's",
            )
            p99_native = _value(prom, f"histogram_quantile(0.99, sum(rate({TTFB}[1h])))")
            p99_classic = _value(
                prom,
                "histogram_quantile(0.99, sum by (le) (rate(tailguard_request_latency_seconds_"
                'bucket{boundary="gateway_ttfb_ms"}[1h])))',
            )
            p99_sketch, p99_exact = _store_p99_s(s), _store_exact_p99_s(s)
            print(
                f"gateway_ttfb_ms P99: PromQL native {p99_native:.3f} s, classic "
                f"{p99_classic:.3f} s; store: sketches {p99_sketch:.3f} s, exact "
                f"{p99_exact:.3f} s; requests: histogram {counted:.0f}, store "
                f"{_store_count(s):.0f}"
            )
            # the rate covers every window (the start timestamp's zero); the native
            # buckets (0.27 % wide) add at most their width to the sketch's 1 %
            assert p99_native is not None
            assert abs(p99_native / p99_sketch - 1) <= RELATIVE_ACCURACY
            assert abs(p99_native / p99_exact - 1) <= 2 * RELATIVE_ACCURACY
            # the page fired in Prometheus during the replayed overload, reached its
            # Alertmanager, and resolved there once the burn was over
            fired = prom.query(
                f'max_over_time(ALERTS{{alertname="{ALERTNAME}", severity="page", '
                'alertstate="firing"}[10m])'
            )
            assert fired, "the page never fired"
            _wait(lambda: _received(am_prom, "resolved") > 0, "a resolved alert")
            assert _received(am_prom, "firing") > 0
            _wait(
                lambda: not [a for a in am_prom.alerts(active="true")
                             if a["labels"].get("severity") == "page"],
                "no page active in Alertmanager",
            )  # fmt: skip
            accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
            text = httpx.get(url, timeout=10, headers=accept).text
            plain = httpx.get(url, timeout=10).content  # text 0.0.4, as curl gets it
            assert worker.alive(), worker.log_tail()
        finally:
            worker.stop()
    got: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            got.setdefault(sample.name, []).append((sample.labels, sample.value))
    assert {lab["scope"]: v for lab, v in got["tailguard_control_level"]} == dict.fromkeys(
        levels, 0.0
    )
    slos = {lab["slo"] for lab, _ in got["tailguard_slo_objective_ratio"]}
    assert slos  # every SLO of the spec that saw traffic
    # the last 5 minutes of event time may hold no traffic (then no sample); the hour has
    hour = {lab["slo"] for lab, _ in got["tailguard_slo_burn_rate"] if lab["window"] == "1h"}
    assert hour
    assert hour <= slos
    assert got["tailguard_worker_events_consumed_total"][0][1] > 0
    assert got["tailguard_worker_store_up"][0][1] == 1
    # the worker's own counters of the windows it stored: what the exported rules read
    counted = {lab["slo"]: v for lab, v in got["tailguard_slo_requests_total"]}
    good = {lab["slo"]: v for lab, v in got["tailguard_slo_good_requests_total"]}
    assert set(counted) >= hour
    assert all(0 <= good[slo] <= counted[slo] for slo in counted)
    assert sum(counted.values()) > 0
    assert got["tailguard_request_latency_seconds_count"]
    # promtool check metrics reports nothing on the live worker's /metrics
    check = subprocess.run(
        [str(promtool()), "check", "metrics"], input=plain, capture_output=True, check=False
    )
    assert (check.returncode, check.stdout + check.stderr) == (0, b"")
    # (P99s cover the controller's last minute of event time, which may hold no traffic
    # by the end: their names and labels are checked in tests/unit/test_slo_exposition.py)


Counts = dict[str, tuple[float, float]]


def _wait(fn: Any, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + ceiling(timeout_s)
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)  # polling the store, /metrics and Prometheus


def _exposed(url: str) -> Counts:
    total: dict[str, float] = {}
    good: dict[str, float] = {}
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
    for fam in text_string_to_metric_families(httpx.get(url, timeout=10, headers=accept).text):
        for sample in fam.samples:
            if sample.name == "tailguard_slo_requests_total":
                total[sample.labels["slo"]] = sample.value
            elif sample.name == "tailguard_slo_good_requests_total":
                good[sample.labels["slo"]] = sample.value
    return {slo: (total[slo], good.get(slo, 0.0)) for slo in total}


def _stored(settings: Any) -> Counts:
    store = open_reader(settings)
    try:
        rows = store.query_rows(
            "SELECT slo, sum(total), sum(good) FROM tailguard.slo_windows "
            "WHERE kind = 'slo' GROUP BY slo"
        )
    finally:
        store.close()
    return {str(slo): (float(t), float(g)) for slo, t, g in rows if int(t)}


def _settled(settings: Any, url: str) -> Counts | None:
    exposed, stored = _exposed(url), _stored(settings)
    return stored if exposed and exposed == stored else None


def _promql_counts(prom: LocalPrometheus) -> Counts:
    def by_slo(expr: str) -> dict[str, float]:
        return {r["metric"]["slo"]: float(r["value"][1]) for r in prom.query(expr)}

    total = by_slo("sum by (slo) (tailguard_slo_requests_total)")
    good = by_slo("sum by (slo) (tailguard_slo_good_requests_total)")
    return {slo: (total[slo], good.get(slo, 0.0)) for slo in total}


def _value(prom: LocalPrometheus, expr: str) -> float | None:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else None


RELATIVE_ACCURACY = 0.01  # the harness' windows' sketches
TTFB = 'tailguard_request_latency_seconds{boundary="gateway_ttfb_ms"}'
_ALL = "boundary = 'gateway_ttfb_ms' AND model = '*' AND priority = '*' AND ctx_bucket = '*'"


def _exposed_ttfb_count(url: str) -> float:
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
    return sum(
        sample.value
        for fam in text_string_to_metric_families(httpx.get(url, timeout=10, headers=accept).text)
        for sample in fam.samples
        if sample.name == "tailguard_request_latency_seconds_count"
        and sample.labels.get("boundary") == "gateway_ttfb_ms"
    )


def _store_count(settings: Any) -> float:
    store = open_reader(settings)
    try:
        ((n,),) = store.query_rows(f"SELECT sum(count) FROM tailguard.window_sketches WHERE {_ALL}")
    finally:
        store.close()
    return float(n)


def _store_p99_s(settings: Any) -> float:
    """The store's P99 over every window: its sketches merged (what its queries report)."""
    store = open_reader(settings)
    try:
        ((ms,),) = store.query_rows(
            f"SELECT {quantile_sql(0.99, RELATIVE_ACCURACY)} FROM tailguard.window_sketches "
            f"WHERE {_ALL}"
        )
    finally:
        store.close()
    return float(ms) / 1000.0


def _store_exact_p99_s(settings: Any) -> float:
    store = open_reader(settings)
    try:
        ((ms,),) = store.query_rows(
            "SELECT quantileExact(0.99)(gateway_ttfb_ms) FROM tailguard.requests FINAL "
            "WHERE gateway_ttfb_ms IS NOT NULL"
        )
    finally:
        store.close()
    return float(ms) / 1000.0


def _received(am: LocalAlertmanager, status: str) -> float:
    """Alerts Alertmanager received with ``status`` (its own counter)."""
    text = httpx.get(f"{am.url}/metrics", timeout=10).text
    return sum(
        sample.value
        for fam in prometheus_text(text)
        for sample in fam.samples
        if sample.name == "alertmanager_alerts_received_total"
        and sample.labels.get("status") == status
    )
