"""The worker's read-only query port for its embedded store.

chDB allows one process per data directory, and a running worker owns it. So
that ``tailguard report|explain|capacity|sql`` work while a worker runs, the
worker answers read-only queries on ``127.0.0.1`` and speaks enough of
ClickHouse's HTTP interface that clickhouse-connect's ordinary HTTP client
works against it: the tools use the same :class:`~pipeline.adapters.store.Store`
API whether they open the directory themselves or go through the worker.

* **Discovery.** While it serves, the worker keeps ``tailguard-query.json``
  (``{"port", "pid", "store", "token"}``, mode 0600) in the store directory and removes it on
  stop. :func:`open_reader` uses the port when that file names a live process
  that answers for this directory, and opens the directory directly otherwise.
* **Authenticated.** Every start draws a fresh random token, kept in the
  discovery file (mode 0600, so only the store's owner can read it); a query
  without it is refused (``516``, HTTP 401). It travels in headers only:
  clickhouse-connect sends it as the password (HTTP basic auth);
  ``X-ClickHouse-Key`` works too. A ``password`` in the URL (ClickHouse's
  ``?password=``) is refused (HTTP 400, the value not echoed) whether right or
  wrong, so that the token never sits in a URL, a shell history or a log; the
  port's own request log never writes a query string. Only ``/ping`` answers
  without the token.
* **The store's own tables only.** Before it runs, a query's AST (ClickHouse's
  ``EXPLAIN AST``) is walked: no table function anywhere (``file``, ``url``,
  ``s3``, ``executable``, ``remote``, ``python``, ... in any statement kind,
  ``DESCRIBE`` and ``EXPLAIN`` included), no scalar function that reads files
  or other tables by name (``file``, ``joinGet``, ``dictGet``...), and every
  table named is in the store's database (unqualified names resolve there:
  it is the session's database) or ``system.one``/``system.settings`` (which
  clickhouse-connect reads when it connects). ``SHOW`` is limited to
  ``SHOW TABLES``, ``SHOW COLUMNS`` and ``SHOW CREATE`` of the store's tables.
* **Read-only, by ClickHouse's own rules.** Queries run on a dedicated chDB
  connection of the worker's engine with the session setting ``readonly = 1``:
  the engine refuses INSERT, DROP, ALTER, CREATE, TRUNCATE, OPTIMIZE and
  setting changes (but not table functions: ``readonly = 1`` runs ``file()``
  and ``url()``, hence the AST check above). It also lets through a
  few statements that are not reads (``SYSTEM STOP MERGES``, ``KILL QUERY``,
  ``SELECT ... INTO OUTFILE``, several statements in one request), so each
  request is first parsed by ClickHouse (``formatQuerySingleLine``, which
  refuses multi-statements) and only the query kinds that read are accepted:
  ``SELECT``, ``WITH``, ``SHOW``, ``DESCRIBE``, ``EXPLAIN``, ``EXISTS``,
  never with ``INTO OUTFILE``.
* **Limits the engine enforces.** The session's settings, fixed before
  ``readonly = 1`` (which then refuses any change, ``SETTINGS`` clauses
  included): ``max_execution_time`` (30 s) with ``timeout_overflow_mode =
  'throw'``, ``max_memory_usage`` (512 MiB), ``max_result_bytes`` (256 MiB;
  also checked by the port on the answer, which the engine does not for one
  huge block), ``max_threads`` (a quarter of the cores, at least 1) and
  ``os_thread_priority = 19``: the engine's threads run a query at nice 19
  (and back to 0 after it), so that the writer's threads, at 0, get the cores
  first. See :class:`QueryLimits`, from ``TAILGUARD_QUERY_*``.
  The engine checks the time between blocks of data, so a query that computes
  one huge block (``SELECT arrayMap(x -> x, range(100000000))``) is not
  stopped by the time limit; it is by the memory limit (such a block is as
  large as the work it holds). Should the engine still not have answered
  ``max_execution_time`` + 1 s after the start, the port answers ``159``
  (``TIMEOUT_EXCEEDED``) itself; the engine finishes that query in the
  background and the port's next query waits for it (up to the limit, then
  ``202``). These errors are HTTP 500, as ClickHouse's (a 503 would make
  clients retry the query).
* **Never in the writer's way.** The read-only session is a chDB connection
  of its own: its queries run alongside the worker's writes, which are on
  another connection of the same engine (ClickHouse sessions run
  concurrently; only one session must not be used by two threads at once).
  So a query takes the port's own lock (one query at a time on its session),
  never the store's: the store's lock (``lock``, the one the worker's writer
  thread takes for each insert) is held only to open and close the session.
  Queries run on the server's own threads, never on the Faust event loop.
  Measured (``bench/query_isolation.py``, 2 shared cores, default limits):
  the writer's flush p99 853 ms with hostile queries back to back against
  629 ms without (p50 273 / 120 ms); with the queries holding the writer's
  lock, as before, 11.1 s with a 10 s limit (42.7 s in a fault trial).
* **Idle cost:** one thread blocked in ``select`` (woken twice a second to
  check for shutdown); nothing runs per Kafka message.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, urlsplit

from pipeline.processes import pid_alive

log = logging.getLogger("tailguard.query_server")
_T = TypeVar("_T")

DISCOVERY_FILE = "tailguard-query.json"
HOST = "127.0.0.1"
READ_KINDS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "EXPLAIN", "EXISTS")

# HTTP parameters that are transport, not query settings (clickhouse-connect
# sends some of them with every request). Any other parameter would be a
# setting change, which the read-only session refuses.
_TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "wait_end_of_query",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "quota_key",
        "compress",
        "decompress",
        "client_protocol_version",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "enable_http_compression",
        "buffer_size",
        "role",
        "user",
    }
)
_TRAILING_FORMAT_RE = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE)
_CODE_RE = re.compile(r"Code: (\d+)")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URL_QUERY_RE = re.compile(r"(\S*?)\?\S*")  # a URL's query string, in a request line

READONLY = 164  # ClickHouse error codes
SYNTAX_ERROR = 62
UNKNOWN_SETTING = 115
AUTHENTICATION_FAILED = 516
TIMEOUT_EXCEEDED = 159
TOO_MANY_SIMULTANEOUS_QUERIES = 202
TOO_MANY_ROWS_OR_BYTES = 396
BAD_ARGUMENTS = 36  # a token in the URL

# Tables outside the store's database a query may name: what clickhouse-connect reads
# when it connects (the session's settings) and the one-row table.
ALLOWED_SYSTEM_TABLES = frozenset({"system.one", "system.settings"})
# Scalar functions that read files, or tables and dictionaries named by a string.
DENIED_FUNCTIONS = frozenset(
    {"file", "joinget", "joingetornull", "catboostevaluate", "hascolumnintable"}
)
DENIED_FUNCTION_PREFIXES = ("dictget", "dicthas", "dictis")
IN_FUNCTIONS = frozenset(
    {"in", "notin", "globalin", "globalnotin", "nullin", "notnullin", "globalnullin",
     "globalnotnullin"}
)  # fmt: skip
_SHOW_TABLES_RE = re.compile(
    r"^SHOW (?:FULL )?TABLES(?: FROM (?P<db>\S+))?(?: (?:NOT )?I?LIKE '(?:[^'\\]|\\.)*')?"
    r"(?: LIMIT \d+)?$",
    re.IGNORECASE,
)
_SHOW_COLUMNS_RE = re.compile(
    r"^SHOW (?:FULL )?COLUMNS FROM (?P<table>\S+)(?: FROM (?P<db>\S+))?"
    r"(?: (?:NOT )?I?LIKE '(?:[^'\\]|\\.)*')?(?: LIMIT \d+)?$",
    re.IGNORECASE,
)


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
    """What one query on the port may use (the engine enforces them; see the module)."""

    max_execution_time_s: int = 30
    max_memory_bytes: int = 512 << 20
    max_result_bytes: int = 256 << 20  # the answer, as the engine wrote it
    max_threads: int = 0  # 0: a quarter of this host's cores, at least 1
    nice: int = 19  # the engine's threads of a query run at this nice value (os_thread_priority)
    grace_s: float = 1.0  # past max_execution_time_s, the port answers 159 itself

    @property
    def threads(self) -> int:
        return self.max_threads or max(1, (os.cpu_count() or 1) // 4)

    def settings(self) -> dict[str, int | str]:
        return {
            "max_execution_time": int(self.max_execution_time_s),
            "timeout_overflow_mode": "throw",
            "max_memory_usage": int(self.max_memory_bytes),
            "max_result_bytes": int(self.max_result_bytes),
            "result_overflow_mode": "throw",
            "max_threads": self.threads,
            "os_thread_priority": int(self.nice),
        }

    @classmethod
    def from_settings(cls, settings: Any) -> QueryLimits:
        return cls(
            max_execution_time_s=settings.query_max_execution_s,
            max_memory_bytes=settings.query_max_memory_mb << 20,
            max_result_bytes=settings.query_max_result_mb << 20,
            max_threads=settings.query_max_threads,
        )


class ReadOnlySession:
    """A chDB connection of this process's engine, in ``readonly = 1`` mode.

    ``lock`` is the lock the process's other chDB user (the worker's store)
    holds for each call: taken here only to open and close this session, never
    for a query (queries take this session's own lock: one at a time).
    """

    def __init__(
        self,
        store_dir: Path,
        lock: threading.Lock,
        *,
        database: str = "tailguard",
        limits: QueryLimits | None = None,
    ) -> None:
        import chdb  # adapter-only import

        if not _IDENT_RE.match(database):
            raise ValueError(f"invalid database name {database!r}")
        self.limits = limits = limits or QueryLimits()
        self.path = os.path.realpath(store_dir)
        self.database = database
        self._engine_lock = lock
        self._lock = threading.Lock()  # this session's: one query at a time
        self.busy = threading.Event()  # set while a query runs in the engine
        self.overruns = 0  # queries the port answered 159 for, the engine still running
        with self._engine_lock:
            # The same path string as clickhouse-connect's: chDB compares them literally.
            self._conn: Any = chdb.connect(self.path)  # type: ignore[no-untyped-call]
            for name, value in limits.settings().items():
                literal = sql_string(value) if isinstance(value, str) else str(int(value))
                self._conn.query(f"SET {name} = {literal}", "TSV")
            # The store's database is the session's: unqualified names resolve there (a
            # store not migrated yet has none; its queries then fail as unknown tables).
            with contextlib.suppress(Exception):
                self._conn.query(f"USE {database}", "TSV")
            # Names only a table function has (``file`` and ``format`` are also scalar
            # functions: ``file`` is denied by name, ``format`` only parses its argument).
            names = self._conn.query(
                "SELECT lower(name) FROM system.table_functions "
                "WHERE name NOT IN (SELECT name FROM system.functions)",
                "TSVRaw",
            )
            self._table_functions = frozenset(names.bytes().decode().split())
            self._conn.query("SET readonly = 1", "TSV")
            self.timezone = self._conn.query("SELECT timezone()", "TSV").bytes().decode().strip()
        self._closed = False

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
            finally:
                self.busy.clear()
                self._lock.release()
                done.set()

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

    def check(self, sql: str, params: Mapping[str, str] | None = None) -> str:
        """ClickHouse's parse of ``sql`` (one statement); refuses what does not read, or
        reads anything but the store's own tables (see the module's docstring)."""
        return self._run(lambda: self._check(sql, params))

    def _check(self, sql: str, params: Mapping[str, str] | None) -> str:
        """:meth:`check`, holding this session's lock."""
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


