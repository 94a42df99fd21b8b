"""ClickHouse adapter: connection, versioned migrations, batched record writes.

One API for both back-ends through clickhouse-connect: the embedded engine
(chDB, ``chdb://DIR``; one process per directory) and a ClickHouse server over
HTTP. Inserts name their columns and types explicitly so that no round trip
asks the server for the table's columns.
"""

from __future__ import annotations

import logging
import re
import string
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.record import RequestRecord
from pipeline.settings import Settings

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
_MIGRATION_RE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


class StoreError(Exception):
    """Root of store failures (connection, migration, write)."""


class Store(Protocol):
    """What the worker and reports need from ClickHouse."""

    database: str

    def command(self, sql: str) -> Any: ...

    def query_rows(
        self, sql: str, parameters: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]: ...

    def insert_columns(
        self,
        table: str,
        columns: Sequence[Sequence[Any]],
        names: Sequence[str],
        types: Sequence[str],
    ) -> None: ...

    def close(self) -> None: ...


class ClickHouseStore:
    """clickhouse-connect client (chDB or HTTP), serialised by a lock.

    chDB corrupts data when two threads insert on one session at once, so
    every call goes through one lock.
    """

    def __init__(self, client: Any, database: str) -> None:
        self._client = client
        self.database = database
        self._lock = threading.Lock()

    def command(self, sql: str) -> Any:
        with self._lock:
            return self._client.command(sql)

    def query_rows(
        self, sql: str, parameters: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._client.query(sql, parameters=parameters).result_rows)

    def insert_columns(
        self,
        table: str,
        columns: Sequence[Sequence[Any]],
        names: Sequence[str],
        types: Sequence[str],
    ) -> None:
        with self._lock:
            self._client.insert(
                table,
                list(columns),
                column_names=list(names),
                column_type_names=list(types),
                column_oriented=True,
                database=self.database,
            )

    def close(self) -> None:
        with self._lock:
            self._client.close()


def open_store(settings: Settings) -> ClickHouseStore:
    import clickhouse_connect  # adapter-only import

    if settings.clickhouse_url:
        client = clickhouse_connect.get_client(
            dsn=settings.clickhouse_url,
            username=settings.clickhouse_user,
            password=settings.clickhouse_password.get_secret_value(),
        )
    else:
        settings.store_dir.mkdir(parents=True, exist_ok=True)
        try:
            client = clickhouse_connect.get_client(dsn=f"chdb://{settings.store_dir.resolve()}")
        except Exception as exc:
            raise StoreError(
                f"cannot open embedded store {settings.store_dir}: {exc} "
                "(chDB allows one process per data directory: is a worker running on it?)"
            ) from exc
    return ClickHouseStore(client, settings.database)


# --- migrations ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    def statements(self, params: dict[str, str]) -> list[str]:
        text = string.Template(self.sql).substitute(params)
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
        return [s.strip() for s in text.split(";") if s.strip()]


