"""Several queries at once on the port: a pool of read-only sessions and a fair queue.

Each query runs on a :class:`~.session.ReadOnlySession` of its own (a chDB session is
used by one thread at a time; sessions run concurrently in the engine), at most
``concurrency`` at once, at most ``per_client`` of them one client's. A query that
cannot start waits in :class:`FairQueue`: clients take turns (round-robin; one client's
queries in the order they came), so a client with queries back to back gets one turn in
each round, not every free slot. A query waits ``queue_wait_s`` at most, then is answered
``202`` (TOO_MANY_SIMULTANEOUS_QUERIES); so is a client's query past
:data:`MAX_WAITING_PER_CLIENT` waiting ones, at once. A slot is free again when the
engine has returned, not when the port answered: a query the port answered ``159`` for
while the engine still runs it keeps its slot and its client's turn until it ends.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping

from pipeline.adapters.query_server.session import (
    TOO_MANY_SIMULTANEOUS_QUERIES,
    CheckCache,
    QueryLimits,
    QueryRefusedError,
    QueryResult,
    ReadOnlySession,
)

MAX_WAITING_PER_CLIENT = 8
MAX_LONG_CLIENTS = 1024  # clients remembered as long-running (the oldest forgotten first)


class LongClients:
    """The clients whose last query ran ``long_s`` or longer (pure; time passed in): their
    next query runs niced (:class:`SessionPool`). A client's short query clears it."""

    def __init__(self, long_s: float, max_clients: int = MAX_LONG_CLIENTS) -> None:
        self.long_s = long_s
        self.max_clients = max_clients
        self._long: dict[str, None] = {}  # insertion-ordered set

    def ran(self, client: str, seconds: float) -> None:
        self._long.pop(client, None)
        if seconds >= self.long_s:
            self._long[client] = None
            while len(self._long) > self.max_clients:
                del self._long[next(iter(self._long))]

    def __contains__(self, client: object) -> bool:
        return client in self._long


class _Ticket:
    __slots__ = ("granted",)

    def __init__(self) -> None:
        self.granted = False


class FairQueue:
    """Admission of queries: ``slots`` at once, ``per_client`` per client, the waiting
    ones granted round-robin across clients (a client is a string; see the port)."""

    def __init__(self, slots: int, per_client: int) -> None:
        if not 1 <= per_client <= slots:
            raise ValueError(f"per_client {per_client} must be 1 to slots {slots}")
        self.slots = slots
        self.per_client = per_client
        self._cond = threading.Condition()
        self._free = slots
        self._held: Counter[str] = Counter()
        self._waiting: dict[str, deque[_Ticket]] = {}
        self._turns: deque[str] = deque()  # clients with waiting queries, next turn first

    def acquire(self, client: str, timeout_s: float) -> None:
        """A slot for ``client``, or :class:`QueryRefusedError` 202 after ``timeout_s``."""
        with self._cond:
            if self._free and self._held[client] < self.per_client and client not in self._waiting:
                self._take(client)
                return
            queue = self._waiting.get(client)
            if queue is not None and len(queue) >= MAX_WAITING_PER_CLIENT:
                raise QueryRefusedError(
                    TOO_MANY_SIMULTANEOUS_QUERIES,
                    f"Too many simultaneous queries: this client already has "
                    f"{MAX_WAITING_PER_CLIENT} queries waiting on the query port",
                )
            ticket = _Ticket()
            if queue is None:
                queue = self._waiting[client] = deque()
                self._turns.append(client)
            queue.append(ticket)
            deadline = time.monotonic() + timeout_s
            while not ticket.granted:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._withdraw(client, ticket)
                    raise QueryRefusedError(
                        TOO_MANY_SIMULTANEOUS_QUERIES,
                        f"Too many simultaneous queries: waited {timeout_s:g} s for a turn "
                        f"on the query port ({self.slots} at once, {self.per_client} per "
                        f"client; this client has {self._held[client]} running)",
                    )
                self._cond.wait(left)

    def release(self, client: str) -> None:
        with self._cond:
            self._free += 1
            self._held[client] -= 1
            if self._held[client] <= 0:
                del self._held[client]
            self._grant()

    def running(self, client: str | None = None) -> int:
        with self._cond:
            return self.slots - self._free if client is None else self._held[client]

    def waiting(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._waiting.values())

    def _take(self, client: str) -> None:
        self._free -= 1
        self._held[client] += 1

    def _withdraw(self, client: str, ticket: _Ticket) -> None:
        queue = self._waiting[client]
        queue.remove(ticket)
        if not queue:
            del self._waiting[client]
            self._turns.remove(client)

    def _grant(self) -> None:
        """Free slots to waiting queries, one per client per round (holding the lock)."""
        granted = False
        while self._free and self._turns:
            for _ in range(len(self._turns)):
                client = self._turns.popleft()
                if self._held[client] < self.per_client:
                    queue = self._waiting[client]
                    queue.popleft().granted = True
                    self._take(client)
                    granted = True
                    if queue:
                        self._turns.append(client)  # its next query: after the others
                    else:
                        del self._waiting[client]
                    break
                self._turns.append(client)  # at its cap: its turn passes
            else:
                break  # every waiting client is at its cap
        if granted:
            self._cond.notify_all()


