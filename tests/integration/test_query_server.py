"""The worker's read-only query port, in process, on the real embedded engine."""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import clickhouse_connect
import pytest

from pipeline.adapters.query_server import (
    DISCOVERY_FILE,
    QueryLimits,
    QueryRefusedError,
    QueryServer,
    find_live_worker,
    open_reader,
)
from pipeline.adapters.store import ClickHouseStore, migrate, open_store, write_requests
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.ceilings import ceiling
from tests.factories import completed, finished, received
from tools.dev.grafana_sql import QueryContext, Variable, interpolate

pytestmark = pytest.mark.integration


def _records(start: int, n: int) -> list:
    return [
        build_record(
            f"q-{i}",
            received(f"q-{i}", i),
            completed(f"q-{i}", i + 100),
            finished(f"q-{i}", i + 98),
        )
        for i in range(start, start + n)
    ]


def _serve(tmp_path: Path, limits: QueryLimits | None = None):
    settings = Settings(store_dir=tmp_path / "store")
    store = open_store(settings)
    migrate(store)
    write_requests(store, _records(0, 10))
    try:  # the store closed whatever fails: chDB serves one path per process
        server = QueryServer(settings.store_dir, store.lock, limits=limits).start()
        client = clickhouse_connect.get_client(
            host="127.0.0.1", port=server.port, compress=False, password=server.token
        )
        try:
            yield settings, store, server, client
        finally:
            client.close()
            server.stop()
    finally:
        store.close()


@pytest.fixture
def served(tmp_path: Path):
    yield from _serve(tmp_path)


@pytest.fixture(scope="module")
def served_shared(tmp_path_factory: pytest.TempPathFactory):
    """One store for the read-only tests below (nothing they run may change it)."""
    yield from _serve(tmp_path_factory.mktemp("shared"))


def _count(store: ClickHouseStore) -> int:
    return int(store.query_rows("SELECT count() FROM tailguard.requests FINAL")[0][0])


def test_clickhouse_connect_reads_through_the_port(served) -> None:
    _settings, store, server, client = served
    reader = ClickHouseStore(client, "tailguard")
    assert _count(reader) == _count(store) == 10
    rows = reader.query_rows(
        "SELECT request_id, gateway_total_ms, toDateTime64(ts_unix_ns / 1e9, 3, 'UTC') "
        "FROM tailguard.requests FINAL WHERE request_id = {rid:String}",
        {"rid": "q-3"},
    )
    assert rows == store.query_rows(
        "SELECT request_id, gateway_total_ms, toDateTime64(ts_unix_ns / 1e9, 3, 'UTC') "
        "FROM tailguard.requests FINAL WHERE request_id = {rid:String}",
        {"rid": "q-3"},
    )
    assert rows[0][0] == "q-3"
    names = [r[0] for r in reader.query_rows("SHOW TABLES FROM tailguard")]
    assert "requests" in names
    assert server.queries >= 3


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO tailguard.requests (request_id) VALUES ('evil')",
        "DROP TABLE tailguard.requests",
        "ALTER TABLE tailguard.requests DELETE WHERE 1",
        "TRUNCATE TABLE tailguard.requests",
        "CREATE TABLE tailguard.x (a UInt8) ENGINE = Memory",
    ],
)
def test_the_engine_itself_refuses_writes_on_the_read_only_session(served, sql: str) -> None:
    """readonly = 1 (ClickHouse's own setting) is what stops writes; chDB honours it."""
    _settings, store, server, _client = served
    # every session of the port's pool: 2 at nice 0, 2 at long_query_nice
    assert sorted(s.nice for s in server.pool.sessions) == [0, 0, 10, 10]
    for session in server.pool.sessions:
        with pytest.raises(QueryRefusedError) as exc:
            session.execute_unchecked(sql)
        assert exc.value.code == 164
        assert "readonly" in str(exc.value).lower()
    assert _count(store) == 10


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO tailguard.requests (request_id) VALUES ('evil')",
        "DROP TABLE tailguard.requests",
        "ALTER TABLE tailguard.requests DELETE WHERE 1",
        # what chDB's readonly = 1 lets through: refused by kind (ClickHouse's own parse)
        "SYSTEM STOP MERGES",
        "KILL QUERY WHERE 1",
        "SELECT 1; DROP TABLE tailguard.requests",
        "SELECT 1 INTO OUTFILE '{out}'",
        "SELECT * FROM file('/etc/hostname', 'LineAsString')",
    ],
)
def test_the_port_refuses_everything_but_reads(served, sql: str, tmp_path: Path) -> None:
    _settings, store, _server, client = served
    out = tmp_path / "outfile.txt"
    with pytest.raises(Exception, match=r"(?i)code: (164|62)") as exc:
        client.query(sql.replace("{out}", str(out)))
    assert getattr(exc.value, "code", None) in (164, 62)
    assert _count(store) == 10
    assert not out.exists()
    assert "requests" in [r[0] for r in store.query_rows("SHOW TABLES FROM tailguard")]


