"""ClickHouse adapter: connection, versioned migrations, batched record writes.

One API for both back-ends through clickhouse-connect: the embedded engine
(chDB, ``chdb://DIR``; one process per directory) and a ClickHouse server over
HTTP. Inserts name their columns and types explicitly so that no round trip
asks the server for the table's columns.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import re
import signal
import string
import tempfile
import threading
import time
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, NamedTuple, Protocol, TypeVar

import msgspec
from msgspec import Raw

from pipeline.adapters.sketch_sql import SKETCH_COLUMNS
from pipeline.contract.wire import AnyEvent, EventBytes, event_slices
from pipeline.core.processor import KeptMessage
from pipeline.core.record import CONFLICTED_VERSION, RequestRecord, revision_of_version
from pipeline.core.sketch import SketchColumns
from pipeline.core.windows import ClosedWindow, WindowKey
from pipeline.settings import Settings
from pipeline.shipped import SQL_DIR

log = logging.getLogger(__name__)

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
        settings: dict[str, Any] | None = None,
    ) -> None: ...

    def close(self) -> None: ...


class ClickHouseStore:
    """clickhouse-connect client (chDB or HTTP), serialised by a lock.

    chDB corrupts data when two threads insert on one session at once, so
    every call goes through one lock.
    """

    def __init__(self, client: Any, database: str, *, embedded: bool = False) -> None:
        self._client = client
        self.database = database
        self._lock = threading.Lock()
        # chDB in this process: it reads files of this host (see insert_from_file)
        self.embedded = embedded

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
        settings: dict[str, Any] | None = None,
    ) -> None:
        if self.embedded:  # the engine builds the dictionaries (C++, off the GIL)
            types = [_PLAIN_TYPES.get(t) or _plain_type(t) for t in types]
        with self._lock:
            self._before_insert(table)
            context = self._client.create_insert_context(
                table,
                column_names=list(names),
                column_type_names=list(types),
                column_oriented=True,
                database=self.database,
                settings=settings,
                data=list(columns),
            )
            try:
                self._client.insert(context=context)
            finally:
                _release(context)

    def _before_insert(self, table: str) -> None:
        """Called under the lock before each insert (fault injection hooks in here)."""

    def insert_from_file(
        self,
        table: str,
        names: Sequence[str],
        select: str,
        data: bytes | Sequence[bytes],
        *,
        fmt: str,
        structure: str,
        settings: dict[str, int] | None = None,
        array_join: str = "",
    ) -> None:
        """``INSERT INTO table (names) SELECT select FROM file(<data>, fmt, structure)``:
        the engine parses and converts ``data`` on its own threads, without the GIL (the
        embedded engine only: the file is written on this host). ``settings``: more
        input-format settings of this insert; ``data``: bytes, or pieces of them;
        ``array_join``: an ``ARRAY JOIN`` clause after the file (one row of the file,
        several rows of the table)."""
        if not self.embedded:
            raise StoreError("insert_from_file needs the embedded engine")
        fd, path = tempfile.mkstemp(prefix="tailguard-insert-", suffix=f".{fmt.lower()}")
        try:
            try:
                write_all(fd, [data] if isinstance(data, bytes) else data)
            finally:
                os.close(fd)
            sql = (
                f"INSERT INTO {self.database}.{table} ({', '.join(names)}) SELECT {select} "
                f"FROM file({_quote(path)}, {fmt}, {_quote(structure)}) {array_join} "
                # floats as msgspec wrote them (shortest round-trip), read back exactly
                "SETTINGS precise_float_parsing = 1, "
                # one parsing thread: parallel parsing first scans the whole text for row
                # ends, a second pass over it (lifecycle_events, the raw events' payloads:
                # 3.8 against 5.0 µs of engine CPU per event; requests: the same CPU)
                "input_format_parallel_parsing = 0"
                + "".join(f", {k} = {int(v)}" for k, v in (settings or {}).items())
            )
            with self._lock:
                self._before_insert(table)
                self._client.command(sql)
        finally:
            os.unlink(path)

    @property
    def lock(self) -> threading.Lock:
        """Held for every call; another user of this process's chDB engine takes it too."""
        return self._lock

    def close(self) -> None:
        with self._lock:
            self._client.close()


# Pieces per writev(2) call: the system's IOV_MAX (1024 on Linux).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def write_all(fd: int, pieces: Sequence[bytes]) -> None:
    """Write ``pieces`` to ``fd``, one after the other, in as few system calls as the
    kernel allows (``writev``, up to :data:`_IOV_MAX` pieces a call).

    Each system call releases the GIL and takes it back after: a thread that takes it
    back while the event loop computes waits for the loop's switch interval (5 ms). A
    buffered file's ``writelines`` made one call per 8 KiB, thousands a flush: measured
    (``bench.core_speed`` workload, a thread spinning in Python beside the writer) the raw
    events' write took 70-100 µs of wall time an event against 3.4-5.4 alone; the worker
    catching up spent ~14 s of a 25 s run writing raw events for ~8 s of CPU."""
    for i in range(0, len(pieces), _IOV_MAX):
        chunk = pieces[i : i + _IOV_MAX]
        done = os.writev(fd, chunk)
        total = sum(map(len, chunk))
        if done < total:  # a short write (a regular file: very large writes only)
            rest = memoryview(b"".join(chunk))[done:]
            while rest:
                rest = rest[os.write(fd, rest) :]


def _release(context: Any) -> None:
    """Drop what a used insert context holds. clickhouse-connect's ``InsertContext``
    refers to itself (a bound method in an attribute) and, after the insert, still to
    the columns: without this, every insert's rows would wait for the cycle collector's
    oldest generation, which ``tune_gc`` makes rare (the worker's RSS grew by ~28 MiB a
    minute at 10,000 events/s: ``bench/memory_live.py``)."""
    vars(context).clear()


_LOW_CARDINALITY = re.compile(r"LowCardinality\(((?:[^()]|\([^()]*\))*)\)")
_PLAIN_TYPES: dict[str, str] = {}