class SessionPool:
    """``limits.concurrency`` read-only sessions, handed out by a :class:`FairQueue`; as
    many again at ``limits.long_query_nice`` for the clients whose last query ran
    ``limits.long_query_s`` or longer (:class:`LongClients`).

    Why (issue 49): beside a client sending 30 s queries and memory bombs back to back,
    ``report``'s reads took up to 3.2 s (p50 1.5-1.7 s) against 1.4-2.3 s without it: the
    fair queue gave them a session at once (no wait measured), but the engine time of
    their 20 queries doubled, the hostile query's thread (nice 0) taking the cores from
    them and from the writer. Its next queries now run niced: the first bomb of a client
    runs at nice 0 (stopped at its memory limit within 1-3 s here), those that follow it
    get ~1/10 of a core a nice-0 thread wants (CFS weights 110 : 1024). The queries at
    once stay ``concurrency`` (the slots are the queue's), so the memory bound is the same.
    """

    def __init__(
        self, open_session: Callable[..., ReadOnlySession], limits: QueryLimits | None = None
    ) -> None:
        """``open_session(checked=, nice=, like=)`` opens one session over the store (its
        directory, lock, database and ``limits`` bound by the caller)."""
        self.limits = limits = limits or QueryLimits()
        self.sessions: list[ReadOnlySession] = []
        self.checked = CheckCache()  # the sessions check alike: one cache for them all
        nices = [limits.nice]
        if limits.long_query_nice > limits.nice:
            nices.append(limits.long_query_nice)
        try:
            for nice in nices:
                for _ in range(limits.concurrency):
                    self.sessions.append(
                        open_session(
                            checked=self.checked, nice=nice,
                            like=self.sessions[0] if self.sessions else None,
                        )
                    )  # fmt: skip
        except BaseException:
            self.close()
            raise
        first = self.sessions[0]
        self.path, self.database, self.timezone = first.path, first.database, first.timezone
        self.queue = FairQueue(limits.concurrency, limits.per_client)
        self._lock = threading.Lock()
        # per nice value, the free sessions (a slot of the queue always finds one of each:
        # at most `concurrency` run, and each nice value has that many)
        self._free = {n: [x for x in self.sessions if x.nice == n] for n in nices}
        self.long_clients = LongClients(limits.long_query_s)
        self._holder: dict[int, str] = {}  # id(session) -> its client
        self._handed_back: set[int] = set()  # answered, the engine still running it
        for session in self.sessions:
            session.on_idle = lambda s=session: self._engine_returned(s)

    @property
    def overruns(self) -> int:
        return sum(s.overruns for s in self.sessions)

    def in_engine(self) -> int:
        """Sessions whose query is in the engine now."""
        return sum(s.in_engine for s in self.sessions)

    def execute(
        self,
        client: str,
        sql: str,
        *,
        default_format: str = "TabSeparated",
        database: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> QueryResult:
        """Wait for ``client``'s turn, then check and run ``sql`` on a free session."""
        self.queue.acquire(client, self.limits.queue_wait_s)
        with self._lock:
            niced = client in self.long_clients and len(self._free) > 1
            session = self._free[self.limits.long_query_nice if niced else self.limits.nice].pop()
            self._holder[id(session)] = client
        t0 = time.monotonic()
        try:
            return session.execute(
                sql, default_format=default_format, database=database, params=params
            )
        finally:
            with self._lock:
                self.long_clients.ran(client, time.monotonic() - t0)
            self._hand_back(session)

    def _hand_back(self, session: ReadOnlySession) -> None:
        with self._lock:
            if session.in_engine:  # answered 159: free once the engine returns
                self._handed_back.add(id(session))
                return
        self._put_back(session)

    def _engine_returned(self, session: ReadOnlySession) -> None:
        with self._lock:
            if id(session) not in self._handed_back or session.in_engine:
                return
            self._handed_back.discard(id(session))
        self._put_back(session)

    def _put_back(self, session: ReadOnlySession) -> None:
        with self._lock:
            client = self._holder.pop(id(session))
            self._free[session.nice].append(session)
        self.queue.release(client)

    def close(self, timeout_s: float = 5.0) -> None:
        for session in self.sessions:
            session.close(timeout_s)
