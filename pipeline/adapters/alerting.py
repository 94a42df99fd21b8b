"""Alert delivery: Alertmanager's v2 API and a generic signed webhook.

:class:`AlertDelivery` takes the :class:`~pipeline.core.alerts.AlertMessage` batches of
each evaluation and posts them from a background thread (the controller never waits on
a receiver): to Alertmanager as ``POST <url>/api/v2/alerts`` (a JSON array of alerts),
and to a webhook as ``POST <url>`` with the body::

    {"version": "1", "receiver": "tailguard", "alerts": [<the same alerts>]}

signed with HMAC-SHA256 over ``<timestamp>.<body>`` under the shared secret:
``X-Tailguard-Timestamp: <unix seconds>`` and
``X-Tailguard-Signature: sha256=<hex>`` (a receiver recomputes it and rejects stale
timestamps; see :func:`verify_signature`). Each post is tried 3 times with back-off; a
batch still undelivered is dropped and counted (``counters["failed"]``); a full queue
(:data:`MAX_QUEUED` batches) drops the newest and counts it: the next evaluation re-sends
every firing alert anyway.

A batch the receiver *refuses* (HTTP 400 or 422: one alert it finds invalid fails the
whole batch in Alertmanager's v2 API) is not retried as it is: its alerts are posted one
by one, so the valid ones are delivered and only the refused ones are dropped, each
logged with its labels and the receiver's reason and counted (``counters["rejected"]``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson

from pipeline.core.alerts import AlertMessage

log = logging.getLogger("tailguard.alerts")

MAX_QUEUED: Final = 100
ATTEMPTS: Final = 3
REFUSED: Final = frozenset({400, 422})  # the request is invalid: resending it cannot help
SIGNATURE_HEADER: Final = "X-Tailguard-Signature"
TIMESTAMP_HEADER: Final = "X-Tailguard-Timestamp"


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(
    secret: bytes, timestamp: str, body: bytes, signature: str, *, now_s: float,
    max_age_s: float = 300.0,
) -> bool:  # fmt: skip
    """What a webhook receiver checks: the signature, and a timestamp no older than
    ``max_age_s`` (a replayed request fails)."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs(now_s - ts) > max_age_s:
        return False
    return hmac.compare_digest(sign(secret, ts, body), signature)


@dataclass(frozen=True, slots=True)
class Webhook:
    url: str
    secret: bytes


class AlertDelivery:
    """Posts alert batches to Alertmanager and/or a webhook (see the module docstring)."""

    def __init__(
        self,
        alertmanager_url: str | None = None,
        webhook: Webhook | None = None,
        *,
        timeout_s: float = 5.0,
        backoff_s: float = 0.5,
        generator_url: str = "",
    ) -> None:
        if alertmanager_url is None and webhook is None:
            raise ValueError("alert delivery needs an Alertmanager URL or a webhook")
        self.alertmanager_url = alertmanager_url.rstrip("/") if alertmanager_url else None
        self.webhook = webhook
        self.generator_url = generator_url
        self.backoff_s = backoff_s
        self.counters = {
            "batches": 0, "alerts": 0, "sent": 0, "failed": 0, "dropped": 0, "rejected": 0,
        }  # fmt: skip
        self._client = httpx.Client(timeout=timeout_s)
        self._queue: queue.Queue[list[dict[str, Any]] | None] = queue.Queue(MAX_QUEUED)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tailguard-alerts", daemon=True)
        self._thread.start()

    def send(self, messages: Sequence[AlertMessage]) -> None:
        """Queue one evaluation's alerts (never blocks)."""
        if not messages:
            return
        batch = [m.to_json(self.generator_url) for m in messages]
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.counters["dropped"] += 1
            log.warning("alert queue full: an evaluation's %d alerts dropped", len(batch))
            return
        self.counters["batches"] += 1
        self.counters["alerts"] += len(batch)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued batch was tried; True when the queue drained."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)  # queue.join() has no timeout
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        self.flush(timeout_s)
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._client.close()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                self._deliver(batch)
            except Exception:  # a delivery bug never kills the thread
                log.exception("alert delivery failed")
            finally:
                self._queue.task_done()

    def _deliver(self, batch: list[dict[str, Any]]) -> None:
        if self.alertmanager_url is not None:
            self._deliver_to(f"{self.alertmanager_url}/api/v2/alerts", batch, self._alertmanager)
        if self.webhook is not None:
            self._deliver_to(self.webhook.url, batch, self._signed)

    def _alertmanager(self, alerts: list[dict[str, Any]]) -> tuple[bytes, dict[str, str]]:
        return orjson.dumps(alerts), {}

    def _signed(self, alerts: list[dict[str, Any]]) -> tuple[bytes, dict[str, str]]:
        assert self.webhook is not None
        body = orjson.dumps({"version": "1", "receiver": "tailguard", "alerts": alerts})
        ts = int(time.time())
        return body, {
            TIMESTAMP_HEADER: str(ts),
            SIGNATURE_HEADER: sign(self.webhook.secret, ts, body),
        }

    def _deliver_to(
        self,
        url: str,
        batch: list[dict[str, Any]],
        encode: Callable[[list[dict[str, Any]]], tuple[bytes, dict[str, str]]],
    ) -> None:
        """Post the batch; refused as a whole, post its alerts one by one (module docstring)."""
        refused = self._post(url, *encode(batch))
        if refused is None:
            return
        if len(batch) == 1:
            self.counters["rejected"] += 1
            log.warning("alert refused by %s (%s), dropped: %s", url, refused,
                        batch[0].get("labels"))  # fmt: skip
            return
        log.info("alert batch of %d refused by %s (%s): posting one by one",
                 len(batch), url, refused)  # fmt: skip
        for alert in batch:
            self._deliver_to(url, [alert], encode)

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> str | None:
        """Post with retries; the receiver's reason when it refuses the request (400, 422),
        else None (delivered, or given up and counted as failed)."""
        for attempt in range(ATTEMPTS):
            try:
                r = self._client.post(
                    url, content=body, headers={"Content-Type": "application/json", **headers}
                )
                if r.status_code < 300:
                    self.counters["sent"] += 1
                    return None
                why = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code in REFUSED:
                    return why
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < ATTEMPTS and not self._stop.wait(self.backoff_s * 2**attempt):
                continue
            self.counters["failed"] += 1
            log.warning("alerts to %s not delivered: %s", url, why)
            return None
        return None
