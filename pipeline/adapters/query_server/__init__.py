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

The modules: :mod:`~.audit` (what a query may read, from its AST), :mod:`~.session`
(the read-only chDB session and its limits), :mod:`~.port` (the HTTP interface, the
discovery file, :class:`QueryServer`), :mod:`~.reader` (the tools' side).
"""

from __future__ import annotations

from pipeline.adapters.query_server.audit import AstNode, audit_query, parse_ast
from pipeline.adapters.query_server.port import (
    DISCOVERY_FILE,
    HOST,
    QueryServer,
    start_query_server,
)
from pipeline.adapters.query_server.reader import (
    LiveWorker,
    find_live_worker,
    open_reader,
    read_only_client,
)
from pipeline.adapters.query_server.session import (
    READ_KINDS,
    QueryLimits,
    QueryRefusedError,
    QueryResult,
    ReadOnlySession,
    sql_string,
)

__all__ = [
    "DISCOVERY_FILE",
    "HOST",
    "READ_KINDS",
    "AstNode",
    "LiveWorker",
    "QueryLimits",
    "QueryRefusedError",
    "QueryResult",
    "QueryServer",
    "ReadOnlySession",
    "audit_query",
    "find_live_worker",
    "open_reader",
    "parse_ast",
    "read_only_client",
    "sql_string",
    "start_query_server",
]
