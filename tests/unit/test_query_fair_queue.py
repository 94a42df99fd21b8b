"""The query port's admission (pipeline.adapters.query_server.pool.FairQueue): caps,
round-robin turns across clients, the queue-wait ceiling. No engine: slots only."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.adapters.query_server.pool import MAX_WAITING_PER_CLIENT, FairQueue, LongClients
from pipeline.adapters.query_server.session import QueryLimits, QueryRefusedError
from tests.ceilings import ceiling


def _wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + ceiling(timeout_s)
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


class _Waiters:
    """Threads each acquiring a slot for a client; records the order of grants."""

    def __init__(self, queue: FairQueue) -> None:
        self.queue = queue
        self.order: list[str] = []
        self.errors: list[QueryRefusedError] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def ask(self, client: str, label: str, timeout_s: float = 30.0) -> None:
        n = self.queue.waiting()

        def run() -> None:
            try:
                self.queue.acquire(client, timeout_s)
            except QueryRefusedError as exc:
                with self._lock:
                    self.errors.append(exc)
                return
            with self._lock:
                self.order.append(label)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)
        _wait_until(lambda: self.queue.waiting() == n + 1)  # queued in this order

    def granted(self, n: int) -> None:
        _wait_until(lambda: len(self.order) == n)


def test_a_client_runs_at_most_its_cap_and_others_take_the_free_slots() -> None:
    q = FairQueue(slots=2, per_client=1)
    q.acquire("hog", 1)
    assert q.running("hog") == 1
    w = _Waiters(q)
    w.ask("hog", "hog-2")  # the second slot is free, but hog is at its cap
    q.acquire("tools", 1)  # another client takes it at once
    assert q.running() == 2
    q.release("tools")
    assert w.order == []  # hog still at its cap: the freed slot stays free
    assert q.running() == 1
    q.release("hog")
    w.granted(1)
    assert w.order == ["hog-2"]


def test_waiting_clients_take_turns_round_robin() -> None:
    """hog queued four queries before the others asked once each: each freed slot goes
    to the next client in turn, not to hog's backlog."""
    q = FairQueue(slots=1, per_client=1)
    q.acquire("x", 1)
    w = _Waiters(q)
    for i in range(4):
        w.ask("hog", f"hog-{i}")
    w.ask("report", "report")
    w.ask("grafana", "grafana")
    expected = ["hog-0", "report", "grafana", "hog-1", "hog-2", "hog-3"]
    clients = ["x", "hog", "report", "grafana", "hog", "hog"]
    for n, client in enumerate(clients):
        q.release(client)
        w.granted(n + 1)
    assert w.order == expected
    assert not w.errors


def test_a_query_waits_its_ceiling_then_is_answered_202() -> None:
    q = FairQueue(slots=1, per_client=1)
    q.acquire("hog", 1)
    with pytest.raises(QueryRefusedError, match=r"waited 0\.2 s for a turn") as exc:
        q.acquire("report", 0.2)
    assert exc.value.code == 202
    assert q.waiting() == 0  # withdrawn: the next release does not grant a gone query
    q.release("hog")
    assert q.running() == 0
    q.acquire("report", 1)


def test_a_client_with_too_many_waiting_is_refused_at_once() -> None:
    q = FairQueue(slots=1, per_client=1)
    q.acquire("hog", 1)
    w = _Waiters(q)
    for i in range(MAX_WAITING_PER_CLIENT):
        w.ask("hog", f"hog-{i}")
    with pytest.raises(QueryRefusedError, match="already has 8 queries waiting") as exc:
        q.acquire("hog", 30)
    assert exc.value.code == 202
    w.ask("report", "report", timeout_s=0.1)  # other clients still queue (and time out)
    for t in w.threads[-1:]:
        t.join()
    assert len(w.errors) == 1


@pytest.mark.parametrize(
    "kwargs",
    [{"concurrency": 2, "per_client": 3}, {"per_client": 0}, {"queue_wait_s": 0}, {"nice": 20}],
)
def test_bad_port_limits_fail_at_construction(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="query port"):
        QueryLimits(**kwargs)  # type: ignore[arg-type]


def test_a_client_is_its_user_name_and_user_agent() -> None:
    from pipeline.adapters.query_server import client_of

    grafana = client_of("default", "Grafana/11.2 clickhouse-go/2.30")
    curl = client_of("", "curl/8.5.0")  # no user: ClickHouse's default
    assert curl == client_of("default", "curl/8.5.0")
    assert len({grafana, curl, client_of("tailguard-41", "clickhouse-connect/0.8")}) == 3
    assert client_of("tailguard-41", "x") != client_of("tailguard-42", "x")  # each tool process


@pytest.mark.parametrize(
    ("runs", "long_after"),
    [
        ([("a", 0.2)], set()),
        ([("a", 1.0)], {"a"}),  # at the threshold: long
        ([("a", 5.0), ("b", 0.1)], {"a"}),  # per client
        ([("a", 5.0), ("a", 0.1)], set()),  # a short query clears it
        ([("a", 5.0), ("b", 31.0), ("c", 2.0)], {"b", "c"}),  # the oldest forgotten past 2
    ],
)
def test_a_client_whose_last_query_ran_long_is_long(
    runs: list[tuple[str, float]], long_after: set[str]
) -> None:
    """Issue 49: a client whose last query ran ``long_query_s`` or longer runs its next
    one on a niced session (``SessionPool``); remembered for at most ``max_clients``."""
    long = LongClients(1.0, max_clients=2)
    for client, seconds in runs:
        long.ran(client, seconds)
    assert {c for c in "abc" if c in long} == long_after
