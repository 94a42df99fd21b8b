"""A statement's read through the worker's query port (issue 53): rows larger than the
port's answer limit come a day at a time, the same rows as from the store itself. A
module of its own: chDB hosts one data directory per process, and test_query_server's
module-wide store would hold it."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clickhouse_connect
import msgspec
import pytest

from pipeline.adapters.queries import statement_rows
from pipeline.adapters.query_server import QueryLimits, QueryServer
from pipeline.adapters.store import ClickHouseStore, migrate, open_store, write_requests
from pipeline.app.statement import build_statement
from pipeline.settings import Settings
from tests.integration.test_query_server import _records
from tests.integration.test_statement_engine import example_contract

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def _through_the_port(
    store: Any, store_dir: Path, limits: QueryLimits
) -> Iterator[ClickHouseStore]:
    """The store as a client of the worker's query port sees it (the server and the
    client stopped on leaving)."""
    server = QueryServer(store_dir, store.lock, limits=limits).start()
    client = clickhouse_connect.get_client(
        host="127.0.0.1", port=server.port, compress=False, password=server.token
    )
    try:
        yield ClickHouseStore(client, store.database)
    finally:
        client.close()
        server.stop()


def test_a_statements_rows_come_through_the_port_a_day_at_a_time(tmp_path: Path) -> None:
    """A tenant's rows larger than the port's answer limit (1 MiB here) are read a day of
    ends at a time: the same rows, digest and all, as from the store itself."""
    day_ns = 86_400 * 10**9
    base = _records(0, 1)[0]
    t0 = 1_796_000_000 * 10**9
    records = [
        msgspec.structs.replace(
            base, request_id=f"t-{i:06d}", tenant="t1",
            end_unix_ns=t0 + (i % 4) * day_ns + i * 10**6,
            ts_unix_ns=t0 + (i % 4) * day_ns + i * 10**6 - 10**8,
        )
        for i in range(16_000)
    ]  # fmt: skip
    settings = Settings(store_dir=tmp_path / "store")
    store = open_store(settings)
    migrate(store)
    write_requests(store, records)
    limits = QueryLimits(
        max_execution_time_s=60, max_memory_bytes=512 << 20, max_result_bytes=1 << 20
    )
    try:
        with _through_the_port(store, settings.store_dir, limits) as port:
            whole = statement_rows._Read(port, "t1", t0, t0 + 4 * day_ns)
            with pytest.raises(Exception, match="Code: 396"):  # one answer: too large
                port.query_arrow(
                    f"SELECT {', '.join(statement_rows.STATEMENT_COLUMNS)} FROM requests "
                    "WHERE tenant = 't1'"
                )
            got = statement_rows.read_rows(port, "t1", t0, t0 + 4 * day_ns)
            want = statement_rows.read_rows(store, "t1", t0, t0 + 4 * day_ns)
            assert len(got) == len(want) == 16_000
            assert got.digest() == want.digest()
            assert whole.matching(["request_id", "attempt"]).num_rows == 16_000
    finally:
        store.close()


def test_the_engines_statement_through_the_port_is_the_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Statement version 4 (counted in the engine) through the query port: the same
    statement as from the store itself; its reads' parameters (a month store's groups)
    can be too long for a URL, and come as form fields."""
    day_ns = 86_400 * 10**9
    base = _records(0, 1)[0]
    t0 = int(dt.datetime(2026, 11, 10, tzinfo=dt.UTC).timestamp()) * 10**9
    records = [
        msgspec.structs.replace(
            base, request_id=f"t-{i:06d}", tenant="t1",
            end_unix_ns=t0 + (i % 4) * day_ns + i * 10**6,
            ts_unix_ns=t0 + (i % 4) * day_ns + i * 10**6 - 10**8,
            gateway_total_ms=float(i % 900), cold_start_unix_ns=t0 if i % 97 == 0 else None,
        )
        for i in range(4_000)
    ]  # fmt: skip
    settings = Settings(store_dir=tmp_path / "store")
    store = open_store(settings)
    migrate(store)
    write_requests(store, [*records, records[5]])  # (a key written twice)
    loaded = example_contract(tmp_path, ["t1"])
    limits = QueryLimits(max_execution_time_s=60, max_memory_bytes=512 << 20)
    # the other versions grouped in passes sized to the port's memory limit (as if a
    # row cost 1/1000 of it: 4 passes over the 4,000 rows)
    monkeypatch.setattr(statement_rows, "SHARED_BYTES_PER_ROW", (512 << 20) // 1_000)
    passes: list[str] = []
    shared_sql = statement_rows._Read.shared_sql
    monkeypatch.setattr(
        statement_rows._Read,
        "shared_sql",
        lambda self, n, at: passes.append(f"{at}/{n}") or shared_sql(self, n, at),
    )
    try:
        with _through_the_port(store, settings.store_dir, limits) as port:
            # parameters too long for a URL come as form fields (clickhouse-connect's)
            ids = list(range(20_000))
            assert port.query_rows("SELECT length({ids:Array(UInt64)})", {"ids": ids}) == [
                (20_000,)
            ]
            got = build_statement(port, loaded, "t1", "2026-11").to_json()
            want = build_statement(store, loaded, "t1", "2026-11").to_json()
            assert got["statement_version"] == 4
            assert got == want
            assert got["requests"] == 4_000
            assert "3/4" in passes
            assert "0/1" in passes  # the store itself sets no limit
    finally:
        store.close()