def _plain_type(ch_type: str) -> str:
    """``ch_type`` without its ``LowCardinality`` wrappers: what the embedded engine is
    sent (it converts the column into the table's type itself), so that clickhouse-connect
    builds no dictionary in Python, the writer's costliest step for such columns."""
    plain = _PLAIN_TYPES[ch_type] = _LOW_CARDINALITY.sub(r"\1", ch_type)
    return plain


def _quote(text: str) -> str:
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


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
    embedded = not settings.clickhouse_url
    if settings.fault_store_partial_file is not None:
        return PartialWriteInjectingStore(
            client, settings.database, settings.fault_store_partial_file, embedded=embedded
        )
    if settings.fault_store_outage_file is not None:
        return OutageInjectingStore(
            client, settings.database, settings.fault_store_outage_file, embedded=embedded
        )
    return ClickHouseStore(client, settings.database, embedded=embedded)


class OutageInjectingStore(ClickHouseStore):
    """Fault injection, for tests only (``TAILGUARD_FAULT_STORE_OUTAGE_FILE``).

    While the flag file exists, ClickHouse itself rejects every insert: before an
    insert into a table, a ``CHECK 0`` constraint is added to it (the engine then
    fails the insert with ``VIOLATED_CONSTRAINT``, through the real driver, with no
    row, no materialized-view row and no deduplication token recorded). Once the
    file is gone, the next insert drops the constraints again. Queries are not
    affected. A constraint left behind by a killed process is dropped at the first
    insert into its table after the file is gone.
    """

    CONSTRAINT = "tailguard_injected_outage"

    def __init__(self, client: Any, database: str, flag: Path, *, embedded: bool = False) -> None:
        super().__init__(client, database, embedded=embedded)
        self._flag = flag
        self._blocked: set[str] = set()
        self._cleared: set[str] = set()  # tables known to carry no injected constraint

    def _before_insert(self, table: str) -> None:
        """Add or drop the injected constraint to match the flag file (under the lock)."""
        name = f"{self.database}.{table}"
        if self._flag.exists():
            if table not in self._blocked:
                self._client.command(f"ALTER TABLE {name} ADD CONSTRAINT {self.CONSTRAINT} CHECK 0")
                self._blocked.add(table)
                self._cleared.discard(table)
                log.warning("injected outage: inserts into %s now fail", name)
            return
        for t in sorted(self._blocked | ({table} - self._cleared)):
            self._client.command(
                f"ALTER TABLE {self.database}.{t} DROP CONSTRAINT IF EXISTS {self.CONSTRAINT}"
            )
            self._cleared.add(t)
            if t in self._blocked:
                log.warning("injected outage over: inserts into %s.%s work again", self.database, t)
        self._blocked.clear()


class PartialWriteInjectingStore(ClickHouseStore):
    """Fault injection, for tests only (``TAILGUARD_FAULT_STORE_PARTIAL_FILE``): a write
    that fails after the base table took its rows.

    While the flag file exists, the tables it names (one a line; none named:
    ``latency_1h``), targets of the materialized views, carry a ``CHECK 0`` constraint
    (:attr:`OutageInjectingStore.CONSTRAINT`): an insert into ``window_sketches`` then lands
    in the base table and in the views the engine pushed to before, and fails with
    ``VIOLATED_CONSTRAINT`` in the blocked one, through the real driver (the constraints
    follow the flag file at each insert into ``window_sketches`` and each ``INSERT``
    statement). A line ``kill``:
    right after such a failure the process SIGKILLs itself, before any retry (a worker
    killed between the base table and a view). Once the file is gone, the next insert
    drops the constraints (also those a killed process left behind).
    """

    CONSTRAINT = "tailguard_injected_outage"  # an outage, not a data error (is_data_error)
    ROLLUPS = ("slo_windows", "latency_1m", "latency_1h", "slo_1m", "slo_1h")

    def __init__(self, client: Any, database: str, flag: Path, *, embedded: bool = False) -> None:
        super().__init__(client, database, embedded=embedded)
        self._flag = flag
        self._blocked: set[str] = set()
        self._cleared = False  # constraints left by an earlier process dropped
        self._kill = False

    def _wanted(self) -> tuple[set[str], bool]:
        try:
            lines = {x.strip() for x in self._flag.read_text().splitlines() if x.strip()}
        except FileNotFoundError:
            return set(), False
        tables = lines - {"kill"}
        unknown = tables - set(self.ROLLUPS)
        if unknown:
            raise StoreError(f"{self._flag}: not a rollup: {sorted(unknown)}")
        return tables or {"latency_1h"}, "kill" in lines

    def _before_insert(self, table: str) -> None:
        """Add or drop the injected constraints to match the flag file (under the lock),
        before an insert into the views' base table (other inserts: untouched; during the
        migrations the rollups may not exist yet)."""
        if table == "window_sketches":
            self._follow_flag()

    def command(self, sql: str) -> Any:
        """A statement; an ``INSERT`` (the rollups' repair) meets the injected constraints
        as the flag file has them."""
        if not sql.lstrip().upper().startswith("INSERT"):
            return super().command(sql)
        with self._lock:
            self._follow_flag()
            return self._client.command(sql)

    def _follow_flag(self) -> None:
        wanted, self._kill = self._wanted()
        stale = set(self.ROLLUPS) if not self._cleared else self._blocked
        for t in sorted(stale - wanted):
            self._client.command(
                f"ALTER TABLE {self.database}.{t} DROP CONSTRAINT IF EXISTS {self.CONSTRAINT}"
            )
            if t in self._blocked:
                log.warning("injected partial writes over: %s.%s takes inserts", self.database, t)
        self._cleared = True
        self._blocked &= wanted
        for t in sorted(wanted - self._blocked):
            self._client.command(
                f"ALTER TABLE {self.database}.{t} ADD CONSTRAINT {self.CONSTRAINT} CHECK 0"
            )
            self._blocked.add(t)
            log.warning("injected partial writes: inserts into %s.%s now fail", self.database, t)

    def insert_columns(
        self,
        table: str,
        columns: Sequence[Sequence[Any]],
        names: Sequence[str],
        types: Sequence[str],
        settings: dict[str, Any] | None = None,
    ) -> None:
        try:
            super().insert_columns(table, columns, names, types, settings)
        except Exception as exc:
            if self._kill and self.CONSTRAINT in str(exc):
                log.error("injected partial write into %s: killing this process", table)  # noqa: TRY400
                logging.shutdown()
                os.kill(os.getpid(), signal.SIGKILL)
            raise


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