@dataclass(slots=True)
class AstNode:
    """One line of ClickHouse's ``EXPLAIN AST``: ``Function file``, ``TableIdentifier db.t``."""

    kind: str
    arg: str
    children: list[AstNode]


_CHILDREN_RE = re.compile(r" \(children \d+\)$")
_ALIAS_RE = re.compile(r" \(alias [^)]*\)$")


def parse_ast(text: str) -> list[AstNode]:
    """The tree of ``EXPLAIN AST`` output (indentation = depth)."""
    roots: list[AstNode] = []
    stack: list[tuple[int, AstNode]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip(" "))
        body = _ALIAS_RE.sub("", _CHILDREN_RE.sub("", line.strip()))
        kind, _, arg = body.partition(" ")
        node = AstNode(kind, arg, [])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        (stack[-1][1].children if stack else roots).append(node)
        stack.append((depth, node))
    return roots


def _unquote(name: str) -> str:
    return name.replace("`", "").replace('"', "")


def _table_problem(name: str, database: str) -> str | None:
    name = _unquote(name.strip())
    if "." not in name:
        return None  # the session's database (the store's), or a WITH name
    db = name.split(".", 1)[0]
    if db == database or name.lower() in ALLOWED_SYSTEM_TABLES:
        return None
    return f"only the store's own tables (database {database}) can be read, not {name}"


