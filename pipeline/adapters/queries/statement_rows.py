"""What a statement reads of ``requests``: a tenant's rows of a period as the core takes
them (:class:`~pipeline.core.statement.StatementRows`), exact without ``FINAL``, and the
latest end of the period (issue 53: a tenant-month of a month store is 2 M rows)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.adapters.store import REQUEST_COLUMNS, Store, records_from_columns
from pipeline.contract.boundaries import BOUNDARIES
from pipeline.core.record import RequestRecord
from pipeline.core.slo import Categorical
from pipeline.core.statement import STATEMENT_FIELDS, StatementRows

# The requests columns a statement (version 3 on) reads (StatementRows.digest names what).
STATEMENT_COLUMNS: Final = (*STATEMENT_FIELDS, *BOUNDARIES)
_ALL_COLUMNS: Final = tuple(n for n, _ in REQUEST_COLUMNS)
_NONE_IF_EMPTY: Final = frozenset({"tenant", "engine_host"})  # stored "" (records_from_columns)
_AS_NUMPY: Final = frozenset({"end_unix_ns", "ts_unix_ns", "attempt", "request_id"})
_AS_LIST: Final = frozenset({"prompt_tokens", "cold_start_unix_ns"})


def read_rows(store: Store, tenant: str, from_unix_ns: int, until_unix_ns: int) -> StatementRows:
    """The tenant's rows ending in the range (statement version 3 on), in the order of
    their key's hash: :func:`tenant_rows`, the matching rows converted while the engine
    looks for their keys' other versions (the engine's query lets the interpreter run:
    ~1 s of a tenant-month's 2 M rows), again when it found some (rare)."""
    read = _Read(store, tenant, from_unix_ns, until_unix_ns)
    rows = read.matching(STATEMENT_COLUMNS)
    with ThreadPoolExecutor(1, thread_name_prefix="statement-read") as pool:
        shared = pool.submit(read.shared)
        converted = statement_rows(rows, _hash_order(rows))
        found = shared.result()
    if len(found):
        rows = read.finals(rows, found)
        converted = statement_rows(rows, _hash_order(rows))
    return converted


def read_records(
    store: Store, tenant: str, from_unix_ns: int, until_unix_ns: int
) -> list[RequestRecord]:
    """The tenant's records ending in the range, every field (statement version 2)."""
    table, _ = tenant_rows(store, tenant, from_unix_ns, until_unix_ns, _ALL_COLUMNS)
    return records_from_columns([c.to_pylist() for c in table.columns])


def statement_rows(table: Any, order: Any) -> StatementRows:
    """The statement's columns (:data:`STATEMENT_COLUMNS` of an Arrow table) in ``order``
    (row indices), as the core takes them: the record's values (None for a stored ""
    tenant or host); numbers as arrays, few distinct values coded (:class:`Categorical`),
    no Python value per cell where the core needs none."""
    fields: dict[str, Any] = {}
    for name in STATEMENT_FIELDS:
        col = table.column(name)
        if name in _AS_NUMPY:
            fields[name] = col.to_numpy(zero_copy_only=False)[order]  # (request_id: str)
        elif name in _AS_LIST:
            fields[name] = np.array(col.to_pylist(), dtype=object)[order]
        else:
            codes, categories = few_values(col, none_if_empty=name in _NONE_IF_EMPTY)
            fields[name] = Categorical(codes[order], categories)
    # column by column (Fortran order): each boundary's values are contiguous
    boundaries = np.empty((table.num_rows, len(BOUNDARIES)), dtype=np.float64, order="F")
    for j, b in enumerate(BOUNDARIES):
        boundaries[:, j] = table.column(b).to_numpy(zero_copy_only=False)[order]
    return StatementRows(fields, boundaries)