def template_params(database: str, cluster: str | None, raw_ttl_days: int = 7) -> dict[str, str]:
    """Values for the ``${...}`` placeholders of ``sql/*.sql``."""
    common = {"db": database, "raw_ttl_days": str(int(raw_ttl_days))}
    if cluster:
        path = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"
        return common | {
            "on_cluster": f"ON CLUSTER '{cluster}'",
            "replicated": "Replicated",
            "replica_args": f"{path}, ",
            "replica_args_only": path,
            "dedup_window_setting": "replicated_deduplication_window = 10000",
        }
    return common | {
        "on_cluster": "",
        "replicated": "",
        "replica_args": "",
        "replica_args_only": "",
        "dedup_window_setting": "non_replicated_deduplication_window = 10000",
    }


def migrate(
    store: Store, cluster: str | None = None, sql_dir: Path = SQL_DIR, raw_ttl_days: int = 7
) -> list[str]:
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
    params = template_params(db, cluster, raw_ttl_days)
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


# --- inserts -----------------------------------------------------------------

_DEDUP_SETTINGS = {"deduplicate_blocks_in_dependent_materialized_views": 1}


Columns = tuple[tuple[str, str], ...]  # a table's (name, ClickHouse type) pairs, in order


def _insert_columns(
    store: Store, table: str, spec: Columns, columns: Sequence[Sequence[Any]], token: str = ""
) -> None:
    """One column-oriented insert of ``columns`` (in ``spec`` order); ``token`` makes a
    retry of the same insert a no-op (also in the materialized views it feeds)."""
    settings = dict(_DEDUP_SETTINGS, insert_deduplication_token=token) if token else None
    store.insert_columns(table, columns, [n for n, _ in spec], [t for _, t in spec], settings)


def _insert(
    store: Store, table: str, spec: Columns, rows: Sequence[Sequence[Any]], token: str = ""
) -> None:
    """Insert tuple rows in ``spec`` order (the NamedTuple row formats below)."""
    if rows:
        _insert_columns(store, table, spec, [list(c) for c in zip(*rows, strict=True)], token)


def _attr_columns(rows: Sequence[Any], names: Iterable[str]) -> list[list[Any]]:
    """The columns ``names`` of ``rows``, read by attribute name (one C-level pass each)."""
    return [list(map(operator.attrgetter(n), rows)) for n in names]


# --- request records ---------------------------------------------------------

# The requests table's columns are the record's fields, in its order (one list: a field
# added to RequestRecord is a column; tests/integration/test_request_columns.py checks
# the migrated table against this). A field's ClickHouse type follows its annotation
# (str String, int Int64, float Float64, bool Bool, X | None Nullable(X), tuple[str, ...]
# Array(String), a Literal of strings LowCardinality(String)); these narrow it:
_NARROWER: Final[dict[str, str]] = {
    "attempt": "UInt16",
    "revision": "UInt8",
    "model": "LowCardinality(String)",
    "priority": "Nullable(UInt8)",
    "tenant": "LowCardinality(String)",
    "ctx_bucket": "LowCardinality(String)",
    "outcome": "LowCardinality(String)",
    "http_status": "Nullable(UInt16)",
    "finish_reason": "LowCardinality(Nullable(String))",
    "gateway_host": "LowCardinality(String)",
    "engine_host": "LowCardinality(String)",
    "prompt_tokens": "Nullable(UInt32)",
    "output_tokens": "Nullable(UInt32)",
    "cached_tokens": "Nullable(UInt32)",
    "preemptions": "Nullable(UInt16)",
    "flags": "Array(LowCardinality(String))",
    "conflicts": "UInt16",
}
_PLAIN: Final[dict[Any, str]] = {str: "String", int: "Int64", float: "Float64", bool: "Bool"}


