"""Burn-rate alerts delivered to a real Prometheus Alertmanager (built from its Go module
by ``tools.dev.alertmanager_local``, started on 127.0.0.1, stopped by PID) and
read back from its v2 API; resolved when they stop firing. And the signed webhook."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
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
from pipeline.core.alerts import AlertTracker
from pipeline.core.budget import BudgetBook
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.slo import load_spec_file
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


def wait_for(fn: Any, what: str, timeout_s: float = 20.0) -> Any:
    """Poll Alertmanager's API until ``fn()`` is truthy (its state is only readable so)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


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
        resolved = tracker.step(book.evaluate(later), later)
        assert {dict(m.labels)["burnrate_tier"] for m in resolved} == set(want)
        assert all(m.resolved for m in resolved)
        # endsAt: now (Alertmanager's clock), not the future evaluation time
        resolved = [type(m)(m.labels, m.annotations, m.starts_at_ms, now) for m in resolved]
        delivery.send(resolved)
        assert delivery.flush()
        wait_for(lambda: not ours(alertmanager.alerts(active="true"), slo), "resolution")
    finally:
        delivery.close()
    assert delivery.counters["failed"] == 0


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