def _db_problem(db: str, database: str) -> str | None:
    db = _unquote(db.strip())
    if not db or db == database:
        return None
    return f"only the store's own tables (database {database}) can be read, not database {db}"


_ROOT_KINDS = frozenset(
    {"SelectWithUnionQuery", "SelectIntersectExceptQuery", "SelectQuery", "DescribeQuery",
     "Explain", "ShowTables", "ShowColumns", "ShowCreateTableQuery", "ShowCreateViewQuery",
     "ExistsTableQuery", "ExistsViewQuery", "ExistsDatabaseQuery"}
)  # fmt: skip


def audit_query(
    roots: list[AstNode], normalized: str, database: str, table_functions: frozenset[str]
) -> str | None:
    """Why the query port refuses a query (None: it may run).

    ``roots``: its ``EXPLAIN AST``; ``normalized``: ClickHouse's single-line form of it
    (for ``SHOW``, whose AST does not name what it shows); ``table_functions``: names
    (lower case) that only a table function has.
    """
    if len(roots) != 1:
        return "one statement at a time"
    root = roots[0]
    if root.kind not in _ROOT_KINDS:
        return (
            "the query port runs SELECT, DESCRIBE, EXPLAIN, EXISTS and SHOW TABLES / "
            f"SHOW COLUMNS / SHOW CREATE TABLE of the store's tables, not {normalized[:60]}"
        )
    if root.kind == "ShowTables":
        m = _SHOW_TABLES_RE.match(normalized)
        if m is None:
            return (
                "of SHOW statements only SHOW TABLES, SHOW COLUMNS and SHOW CREATE run "
                f"here, not {normalized[:60]}"
            )
        return _db_problem(m.group("db") or "", database)
    if root.kind == "ShowColumns":
        m = _SHOW_COLUMNS_RE.match(normalized)
        if m is None:
            return f"unsupported SHOW COLUMNS form: {normalized[:60]}"
        return _db_problem(m.group("db") or "", database) or _table_problem(
            m.group("table"), database
        )
    if root.kind.startswith(("ShowCreate", "Exists")):
        return _db_problem(root.arg.split(" ", 1)[0], database)

    def walk(node: AstNode, parent: str) -> str | None:
        if node.kind == "Function":
            name = node.arg.split(" ", 1)[0]
            low = name.lower()
            if parent == "TableExpression" or low in table_functions:
                return f"table functions are not allowed on the query port: {name}()"
            if low in DENIED_FUNCTIONS or low.startswith(DENIED_FUNCTION_PREFIXES):
                return f"function {name}() is not allowed on the query port"
            if low in IN_FUNCTIONS and node.children and len(node.children[0].children) == 2:
                rhs = node.children[0].children[1]
                if rhs.kind in ("Identifier", "TableIdentifier"):
                    problem = _table_problem(rhs.arg, database)
                    if problem is not None:
                        return problem
        elif node.kind == "TableIdentifier":
            problem = _table_problem(node.arg, database)
            if problem is not None:
                return problem
        for child in node.children:
            problem = walk(child, node.kind)
            if problem is not None:
                return problem
        return None

    return walk(root, "")


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