def clickhouse_type(annotation: Any) -> str:
    """The ClickHouse type of a record field's annotation (see above)."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return f"Nullable({clickhouse_type(inner)})"
    if origin is typing.Literal and all(isinstance(a, str) for a in args):
        return "LowCardinality(String)"
    if origin is tuple and args[-1:] == (Ellipsis,):
        return f"Array({clickhouse_type(args[0])})"
    if annotation in _PLAIN:
        return _PLAIN[annotation]
    raise TypeError(f"no ClickHouse type for a record field of type {annotation!r}")


def record_columns(record_type: type[Any]) -> tuple[tuple[str, str], ...]:
    """``(name, ClickHouse type)`` of each field of ``record_type`` (a msgspec Struct)."""
    hints = typing.get_type_hints(record_type)
    return tuple(
        (name, _NARROWER.get(name) or clickhouse_type(hints[name]))
        for name in record_type.__struct_fields__
    )


REQUEST_COLUMNS: Final[tuple[tuple[str, str], ...]] = record_columns(RequestRecord)
_EMPTY_IF_NONE = frozenset({"tenant", "gateway_host", "engine_host"})


_REQUEST_NAMES: tuple[str, ...] = tuple(n for n, _ in REQUEST_COLUMNS)
_REQUEST_GETTERS = tuple(operator.attrgetter(n) for n in _REQUEST_NAMES)


def request_columns(records: Iterable[RequestRecord]) -> list[list[Any]]:
    """The ``requests`` columns of ``records``: one C-level pass per column (~1.5x
    cheaper than a Python loop over fields)."""
    recs = records if isinstance(records, list) else list(records)
    cols = [list(map(get, recs)) for get in _REQUEST_GETTERS]
    for i, name in enumerate(_REQUEST_NAMES):
        if name in _EMPTY_IF_NONE:
            cols[i] = ["" if v is None else v for v in cols[i]]
        elif name == "flags":
            cols[i] = [list(v) for v in cols[i]]
        elif name == "revision":
            # with superseded: see pipeline.core.record.store_version
            cols[i] = [rec.version for rec in recs]
    return cols


def record_from_row(row: Sequence[Any]) -> RequestRecord:
    """A ``requests`` row (columns in :data:`REQUEST_COLUMNS` order) as its record."""
    d = dict(zip((n for n, _ in REQUEST_COLUMNS), row, strict=True))
    for k in _EMPTY_IF_NONE:
        d[k] = d[k] or None
    d["flags"] = tuple(d["flags"])
    d["revision"] = revision_of_version(d["revision"])  # the store version: see store_version
    return RequestRecord(**d)


# Into the embedded engine, records go as JSON objects (msgspec's C encoder, fields by
# name) that the engine parses and converts itself, on its own threads without the GIL:
# measured on the bench.core_speed workload, the writer thread's GIL-held time for requests
# 0.74-0.76 µs/event against 2.5-2.9 column-wise (request_columns + clickhouse-connect's
# Native encoding), for 2.45-2.5 µs/event of engine CPU against 0.9-1.0 (another core).
# What the column-wise path does in Python, the SELECT does by name: the store version
# (pipeline.core.record.store_version; a test keeps the two equal) and "" for a missing
# tenant or host.
REQUEST_VERSION_SQL = f"revision * 2 + superseded + if(conflicts > 0, {CONFLICTED_VERSION}, 0)"
_REQUEST_STRUCTURE = ", ".join(
    f"{n} {'Nullable(String)' if n in _EMPTY_IF_NONE else t}" for n, t in REQUEST_COLUMNS
)
_REQUEST_SELECT = ", ".join(
    REQUEST_VERSION_SQL if n == "revision" else f"ifNull({n}, '')" if n in _EMPTY_IF_NONE else n
    for n in _REQUEST_NAMES
)
_JSON = msgspec.json.Encoder()
# The engine's in-block replacing merge at insert (optimize_on_insert, on by default)
# collapses the rows of one sorting key within an insert (a row-by-row copy of the whole
# block). A batch with no two rows of one key has nothing to collapse, and without that
# merge the same part is written: the file inserts below skip it then, and only then (a
# batch with a repeated key is merged as before). Measured on the bench/core_speed
# workload (one insert, one parsing thread, 11 interleaved runs): lifecycle_events 3.06
# -> 2.04 µs of engine CPU per event, requests 2.40 -> 1.90.
_NO_INSERT_MERGE = {"optimize_on_insert": 0}
_REQUEST_ID = operator.attrgetter("request_id")


def write_requests(store: Store, records: Sequence[RequestRecord]) -> None:
    if not records:
        return
    # JSON by field name needs records msgspec encodes by name (the core's RequestRecord);
    # anything else that has the attributes goes column-wise
    if (
        isinstance(store, ClickHouseStore)
        and store.embedded
        and all(type(r) is RequestRecord for r in records)
    ):
        # one record per request id: none repeats the key (request_id, attempt)
        unique = len(set(map(_REQUEST_ID, records))) == len(records)
        store.insert_from_file(
            "requests", _REQUEST_NAMES, _REQUEST_SELECT, _JSON.encode(records),
            fmt="JSONEachRow", structure=_REQUEST_STRUCTURE,
            settings=_NO_INSERT_MERGE if unique else None,
        )  # fmt: skip
    else:
        _insert_columns(store, "requests", REQUEST_COLUMNS, request_columns(records))


def with_retry(
    fn: Callable[[], None],
    what: str,
    *,
    attempts: int | None = None,
    base_delay_s: float = 0.2,
    max_delay_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    on_failure: Callable[[Exception], None] | None = None,
    fatal: Callable[[Exception], bool] | None = None,
) -> int:
    """Run ``fn``, retrying with exponential backoff (forever when ``attempts`` is None).

    Returns the number of retries. Every write tailguard retries is idempotent
    (rows keyed by request, windows deduplicated by token). ``on_failure`` hears
    of every failed attempt before its backoff (the worker pauses its input). An
    exception ``fatal`` says retrying cannot cure (a rejected value) is raised at once.
    ``sleep`` may raise to give up (the worker's stops on SIGTERM).
    """
    retries = 0
    delay = base_delay_s
    while True:
        try:
            fn()
        except Exception as exc:
            if fatal is not None and fatal(exc):
                raise
            retries += 1
            if on_failure is not None:
                on_failure(exc)
            if attempts is not None and retries >= attempts:
                raise StoreError(f"{what} failed {retries} times: {exc}") from exc
            log.warning("ClickHouse %s failed (%s); retry %d in %.1fs", what, exc, retries, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay_s)
        else:
            return retries


def write_with_retry(
    store: Store,
    records: Sequence[RequestRecord],
    *,
    attempts: int | None = None,
    base_delay_s: float = 0.2,
    max_delay_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    on_failure: Callable[[Exception], None] | None = None,
) -> int:
    """Write request records with :func:`with_retry`."""
    return with_retry(
        lambda: write_requests(store, records),
        f"write of {len(records)} records",
        attempts=attempts,
        base_delay_s=base_delay_s,
        max_delay_s=max_delay_s,
        sleep=sleep,
        on_failure=on_failure,
    )


# --- rows the store rejects ---------------------------------------------------

# ClickHouse error codes that name the data, not the server: the same rows fail again
# whatever the retries (CANNOT_PARSE_TEXT, CANNOT_CONVERT_TYPE, TYPE_MISMATCH,
# ARGUMENT_OUT_OF_BOUND, VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE, DECIMAL_OVERFLOW,
# CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN, TOO_LARGE_STRING_SIZE, VIOLATED_CONSTRAINT, ...).
# The one constraint that is no data error is the fault injection's own
# (:class:`OutageInjectingStore`): it stands for an outage.
_DATA_ERROR_CODES = frozenset({6, 27, 32, 38, 41, 53, 69, 70, 72, 131, 321, 349, 407, 469})
_CODE_RE = re.compile(r"Code: (\d+)\.")


def is_data_error(exc: BaseException) -> bool:
    """True when ``exc`` rejects the rows themselves (retrying cannot help): the driver
    could not encode a value into its column type, or ClickHouse refused a value."""
    try:
        from clickhouse_connect.driver.exceptions import DataError
    except ImportError:  # pragma: no cover - the worker always has the driver
        DataError = ()  # type: ignore[assignment,misc]  # noqa: N806
    if isinstance(exc, DataError | OverflowError):
        return True
    text = str(exc)
    if OutageInjectingStore.CONSTRAINT in text:
        return False
    m = _CODE_RE.search(text)
    return m is not None and int(m.group(1)) in _DATA_ERROR_CODES


T = TypeVar("T")


def write_isolating(
    write: Callable[[Sequence[T]], None],
    rows: Sequence[T],
    what: str,
    *,
    retry: Callable[[Callable[[], None], str], int],
) -> tuple[int, list[tuple[T, str]]]:
    """Write ``rows``; a batch the store rejects for its data is split in halves until the
    offending rows are isolated, and the rest is written.

    ``retry(fn, what)`` runs one write with the caller's retry policy (e.g.
    :func:`with_retry` with backoff, forever, for an outage); it must let a data error
    through (``with_retry(..., fatal=is_data_error)``). Returns the retries and the
    rejected rows with the store's reason. Every write here is idempotent, so a half
    written twice is harmless.
    """
    rejected: list[tuple[T, str]] = []
    retries = 0
    stack = [list(rows)]
    while stack:
        part = stack.pop()
        try:
            retries += retry(lambda part=part: write(part), f"{what} ({len(part)} rows)")  # type: ignore[misc]
        except Exception as exc:
            if not is_data_error(exc):
                raise
            if len(part) == 1:
                reason = f"store_rejected: {what}: {exc}"
                log.warning("ClickHouse rejected one row of %s: %s", what, exc)
                rejected.append((part[0], reason))
                continue
            mid = len(part) // 2
            stack.append(part[mid:])
            stack.append(part[:mid])
    return retries, rejected


# --- windows, SLO counts, checkpoints, raw events ------------------------------
#
# One named row format per table, next to the column list it fills: rows are built by
# field name (keyword arguments, attributes), never as positional tuples elsewhere.

# The named fields of one SLO's counts in a window's ``__slo__`` row (a Map value).
SLO_COUNT_FIELDS: tuple[tuple[str, str], ...] = (
    ("kind", "String"),
    ("boundary", "String"),
    ("threshold_ms", "Float64"),
    ("objective", "Float64"),
    ("total", "Int64"),
    ("good", "Int64"),
    ("good_secondary_only", "Int64"),
    ("secondary_weight", "Float64"),
)
_SLO_COUNT_TYPE = ", ".join(f"{n} {t}" for n, t in SLO_COUNT_FIELDS)
WINDOW_COLUMNS: tuple[tuple[str, str], ...] = (
    ("window_start", "DateTime64(3, 'UTC')"),
    ("window_ms", "UInt32"),
    ("source_topic", "LowCardinality(String)"),
    ("partition", "UInt16"),
    ("correction", "UInt8"),
    ("model", "LowCardinality(String)"),
    ("priority", "LowCardinality(String)"),
    ("ctx_bucket", "LowCardinality(String)"),
    ("boundary", "LowCardinality(String)"),
    ("relative_accuracy", "Float64"),
    ("records", "Int64"),
    *SKETCH_COLUMNS,  # the sketch's own columns, in their order (WindowRow.sketch)
    ("slo_counts", f"Map(String, Tuple({_SLO_COUNT_TYPE}))"),
    ("through_offset", "Int64"),
    ("ledger_ids", "Array(String)"),
    ("ledger_versions", "Array(UInt8)"),
)
SLO_ROW_BOUNDARY = "__slo__"
_SKETCH_NAMES = frozenset(n for n, _ in SKETCH_COLUMNS)
_NO_SKETCH = SketchColumns(0, 0.0, math.inf, -math.inf, 0, [], [], [], [])


@dataclass(frozen=True, slots=True)
class WindowRow:
    """One ``window_sketches`` row (:data:`WINDOW_COLUMNS`): the sketch of one (key,
    boundary) of a window or correction, or the window's ``__slo__`` row (no sketch; its
    SLO counts, ledger and ``through_offset``)."""

    window_start: datetime
    window_ms: int
    source_topic: str
    partition: int
    correction: int  # 0: the window as it closed, 1: a correction of it
    model: str
    priority: str
    ctx_bucket: str
    boundary: str
    relative_accuracy: float
    records: int
    sketch: SketchColumns  # the SKETCH_COLUMNS, read by name
    slo_counts: dict[str, tuple[Any, ...]]  # SLO name -> SLO_COUNT_FIELDS values
    through_offset: int
    ledger_ids: list[str]
    ledger_versions: list[int]


def _row_constants(win: ClosedWindow, topic: str, relative_accuracy: float) -> dict[str, Any]:
    """The fields every row of ``win`` shares, by name."""
    return {
        "window_start": datetime.fromtimestamp(win.start_ms / 1000, tz=UTC),
        "window_ms": win.size_ms,
        "source_topic": topic,
        "partition": win.partition,
        "correction": 1 if win.correction else 0,  # 0: the window as it closed
        "relative_accuracy": relative_accuracy,
    }


def _stored_cells(win: ClosedWindow) -> list[tuple[tuple[WindowKey, str], SketchColumns]]:
    """The (key, boundary) sketches of ``win`` that get a row, in row order."""
    return [
        (kb, c)
        for kb, c in sorted(win.sketches.items())
        # a cell whose additions and retractions cancelled out has nothing to store
        if c.count or c.pos_keys or c.neg_keys or c.zero_count
    ]


def _slo_row_fields(win: ClosedWindow, through_offset: int) -> dict[str, Any]:
    """The fields of the ``__slo__`` row of ``win`` that are not :func:`_row_constants`."""
    counts = win.slos.rows() if win.slos is not None else []
    return {
        "model": "*",
        "priority": "*",
        "ctx_bucket": "*",
        "boundary": SLO_ROW_BOUNDARY,
        "records": win.records.get(("*", "*", "*"), 0),
        "sketch": _NO_SKETCH,
        "slo_counts": {r.slo: tuple(getattr(r, n) for n, _ in SLO_COUNT_FIELDS) for r in counts},
        "through_offset": through_offset,
        "ledger_ids": list(win.ledger),
        "ledger_versions": list(win.ledger.values()),  # in the same (insertion) order
    }


def window_rows(
    win: ClosedWindow, topic: str, relative_accuracy: float, through_offset: int = 0
) -> list[WindowRow]:
    """Rows of one window or correction: one per (key, boundary), plus its ``__slo__``
    row (SLO counts, and the ledger of the requests counted, with ``through_offset``:
    the partition's input below it is accounted for by this insert and earlier ones)."""
    const = _row_constants(win, topic, relative_accuracy)
    rows = [
        WindowRow(
            **const,
            model=key[0],
            priority=key[1],
            ctx_bucket=key[2],
            boundary=boundary,
            records=win.records.get(key, 0),
            sketch=c,
            slo_counts={},
            through_offset=0,
            ledger_ids=[],
            ledger_versions=[],
        )
        for (key, boundary), c in _stored_cells(win)
    ]
    rows.append(WindowRow(**const, **_slo_row_fields(win, through_offset)))
    return rows


def window_columns(rows: Sequence[WindowRow]) -> list[list[Any]]:
    """The :data:`WINDOW_COLUMNS` of ``rows``, by name (the sketch's from ``row.sketch``)."""
    sketches = [r.sketch for r in rows]
    return [
        list(map(operator.attrgetter(n), sketches if n in _SKETCH_NAMES else rows))
        for n, _ in WINDOW_COLUMNS
    ]


def windows_columns(
    windows: Sequence[ClosedWindow],
    topic: str,
    relative_accuracy: float,
    through_offsets: dict[int, int],
) -> list[list[Any]]:
    """``window_columns`` of the :func:`window_rows` of ``windows`` (``through_offsets``
    per partition), built column by column without a :class:`WindowRow` per row (a frozen
    dataclass costs ~5 µs to build; a test keeps the two equal)."""
    out: dict[str, list[Any]] = {n: [] for n, _ in WINDOW_COLUMNS}
    for win in windows:
        cells = _stored_cells(win)
        slo = _slo_row_fields(win, through_offsets.get(win.partition, 0))
        n = len(cells) + 1
        for name, value in _row_constants(win, topic, relative_accuracy).items():
            out[name] += [value] * n
        keys = [key for (key, _), _ in cells]
        by_cell: dict[str, list[Any]] = {
            "model": [k[0] for k in keys],
            "priority": [k[1] for k in keys],
            "ctx_bucket": [k[2] for k in keys],
            "boundary": [b for (_, b), _ in cells],
            "records": [win.records.get(k, 0) for k in keys],
            # one empty value shared by the cells' rows (the driver only reads them)
            "slo_counts": [{}] * len(cells),
            "through_offset": [0] * len(cells),
            "ledger_ids": [[]] * len(cells),
            "ledger_versions": [[]] * len(cells),
        }
        for name, values in by_cell.items():
            out[name] += values
            out[name].append(slo[name])
        sketches = [c for _, c in cells]
        sketches.append(slo["sketch"])
        for name in _SKETCH_NAMES:
            out[name] += map(operator.attrgetter(name), sketches)
    return [out[n] for n, _ in WINDOW_COLUMNS]


def write_windows(
    store: Store,
    windows: Sequence[ClosedWindow],
    topic: str,
    relative_accuracy: float,
    token: str,
    *,
    through_offsets: dict[int, int] | None = None,
) -> None:
    """Windows and corrections as one insert (atomic: sketches, SLO counts and the
    ledger together). ``through_offsets``: per partition, the next input offset at
    the time the batch was cut (see :func:`read_ledger`).

    ``token`` makes a retry of the same batch a no-op (insert deduplication,
    also for the materialized views fed by this table).
    """
    if windows:
        columns = windows_columns(windows, topic, relative_accuracy, through_offsets or {})
        _insert_columns(store, "window_sketches", WINDOW_COLUMNS, columns, token)


CHECKPOINT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("group_id", "String"),
    ("source_topic", "String"),
    ("partition", "UInt16"),
    ("close_horizon_ms", "Int64"),
    ("watermark_ms", "Int64"),
    ("committed_offset", "Int64"),
    ("corrected_records", "UInt64"),
    ("quarantined_events", "UInt64"),
    ("replayed_records", "UInt64"),
)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One ``worker_checkpoints`` row (informational, for operators), less the group and
    topic, which :func:`write_checkpoints` adds."""

    partition: int
    close_horizon_ms: int
    watermark_ms: int
    committed_offset: int
    corrected_records: int = 0
    quarantined_events: int = 0
    replayed_records: int = 0


def write_checkpoints(store: Store, group: str, topic: str, rows: Sequence[Checkpoint]) -> None:
    if not rows:
        return
    n = len(rows)
    columns = [[group] * n, [topic] * n, *_attr_columns(rows, _CHECKPOINT_FIELDS)]
    _insert_columns(store, "worker_checkpoints", CHECKPOINT_COLUMNS, columns)


_CHECKPOINT_FIELDS = tuple(n for n, _ in CHECKPOINT_COLUMNS[2:])


EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "String"),
    ("kind", "LowCardinality(String)"),
    ("request_id", "String"),
    ("ts_unix_ns", "Int64"),
    ("host", "LowCardinality(String)"),
    ("model", "LowCardinality(String)"),
    ("source_topic", "LowCardinality(String)"),
    ("source_partition", "UInt16"),
    ("source_offset", "Int64"),
    ("payload", "String"),
)
# The event's own fields among them, read by name from the decoded event.
_EVENT_FIELDS = ("event_id", "kind", "request_id", "ts_unix_ns", "host", "model")


class EventRow(NamedTuple):
    """One ``lifecycle_events`` row (:data:`EVENT_COLUMNS`) built one at a time (build it
    by keyword). The worker does not build these: it writes the processor's kept events
    as columns (:func:`write_raw_events`)."""

    event_id: str
    kind: str
    request_id: str
    ts_unix_ns: int
    host: str
    model: str
    source_topic: str
    source_partition: int
    source_offset: int
    payload: str | bytes  # the event's JSON as received


def write_events(store: Store, rows: Sequence[EventRow]) -> None:
    _insert(store, "lifecycle_events", EVENT_COLUMNS, rows)


# An event kept one at a time: (partition, offset, event, its bytes as received). The
# processor keeps whole messages (KeptMessage); tests and tools build these.
KeptEvent = tuple[int, int, AnyEvent, EventBytes]


def kept_events(kept: Sequence[KeptMessage]) -> list[KeptEvent]:
    """The kept messages event by event (the column-wise insert, dead letters)."""
    out: list[KeptEvent] = []
    for m in kept:
        raws = event_slices(m.payload) if isinstance(m.payload, bytes) else m.payload
        out.extend((m.partition, m.offset, ev, raw) for ev, raw in zip(m.events, raws, strict=True))
    return out


def raw_event_columns(topic: str, kept: Sequence[KeptEvent]) -> list[list[Any]]:
    """The :data:`EVENT_COLUMNS` of kept events, by name (no row per event is built); the
    payload is the event's bytes as the producer sent them (not decoded to ``str`` and
    encoded again)."""
    events = [k[2] for k in kept]
    by_name = dict(zip(_EVENT_FIELDS, _attr_columns(events, _EVENT_FIELDS), strict=True))
    by_name["source_topic"] = [topic] * len(kept)
    by_name["source_partition"] = [k[0] for k in kept]
    by_name["source_offset"] = [k[1] for k in kept]
    by_name["payload"] = [bytes(k[3]) for k in kept]
    return [by_name[n] for n, _ in EVENT_COLUMNS]


def _plain(t: str) -> str:
    return t.removeprefix("LowCardinality(").removesuffix(")") if t.startswith("Low") else t


# Into the embedded engine, raw events go as JSON lines (JSONCompactEachRow), one per
# message: its partition and offset, its events and its events' bytes. A message the
# decoder accepted whole is a JSON array of its events: it is written verbatim, twice,
# and read by the engine once as an array of named tuples (the event's fields; other keys
# ignored) and once as an array of the events' own text, byte for byte
# (input_format_json_read_objects_as_strings); ARRAY JOIN makes the rows. No value is
# handled in Python per event: only the message's bytes are copied (the old path built a
# row of fields per event, ~1.3 µs of the writer's GIL time an event, after the decoder
# had sliced every message for it, ~0.7 µs of the event loop's). The source topic is one
# literal of the SELECT.
_TYPES = dict(EVENT_COLUMNS)
_EVENT_TUPLE = ", ".join(f"{n} {_plain(_TYPES[n])}" for n in _EVENT_FIELDS)
_MESSAGE_STRUCTURE = (
    f"source_partition {_TYPES['source_partition']}, source_offset {_TYPES['source_offset']}, "
    f"events Array(Tuple({_EVENT_TUPLE})), payloads Array(String)"
)
_MESSAGE_ARRAY_JOIN = "ARRAY JOIN events AS e, payloads AS payload"
_EVENT_NAMES = tuple(n for n, _ in EVENT_COLUMNS)
# INCORRECT_DATA (an object with a repeated key), SIZES_OF_ARRAYS_DONT_MATCH (the two
# readings of a message disagree: never seen): the engine's reading of the messages
# failed, not the store.
_READ_ERROR_CODES = frozenset({117, 190})
_OBJECTS_AS_TEXT = {"input_format_json_read_objects_as_strings": 1}


class _MessageLine(NamedTuple):
    """One line of :data:`_MESSAGE_STRUCTURE`."""

    source_partition: int
    source_offset: int
    events: list[Raw] | list[dict[str, Any]]  # JSON objects with _EVENT_FIELDS
    payloads: list[Raw | str]


def _json_payload(raw: EventBytes) -> Raw | str:
    """An event's bytes as a JSON value the engine reads back byte for byte: a JSON object
    as itself (a slice of its message is one), anything else (a whole message with
    whitespace around its object) as a JSON string of its text (valid UTF-8: the decoder
    checked it)."""
    if type(raw) is Raw:
        return raw
    data = bytes(raw)
    return Raw(data) if data[:1] == b"{" and data[-1:] == b"}" else data.decode()


def _message_lines(kept: Sequence[KeptMessage], *, decoded: bool) -> list[bytes]:
    """The kept messages as lines of :data:`_MESSAGE_STRUCTURE`, in pieces (written to the
    file one after the other: a message's bytes are copied once, by the kernel). The
    events' fields are read by the engine from their bytes, or with ``decoded`` given as
    the decoder read them (the engine refuses an object with a repeated key, which the
    decoder reads as its last value)."""
    if decoded:
        lines = []
        for m in kept:
            payload = m.payload
            raws = event_slices(payload) if isinstance(payload, bytes) else payload
            lines.append(
                _MessageLine(
                    m.partition,
                    m.offset,
                    [{n: getattr(ev, n) for n in _EVENT_FIELDS} for ev in m.events],
                    [_json_payload(r) for r in raws],
                )
            )
        return [_JSON.encode_lines(lines)]
    pieces: list[bytes] = []
    add = pieces.extend
    for m in kept:
        payload = m.payload
        if isinstance(payload, bytes):  # the message, an array of the events: twice
            add((b"[%d,%d," % (m.partition, m.offset), payload, b",", payload, b"]\n"))
        else:
            line = _MessageLine(
                m.partition,
                m.offset,
                [Raw(bytes(r)) for r in payload],
                [_json_payload(r) for r in payload],
            )
            add((_JSON.encode(line), b"\n"))
    return pieces


def write_raw_messages(store: Store, topic: str, kept: Sequence[KeptMessage]) -> None:
    """The processor's kept messages of ``topic`` into ``lifecycle_events``, one row per
    event."""
    if not kept:
        return
    if not (isinstance(store, ClickHouseStore) and store.embedded):
        _insert_columns(
            store, "lifecycle_events", EVENT_COLUMNS, raw_event_columns(topic, kept_events(kept))
        )
        return
    select = ", ".join(
        _quote(topic) if n == "source_topic" else n if n.startswith("source_") or n == "payload"
        else f"e.{n}"
        for n in _EVENT_NAMES
    )  # fmt: skip
    # no event id twice (a message delivered twice in one batch): no key repeats
    ids = [ev.event_id for m in kept for ev in m.events]
    unique = len(set(ids)) == len(ids)
    settings = _OBJECTS_AS_TEXT | _NO_INSERT_MERGE if unique else _OBJECTS_AS_TEXT

    def insert(decoded: bool) -> None:
        store.insert_from_file(
            "lifecycle_events", _EVENT_NAMES, select, _message_lines(kept, decoded=decoded),
            fmt="JSONCompactEachRow", structure=_MESSAGE_STRUCTURE, settings=settings,
            array_join=_MESSAGE_ARRAY_JOIN,
        )  # fmt: skip

    try:
        insert(decoded=False)
    except Exception as exc:
        m = _CODE_RE.search(str(exc))
        if not (is_data_error(exc) or (m is not None and int(m.group(1)) in _READ_ERROR_CODES)):
            raise
        # An event the engine does not read as the decoder did (a repeated key): each
        # event's fields as decoded, and its bytes sliced here, instead. The failed insert
        # wrote nothing as long as it had fewer rows than one insert block (an INSERT ...
        # SELECT writes in blocks of min_insert_block_size_rows, ~1 M; a flush holds far
        # fewer); rows of a block written before the failure come again identical, and the
        # table collapses them (ReplacingMergeTree, one row per event id).
        log.info(
            "raw events: the engine could not read %d messages as sent (%s); "
            "writing the decoded fields",
            len(kept),
            str(exc).split("\n", 1)[0],
        )
        insert(decoded=True)


def write_raw_isolating(
    store: Store,
    topic: str,
    kept: Sequence[KeptMessage],
    *,
    retry: Callable[[Callable[[], None], str], int],
) -> tuple[int, list[tuple[KeptEvent, str]]]:
    """:func:`write_raw_messages` under :func:`write_isolating`: a message the store
    refuses is written again event by event, so that only the events it refuses are
    returned (with its reason), each with its own offset. Returns the retries too."""
    what = "write of raw events"
    retries, refused = write_isolating(
        lambda rows: write_raw_messages(store, topic, rows), kept, what, retry=retry
    )
    if not refused:
        return retries, []
    more, rejected = write_isolating(
        lambda rows: write_raw_events(store, topic, rows),
        kept_events([m for m, _ in refused]),
        what,
        retry=retry,
    )
    return retries + more, rejected


def write_raw_events(store: Store, topic: str, kept: Sequence[KeptEvent]) -> None:
    """Kept events of ``topic`` into ``lifecycle_events`` (each as a message of its own)."""
    if not kept:
        return
    if isinstance(store, ClickHouseStore) and store.embedded:
        write_raw_messages(
            store,
            topic,
            [KeptMessage(p, off, [ev], [raw]) for p, off, ev, raw in kept],  # type: ignore[list-item]
        )
    else:
        _insert_columns(store, "lifecycle_events", EVENT_COLUMNS, raw_event_columns(topic, kept))


# --- the control audit: control_signals, budget_events ------------------------

CONTROL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("scope", "LowCardinality(String)"),
    ("seq", "UInt64"),
    ("level", "UInt8"),
    ("phase", "LowCardinality(String)"),
    ("issued_at", "DateTime64(3, 'UTC')"),
    ("expires_at", "DateTime64(3, 'UTC')"),
    ("event_time", "DateTime64(3, 'UTC')"),
    ("reason", "String"),
    ("figures", "String"),
    ("actions", "String"),
    ("notify_customer", "Bool"),
    ("budget_exhausted", "Bool"),
    ("heartbeat", "Bool"),
    ("kid", "LowCardinality(String)"),
    ("signal", "String"),
)


class ControlRow(NamedTuple):
    """One ``control_signals`` row (:data:`CONTROL_COLUMNS`); build it by keyword."""

    scope: str
    seq: int
    level: int
    phase: str
    issued_at: datetime
    expires_at: datetime
    event_time: datetime
    reason: str
    figures: str  # JSON
    actions: str  # JSON
    notify_customer: bool
    budget_exhausted: bool
    heartbeat: bool
    kid: str  # "replay": decided by `tailguard replay`, not published
    signal: str  # the signed message as published ("" for a replay)


BUDGET_EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("slo", "LowCardinality(String)"),
    ("event", "LowCardinality(String)"),
    ("event_time", "DateTime64(3, 'UTC')"),
    ("details", "String"),
)


class BudgetEventRow(NamedTuple):
    """One ``budget_events`` row (:data:`BUDGET_EVENT_COLUMNS`); build it by keyword."""

    slo: str
    event: str  # e.g. budget_exhausted
    event_time: datetime
    details: str  # the event as JSON


def write_audit(
    store: Store, control_rows: Sequence[ControlRow], event_rows: Sequence[BudgetEventRow]
) -> None:
    _insert(store, "control_signals", CONTROL_COLUMNS, control_rows)
    _insert(store, "budget_events", BUDGET_EVENT_COLUMNS, event_rows)
