"""The port's read-only session: a chDB connection of the worker's engine in
``readonly = 1`` mode, with the engine-enforced limits (:class:`QueryLimits`), each query
checked (:mod:`pipeline.adapters.query_server.audit`) before it runs."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from pipeline.adapters.query_server.audit import audit_query, parse_ast

log = logging.getLogger("tailguard.query_server")
_T = TypeVar("_T")

READ_KINDS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "EXPLAIN", "EXISTS")

_TRAILING_FORMAT_RE = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE)
_CODE_RE = re.compile(r"Code: (\d+)")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

READONLY = 164  # ClickHouse error codes
SYNTAX_ERROR = 62
UNKNOWN_SETTING = 115
AUTHENTICATION_FAILED = 516
TIMEOUT_EXCEEDED = 159
TOO_MANY_SIMULTANEOUS_QUERIES = 202
TOO_MANY_ROWS_OR_BYTES = 396
BAD_ARGUMENTS = 36  # a token in the URL


class QueryRefusedError(Exception):
    """A request the read-only port does not run (ClickHouse error code and text)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def sql_string(text: str) -> str:
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True, slots=True)
class QueryResult:
    body: bytes
    fmt: str
    rows_read: int
    bytes_read: int
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class QueryLimits:
    """What queries on the port may use: each one (the engine enforces those limits) and
    all of them at once (the port's :class:`~.pool.SessionPool`); see the package."""

    max_execution_time_s: int = 30
    max_memory_bytes: int = 512 << 20
    max_result_bytes: int = 256 << 20  # the answer, as the engine wrote it
    max_threads: int = 0  # 0: a quarter of this host's cores, at least 1
    nice: int = 0  # the engine's threads of a query run at this nice value (os_thread_priority)
    grace_s: float = 1.0  # past max_execution_time_s, the port answers 159 itself
    concurrency: int = 2  # queries running at once, one read-only session each
    per_client: int = 1  # queries one client runs at once
    queue_wait_s: float = 10.0  # the longest a query waits for its turn (then 202)
    # A client whose last query ran this long runs its next ones at ``long_query_nice``
    # (see :class:`~.pool.SessionPool`): back-to-back 30 s queries and bombs stop taking
    # the cores from ``report``, the dashboards and the writer. Not if no higher than nice.
    long_query_s: float = 1.0
    long_query_nice: int = 10

    def __post_init__(self) -> None:
        if not 1 <= self.per_client <= self.concurrency:
            raise ValueError(
                f"the query port's per-client cap ({self.per_client}) must be 1 to its "
                f"concurrency ({self.concurrency})"
            )
        if (
            self.queue_wait_s <= 0
            or self.long_query_s <= 0
            or not 0 <= self.nice <= 19
            or not 0 <= self.long_query_nice <= 19
        ):
            raise ValueError(f"invalid query port limits: {self}")

    @property
    def threads(self) -> int:
        return self.max_threads or max(1, (os.cpu_count() or 1) // 4)

    def settings(self, nice: int | None = None) -> dict[str, int | str]:
        """The engine's settings of one query (each session's, fixed before ``readonly``);
        ``nice``: another ``os_thread_priority`` than ``self.nice``."""
        return {
            "max_execution_time": int(self.max_execution_time_s),
            "timeout_overflow_mode": "throw",
            "max_memory_usage": int(self.max_memory_bytes),
            "max_result_bytes": int(self.max_result_bytes),
            "result_overflow_mode": "throw",
            "max_threads": self.threads,
            "os_thread_priority": int(self.nice if nice is None else nice),
        }

    @classmethod
    def from_settings(cls, settings: Any) -> QueryLimits:
        return cls(
            max_execution_time_s=settings.query_max_execution_s,
            max_memory_bytes=settings.query_max_memory_mb << 20,
            max_result_bytes=settings.query_max_result_mb << 20,
            max_threads=settings.query_max_threads,
            nice=settings.query_nice,
            concurrency=settings.query_concurrency,
            per_client=settings.query_per_client,
            queue_wait_s=settings.query_queue_wait_s,
        )


class CheckCache:
    """The query texts the port's check accepted, with ClickHouse's parse of each (LRU,
    shared by a pool's sessions, which check alike: same database, same table functions).

    The check is two engine calls (``formatQuerySingleLine`` and ``EXPLAIN AST``), both
    syntactic: their verdict depends on the text and its parameters alone. Measured
    (``bench/query_isolation.py``, issue 49): they were 44 % of the port's time for
    ``report``'s 20 queries (median 14 ms each, 0.1 s at p90 on a loaded machine), and
    ``report`` and the dashboards send the same texts again and again. Refusals are not
    kept (each is checked again); nor is a text over ``max_sql_chars``."""

    def __init__(self, max_entries: int = 512, max_sql_chars: int = 16_384) -> None:
        self.max_entries = max_entries
        self.max_sql_chars = max_sql_chars
        self._lock = threading.Lock()
        self._accepted: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], str] = OrderedDict()
        self.hits = 0

    @staticmethod
    def key(sql: str, params: Mapping[str, str] | None) -> tuple[str, tuple[tuple[str, str], ...]]:
        return sql, tuple(sorted((params or {}).items()))

    def get(self, sql: str, params: Mapping[str, str] | None) -> str | None:
        k = self.key(sql, params)
        with self._lock:
            normalized = self._accepted.get(k)
            if normalized is not None:
                self._accepted.move_to_end(k)
                self.hits += 1
            return normalized

    def put(self, sql: str, params: Mapping[str, str] | None, normalized: str) -> None:
        if len(sql) > self.max_sql_chars:
            return
        with self._lock:
            self._accepted[self.key(sql, params)] = normalized
            while len(self._accepted) > self.max_entries:
                self._accepted.popitem(last=False)