def _http_status(code: int) -> int:
    """ClickHouse's own mapping for the codes this port produces."""
    if code == READONLY:
        return 403
    if code == AUTHENTICATION_FAILED:
        return 401
    if code in (SYNTAX_ERROR, UNKNOWN_SETTING, BAD_ARGUMENTS, 457):
        return 400
    if code in (60, 81):  # UNKNOWN_TABLE, UNKNOWN_DATABASE
        return 404
    return 500


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

    def log_message(self, format: str, *args: Any) -> None:
        # The request line's query string may hold a URL token (refused, but sent):
        # never write it, at any level.
        text = _URL_QUERY_RE.sub(r"\1?<query not logged>", format % args)
        log.debug("query port: %s", text)

    def _url_token_refused(self) -> bool:
        """A ``password`` in the URL is refused (HTTP 400) before anything else, whether
        it is the token or not, and its value is not echoed."""
        names = {k.lower() for k, _ in parse_qsl(urlsplit(self.path).query, keep_blank_values=True)}
        if "password" not in names:
            return False
        self._error(
            BAD_ARGUMENTS,
            "the query port takes its token in headers only (HTTP basic auth password or "
            "X-ClickHouse-Key), never as the password parameter of the URL",
        )
        return True

    def _send(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:
        body = f"Code: {code}. DB::Exception: {message}\n".encode()
        self._send(
            _http_status(code),
            body,
            {"X-ClickHouse-Exception-Code": str(code), "Content-Type": "text/plain"},
        )

    def _authorized(self) -> bool:
        """The request carries the port's token in a header: as the password (HTTP basic
        auth, what clickhouse-connect sends) or ``X-ClickHouse-Key``."""
        offered: list[str] = []
        auth = self.headers.get("Authorization") or ""
        if auth[:6].lower() == "basic ":
            with contextlib.suppress(ValueError):
                offered.append(base64.b64decode(auth[6:]).decode().partition(":")[2])
        offered.append(self.headers.get("X-ClickHouse-Key") or "")
        token = self.server.token.encode()
        ok = False
        for candidate in offered:  # compare every one, in constant time each
            ok |= hmac.compare_digest(candidate.encode(), token)
        if not ok:
            self._error(
                AUTHENTICATION_FAILED,
                "Authentication failed: the query port needs the token of the store's "
                f"{DISCOVERY_FILE} in a header (the basic auth password or X-ClickHouse-Key)",
            )
        return ok

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if self._url_token_refused():
            return
        if path == "/ping":
            self._send(200, b"Ok.\n", {"Content-Type": "text/plain"})
        elif not self._authorized():
            return
        elif path == "/tailguard":
            info = {"pid": os.getpid(), "store": self.server.session.path}
            self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
        elif path == "/":
            self._query(b"")
        else:
            self._error(1000, f"no such path {path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if not self._url_token_refused() and self._authorized():
            self._query(body)

    def _query(self, body: bytes) -> None:
        url = urlsplit(self.path)
        if url.path != "/":
            self._error(1000, f"no such path {url.path}")
            return
        args = dict(parse_qsl(url.query, keep_blank_values=True))
        parts = [args.get("query", ""), body.decode(errors="replace")]
        sql = "\n".join(p for p in parts if p).strip()
        if not sql:
            self._error(SYNTAX_ERROR, "empty query")
            return
        params = {k[6:]: v for k, v in args.items() if k.startswith("param_")}
        settings = [k for k in args if k not in _TRANSPORT_PARAMS and not k.startswith("param_")]
        if settings:
            self._error(
                READONLY,
                f"Cannot modify {', '.join(sorted(settings))}: the query port is read-only",
            )
            return
        try:
            result = self.server.session.execute(
                sql,
                default_format=args.get("default_format", "TabSeparated"),
                database=args.get("database") or None,
                params=params,
            )
        except QueryRefusedError as exc:
            self._error(exc.code, str(exc))
            return
        summary = {
            "read_rows": str(result.rows_read),
            "read_bytes": str(result.bytes_read),
            "elapsed_ns": str(int(result.elapsed_s * 1e9)),
        }
        self.server.queries += 1
        self._send(
            200,
            result.body,
            {
                "X-ClickHouse-Format": result.fmt,
                "X-ClickHouse-Timezone": self.server.session.timezone,
                "X-ClickHouse-Summary": json.dumps(summary),
                "Content-Type": "application/octet-stream",
            },
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, session: ReadOnlySession, token: str) -> None:
        super().__init__((HOST, port), _Handler)
        self.session = session
        self.token = token
        self.queries = 0


class QueryServer:
    """The read-only port: a thread serving :class:`ReadOnlySession` over HTTP."""

    def __init__(
        self,
        store_dir: Path,
        lock: threading.Lock,
        *,
        database: str = "tailguard",
        port: int = 0,
        limits: QueryLimits | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.session = ReadOnlySession(self.store_dir, lock, database=database, limits=limits)
        # Fresh on every start; readers find it in the discovery file (mode 0600).
        self.token = secrets.token_urlsafe(32)
        try:
            self._server = _Server(port, self.session, self.token)
        except Exception:
            self.session.close()
            raise
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="tailguard-query-port", daemon=True
        )
        self.discovery = self.store_dir / DISCOVERY_FILE

    @property
    def queries(self) -> int:
        return self._server.queries

    def start(self, *, publish: bool = True) -> QueryServer:
        """Serve; ``publish``: write the discovery file (the worker does, a tool does not)."""
        self._thread.start()
        if not publish:
            return self
        tmp = self.discovery.with_suffix(f".{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        info = {"port": self.port, "pid": os.getpid(), "store": self.session.path}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the token is a secret
        with os.fdopen(fd, "w") as fh:
            json.dump(info | {"token": self.token}, fh)
        tmp.replace(self.discovery)
        log.info("read-only query port on %s:%d (%s)", HOST, self.port, self.discovery)
        return self

    def stop(self) -> None:
        """Remove the discovery file (if ours), stop serving, close the session."""
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.discovery.read_text()).get("pid") == os.getpid():
                self.discovery.unlink()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.session.close()


def start_query_server(settings: Any, store: Any) -> QueryServer | None:
    """The worker's port, or None (a ClickHouse server needs none; port -1 = off)."""
    if settings.clickhouse_url or settings.query_port < 0:
        return None
    return QueryServer(
        settings.store_dir,
        store.lock,
        database=settings.database,
        port=settings.query_port,
        limits=QueryLimits.from_settings(settings),
    ).start()


# --- the tools' side -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LiveWorker:
    port: int
    pid: int
    token: str = ""


def find_live_worker(store_dir: Path, timeout_s: float = 2.0) -> LiveWorker | None:
    """The worker serving ``store_dir``'s query port, if its discovery file
    names a live process that answers for this directory."""
    import urllib.request

    path = Path(store_dir) / DISCOVERY_FILE
    try:
        info = json.loads(path.read_text())
        port, pid, token = int(info["port"]), int(info["pid"]), str(info.get("token", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pid_alive(pid):
        return None
    request = urllib.request.Request(
        f"http://{HOST}:{port}/tailguard", headers={"X-ClickHouse-Key": token}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (http://127.0.0.1)
            served = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    if served.get("pid") != pid or served.get("store") != os.path.realpath(store_dir):
        return None  # a stale file and a port reused by someone else
    return LiveWorker(port, pid, token)


def _http_client(port: int, token: str, database: str) -> Any:
    import clickhouse_connect

    return clickhouse_connect.get_client(
        host=HOST,
        port=port,
        interface="http",
        compress=False,
        username="tailguard",
        password=token,
        database=database,
    )


def _http_store(live: LiveWorker, database: str) -> Any:
    from pipeline.adapters.store import ClickHouseStore

    return ClickHouseStore(_http_client(live.port, live.token, database), database)


def _open_embedded_or_port(settings: Any, wait_s: float) -> tuple[Any, bool]:
    """(store, through_port): the live worker's port, else the directory itself."""
    from pipeline.adapters.store import StoreError, open_store

    if not Path(settings.store_dir).is_dir():
        raise StoreError(f"no store at {settings.store_dir} (run a worker or `replay` first)")
    deadline = time.monotonic() + wait_s
    while True:
        live = find_live_worker(settings.store_dir)
        if live is not None:
            log.debug(
                "reading %s through worker %d's port %d", settings.store_dir, live.pid, live.port
            )
            return _http_store(live, settings.database), True
        try:
            return open_store(settings), False
        except StoreError:
            # Locked by a process that has not published its port yet (a worker starting)?
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def open_reader(settings: Any, *, wait_s: float = 10.0) -> Any:
    """A :class:`~pipeline.adapters.store.ClickHouseStore` for the tools' own queries.

    A ClickHouse server when ``clickhouse_url`` is set; else the live worker's
    query port for ``store_dir``; else the directory itself. If the directory
    is locked by a process that has not published its port yet, wait up to
    ``wait_s`` for the port.
    """
    from pipeline.adapters.store import open_store

    if settings.clickhouse_url:
        return open_store(settings)
    return _open_embedded_or_port(settings, wait_s)[0]


@contextlib.contextmanager
def read_only_client(settings: Any, *, wait_s: float = 10.0) -> Iterator[Any]:
    """A clickhouse-connect client on which only reads run (``tailguard sql``).

    A ClickHouse server: the session setting ``readonly = 1``. A live worker:
    its port. Otherwise this process opens the directory and serves itself the
    same read-only port (unpublished), so the rules are the same either way.
    """
    import clickhouse_connect

    from pipeline.adapters.store import StoreError, open_store

    if settings.clickhouse_url:
        client = clickhouse_connect.get_client(
            dsn=settings.clickhouse_url,
            username=settings.clickhouse_user,
            password=settings.clickhouse_password.get_secret_value(),
            database=settings.database,
            settings={"readonly": 1},
        )
        try:
            yield client
        finally:
            client.close()
        return
    if not Path(settings.store_dir).is_dir():
        raise StoreError(f"no store at {settings.store_dir} (run a worker or `replay` first)")
    deadline = time.monotonic() + wait_s
    while True:
        live = find_live_worker(settings.store_dir)
        if live is not None:
            client = _http_client(live.port, live.token, settings.database)
            try:
                yield client
            finally:
                client.close()
            return
        try:
            owner = open_store(settings)
            break
        except StoreError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
    try:
        server = QueryServer(
            settings.store_dir,
            owner.lock,
            database=settings.database,
            limits=QueryLimits.from_settings(settings),
        ).start(publish=False)
        try:
            client = _http_client(server.port, server.token, settings.database)
            try:
                yield client
            finally:
                client.close()
        finally:
            server.stop()
    finally:
        owner.close()
