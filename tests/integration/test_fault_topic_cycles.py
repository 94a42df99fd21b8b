"""Issue 37 item 1: the lifecycle topic deleted and created again, 20 times, under a stream
that pauses only while the topic is gone, with the worker's commits in flight (a 50 ms
flush and commit period; the topic id checked every 100 ms). Each new generation is read
from its first offset: the store ends with exactly the requests the producer delivered,
also after a restart at the end.

Before the fix, a commit of the old generation's offsets was retried through the deletion
and accepted once the topic existed again, and the group read the new generation from
those offsets: its first messages were skipped (1 of 3 trial runs lost 95.7 % of the
requests sent after the recreation). Each message here carries whole requests (all their
events), so a request is stored if and only if its message was read.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Message
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.contract.codec import encode_batch
from pipeline.contract.events import Event
from pipeline.contract.partitioning import partition_for
from pipeline.settings import Settings
from tests.ceilings import ceiling
from tests.integration.faults import lifecycle_events, producer, wait_for
from tests.integration.harness import WorkerProcess, make_settings

pytestmark = [pytest.mark.integration, pytest.mark.long(105)]

CYCLES = int(os.environ.get("TG_TOPIC_CYCLES", "20"))  # fewer: a quicker local run
PARTITIONS = 2
REQUESTS_PER_MESSAGE = 4
MESSAGE_INTERVAL_S = 0.01  # ~100 messages/s, ~400 requests/s
RUN_S = 1.0  # the stream's time on each generation (beyond the worker's catching up)


def _messages(events: list[Event]) -> list[tuple[int, list[str], bytes]]:
    """Whole requests per message: (partition, request ids, value), in time order."""
    by_request: dict[str, list[Event]] = defaultdict(list)
    for ev in events:
        by_request[ev.request_id].append(ev)
    open_: dict[int, list[str]] = defaultdict(list)
    out = []
    for rid in by_request:  # first-event order
        p = partition_for(rid, PARTITIONS)
        open_[p].append(rid)
        if len(open_[p]) == REQUESTS_PER_MESSAGE:
            ids = open_.pop(p)
            out.append((p, ids, encode_batch([ev for r in ids for ev in by_request[r]])))
    return out


class Stream:
    """A producer thread sending ``messages`` in order, paced, while not held; the
    request ids of every message the broker acknowledged are in ``delivered``."""

    def __init__(self, s: Settings, messages: list[tuple[int, list[str], bytes]]) -> None:
        self.topic = s.lifecycle_topic
        self.prod = producer(s)
        self.messages = messages
        self.sent = 0
        self.delivered: set[str] = set()
        self.acked_at: dict[str, tuple[int, int]] = {}  # request id -> (partition, offset)
        self.failed = 0
        self.running = threading.Event()
        self.idle = threading.Event()  # held, and everything sent acknowledged
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if not self.running.is_set():
                assert self.prod.flush(30) == 0
                self.idle.set()
                self.running.wait(0.05)
                continue
            self.idle.clear()
            if self.sent == len(self.messages):
                self.running.clear()
                continue
            p, ids, value = self.messages[self.sent]
            self.sent += 1

            def on_delivery(err: object, msg: Message, ids: list[str] = ids) -> None:
                if err is None:
                    self.delivered.update(ids)
                    self.acked_at.update(dict.fromkeys(ids, (msg.partition(), msg.offset())))
                else:
                    self.failed += 1

            self.prod.produce(self.topic, value, partition=p, on_delivery=on_delivery)
            self.prod.poll(0)
            time.sleep(MESSAGE_INTERVAL_S)
        self.prod.flush(30)

    def hold(self) -> None:
        """Stop sending; return once everything sent is acknowledged (or failed)."""
        self.running.clear()
        self.idle.clear()
        assert self.idle.wait(60), "the producer did not drain"

    def close(self) -> None:
        self.done.set()
        self.running.set()
        self.thread.join(60)


def _stored(s: Settings) -> set[str]:
    from pipeline.adapters.query_server import find_live_worker, open_reader

    if find_live_worker(s.store_dir) is None:
        # (no worker serving the store yet: opening it here would lock it against one)
        return set()
    store = open_reader(s)  # through the worker's query port while it owns the store
    try:
        return {r for (r,) in store.query_rows(f"SELECT request_id FROM {s.database}.requests")}
    except Exception as exc:  # ... or not created its tables yet
        if "UNKNOWN_DATABASE" in str(exc) or "UNKNOWN_TABLE" in str(exc):
            return set()
        raise
    finally:
        store.close()


def _recreate(a: AdminClient, s: Settings) -> None:
    topic = s.lifecycle_topic
    a.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)
    wait_for(lambda: topic not in a.list_topics(timeout=10).topics, "the deletion", 30, 0.02)
    deadline = time.monotonic() + ceiling(30)
    while time.monotonic() < deadline:  # the broker may still be removing it
        try:
            new = NewTopic(topic, PARTITIONS, 1)
            a.create_topics([new], operation_timeout=30)[topic].result(timeout=30)
            break
        except KafkaException:
            time.sleep(0.05)
    wait_for(
        lambda: (
            len(a.list_topics(timeout=10).topics.get(topic).partitions or {}) == PARTITIONS
            if topic in a.list_topics(timeout=10).topics
            else False
        ),
        "the new topic's partitions",
        30,
        0.02,
    )


def test_twenty_recreations_under_a_stream_lose_nothing(kafka, tmp_path: Path) -> None:
    s = make_settings(
        kafka.bootstrap_servers,
        tmp_path,
        topic_partitions=PARTITIONS,
        flush_interval_ms=50,
        topic_check_interval_ms=100,  # the consumer's metadata: at most 500 ms old
        session_timeout_ms=6000,
    )
    events = lifecycle_events(
        int(RUN_S / MESSAGE_INTERVAL_S * REQUESTS_PER_MESSAGE) * (CYCLES + 2), seed=37
    )
    messages = _messages(events)
    per_cycle = len(messages) // (CYCLES + 2)
    stream = Stream(s, messages)
    a = AdminClient(s.kafka_config())
    log_path = tmp_path / "worker.log"
    worker = WorkerProcess(s, log_path)
    took: list[float] = []
    try:
        for cycle in range(CYCLES + 1):
            stream.running.set()
            wait_for(lambda c=cycle: stream.sent >= (c + 1) * per_cycle, "the stream", 60, 0.02)
            stream.hold()
            want = set(stream.delivered)
            t0 = time.monotonic()
            # The moment the last rows are stored, the worker commits their offsets: the
            # topic goes while that commit is in flight.
            _wait_stored(
                s, stream, want, worker, what=f"cycle {cycle}'s requests stored", timeout_s=60
            )
            took.append(time.monotonic() - t0)
            assert worker.alive(), worker.log_tail()
            if cycle < CYCLES:
                _recreate(a, s)
        # A restart on the last generation resumes from its own commits.
        assert worker.stop() == 0, worker.log_tail()
        stream.running.set()
        wait_for(lambda: stream.sent >= len(messages), "the last messages", 60, 0.02)
        stream.hold()
        worker = WorkerProcess(s, tmp_path / "worker2.log")
        want = set(stream.delivered)
        _wait_stored(s, stream, want, worker, what="the last requests stored", timeout_s=90)
    finally:
        worker.stop()
        stream.close()
    stored = _stored_final(s)
    text = log_path.read_text(errors="replace")
    print(
        f"{CYCLES} recreations: {len(stream.delivered)} requests delivered, "
        f"{len(stored)} stored; each generation stored {min(took):.2f}-{max(took):.2f} s "
        f"after its last message was acknowledged; {text.count('dropped: read from')} commits "
        f"dropped, {text.count('not to the current one')} committed offsets ignored"
    )
    assert stream.failed == 0
    missing = stream.delivered - stored.keys()
    assert not missing, f"{len(missing)} of {len(stream.delivered)} requests lost"
    assert stored.keys() == stream.delivered
    assert set(stored.values()) == {1}


def _wait_stored(
    s: Settings,
    stream: Stream,
    want: set[str],
    worker: WorkerProcess,
    *,
    what: str,
    timeout_s: float,
) -> None:
    """Until every request of ``want`` is stored; past the ceiling, an AssertionError that
    says where the missing ones are (partition and offsets as acknowledged), where the
    group's commits and the topic's ends stand, and the worker log's tail."""
    try:
        wait_for(lambda: want <= _stored(s), what, timeout_s, 0.02)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_why_not_stored(s, stream, want, worker)}") from None