class ReadOnlySession:
    """A chDB connection of this process's engine, in ``readonly = 1`` mode.

    ``lock`` is the lock the process's other chDB user (the worker's store)
    holds for each call: taken here only to open and close this session, never
    for a query (queries take this session's own lock: one at a time; the port
    runs several at once on a :class:`~.pool.SessionPool` of these).
    """

    def __init__(
        self,
        store_dir: Path,
        lock: threading.Lock,
        *,
        database: str = "tailguard",
        limits: QueryLimits | None = None,
        checked: CheckCache | None = None,
        nice: int | None = None,
        like: ReadOnlySession | None = None,
    ) -> None:
        """``like``: a session of the same engine whose lookups (table functions, time
        zone) this one takes instead of asking the engine again (a pool's)."""
        import chdb  # adapter-only import

        if not _IDENT_RE.match(database):
            raise ValueError(f"invalid database name {database!r}")
        self.limits = limits = limits or QueryLimits()
        self.checked = checked or CheckCache()
        self.nice = limits.nice if nice is None else nice  # its queries' os_thread_priority
        self.path = os.path.realpath(store_dir)
        self.database = database
        self._engine_lock = lock
        self._lock = threading.Lock()  # this session's: one query at a time
        self.busy = threading.Event()  # set while a query runs in the engine
        self.overruns = 0  # queries the port answered 159 for, the engine still running
        # Called once the engine has returned (this session's lock released): the pool
        # hands the session out again only then, a query answered 159 included.
        self.on_idle: Callable[[], None] | None = None
        with self._engine_lock:
            # The same path string as clickhouse-connect's: chDB compares them literally.
            self._conn: Any = chdb.connect(self.path)  # type: ignore[no-untyped-call]
            # The store's database is the session's: unqualified names resolve there (a
            # store not migrated yet has none; its queries then fail as unknown tables).
            with contextlib.suppress(Exception):
                self._conn.query(f"USE {database}", "TSV")
            # Names only a table function has (``file`` and ``format`` are also scalar
            # functions: ``file`` is denied by name, ``format`` only parses its argument).
            self._table_functions: frozenset[str]
            self.timezone: str
            if like is not None:
                self._table_functions, self.timezone = like._table_functions, like.timezone
            else:
                names = self._conn.query(
                    "SELECT lower(name) FROM system.table_functions "
                    "WHERE name NOT IN (SELECT name FROM system.functions)",
                    "TSVRaw",
                )
                self._table_functions = frozenset(names.bytes().decode().split())
                tz = self._conn.query("SELECT timezone()", "TSV")
                self.timezone = tz.bytes().decode().strip()
            # The limits are the clients' queries', set after the session's own queries
            # above: on a busy machine the table-function lookup took 2.8 s, past a 2 s
            # limit, and the port failed to open (a suite run with six xdist workers).
            for name, value in limits.settings(self.nice).items():
                literal = sql_string(value) if isinstance(value, str) else str(int(value))
                self._conn.query(f"SET {name} = {literal}", "TSV")
            self._conn.query("SET readonly = 1", "TSV")
        self._closed = False

    @property
    def in_engine(self) -> bool:
        """A call of this session is in the engine (one the port answered 159 for included)."""
        return self._lock.locked()

    def _run(self, work: Callable[[], _T]) -> _T:
        """``work`` (engine calls on this session) on a thread of its own, holding this
        session's lock until the engine returns; answered by the limit (+ grace) at the
        latest: past it, :class:`QueryRefusedError` 159 while the engine goes on."""
        limit_s = self.limits.max_execution_time_s
        if not self._lock.acquire(timeout=limit_s):
            raise QueryRefusedError(
                TOO_MANY_SIMULTANEOUS_QUERIES,
                f"the query port's previous query is still running after {limit_s} s",
            )
        done = threading.Event()
        out: list[Any] = []

        def run() -> None:
            try:
                if self._closed:
                    _shutting_down()
                self.busy.set()
                out.append((True, work()))
            except BaseException as exc:  # handed to the waiting thread
                out.append((False, exc))
                self._drain()
            finally:
                self.busy.clear()
                self._lock.release()
                done.set()
                if self.on_idle is not None:
                    self.on_idle()

        threading.Thread(target=run, name="tailguard-query", daemon=True).start()
        if not done.wait(limit_s + self.limits.grace_s):
            self.overruns += 1
            log.warning(
                "query port: a query ran past %d s (+%.0f s) without the engine stopping it; "
                "answered as timed out, the engine finishes it in the background",
                limit_s,
                self.limits.grace_s,
            )
            raise QueryRefusedError(
                TIMEOUT_EXCEEDED,
                f"Timeout exceeded: the query ran past the port's limit of {limit_s} s "
                "(max_execution_time)",
            )
        ok, value = out[0]
        if not ok:
            raise value
        return cast(_T, value)

    def _drain(self) -> None:
        """After a call that failed: chDB (4.4) hands what a failed query had written of
        its answer (a format's header, first blocks: Arrow, Parquet, JSON, CSVWithNames,
        ...) to the next query of the session, ahead of that query's own answer; a
        throwaway query takes it (checked: its answer must be its own)."""
        if self._closed:
            return
        for _ in range(3):
            with contextlib.suppress(Exception):
                if bytes(self._conn.query("SELECT 1", "TSVRaw").bytes() or b"") == b"1\n":
                    return
        log.warning("query port: a session still answered with another query's output")

    def check(self, sql: str, params: Mapping[str, str] | None = None) -> str:
        """ClickHouse's parse of ``sql`` (one statement); refuses what does not read, or
        reads anything but the store's own tables (see the module's docstring)."""
        return self._run(lambda: self._check(sql, params))

    def _check(self, sql: str, params: Mapping[str, str] | None) -> str:
        """:meth:`check`, holding this session's lock; a text accepted before is not
        checked again (:class:`CheckCache`)."""
        normalized = self.checked.get(sql, params)
        if normalized is None:
            normalized = self._check_in_engine(sql, params)
            self.checked.put(sql, params, normalized)
        return normalized

    def _check_in_engine(self, sql: str, params: Mapping[str, str] | None) -> str:
        try:
            text = self._conn.query(
                f"SELECT formatQuerySingleLine({sql_string(sql)})", "TSVRaw"
            ).bytes()
        except Exception as exc:
            raise QueryRefusedError(
                _code_of(str(exc), SYNTAX_ERROR), _message_of(str(exc))
            ) from None
        normalized = str(text.decode(errors="replace")).strip()
        first = normalized.split(" ", 1)[0].upper()
        if first not in READ_KINDS:
            raise QueryRefusedError(
                READONLY, f"the query port runs reads only ({', '.join(READ_KINDS)}), not {first}"
            )
        if "INTO OUTFILE" in normalized.upper():
            raise QueryRefusedError(READONLY, "the query port does not write files (INTO OUTFILE)")
        body = _TRAILING_FORMAT_RE.sub("", normalized).rstrip().rstrip(";")
        try:
            ast = self._conn.query(f"EXPLAIN AST {body}", "TSVRaw", params=dict(params or {}))
            ast_text = (ast.bytes() or b"").decode(errors="replace")
        except Exception as exc:
            raise QueryRefusedError(
                _code_of(str(exc), SYNTAX_ERROR), _message_of(str(exc))
            ) from None
        problem = audit_query(parse_ast(ast_text), body, self.database, self._table_functions)
        if problem is not None:
            raise QueryRefusedError(READONLY, problem)
        return normalized

    def execute(
        self,
        sql: str,
        *,
        default_format: str = "TabSeparated",
        database: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> QueryResult:
        """Check, then run one read-only query (an error is a :class:`QueryRefusedError`)."""
        if database is not None and database != self.database:
            raise QueryRefusedError(
                READONLY, f"the query port serves the store's database {self.database} only"
            )
        match = _TRAILING_FORMAT_RE.search(sql)
        fmt = match.group(1) if match else default_format
        t0 = time.perf_counter()
        body, rows_read, bytes_read = self._run(lambda: self._execute(sql, fmt, params))
        return QueryResult(body, fmt, rows_read, bytes_read, time.perf_counter() - t0)

    def _execute(
        self, sql: str, fmt: str, params: Mapping[str, str] | None
    ) -> tuple[bytes, int, int]:
        """:meth:`execute`, holding this session's lock: the answer, rows and bytes read."""
        self._check(sql, params)
        try:
            result = self._conn.query(sql, fmt, params=dict(params or {}))
        except Exception as exc:
            raise QueryRefusedError(_code_of(str(exc), 1000), _message_of(str(exc))) from None
        size, limit = int(result.size()), self.limits.max_result_bytes
        if size > limit:  # (the engine checks whole blocks: one huge block gets here)
            raise QueryRefusedError(
                TOO_MANY_ROWS_OR_BYTES,
                f"Limit for result exceeded, max bytes: {limit}, current bytes: {size}",
            )
        body = bytes(result.bytes() or b"")
        rows_read = bytes_read = 0
        with contextlib.suppress(Exception):
            rows_read, bytes_read = int(result.rows_read()), int(result.bytes_read())
        return body, rows_read, bytes_read

    def execute_unchecked(self, sql: str) -> bytes:
        """Run ``sql`` on the read-only session without :meth:`check` (tests use it
        to show that the engine itself refuses writes and enforces the limits)."""

        def run() -> bytes:
            try:
                return bytes(self._conn.query(sql, "TSV").bytes() or b"")
            except Exception as exc:
                raise QueryRefusedError(_code_of(str(exc), 1000), _message_of(str(exc))) from None

        return self._run(run)

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the session once its query (if any) is over; a query the engine is still
        running after ``timeout_s`` (one the port gave up on) leaves it open (logged)."""
        if not self._lock.acquire(timeout=timeout_s):
            self._closed = True  # the running query's end does not open another
            log.warning("query port: a query still runs in the engine; session left open")
            return
        try:
            if not self._closed:
                self._closed = True
                with self._engine_lock:
                    self._conn.close()
        finally:
            self._lock.release()


def _shutting_down() -> None:
    raise QueryRefusedError(210, "the query port is shutting down")


def _code_of(message: str, default: int) -> int:
    m = _CODE_RE.search(message)
    return int(m.group(1)) if m else default


def _message_of(message: str) -> str:
    i = message.find("Code: ")
    message = (message[i:] if i >= 0 else message).strip()
    # A syntax error found by the port's own parse (formatQuerySingleLine of the query as
    # a string): the engine's scope names that wrapper, not the user's query.
    j = message.find(" In scope SELECT formatQuerySingleLine(")
    if j >= 0:
        name = re.search(r"\(([A-Z_]+)\)\s*$", message)
        message = message[:j].rstrip(":. ") + (f". ({name.group(1)})" if name else "")
    return message