def test_setting_changes_are_refused(served) -> None:
    _settings, _store, server, client = served
    # clickhouse-connect already knows (system.settings says readonly) ...
    with pytest.raises(Exception, match=r"(?i)read-?only"):
        client.query("SELECT 1", settings={"max_threads": 7})
    # ... and a plain HTTP client is refused by the port and by the engine
    url = f"http://127.0.0.1:{server.port}/?max_threads=7"
    request = urllib.request.Request(
        url, data=b"SELECT 1", headers={"X-ClickHouse-Key": server.token}
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(request, timeout=10)
    assert exc.value.code == 403
    assert exc.value.headers["X-ClickHouse-Exception-Code"] == "164"
    with pytest.raises(Exception, match=r"(?i)readonly"):
        client.query("SELECT 1 SETTINGS readonly = 0")
    # nor can a query lift its own limits
    for setting in ("max_memory_usage = 0", "max_execution_time = 0", "max_threads = 64"):
        with pytest.raises(Exception, match=r"(?i)readonly"):
            client.query(f"SELECT 1 SETTINGS {setting}")


def test_queries_interleave_with_writes_of_the_owning_process(served) -> None:
    """The writer thread inserts while the port answers: each query sees a whole
    number of batches (the store lock serialises them), and nothing is lost."""
    _settings, store, _server, client = served
    reader = ClickHouseStore(client, "tailguard")
    batches, size = 20, 50
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for b in range(batches):
                write_requests(store, _records(1000 + b * size, size))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    seen = []
    while writer.is_alive():
        seen.append(_count(reader))
    writer.join()
    assert not errors
    seen.append(_count(reader))
    assert seen == sorted(seen)
    assert all((n - 10) % size == 0 for n in seen)
    assert seen[-1] == 10 + batches * size
    assert len(set(seen)) > 1  # some queries ran between writes


# --- limits: a query cannot starve the writer ------------------------------------------


@pytest.fixture
def served_limited(tmp_path: Path):
    yield from _serve(
        tmp_path,
        QueryLimits(max_execution_time_s=2, max_memory_bytes=256 << 20, max_result_bytes=1 << 20),
    )


def test_a_query_is_stopped_at_its_memory_limit(served_limited) -> None:
    """One block of 10^8 numbers (the engine does not check the time inside a block):
    the memory limit stops it, in the worker's process, before it is built."""
    _settings, store, _server, client = served_limited
    t0 = time.monotonic()
    with pytest.raises(Exception, match=r"code: 241\b") as exc:
        client.query("SELECT arrayMap(x -> x, range(100000000))")
    assert "MEMORY_LIMIT_EXCEEDED" in str(exc.value)
    assert time.monotonic() - t0 < 2
    assert _count(store) == 10


@pytest.fixture
def served_sized(tmp_path: Path):
    """The size limits of ``served_limited`` with a time limit out of play: at six xdist
    workers beside other work the many-block query below took 2.1 s, and the 2 s limit
    answered (159) before the result limit (396) it checks."""
    yield from _serve(
        tmp_path,
        QueryLimits(max_execution_time_s=60, max_memory_bytes=256 << 20, max_result_bytes=1 << 20),
    )


def test_an_answer_larger_than_its_limit_is_refused(served_sized) -> None:
    """Many blocks: the engine stops at the limit; one block (one row of 10^6 numbers,
    which the engine does not check): the port refuses it before copying it."""
    _settings, _store, _server, client = served_sized
    with pytest.raises(Exception, match=r"code: 396\b"):
        client.query("SELECT request_id FROM requests ARRAY JOIN range(100000) AS n")
    with pytest.raises(Exception, match=r"code: 396\b"):
        client.query("SELECT arrayMap(x -> x, range(1000000))")
    assert client.query("SELECT arrayMap(x -> x, range(1000))").result_rows[0][0][-1] == 999


@pytest.mark.parametrize("fmt", ["Arrow", "CSVWithNames", "TabSeparatedWithNamesAndTypes"])
def test_after_an_answer_too_large_the_next_answers_are_their_own(served_sized, fmt: str) -> None:
    """chDB hands what a failed query had written (a format's header) to the next query
    of its session, ahead of that query's answer: a CSV header read as a row, Arrow bytes
    read as a query. Every session answers its next queries with their own answers."""
    _settings, _store, server, client = served_sized
    for _ in range(2):
        with pytest.raises(Exception, match=r"code: 396\b"):
            client.raw_query(
                f"SELECT request_id, n FROM requests ARRAY JOIN range(100000) AS n FORMAT {fmt}"
            )
    for i in range(2 * len(server.pool.sessions) + 1):  # (every session, whichever answers)
        assert client.raw_query(f"SELECT {i} FORMAT TSVRaw") == f"{i}\n".encode()


def test_after_a_failed_query_the_stores_next_answer_is_its_own(tmp_path: Path) -> None:
    """The same in the worker's own store (the embedded engine in this process)."""
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        with pytest.raises(Exception, match="396"):
            store.query_arrow(
                "SELECT number, toString(number) FROM numbers(5000000) "
                "SETTINGS max_result_bytes = 1000000, result_overflow_mode = 'throw'"
            )
        assert store.query_rows("SELECT 41 + 1") == [(42,)]
        assert store.query_arrow("SELECT 7 AS x").column(0).to_pylist() == [7]
    finally:
        store.close()


# 10 copies of the 10 requests joined: 10^10 rows, in blocks (the engine checks the time
# between them)
CROSS_JOIN = "SELECT count() FROM " + ", ".join(f"requests AS t{i}" for i in range(10))


def test_a_query_is_stopped_at_its_time_limit(served_limited) -> None:
    _settings, _store, _server, client = served_limited
    t0 = time.monotonic()
    with pytest.raises(Exception, match=r"code: 159\b"):
        client.query(CROSS_JOIN)
    assert 1.9 < time.monotonic() - t0 < 3.0


def _wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + ceiling(timeout_s)
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_writes_go_on_while_a_query_runs(served_limited) -> None:
    """The port's queries do not take the store's lock: a write while one runs (1.5 s
    of sleep in the engine) takes its usual time, not the query's."""
    _settings, store, server, client = served_limited
    result: list[object] = []
    reader = threading.Thread(
        target=lambda: result.append(client.query("SELECT sleep(1.5)").result_rows)
    )
    reader.start()
    _wait_until(lambda: server.pool.in_engine() == 1, 5)
    t0 = time.monotonic()
    write_requests(store, _records(100, 50))
    write_s = time.monotonic() - t0
    still_running = server.pool.in_engine() == 1
    reader.join()
    assert result == [[(0,)]]
    assert still_running, "the write waited for the query"
    assert write_s < 1.0
    assert _count(store) == 60


def test_the_port_answers_at_its_limit_when_the_engine_does_not(served_limited) -> None:
    """A query the engine keeps computing past the limit is answered 159 by the port
    (limit + grace); it keeps its session and its client's turn until the engine returns
    (another client's queries run meanwhile), then the client's next query runs."""
    _settings, _store, server, _client = served_limited
    pool = server.pool
    release = threading.Event()
    calls: list[str] = []
    for session in pool.sessions:  # the port's first query, on either session, gets stuck
        real = session._execute

        def stuck(sql, fmt, params, real=real):
            calls.append(sql)
            if len(calls) == 1:
                release.wait(30)
            return real(sql, fmt, params)

        session._execute = stuck
    t0 = time.monotonic()
    with pytest.raises(QueryRefusedError) as exc:
        pool.execute("hog", "SELECT 1")
    waited = time.monotonic() - t0
    assert exc.value.code == 159
    assert 2.9 < waited < 4.0  # max_execution_time 2 s + 1 s of grace
    assert pool.overruns == 1
    assert pool.in_engine() == 1  # still in the "engine"
    assert pool.queue.running("hog") == 1  # its slot and turn kept
    assert pool.execute("other", "SELECT count() FROM requests FINAL").body == b"10\n"
    done: list[bytes] = []
    nxt = threading.Thread(target=lambda: done.append(pool.execute("hog", "SELECT 2").body))
    nxt.start()
    _wait_until(lambda: pool.queue.waiting() == 1, 5)  # waits for its own first query
    release.set()
    nxt.join()
    assert done == [b"2\n"]
    _wait_until(lambda: pool.queue.running() == 0, 5)


# A client's long queries back to back, a memory bomb between them (the hostile
# client); the time limit (10 s) only bounds the test: the assertions are orderings.
def test_an_interactive_query_is_answered_while_a_long_one_runs(tmp_path: Path) -> None:
    """A hostile client (curl-like: user ``default``) sends long queries and a memory
    bomb back to back, the owner's writer writes meanwhile: the tools' client
    (``open_reader``) and a Grafana-like client running a dashboard panel each get their
    answer while one of the hostile queries runs (sent before they asked, answered after
    they were); nothing written is lost. With one query at a time, as before issue 49,
    this fails."""
    gen = _serve(tmp_path, QueryLimits(max_execution_time_s=10, max_memory_bytes=256 << 20))
    settings, store, server, _client = next(gen)
    hostile_client = "default curl/8.5.0"
    try:
        hostile_sql = [CROSS_JOIN, "SELECT arrayMap(x -> x, range(100000000))"]
        lock = threading.Lock()
        inflight: set[int] = set()
        answers: list[str] = []
        stop = threading.Event()

        def hostile() -> None:
            i = 0
            while not stop.is_set():
                request = urllib.request.Request(
                    f"http://127.0.0.1:{server.port}/",
                    data=hostile_sql[i % 2].encode(),
                    headers={"X-ClickHouse-Key": server.token, "User-Agent": "curl/8.5.0"},
                )
                with lock:
                    inflight.add(i)
                try:
                    urllib.request.urlopen(request, timeout=120).read()
                    code = "ok"
                except urllib.error.HTTPError as exc:
                    code = exc.headers.get("X-ClickHouse-Exception-Code", "")
                with lock:
                    inflight.discard(i)
                    answers.append(code)
                i += 1

        written: list[int] = []

        def write() -> None:
            b = 0
            while not stop.is_set():
                write_requests(store, _records(1000 + b * 50, 50))
                b += 1
            written.append(b * 50)

        threads = [threading.Thread(target=hostile), threading.Thread(target=write)]
        for t in threads:
            t.start()
        asked = 0
        reader = grafana = None
        try:
            for ask in ("report", "panel", "report", "panel"):
                # its long query in the engine (not the bomb, which ends at once)
                _wait_until(
                    lambda: (
                        server.pool.queue.running(hostile_client) == 1 and len(answers) % 2 == 0
                    ),
                    60,
                )
                with lock:
                    before = set(inflight)
                if ask == "report":
                    reader = reader or open_reader(settings)  # the tools' way: the live port
                    assert _count(reader) >= 10
                else:
                    grafana = grafana or clickhouse_connect.get_client(
                        host="127.0.0.1", port=server.port, compress=False,
                        password=server.token, client_name="Grafana",
                    )  # fmt: skip
                    grafana.query(PANEL_SQL)
                with lock:
                    still = before & inflight
                assert still, f"{ask}: the interactive query waited for the long one to end"
                asked += 1
        finally:
            stop.set()
            for t in threads:
                t.join()
            if reader is not None:
                reader.close()
            if grafana is not None:
                grafana.close()
        assert asked == 4
        assert set(answers) <= {"159", "241"}, answers
        assert _count(store) == 10 + written[0]
    finally:
        gen.close()


def _panel_sql() -> str:
    """The SLO dashboard's first panel as Grafana's plugin sends it (the last hour)."""
    path = Path(__file__).parents[2] / "dashboards" / "json" / "tailguard-slo.json"
    model = json.loads(path.read_text())
    variables = {
        v["name"]: Variable(v["name"], v["current"]["value"]) for v in model["templating"]["list"]
    }
    now_ms = int(time.time() * 1000)
    return interpolate(
        model["panels"][0]["targets"][0]["rawSql"],
        QueryContext(now_ms - 3_600_000, now_ms, 60_000, variables),
    )


PANEL_SQL = _panel_sql()


def test_discovery_file_and_live_worker_lookup(served, tmp_path: Path) -> None:
    settings, _store, server, _client = served
    path = settings.store_dir / DISCOVERY_FILE
    info = json.loads(path.read_text())
    assert info == {
        "port": server.port,
        "pid": os.getpid(),
        "store": os.path.realpath(settings.store_dir),
        "token": server.token,
    }
    assert len(server.token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the token: only the owner reads it
    live = find_live_worker(settings.store_dir)
    assert live is not None
    assert (live.port, live.pid) == (server.port, os.getpid())
    # open_reader goes through the port (the directory is this process's anyway)
    reader = open_reader(settings)
    try:
        assert reader._client.__class__.__name__ == "HttpClient"
        assert _count(reader) == 10
    finally:
        reader.close()
    # the same file copied next to another directory does not answer for it
    other = tmp_path / "other"
    other.mkdir()
    (other / DISCOVERY_FILE).write_text(json.dumps(info))
    assert find_live_worker(other) is None
    # a dead pid is stale
    (other / DISCOVERY_FILE).write_text(json.dumps(dict(info, pid=2**22 + 12345)))
    assert find_live_worker(other) is None


def test_stop_removes_the_discovery_file(tmp_path: Path) -> None:
    settings = Settings(store_dir=tmp_path / "store")
    store = open_store(settings)
    migrate(store)
    server = QueryServer(settings.store_dir, store.lock).start()
    path = settings.store_dir / DISCOVERY_FILE
    assert path.exists()
    server.stop()
    assert not path.exists()
    assert find_live_worker(settings.store_dir) is None
    store.close()


def test_idle_port_costs_next_to_nothing(served) -> None:
    """CPU time of the serving thread while idle (it polls for shutdown twice a second)."""
    _settings, _store, server, _client = served
    tid = server._thread.native_id

    def cpu_s() -> float:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before, t0 = cpu_s(), time.monotonic()
    time.sleep(3.0)  # the measurement itself: idle for 3 s
    used = cpu_s() - before
    print(f"idle query port: {used * 1000:.0f} ms CPU in {time.monotonic() - t0:.1f} s")
    assert used < 0.05


# --- only the store's own tables, and only with the token ------------------------------

# Every table function in every statement kind, and the other ways out of the store.
ESCAPES = [
    "SELECT * FROM file('/etc/passwd', 'TSVWithNames')",
    "DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
    "DESCRIBE TABLE file('/etc/passwd', 'JSONEachRow')",
    "DESC url('http://127.0.0.1:{port}/x', 'TSVWithNames')",
    "EXPLAIN SELECT * FROM url('http://127.0.0.1:{port}/x', 'TSVWithNames')",
    "EXPLAIN PLAN SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "EXPLAIN SYNTAX SELECT * FROM s3('http://127.0.0.1:{port}/b/k', 'CSV')",
    "EXPLAIN ESTIMATE SELECT * FROM remote('127.0.0.1:{port}', system.one)",
    "WITH x AS (SELECT * FROM executable('id', 'TSV', 'a String')) SELECT * FROM x",
    "SELECT * FROM tailguard.requests WHERE request_id IN "
    "(SELECT * FROM file('/etc/hostname', 'LineAsString'))",
    "SELECT request_id FROM tailguard.requests UNION ALL "
    "SELECT * FROM cluster('default', system.one)",
    "SELECT * FROM tailguard.requests AS r JOIN jdbc('x', 'y', 'z') AS j ON 1",
    "SELECT * FROM (SELECT * FROM url('http://127.0.0.1:{port}/x', 'LineAsString'))",
    "SELECT * FROM python('x')",
    "SELECT * FROM filesystem('/etc')",
    "SELECT * FROM numbers(10)",
    "SELECT * FROM merge('system', '.*')",
    "SELECT * FROM dictionary('d')",
    "SELECT 1 IN url('http://127.0.0.1:{port}/x', 'LineAsString')",
    "SELECT file('/etc/passwd')",
    "SELECT FILE('/etc/passwd')",
    "SELECT joinGet('system.one', 'dummy', 0)",
    "SELECT * FROM system.tables",
    "SELECT * FROM system.processes",
    "SELECT 1 IN system.tables",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM `system`.`tables`",
    "DESCRIBE TABLE system.tables",
    "EXISTS TABLE system.tables",
    "SHOW CREATE TABLE system.tables",
    "SHOW TABLES FROM system",
    "SHOW COLUMNS FROM system.tables",
    "SHOW COLUMNS FROM tables FROM system",
    "SHOW DATABASES",
    "SHOW PROCESSLIST",
    "SHOW GRANTS",
    "SHOW SETTINGS LIKE '%'",
    "SHOW DICTIONARIES",
    "SELECT 1 INTO OUTFILE '/tmp/x'",
]
ESCAPES_LEAK = ("root:", "x:0:0", "secret-body")


@pytest.fixture
def http_bait():
    """A local HTTP server whose body must never come back (and that counts its hits)."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    hits: list[str] = []

    class Bait(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b"a\nsecret-body\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Bait)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1], hits
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("sql", ESCAPES)
def test_only_the_stores_own_tables_through_the_port(served_shared, http_bait, sql: str) -> None:
    _settings, store, _server, client = served_shared
    port, hits = http_bait
    with pytest.raises(Exception, match=r"code: (164|62)\b") as exc:
        client.query(sql.replace("{port}", str(port)))
    message = str(exc.value)
    for leak in ESCAPES_LEAK:
        assert leak not in message
    assert hits == []  # no request was made
    assert _count(store) == 10


@pytest.mark.parametrize("sql", ESCAPES)
def test_without_the_token_nothing_runs(served_shared, http_bait, sql: str) -> None:
    _settings, _store, server, _client = served_shared
    port, hits = http_bait
    for headers in ({}, {"X-ClickHouse-Key": "wrong"}, {"Authorization": "Basic Og=="}):
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/",
            data=sql.replace("{port}", str(port)).encode(),
            headers=headers,
        )
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(request, timeout=10)
        assert exc.value.code == 401
        assert exc.value.headers["X-ClickHouse-Exception-Code"] == "516"
        assert b"root:" not in exc.value.read()
    assert hits == []
    # a plain SELECT without the token is refused too; /ping answers (as ClickHouse's)
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/", data=b"SELECT 1")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(request, timeout=10)
    assert exc.value.code == 401
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/tailguard", timeout=10)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/ping", timeout=10) as resp:
        assert resp.read() == b"Ok.\n"
    with pytest.raises(Exception, match="516"):  # clickhouse-connect fails as it connects
        clickhouse_connect.get_client(host="127.0.0.1", port=server.port, password="wrong")


def test_query_parameters_do_not_smuggle_a_table_in(served_shared) -> None:
    """Server-side parameters are substituted before the check, as before the run."""
    _settings, _store, _server, client = served_shared
    with pytest.raises(Exception, match=r"code: 164\b"):
        client.query("SELECT * FROM {t:Identifier}", parameters={"t": "system.tables"})
    rows = client.query("SELECT count() FROM {t:Identifier}", parameters={"t": "requests"})
    assert rows.result_rows == [(10,)]
    with pytest.raises(Exception, match=r"code: 164\b"):
        client.query("SELECT hasColumnInTable('system', 'tables', 'name')")


def test_a_text_accepted_once_is_not_checked_again_its_parameters_are(served_shared) -> None:
    """Issue 49: the port keeps what its check accepted (``CheckCache``); the same text
    with other parameters is checked again (and refused here), a refusal is never kept."""
    _settings, _store, server, client = served_shared
    checked = server.pool.checked
    sql = "SELECT count() AS cached FROM {t:Identifier}"  # this test's own text
    before = checked.hits
    for _ in range(3):
        assert client.query(sql, parameters={"t": "requests"}).result_rows == [(10,)]
    assert checked.hits == before + 2
    for _ in range(2):
        with pytest.raises(Exception, match=r"code: 164\b"):
            client.query(sql, parameters={"t": "system.tables"})
        with pytest.raises(Exception, match=r"code: 164\b"):
            client.query("SELECT * FROM file('/etc/passwd')")
    assert checked.hits == before + 2


def test_a_client_whose_last_query_ran_long_runs_its_next_one_niced(served_shared) -> None:
    """Issue 49: a client whose last query ran ``long_query_s`` (1 s) or longer gets a
    session at ``long_query_nice`` (10) for its next one; other clients, and that one
    after a short query, run at the port's nice (0)."""
    _settings, _store, server, _client = served_shared
    assert (server.pool.limits.long_query_s, server.pool.limits.long_query_nice) == (1.0, 10)

    def ask(agent: str, sql: str) -> str:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/",
            data=sql.encode(),
            headers={"X-ClickHouse-Key": server.token, "User-Agent": agent},
        )
        with urllib.request.urlopen(request, timeout=ceiling(30)) as resp:
            return str(resp.read().decode().strip())

    nice = "SELECT getSetting('os_thread_priority')"
    steps = [
        ("slow", nice, "0"),
        ("slow", "SELECT sleep(1.2)", "0"),  # a long query, at nice 0 itself
        ("slow", nice, "10"),  # the next one niced (and short: clears it)
        ("other", nice, "0"),
        ("slow", nice, "0"),
    ]
    assert [ask(agent, sql) for agent, sql, _ in steps] == [want for _, _, want in steps]


def test_with_the_token_in_either_header(served_shared) -> None:
    _settings, _store, server, _client = served_shared
    basic = base64.b64encode(f"tailguard:{server.token}".encode()).decode()
    for headers in ({"X-ClickHouse-Key": server.token}, {"Authorization": f"Basic {basic}"}):
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/",
            data=b"SELECT count() FROM requests FINAL",
            headers=headers,
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.read() == b"10\n"


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("headers", ["none", "key"])
def test_a_token_in_the_url_is_refused_not_echoed_not_logged(
    served_shared, caplog: pytest.LogCaptureFixture, method: str, headers: str
) -> None:
    """``?password=`` puts the token in URLs and logs: refused (400) even when it is the
    right token and a header carries it too; neither the answer nor the log holds it."""
    _settings, _store, server, _client = served_shared
    caplog.set_level(logging.DEBUG, logger="tailguard.query_server")
    sent = {"X-ClickHouse-Key": server.token} if headers == "key" else {}
    for path in ("/", "/tailguard", "/ping"):
        query = "?query=SELECT%201" if method == "GET" and path == "/" else "?"
        url = f"http://127.0.0.1:{server.port}{path}{query}&password={server.token}"
        data = b"SELECT count() FROM requests FINAL" if method == "POST" else None
        request = urllib.request.Request(url, data=data, headers=sent, method=method)
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(request, timeout=10)
        assert exc.value.code == 400
        assert exc.value.headers["X-ClickHouse-Exception-Code"] == "36"
        body = exc.value.read()
        assert b"headers only" in body
        assert server.token.encode() not in body
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "query port:" in logged  # the request log ran, at DEBUG
    assert server.token not in logged
    assert "password" not in logged


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count() FROM requests FINAL",
        "SELECT count() FROM tailguard.requests FINAL",
        "SELECT count() FROM `tailguard`.`requests` FINAL",
        "WITH r AS (SELECT * FROM requests FINAL) SELECT count() FROM r",
        "SELECT count() FROM requests AS a JOIN tailguard.requests AS b USING request_id",
        "SELECT count() FROM (SELECT request_id FROM requests) WHERE request_id IN "
        "(SELECT request_id FROM tailguard.requests)",
        "SELECT count() FROM slo_1m",
        "SELECT format('{} {}', 'a', 'b')",
        "SELECT dummy FROM system.one",
        "DESCRIBE TABLE requests",
        "DESCRIBE (SELECT 1 AS x)",
        "EXPLAIN SELECT count() FROM requests",
        "EXISTS TABLE requests",
        "EXISTS TABLE tailguard.requests",
        "SHOW TABLES",
        "SHOW TABLES FROM tailguard LIKE 'req%'",
        "SHOW COLUMNS FROM requests",
        "SHOW CREATE TABLE requests",
    ],
)
def test_the_stores_own_tables_work_unqualified_and_qualified(served_shared, sql: str) -> None:
    _settings, _store, _server, client = served_shared
    rows = client.query(sql).result_rows
    assert rows
