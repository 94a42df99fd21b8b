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
* **Limits the engine enforces.** Each session's settings, fixed before
  ``readonly = 1`` (which then refuses any change, ``SETTINGS`` clauses
  included): ``max_execution_time`` (30 s) with ``timeout_overflow_mode =
  'throw'``, ``max_memory_usage`` (512 MiB), ``max_result_bytes`` (256 MiB;
  also checked by the port on the answer, which the engine does not for one
  huge block), ``max_threads`` (a quarter of the cores, at least 1) and
  ``os_thread_priority`` (0: see below). See :class:`QueryLimits`, from
  ``TAILGUARD_QUERY_*``.
  The engine checks the time between blocks of data, so a query that computes
  one huge block (``SELECT arrayMap(x -> x, range(100000000))``) is not
  stopped by the time limit; it is by the memory limit (such a block is as
  large as the work it holds). Should the engine still not have answered
  ``max_execution_time`` + 1 s after the start, the port answers ``159``
  (``TIMEOUT_EXCEEDED``) itself; the engine finishes that query in the
  background, on its session, which the pool hands out again only then.
  These errors are HTTP 500, as ClickHouse's (a 503 would make clients retry
  the query).
* **Why nice 0 (19 before issue 49).** The memory limit is checked at each
  allocation (the engine's tracker, in 4 MiB steps per thread): a query is
  stopped once it has allocated 512 MiB, which takes CPU time, not wall time.
  At nice 19 a query gets ~1.5 % of a core that a nice-0 process wants (CFS
  weights 15 : 1024): a memory bomb pinned to one core beside one busy process
  had not reached its limit after 18 s (twice; nice 10: 2.9-7.2 s; nice 0:
  1.0-2.4 s), the likely cause of the 9-21 s a fault trial's bombs ran; on a
  machine loaded by others it starved the interactive queries too. The port's
  queries stay out of the writer's cores by their thread cap (``max_threads``)
  and the concurrency; ``TAILGUARD_QUERY_NICE`` still gives the writer the
  cores first, at that cost.
* **Readers do not block each other.** The port runs up to
  ``TAILGUARD_QUERY_CONCURRENCY`` (2) queries at once, each on a read-only
  session of its own (:class:`SessionPool`; a chDB session is used by one
  thread at a time, sessions run concurrently in the engine), each under the
  limits above: the port's queries hold at most 2 x 512 MiB. A client runs
  at most ``TAILGUARD_QUERY_PER_CLIENT`` (1) at once; the queries that must
  wait are granted round-robin across clients (:class:`FairQueue`: one turn
  per client per round, a client's own queries in order), and one that waited
  ``TAILGUARD_QUERY_QUEUE_WAIT_S`` (10 s) is answered ``202``, as is a
  client's 9th waiting query at once. So a client sending 30 s queries back to
  back holds one session; ``report`` and the dashboards take turns on the
  other. **A client** is its user name and User-Agent
  (:func:`~.port.client_of`): every local client holds the same token and most
  send the user ``default``, so Grafana's plugin, curl and one's own script
  are three clients; the tools send ``tailguard-<pid>``, each tool process
  its own. This is fairness between the store owner's own processes, not a
  boundary: a client that names itself anew for each query gets up to the
  concurrency, and each query's limits still bound it. A query the port
  answered ``159`` keeps its session and its client's turn until the engine
  returns.
* **A long query's client runs its next one niced.** A client whose last query
  ran ``long_query_s`` (1 s) or more runs its next one at ``long_query_nice``
  (10), on a second set of ``concurrency`` sessions (:class:`SessionPool`; the
  queries at once stay ``concurrency``, so the memory bound is unchanged); a
  short query clears it. Its first bomb runs at nice 0 (stopped at the memory
  limit in 1.2-1.9 s here), those that follow get ~1/10 of the CPU a nice-0
  thread wants. Why: beside back-to-back 30 s queries and bombs, ``report``'s
  queries got a session at once (no wait measured in the fair queue) but their
  engine time doubled (0.22 -> 0.52 s for its 20 queries), the hostile thread
  taking the cores from them and from the writer. Measured
  (``bench/query_isolation.py``, 2 shared cores at load 7-26, back to back):
  report's reads beside the hostile client p50 0.85-1.21 s, max 2.57-2.86 s
  (3 runs; ``./tg bench --only query_isolation`` in ``bench/RESULTS.md``)
  against p50 1.45-1.90 s, max 3.00-3.61 s with ``--long-query-nice 0``
  (2 runs); the writer's flush p50 beside it 226-235 ms (2 runs) against 366-404 ms.
* **A text checked once is not checked again.** The check above is two engine
  calls per query; ``report`` and the dashboards send the same texts again and
  again: :class:`~.session.CheckCache` keeps the texts accepted (with their
  parameters; 512, least recently used out; refusals are never kept). Measured:
  the check was 44 % of the port's time for report's queries beside a hostile
  client (median 14 ms, p90 0.1 s each on a loaded machine).
* **Never in the writer's way.** The read-only sessions are chDB connections
  of their own: their queries run alongside the worker's writes, which are on
  another connection of the same engine (ClickHouse sessions run
  concurrently). A query never takes the store's lock (``lock``, the one the
  worker's writer thread takes for each insert): it is held only to open and
  close a session. Queries run on the server's own threads, never on the Faust
  event loop. Measured (``bench/query_isolation.py``, 2 shared cores, default
  limits, one query at a time, before issue 49): the writer's flush p99 853 ms
  with hostile queries back to back against 629 ms without (p50 273 / 120 ms);
  with the queries holding the writer's lock, as before issue 37, 11.1 s with a
  10 s limit (42.7 s in a fault trial). With the pool (defaults, load 8-19 from
  others' work), a client sending 30 s queries and memory bombs back to back:
  report's reads answered in 0.8 s p50, 1.6-2.6 s p90, 2.3-4.1 s at most (0.4-0.5 /
  0.9-1.5 / 1.5-3.4 s without it; with one query at a time, as before, 202 after
  10-20 s), a dashboard panel in 0.03 s p50, 0.35 s at most; ``arrayMap`` bombs
  stopped after 1.1-1.6 s, a growing ``uniqExact`` after 11-21 s; the RSS rose
  ~0.4 GB; the writer's flush p99 751-1,117 ms against 514-1,088 ms
  (``docs/configuration.md``).
* **Idle cost:** one thread blocked in ``select`` (woken twice a second to
  check for shutdown); nothing runs per Kafka message.

The modules: :mod:`~.audit` (what a query may read, from its AST), :mod:`~.session`
(the read-only chDB session and its limits), :mod:`~.pool` (the sessions and the fair
queue), :mod:`~.port` (the HTTP interface, the discovery file, :class:`QueryServer`),
:mod:`~.reader` (the tools' side).
"""

from __future__ import annotations

from pipeline.adapters.query_server.audit import AstNode, audit_query, parse_ast
from pipeline.adapters.query_server.pool import FairQueue, SessionPool
from pipeline.adapters.query_server.port import (
    DISCOVERY_FILE,
    HOST,
    QueryServer,
    client_of,
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
    "FairQueue",
    "LiveWorker",
    "QueryLimits",
    "QueryRefusedError",
    "QueryResult",
    "QueryServer",
    "ReadOnlySession",
    "SessionPool",
    "audit_query",
    "client_of",
    "find_live_worker",
    "open_reader",
    "parse_ast",
    "read_only_client",
    "sql_string",
    "start_query_server",
]
