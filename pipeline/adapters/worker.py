"""The Faust worker: a thin shell around :class:`pipeline.core.processor.StreamProcessor`.

Delivery guarantee: at-least-once with idempotent writes.

* The lifecycle topic is consumed with Faust acks disabled; the worker
  commits offsets itself, per partition, only up to
  ``StreamProcessor.safe_offsets()``: the oldest offset whose events are
  still held in memory (pending joins), and only after every record built
  from earlier offsets has been written to ClickHouse and every dead letter
  has been delivered to the DLQ. A crash therefore replays from the oldest
  open state and rebuilds it; rows are keyed by request_id (ReplacingMergeTree)
  so the replay writes nothing twice.
* (Faust's own out-of-order ack tracking commits past an un-acked head offset
  — ``Consumer._new_offset`` — so holding messages un-acked is not safe; hence
  our own commit.)
* On a rebalance the state of revoked partitions is dropped; the new owner
  rebuilds it from the committed offset.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faust
from confluent_kafka import Producer
from faust.types import TP

from pipeline.adapters.store import ClickHouseStore, migrate, open_store, write_with_retry
from pipeline.contract.codec import DeadLetter
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import RequestRecord
from pipeline.settings import Settings

log = logging.getLogger("tailguard.worker")


class DeadLetterSink:
    """Sends rejected input to the DLQ topic: the raw bytes as the value, the
    reason and source coordinates as headers."""

    def __init__(self, settings: Settings) -> None:
        conf = settings.kafka_config()
        conf.update({"linger.ms": 20, "compression.type": "lz4", "enable.idempotence": True})
        self._producer = Producer(conf)
        self._topic = settings.dlq_topic
        self.failed = 0

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed += 1
            log.error("DLQ delivery failed: %s", err)

    def send(self, dead: list[DeadLetter]) -> None:
        for d in dead:
            headers: list[tuple[str, str | bytes | None]] = [
                ("tailguard.reason", d.reason.encode()),
                ("tailguard.source.topic", d.source.topic.encode()),
                ("tailguard.source.partition", str(d.source.partition).encode()),
                ("tailguard.source.offset", str(d.source.offset).encode()),
            ]
            if d.index is not None:
                headers.append(("tailguard.source.index", str(d.index).encode()))
            while True:
                try:
                    self._producer.produce(
                        self._topic, d.raw, headers=headers, on_delivery=self._on_delivery
                    )
                    break
                except BufferError:
                    self._producer.poll(0.1)
        self._producer.poll(0)

    def flush(self) -> None:
        """Block until every dead letter is acknowledged by the broker."""
        while self._producer.flush(5.0) > 0:
            log.warning("waiting for the DLQ producer to deliver")


class WorkerShell:
    """Holds the adapters; all logic lives in the processor."""

    def __init__(self, settings: Settings, app: faust.App) -> None:
        self.settings = settings
        self.app = app
        self.processor = StreamProcessor(
            settings.lifecycle_topic, settings.join_config(), settings.max_message_bytes
        )
        self.store: ClickHouseStore | None = None
        self.dlq: DeadLetterSink | None = None
        self._buffer: list[RequestRecord] = []
        self._flush_lock = asyncio.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailguard-writer")
        self._committed: dict[int, int] = {}
        self.write_retries = 0
        self.rows_written = 0
        self._last_log = time.monotonic()

    def open(self) -> None:
        """Open the store (applying migrations) and the DLQ producer; before consuming."""
        self.store = open_store(self.settings)
        migrate(self.store, self.settings.cluster)
        self.dlq = DeadLetterSink(self.settings)
        log.info(
            "worker started: %s",
            {k: v for k, v in self.settings.redacted().items() if "password" not in k},
        )

    async def on_batch(self, messages: list[tuple[int, int, bytes]]) -> None:
        out = self.processor.process(messages, int(time.time() * 1000))
        if out.dead:
            assert self.dlq is not None
            self.dlq.send(out.dead)
        self._buffer.extend(out.records)
        if len(self._buffer) >= self.settings.flush_max_rows:
            await self.flush_and_commit()

    async def flush_and_commit(self) -> None:
        async with self._flush_lock:
            self._buffer.extend(self.processor.tick(int(time.time() * 1000)))
            # Snapshot offsets and rows together: nothing processed after this
            # point is covered by the commit below.
            offsets = self.processor.safe_offsets()
            batch, self._buffer = self._buffer, []
            loop = asyncio.get_running_loop()
            if batch:
                assert self.store is not None
                t0 = time.perf_counter()
                retries = await loop.run_in_executor(
                    self._executor, write_with_retry, self.store, batch
                )
                self.write_retries += retries
                self.rows_written += len(batch)
                log.debug("wrote %d rows in %.1f ms", len(batch), (time.perf_counter() - t0) * 1000)
            assert self.dlq is not None
            await loop.run_in_executor(self._executor, self.dlq.flush)
            changed = {p: o for p, o in offsets.items() if self._committed.get(p) != o}
            if changed:
                topic = self.settings.lifecycle_topic
                # Faust's commit path for explicit offsets (assignment-checked).
                await self.app.consumer._commit_offsets(  # type: ignore[attr-defined]
                    {TP(topic, p): o for p, o in changed.items()}
                )
                self._committed.update(changed)
            self._maybe_log()

    def _maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_log < 10 and not force:
            return
        self._last_log = now
        c = self.processor.counters
        j = self.processor.join_counters()
        log.info(
            "messages=%d events=%d records=%d rows_written=%d dead_letters=%d pending=%d "
            "joined=%d gateway_only=%d engine_only=%d duplicates=%d write_retries=%d",
            c.messages,
            c.events,
            c.records,
            self.rows_written,
            c.dead_letters,
            self.processor.pending(),
            j.joined,
            j.gateway_only,
            j.engine_only,
            j.duplicates,
            self.write_retries,
        )

    async def on_revoked(self, revoked: set[TP]) -> None:
        parts = [tp.partition for tp in revoked if tp.topic == self.settings.lifecycle_topic]
        # Write what is complete (idempotent), then forget the handed-away state.
        await self.flush_and_commit()
        self.processor.revoke(parts)
        for p in parts:
            self._committed.pop(p, None)

    async def stop(self) -> None:
        """Write what is buffered (idempotent). No commit: the consumer is gone by
        now, and anything uncommitted is replayed by the next worker."""
        try:
            batch, self._buffer = self._buffer, []
            if batch and self.store is not None:
                write_with_retry(self.store, batch, attempts=3)
                self.rows_written += len(batch)
        finally:
            self._executor.shutdown(wait=True)
            if self.store is not None:
                self.store.close()
            self._maybe_log(force=True)


def _credentials(settings: Settings) -> Any:
    if settings.security_protocol == "PLAINTEXT":
        return None
    ctx = ssl.create_default_context(
        cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None
    )
    if settings.security_protocol == "SSL":
        return faust.SSLCredentials(ctx)
    return faust.SASLCredentials(
        username=settings.sasl_username,
        password=settings.sasl_password.get_secret_value() if settings.sasl_password else None,
        mechanism=settings.sasl_mechanism,
        ssl_context=ctx if settings.security_protocol == "SASL_SSL" else None,
    )


def build_app(settings: Settings) -> tuple[faust.App, WorkerShell]:
    """Build the Faust app and its shell. Nothing runs until a faust.Worker starts it."""
    app = faust.App(
        settings.group_id,
        broker=[f"kafka://{hp.strip()}" for hp in settings.bootstrap_servers.split(",")],
        broker_credentials=_credentials(settings),
        store="memory://",
        autodiscover=False,
        web_enabled=settings.worker_web_port is not None,
        web_port=settings.worker_web_port or 6066,
        web_bind="127.0.0.1",
        topic_partitions=settings.topic_partitions,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_max_poll_records=5000,
        stream_buffer_maxsize=8192,
    )
    shell = WorkerShell(settings, app)
    topic = app.topic(
        settings.lifecycle_topic, value_type=bytes, value_serializer="raw", acks=False
    )

    @app.agent(topic, name="tailguard-lifecycle")
    async def lifecycle(stream: faust.StreamT[bytes]) -> None:
        take = stream.take_events  # type: ignore[attr-defined]  # faust-streaming API, not in StreamT
        async for events in take(settings.take_max_messages, within=0.1):
            await shell.on_batch(
                [(ev.message.partition, ev.message.offset, ev.message.value) for ev in events]
            )

    @app.timer(interval=settings.flush_interval_ms / 1000)  # type: ignore[untyped-decorator]
    async def flush() -> None:
        await shell.flush_and_commit()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        await shell.on_revoked(revoked)

    return app, shell


def run_worker(settings: Settings, loglevel: str = "info") -> None:
    """Run one worker until SIGTERM/SIGINT (blocking)."""
    app, shell = build_app(settings)
    shell.open()  # fail fast on a bad store, before joining the group

    class _Lifecycle(faust.Service):
        async def on_stop(self) -> None:  # runs after the app (and its consumer) stopped
            await shell.stop()

    worker = faust.Worker(app, _Lifecycle(), loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