def tenant_rows(
    store: Store, tenant: str, from_unix_ns: int, until_unix_ns: int, columns: Sequence[str]
) -> tuple[pa.Table, Any]:
    """``columns`` (as stored) of a tenant's requests ending in the range: the rows
    ``FINAL`` gives (each key's last version), as an Arrow table in no order, and the
    order of its rows by the hash of their key, then the key (a canonical order, ~4x
    cheaper to sort into than the keys'): ``(table, order)``, ``order`` an int array of
    row indices. ``columns`` must name request_id and attempt.

    Without ``FINAL``, which merges every version of the table (ClickHouse does not prune
    partitions under it here: 24 s for a tenant-month of a month store, issue 53):

    1. the matching rows, with the hash of their key (``key_hash``: cityHash64 of
       (request_id, attempt)) and their version; read from the ``by_tenant`` projection,
       which holds a tenant's rows together (sql/0020, sql/0022);
    2. the hashes of theirs that more than one row of the table has (any version of the
       key, anywhere; or another key with the same hash): the table's hashes grouped, those
       held by more than one row, then the matching rows' among them. A matching row whose
       hash no other row has is its key's only version: final;
    3. only when there are such hashes: the highest version of each key that has one of
       them, compared by the key itself. A matching row with one of them is final when it
       is its key's highest version (one per key, for a version written twice)."""
    read = _Read(store, tenant, from_unix_ns, until_unix_ns)
    rows = read.finals(read.matching(columns), read.shared())
    return rows.select(list(columns)), _hash_order(rows)


