"""Burn-rate alerts delivered to a real Prometheus Alertmanager (built from its Go module
by ``tools.dev.alertmanager_local``, started on 127.0.0.1, stopped by PID) and
read back from its v2 API; resolved when they stop firing. And the signed webhook."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from pipeline.adapters.alerting import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    AlertDelivery,
    Webhook,
    verify_signature,
)
from pipeline.core.alerts import AlertMessage, AlertTracker, rfc3339
from pipeline.core.budget import BudgetBook
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.slo import load_spec_file
from tests.ceilings import wait_for
from tools.dev.alertmanager_local import LocalAlertmanager

pytestmark = pytest.mark.integration

STEP = 10_000


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAlertmanager]:
    with LocalAlertmanager(tmp_path_factory.mktemp("alertmanager")) as am:
        yield am


def burning_book(t0: int) -> tuple[BudgetBook, int]:
    spec = load_spec_file("specs/slo-default.yaml")
    book = BudgetBook(spec, load_burn_rules_file())
    slo = spec.slos[0].name
    fractions = [0.995] * 2160 + [0.2] * 360  # 6 h fine, then an hour at 80 % bad
    for i, frac in enumerate(fractions):
        book.add_window(slo, t0 + i * STEP, STEP, 100, 100 * frac)
    return book, t0 + len(fractions) * STEP


def ours(alerts: list[dict[str, Any]], slo: str) -> dict[str, dict[str, Any]]:
    return {
        a["labels"]["burnrate_tier"]: a
        for a in alerts
        if a["labels"].get("service") == "tailguard" and a["labels"].get("slo") == slo
    }


def test_alerts_reach_alertmanager_and_resolve(alertmanager: LocalAlertmanager) -> None:
    # Live wall-clock times: Alertmanager judges "resolved" against its own clock.
    now = int(time.time() * 1000) // STEP * STEP
    book, end = burning_book(now - 2520 * STEP)
    assert end == now
    tracker = AlertTracker()
    delivery = AlertDelivery(alertmanager.url, backoff_s=0.1)
    try:
        firing = tracker.step(book.evaluate(end), end)
        assert firing
        delivery.send(firing)
        assert delivery.flush()
        assert delivery.counters["sent"] == 1
        slo = dict(firing[0].labels)["slo"]
        got = wait_for(lambda: ours(alertmanager.alerts(active="true"), slo), "firing alerts")
        want = {dict(m.labels)["burnrate_tier"]: dict(m.labels) for m in firing}
        assert set(got) == set(want)
        for tier, alert in got.items():
            assert alert["labels"]["severity"] in ("page", "ticket")
            assert alert["labels"] == want[tier]
            assert alert["status"]["state"] == "active"
            assert alert["annotations"]["summary"].startswith(f"SLO {slo}")
        assert "page" in {a["labels"]["severity"] for a in got.values()}

        # Traffic recovers past every window: the tracker resolves each alert once.
        later = end + 3 * 86_400_000
        book.add_window(slo, later - STEP, STEP, 100, 100.0)
        resolved = tracker.step(book.evaluate(later), later, wall_ms=int(time.time() * 1000))
        assert {dict(m.labels)["burnrate_tier"] for m in resolved} == set(want)
        assert all(m.resolved for m in resolved)
        # endsAt: wall time (Alertmanager's clock), not the future evaluation time
        assert all(now < m.ends_at_ms <= int(time.time() * 1000) + 1 for m in resolved)  # type: ignore[operator]
        delivery.send(resolved)
        assert delivery.flush()
        wait_for(lambda: not ours(alertmanager.alerts(active="true"), slo), "resolution")
    finally:
        delivery.close()
    assert delivery.counters["failed"] == 0


CYCLES = 100


def _firing_at(am: LocalAlertmanager, slo: str, event_time: str) -> list[dict[str, Any]]:
    """Our active alerts of ``slo`` that fired at ``event_time`` (one cycle's)."""
    alerts = ours(am.alerts(active="true"), slo).values()
    return [a for a in alerts if a["annotations"].get("event_time") == event_time]


def test_hundred_fire_resolve_cycles_without_a_refusal(
    alertmanager: LocalAlertmanager, caplog: pytest.LogCaptureFixture
) -> None:
    """Event time two hours ahead of the wall clock (``simulate`` at full speed into a
    live worker): each cycle fires, is seen active, resolves and is seen gone, with no
    400 from Alertmanager (times are wall time; the event time is an annotation)."""
    wall0 = int(time.time() * 1000) // STEP * STEP
    book, end = burning_book(wall0 + 2 * 3_600_000 - 2520 * STEP)
    burning = book.evaluate(end)
    quiet = [dataclasses.replace(st, alerts=()) for st in burning]
    slo = burning[0].slo
    tiers = {a.rule for st in burning for a in st.alerts}
    assert "page-fast-burn" in tiers
    tracker = AlertTracker()
    delivery = AlertDelivery(alertmanager.url, timeout_s=2.0, backoff_s=0.01)
    caplog.set_level(logging.INFO, logger="tailguard.alerts")
    try:
        for i in range(CYCLES):
            now = end + 2 * i * STEP
            fired = tracker.step(burning, now, wall_ms=int(time.time() * 1000))
            assert {dict(m.labels)["burnrate_tier"] for m in fired} == tiers
            delivery.send(fired)
            assert delivery.flush()
            got = wait_for(
                partial(_firing_at, alertmanager, slo, rfc3339(now)),
                f"cycle {i}: firing",
                poll_s=0.005,
            )
            assert {a["labels"]["burnrate_tier"] for a in got} == tiers
            resolved = tracker.step(quiet, now + STEP, wall_ms=int(time.time() * 1000))
            assert all(m.resolved for m in resolved)
            assert len(resolved) == len(tiers)
            delivery.send(resolved)
            assert delivery.flush()
            wait_for(
                lambda: not ours(alertmanager.alerts(active="true"), slo),
                f"cycle {i}: resolved",
                poll_s=0.005,
            )
    finally:
        delivery.close()
    assert delivery.counters["sent"] == 2 * CYCLES
    assert (delivery.counters["failed"], delivery.counters["rejected"]) == (0, 0)
    refused = [r.getMessage() for r in caplog.records if r.name == "tailguard.alerts"]
    assert refused == []  # nothing logged at all: no 400, no retry, no split


def test_one_refused_alert_does_not_lose_its_batch(alertmanager: LocalAlertmanager) -> None:
    """Alertmanager refuses a whole batch for one invalid alert (no labels); the others
    are delivered one by one."""
    now = int(time.time() * 1000)
    good = [
        AlertMessage((("alertname", "TailguardTest"), ("service", "tailguard"),
                      ("slo", "batch-test"), ("burnrate_tier", f"t{i}")), (), now, None)
        for i in range(3)
    ]  # fmt: skip
    bad = AlertMessage((), (("summary", "no labels"),), now, None)
    delivery = AlertDelivery(alertmanager.url, timeout_s=2.0, backoff_s=0.01)
    try:
        delivery.send([good[0], bad, *good[1:]])
        assert delivery.flush()
    finally:
        delivery.close()
    got = wait_for(
        lambda: (
            len(ours(alertmanager.alerts(active="true"), "batch-test")) == 3
            and ours(alertmanager.alerts(active="true"), "batch-test")
        ),
        "the valid alerts of a refused batch",
    )
    assert set(got) == {"t0", "t1", "t2"}
    assert (delivery.counters["rejected"], delivery.counters["failed"]) == (1, 0)
    assert delivery.counters["sent"] == 3


class _Receiver(BaseHTTPRequestHandler):
    got: ClassVar[list[tuple[dict[str, str], bytes]]] = []
    arrived = threading.Event()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append((dict(self.headers.items()), body))
        self.send_response(204)
        self.end_headers()
        type(self).arrived.set()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_signed_webhook(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    delivery = AlertDelivery(webhook=Webhook(f"http://127.0.0.1:{port}/hook", b"s3cret"))
    try:
        now = int(time.time() * 1000) // STEP * STEP
        book, end = burning_book(now - 2520 * STEP)
        delivery.send(AlertTracker().step(book.evaluate(end), end))
        assert _Receiver.arrived.wait(20)
    finally:
        delivery.close()
        server.shutdown()
        server.server_close()
    ((headers, body),) = _Receiver.got
    assert verify_signature(
        b"s3cret", headers[TIMESTAMP_HEADER], body, headers[SIGNATURE_HEADER], now_s=time.time()
    )
    assert not verify_signature(
        b"wrong", headers[TIMESTAMP_HEADER], body, headers[SIGNATURE_HEADER], now_s=time.time()
    )
    doc = orjson.loads(body)
    assert doc["version"] == "1"
    assert {a["labels"]["severity"] for a in doc["alerts"]} <= {"page", "ticket"}
    assert all("burnrate_tier" in a["labels"] for a in doc["alerts"])