def _why_not_stored(s: Settings, stream: Stream, want: set[str], worker: WorkerProcess) -> str:
    from confluent_kafka import Consumer, TopicPartition

    lines = []
    try:
        missing = want - _stored(s)
        where: dict[int, list[int]] = defaultdict(list)
        for rid in missing:
            p, off = stream.acked_at.get(rid, (-1, -1))
            where[p].append(off)
        lines.append(
            f"{len(missing)} of {len(want)} missing; per partition (offsets as acknowledged): "
            + ", ".join(f"{p}: {len(o)} at {min(o)}-{max(o)}" for p, o in sorted(where.items()))
        )
        c = Consumer(s.kafka_config() | {"group.id": s.group_id, "enable.auto.commit": False})
        try:
            tps = [TopicPartition(s.lifecycle_topic, p) for p in range(PARTITIONS)]
            committed = {tp.partition: tp.offset for tp in c.committed(tps, timeout=10)}
            ends = {tp.partition: c.get_watermark_offsets(tp, timeout=10) for tp in tps}
        finally:
            c.close()
        lines.append(f"group committed {committed}; topic (low, high) {ends}")
    except Exception as err:  # the diagnosis must not hide the failure
        lines.append(f"(diagnosis failed: {err!r})")
    lines.append(f"worker alive: {worker.alive()}; its log's tail:\n{worker.log_tail(6000)}")
    return "\n".join(lines)