def load_migrations(sql_dir: Path = SQL_DIR) -> list[Migration]:
    found = []
    for path in sorted(sql_dir.glob("*.sql")):
        m = _MIGRATION_RE.match(path.name)
        if not m:
            raise StoreError(f"migration file name must look like 0001_name.sql: {path}")
        found.append(Migration(int(m.group(1)), path.stem, path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise StoreError(f"duplicate migration versions in {sql_dir}")
    return found


def template_params(database: str, cluster: str | None) -> dict[str, str]:
    if cluster:
        return {
            "db": database,
            "on_cluster": f"ON CLUSTER '{cluster}'",
            "replicated": "Replicated",
            "replica_args": "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}', ",
        }
    return {"db": database, "on_cluster": "", "replicated": "", "replica_args": ""}


def migrate(store: Store, cluster: str | None = None, sql_dir: Path = SQL_DIR) -> list[str]:
    """Apply pending migrations in order; idempotent. Returns the names applied."""
    db = store.database
    on_cluster = f"ON CLUSTER '{cluster}'" if cluster else ""
    store.command(f"CREATE DATABASE IF NOT EXISTS {db} {on_cluster}")
    engine = (
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')"
        if cluster
        else "ReplacingMergeTree"
    )
    store.command(
        f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations {on_cluster} "
        "(version UInt32, name String, applied_at DateTime64(3) DEFAULT now64(3)) "
        f"ENGINE = {engine} ORDER BY version"
    )
    done = {int(r[0]) for r in store.query_rows(f"SELECT version FROM {db}.schema_migrations")}
    params = template_params(db, cluster)
    applied = []
    for mig in load_migrations(sql_dir):
        if mig.version in done:
            continue
        for stmt in mig.statements(params):
            store.command(stmt)
        store.insert_columns(
            "schema_migrations",
            [[mig.version], [mig.name]],
            ["version", "name"],
            ["UInt32", "String"],
        )
        applied.append(mig.name)
        log.info("applied migration %s", mig.name)
    return applied


# --- request records ---------------------------------------------------------

REQUEST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("request_id", "String"),
    ("revision", "UInt8"),
    ("source", "LowCardinality(String)"),
    ("ts_unix_ns", "Int64"),
    ("model", "LowCardinality(String)"),
    ("priority", "Nullable(UInt8)"),
    ("tenant", "LowCardinality(String)"),
    ("ctx_bucket", "LowCardinality(String)"),
    ("outcome", "LowCardinality(String)"),
    ("http_status", "Nullable(UInt16)"),
    ("finish_reason", "LowCardinality(Nullable(String))"),
    ("stream", "Nullable(Bool)"),
    ("gateway_host", "LowCardinality(String)"),
    ("engine_host", "LowCardinality(String)"),
    ("gateway_received_unix_ns", "Nullable(Int64)"),
    ("engine_arrival_unix_ns", "Nullable(Int64)"),
    ("prompt_tokens", "Nullable(UInt32)"),
    ("output_tokens", "Nullable(UInt32)"),
    ("cached_tokens", "Nullable(UInt32)"),
    ("preemptions", "Nullable(UInt16)"),
    ("gateway_total_ms", "Nullable(Float64)"),
    ("gateway_ttfb_ms", "Nullable(Float64)"),
    ("engine_e2e_ms", "Nullable(Float64)"),
    ("queue_ms", "Nullable(Float64)"),
    ("prefill_ms", "Nullable(Float64)"),
    ("decode_ms", "Nullable(Float64)"),
    ("inference_ms", "Nullable(Float64)"),
    ("ttft_engine_ms", "Nullable(Float64)"),
    ("tpot_ms", "Nullable(Float64)"),
    ("gateway_overhead_ms", "Nullable(Float64)"),
)
_EMPTY_IF_NONE = frozenset({"tenant", "gateway_host", "engine_host"})


def request_columns(records: Iterable[RequestRecord]) -> list[list[Any]]:
    cols: list[list[Any]] = [[] for _ in REQUEST_COLUMNS]
    names = [n for n, _ in REQUEST_COLUMNS]
    for rec in records:
        for i, name in enumerate(names):
            v = getattr(rec, name)
            if v is None and name in _EMPTY_IF_NONE:
                v = ""
            cols[i].append(v)
    return cols


def write_requests(store: Store, records: Sequence[RequestRecord]) -> None:
    if not records:
        return
    store.insert_columns(
        "requests",
        request_columns(records),
        [n for n, _ in REQUEST_COLUMNS],
        [t for _, t in REQUEST_COLUMNS],
    )


def write_with_retry(
    store: Store,
    records: Sequence[RequestRecord],
    *,
    attempts: int | None = None,
    base_delay_s: float = 0.2,
    max_delay_s: float = 10.0,
    sleep: Any = time.sleep,
) -> int:
    """Write, retrying with exponential backoff (forever when ``attempts`` is None).

    Returns the number of retries. Re-writing a batch is safe: rows are keyed by
    request_id and revision.
    """
    retries = 0
    delay = base_delay_s
    while True:
        try:
            write_requests(store, records)
        except Exception as exc:
            retries += 1
            if attempts is not None and retries >= attempts:
                raise StoreError(
                    f"write of {len(records)} records failed {retries} times: {exc}"
                ) from exc
            log.warning("ClickHouse write failed (%s); retry %d in %.1fs", exc, retries, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay_s)
        else:
            return retries