class _Read:
    """The queries of :func:`tenant_rows`, one tenant and range."""

    def __init__(self, store: Store, tenant: str, from_unix_ns: int, until_unix_ns: int) -> None:
        self.store = store
        self.db = store.database
        self.bound: dict[str, Any] = {"t": tenant, "a": from_unix_ns, "b": until_unix_ns}
        self.match = "tenant = {t:String} AND end_unix_ns >= {a:Int64} AND end_unix_ns < {b:Int64}"
        self.key_hash = "key_hash"
        self._stored: int | None = None

    def shared_sql(self, passes: int, at: int) -> str:
        """The query of step 2 (the hashes ``h % passes = at`` of them), grouped: the
        table's hashes held by more than one row, then the matching rows' among them.

        Grouping every hash of the table once (~1.2 s for the month store's 52 M rows)
        costs less than asking of each row whether its hash is one of the matching rows'
        (:meth:`probed_sql`: 3.0 s for a 14.6 M-row tenant-month, a set that large built
        on one core and probed at random by every row), but it needs memory for every
        hash of the table, not only the matching rows' (:data:`SHARED_PASS_ROWS`)."""
        h = self.key_hash
        part = f" WHERE {h} % {passes} = {at}" if passes > 1 else ""
        return (
            f"SELECT h FROM (SELECT {h} AS h FROM {self.db}.requests WHERE {self.match} "
            f"AND h IN (SELECT {h} FROM {self.db}.requests{part} GROUP BY {h} "
            "HAVING count() > 1)) GROUP BY h"
        )

    @property
    def probed_sql(self) -> str:
        """The query of step 2, probed: every row of the table asked whether its hash is
        one of the matching rows' (memory for the matching rows' hashes only)."""
        h = self.key_hash
        return (
            f"SELECT {h} AS h FROM {self.db}.requests PREWHERE h IN (SELECT {h} FROM "
            f"{self.db}.requests WHERE {self.match}) GROUP BY h HAVING count() > 1"
        )

    def matching(self, columns: Sequence[str]) -> pa.Table:
        """1: the matching rows, every version, with their key's hash and version: in one
        answer, or a day of ends at a time (:data:`READ_SPAN_NS`) when the store refuses
        an answer that large (the query port: :data:`ANSWER_TOO_LARGE`)."""
        if "request_id" not in columns or "attempt" not in columns:
            raise ValueError("tenant_rows needs request_id and attempt")
        sql = (
            f"SELECT {', '.join(columns)}, {_KEY_HASH} AS _key_hash, "
            f"revision AS _version FROM {self.db}.requests WHERE {self.match}"
        )
        try:
            return self.store.query_arrow(sql, self.bound)
        except Exception as exc:
            if ANSWER_TOO_LARGE not in str(exc):
                raise
        a, b = self.bound["a"], self.bound["b"]
        spans = [(lo, min(b, lo + READ_SPAN_NS)) for lo in range(a, b, READ_SPAN_NS)]
        return pa.concat_tables(
            [self.store.query_arrow(sql, {**self.bound, "a": lo, "b": hi}) for lo, hi in spans]
        )

    def shared(self) -> pa.Array:
        """2: the hashes of the matching rows that another row of the table has too.
        Grouped (:meth:`shared_sql`) in one pass where the store sets no memory limit per
        query or the table's hashes fit in it, else probed (:meth:`probed_sql`) where the
        matching rows' fit (a tenant's period through the query port, 512 MiB), else
        grouped in as many passes as fit (:data:`SHARED_PASS_ROWS`). On a store without
        ``key_hash`` yet (a reader newer than the worker that migrates it), the hash
        computed from the key: the same values, read from the ids."""
        rows, limit = self.sizes()
        per_pass = SHARED_PASS_ROWS
        if limit and rows * SHARED_BYTES_PER_ROW > limit:
            if self.stored() * SHARED_BYTES_PER_ROW <= limit:
                return self._hashes(lambda: self.probed_sql)
            per_pass = max(1, min(per_pass, limit // SHARED_BYTES_PER_ROW))
        passes = max(1, -(-rows // per_pass))
        found = [
            self._hashes(functools.partial(self.shared_sql, passes, at)) for at in range(passes)
        ]
        return pa.concat_arrays(found) if found else pa.array([], pa.uint64())

    def stored(self, *, fresh: bool = False) -> int:
        """The matching rows, every version (the ``by_tenant`` projection: a few ms):
        counted once (by :meth:`shared` or the first caller), then that count, unless
        ``fresh`` (a live store's check that nothing was written since)."""
        if self._stored is None or fresh:
            ((n,),) = self.store.query_rows(
                f"SELECT count() FROM {self.db}.requests WHERE {self.match}", self.bound
            )
            self._stored = int(n)
        return self._stored

    def sizes(self) -> tuple[int, int]:
        """(the table's rows, the store's memory limit per query in bytes; 0: none)."""
        ((rows, limit),) = self.store.query_rows(
            f"SELECT count(), getSetting('max_memory_usage') FROM {self.db}.requests"
        )
        return int(rows), int(limit)

    def _hashes(self, sql: Callable[[], str]) -> pa.Array:
        """The hashes a query of step 2 answers (``sql`` formed again on a store without
        ``key_hash``)."""
        try:
            answer = self.store.query_arrow(sql(), self.bound)
        except Exception as exc:
            if "key_hash" not in str(exc) or self.key_hash == _KEY_HASH:
                raise
            self.key_hash = _KEY_HASH
            answer = self.store.query_arrow(sql(), self.bound)
        return answer.column(0).combine_chunks()

    def highest(self, shared: pa.Array) -> list[tuple[str, int, int]]:
        """Each key with one of the hashes ``shared``: (request_id, attempt, its highest
        version), over every row of the table."""
        top = self.store.query_rows(
            f"SELECT request_id, attempt, max(revision) FROM {self.db}.requests "
            f"PREWHERE {self.key_hash} IN {{shared:Array(UInt64)}} GROUP BY request_id, attempt",
            {"shared": shared.to_pylist()},
        )
        return [(str(r), int(a), int(v)) for r, a, v in top]

    def finals(self, rows: pa.Table, shared: pa.Array) -> pa.Table:
        """3: the matching rows that are their key's final version."""
        if not len(shared):
            return rows
        suspect = pc.is_in(rows.column("_key_hash"), value_set=shared)
        highest = {(r, a): v for r, a, v in self.highest(shared)}
        keep = pc.invert(suspect).to_numpy(zero_copy_only=False)
        at = np.flatnonzero(~keep)
        them = rows.take(at)
        seen: set[tuple[str, int]] = set()
        for k, key, version in zip(
            at.tolist(),
            zip(
                them.column("request_id").to_pylist(),
                them.column("attempt").to_pylist(),
                strict=True,
            ),
            them.column("_version").to_pylist(),
            strict=True,
        ):
            if key not in seen and version == highest[key]:
                keep[k] = True
                seen.add(key)
        return rows.filter(pa.array(keep))


def _hash_order(rows: pa.Table) -> Any:
    """The rows' order by their key's hash, then the key (row indices)."""
    return pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in _HASH_ORDER]).to_numpy()


# An answer larger than the store gives (ClickHouse's TOO_MANY_ROWS_OR_BYTES: the query
# port's limit, 256 MiB; a tenant-month of 2 M rows is ~300 MiB): the matching rows are
# then read a day of ends at a time (a day of the month bench's largest tenant: ~65 MiB).
# Not always: 30 reads cost the embedded engine ~0.4 s more than one.
ANSWER_TOO_LARGE: Final = "Code: 396"
# _Read.shared groups the table's hashes in passes (one residue of the hash each), each of
# at most SHARED_PASS_ROWS rows and within the store's memory limit per query at
# SHARED_BYTES_PER_ROW a row: on the month store (52 M rows) one pass needed 1-4 GiB, two
# 0.5-1, four 256-512 MiB and eight under 256 (max_memory_usage tried at 256 MiB steps:
# ~40 B a row, 64 with a margin). The time: 1.2-2.4 s in one pass, 0.3 s a pass in eight.
# Probed (the matching rows' hashes as a set) it needed 256 MiB-1 GiB for the largest
# tenant-month (14.6 M rows) and under 256 MiB for stark's (2.1 M: 1.6 s).
SHARED_PASS_ROWS: Final = 64_000_000
SHARED_BYTES_PER_ROW: Final = 64
READ_SPAN_NS: Final = 86_400 * 10**9
_HASH_ORDER: Final = ("_key_hash", "request_id", "attempt")
_KEY_HASH: Final = "cityHash64(request_id, attempt)"  # = requests.key_hash (sql/0020)


def few_values(
    column: pa.ChunkedArray | pa.Array, *, none_if_empty: bool = False
) -> tuple[Any, list[Any]]:
    """A column of few distinct values (model, outcome, ...) as codes (an int array)
    into its distinct values (Python values; null, and with ``none_if_empty`` "", as
    None): no Python value per row."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = column.dictionary_encode()
    distinct = encoded.dictionary.to_pylist()
    if none_if_empty:
        distinct = [None if v == "" else v for v in distinct]
    at = pc.fill_null(encoded.indices, len(distinct)).to_numpy(zero_copy_only=False)
    return at, [*distinct, None]  # null: the last


# The latest versions by end that last_end looks at before merging every version (each
# key costs a lookup: ~5 ms a key on a month store).
LAST_END_CANDIDATES: Final = 16


# How far back from the range's end last_end looks first (then the whole range): a read of
# the ends of the range's requests is ~2 s for a month of a month store, one of its last
# hour a few ms (the minmax index on end_unix_ns skips the rest).
LAST_END_PROBES_NS: Final = (3_600 * 10**9, 86_400 * 10**9)


def last_end(store: Store, from_unix_ns: int, until_unix_ns: int) -> int | None:
    """The latest ``end_unix_ns`` of a request (its last version, as ``FINAL``) ending in
    the range, None when none does; exact.

    Looked for in the range's last hour, then its last day, then all of it
    (:data:`LAST_END_PROBES_NS`): when a part ending at the range's end holds a last
    version, the latest of them is the range's (anything later is in the part too)."""
    for back in LAST_END_PROBES_NS:
        if until_unix_ns - back <= from_unix_ns:
            break
        found, end = _last_end_in(store, until_unix_ns - back, until_unix_ns)
        if found:
            return end
    return _last_end_in(store, from_unix_ns, until_unix_ns)[1]


def _last_end_in(store: Store, from_unix_ns: int, until_unix_ns: int) -> tuple[bool, int | None]:
    """(whether a request ends in the range, the latest end of a last version there).

    Without merging every version of the range (``FINAL`` over a month of requests: most
    of a statement's read, issue 53): the :data:`LAST_END_CANDIDATES` latest rows of the
    range, any version, and of their keys the last version (the highest store version,
    over every row of the key wherever it ended; the ids' bloom filter finds them). The
    latest of them that is its key's last is the answer: a last version ending later would
    be a row of the range ending later, so among them. When none of them is (they were all
    replaced: a backlog of upgrades), ``FINAL`` decides."""
    db = store.database
    in_range = "end_unix_ns >= {a:Int64} AND end_unix_ns < {b:Int64}"
    bounds = {"a": from_unix_ns, "b": until_unix_ns}
    latest = store.query_rows(
        f"SELECT request_id, attempt, revision, end_unix_ns FROM {db}.requests WHERE "
        f"{in_range} ORDER BY end_unix_ns DESC LIMIT {LAST_END_CANDIDATES}",
        bounds,
    )
    if not latest:
        return False, None
    highest = {
        (rid, attempt): top
        for rid, attempt, top in store.query_rows(
            f"SELECT request_id, attempt, max(revision) FROM {db}.requests "
            "WHERE request_id IN {ids:Array(String)} GROUP BY request_id, attempt",
            {"ids": sorted({r[0] for r in latest})},
        )
    }
    for rid, attempt, version, end in latest:  # latest first
        if version == highest[(rid, attempt)]:
            return True, int(end)
    ((end, n),) = store.query_rows(
        f"SELECT max(end_unix_ns), count() FROM {db}.requests FINAL WHERE {in_range}", bounds
    )
    return bool(n), int(end) if n else None