def _stored_final(s: Settings) -> dict[str, int]:
    from pipeline.adapters.store import open_store

    store = open_store(s)
    try:
        rows = store.query_rows(
            f"SELECT request_id, count() FROM {s.database}.requests FINAL GROUP BY 1"
        )
        return {str(r): int(n) for r, n in rows}
    finally:
        store.close()


def test_a_commit_of_an_old_generation_on_the_new_topic_is_ignored(kafka, tmp_path: Path) -> None:
    """The race the cycles above rarely hit, forced: a commit made for the old generation
    lands on the new topic (deleted and created again within the commit's round trip).
    Its metadata names the old topic id, so the worker reads the new topic from its first
    offset instead of from there."""
    from confluent_kafka import Consumer, TopicPartition

    from pipeline.core.generation import CommitMeta, commit_metadata
    from tests.integration.faults import produce_batches
    from tests.integration.harness import run_until_caught_up

    s = make_settings(kafka.bootstrap_servers, tmp_path, topic_partitions=PARTITIONS)
    events = lifecycle_events(600, seed=38)
    produce_batches(s, events)
    stale = commit_metadata(CommitMeta("an-old-generation-id"))
    c = Consumer(s.kafka_config() | {"group.id": s.group_id, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(s.lifecycle_topic, p, 3, metadata=stale) for p in range(PARTITIONS)]
        c.commit(offsets=tps, asynchronous=False)
    finally:
        c.close()
    log = run_until_caught_up(s, tmp_path / "worker.log")
    for p in range(PARTITIONS):  # (the gate sees each fetch of committed offsets)
        assert f"partition {p}: committed offset 3 belongs to" in log, log[-3000:]
        assert f"partition {p}: resuming at offset 0," in log, log[-3000:]
    stored = _stored_final(s)
    assert stored.keys() == {ev.request_id for ev in events}


# Per case: the committed offset of each partition before the worker's consumer reads
# (None: none; ``stale``: made for another generation), and where it reads from after
# Faust's seek to the committed offsets.
SEEK_CASES = {
    "no commit (a topic created again)": (None, False, 0),
    "another generation's commit": (3, True, 0),
    "a commit of this generation": (3, False, 3),
    "a commit at the first offset": (0, False, 0),
}


@pytest.mark.parametrize(
    ("committed", "stale", "reads_from"), list(SEEK_CASES.values()), ids=list(SEEK_CASES)
)
def test_a_fetch_faust_drops_is_read_again_from_where_the_commits_say(
    kafka, tmp_path: Path, committed: int | None, stale: bool, reads_from: int
) -> None:
    """Issue 49's stall, forced: the consumer has fetched every message of a partition
    (its position at the end) and Faust dropped them, as it does with a fetch returned
    while its flow is stopped; it then seeks to the committed offsets. A lifecycle
    partition without a commit of this generation is read from its first offset again:
    aiokafka's own seek left it at the end, and with nothing more produced to it the
    worker never read those messages (under CPU stress: the whole new generation after
    a recreation, and no message read for 4 minutes)."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    from pipeline.adapters.faust_wiring import _gate_committed_fetches, seek_to_committed
    from pipeline.adapters.generations import Commits, TopicIds
    from pipeline.adapters.kafka_admin import admin
    from pipeline.core.generation import CommitMeta, commit_metadata
    from tests.integration.faults import produce_batches

    s = make_settings(kafka.bootstrap_servers, tmp_path, topic_partitions=PARTITIONS)
    preload = produce_batches(s, lifecycle_events(200, seed=39), per_message=12)
    ends = {p: len(sizes) for p, sizes in preload.per_message.items()}  # messages each
    ids = TopicIds(lambda: admin(s.kafka_only()), s.lifecycle_topic)
    topic, gen = s.lifecycle_topic, ids()
    assert gen is not None

    async def positions_after_the_drop() -> dict[int, int]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap_servers, group_id=s.group_id,
            auto_offset_reset="earliest", enable_auto_commit=False,
        )  # fmt: skip
        await asyncio.wait_for(consumer.start(), ceiling(30))
        try:
            _gate_committed_fetches(consumer._coordinator, Commits(topic, None, ids).gate)
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            if committed is not None:  # as the worker commits (Commits.commit)
                meta = commit_metadata(CommitMeta("an-old-generation-id" if stale else gen))
                await consumer.commit({tp: OffsetAndMetadata(committed, meta) for tp in tps})
            for tp in tps:  # every message fetched (and dropped): positions at the end
                consumer.seek(tp, 0)
            deadline = asyncio.get_running_loop().time() + ceiling(30)
            while [await consumer.position(tp) for tp in tps] != [ends[p] for p in sorted(ends)]:
                assert asyncio.get_running_loop().time() < deadline, "not all fetched"
                await consumer.getmany(timeout_ms=100)
            await seek_to_committed(consumer, frozenset({topic}))  # Faust's perform_seek
            return {tp.partition: await consumer.position(tp) for tp in tps}
        finally:
            await asyncio.wait_for(consumer.stop(), ceiling(30))

    assert all(n > reads_from for n in ends.values()), ends
    assert asyncio.run(positions_after_the_drop()) == dict.fromkeys(range(PARTITIONS), reads_from)
