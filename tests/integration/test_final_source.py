"""Issue 53: ``requests.final_source`` reads the same rows as ``requests FINAL WHERE ...``
however the versions of a request lie, on the real embedded engine, while merging the
versions of the keys some version of which matches only (ClickHouse 26.3 skips
partition pruning under FINAL on this table: FINAL over any range merged every request
of the store).

Each case stores the versions of one request attempt (each write its own part, merges
stopped, so every version stays a row) where the end moves into or out of the span
read, in both directions, with equal versions, across day partitions and attempts; the
rows read through ``final_source`` are FINAL's, on both of its paths (few candidates,
and more than ``FINAL_KEYS_MAX``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pipeline.adapters.queries import requests, statement_rows
from pipeline.adapters.store import REQUEST_COLUMNS, Store, migrate, open_store
from pipeline.adapters.store.requests import write_requests
from pipeline.core.record import RequestRecord, build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received

pytestmark = pytest.mark.integration

S_NS = 1_000_000_000
DAY_NS = 86_400 * S_NS
A_NS = 1_796_000_000 * S_NS  # the span read: [A, B), ten seconds
B_NS = A_NS + 10 * S_NS
IN_NS = A_NS + 5 * S_NS
BEFORE_NS, AFTER_NS = A_NS - 3_600 * S_NS, B_NS + 3_600 * S_NS

_BASE = build_record("x", received("x"), completed("x"), finished("x"))


def _row(rid: str, version: int, *, end_ns: int = IN_NS, took_ms: int = 100, attempt: int = 1,
         outcome: str = "ok", tenant: str | None = "t1") -> RequestRecord:  # fmt: skip
    """Request attempt ``rid``/``attempt`` stored with ``version`` (2 * revision +
    superseded: pipeline.core.record.store_version), ended at ``end_ns``."""
    return msgspec.structs.replace(
        _BASE, request_id=rid, attempt=attempt, revision=version // 2,
        superseded=bool(version % 2), end_unix_ns=end_ns,
        ts_unix_ns=end_ns - took_ms * 1_000_000, outcome=outcome, tenant=tenant,
    )  # fmt: skip


# (case, the versions in the order written)
CASES: list[tuple[str, list[dict[str, Any]]]] = [
    ("one row in the span", [{"version": 6}]),
    ("one row before the span", [{"version": 6, "end_ns": BEFORE_NS}]),
    ("one row at the span's end (excluded)", [{"version": 6, "end_ns": B_NS}]),
    ("newer version ends after the span", [{"version": 2}, {"version": 6, "end_ns": AFTER_NS}]),
    ("newer version ends before the span", [{"version": 2}, {"version": 6, "end_ns": BEFORE_NS}]),
    ("older version ended outside, newer inside",
     [{"version": 2, "end_ns": AFTER_NS, "outcome": "error"}, {"version": 6}]),
    ("newer version written first", [{"version": 6}, {"version": 2, "end_ns": AFTER_NS}]),
    ("newer version outside written first", [{"version": 6, "end_ns": AFTER_NS}, {"version": 2}]),
    ("superseded (a retry followed)", [{"version": 6}, {"version": 7, "outcome": "error"}]),
    ("the same version twice", [{"version": 6}, {"version": 6}]),
    ("newer version a day later (another partition)",
     [{"version": 2}, {"version": 6, "end_ns": IN_NS + DAY_NS}]),
    ("older version a day earlier (another partition)",
     [{"version": 2, "end_ns": IN_NS - DAY_NS, "outcome": "error"}, {"version": 6}]),
    ("the second attempt moved out, the first in the span",
     [{"version": 6, "attempt": 1}, {"version": 2, "attempt": 2},
      {"version": 6, "attempt": 2, "end_ns": AFTER_NS}]),
    ("the tenant known on the newer version only",
     [{"version": 0, "tenant": None}, {"version": 6}]),
    ("the newer version names another tenant", [{"version": 2}, {"version": 6, "tenant": "t2"}]),
    ("another tenant's older version", [{"version": 2, "tenant": "t2"}, {"version": 6}]),
]  # fmt: skip

WHERE = "end_unix_ns >= {a:Int64} AND end_unix_ns < {b:Int64}"
BOUND = {"a": A_NS, "b": B_NS}
COLUMNS = "request_id, attempt, revision, superseded, end_unix_ns, outcome"


def _write(store: Store) -> None:
    """Each case's versions, the n-th version of every case in the n-th writes (one part
    each: merges are stopped), request ``c<case>``."""
    store.command(f"SYSTEM STOP MERGES {store.database}.requests")
    for n in range(max(len(v) for _, v in CASES)):
        for i, (_, versions) in enumerate(CASES):
            if n < len(versions):
                write_requests(store, [_row(f"c{i}", **versions[n])])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(Settings(store_dir=tmp_path / "store"))
    migrate(s)
    _write(s)
    try:
        yield s
    finally:
        s.close()


def _rows(store: Store, source: str) -> list[tuple[Any, ...]]:
    return sorted(store.query_rows(f"SELECT {COLUMNS} FROM {source}", BOUND))


@pytest.mark.parametrize("keys_max", [requests.FINAL_KEYS_MAX, 0], ids=["few keys", "many"])
def test_final_source_reads_finals_rows(store: Store, keys_max: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(requests, "FINAL_KEYS_MAX", keys_max)
    ((rows,),) = store.query_rows(f"SELECT count() FROM {store.database}.requests")
    assert rows == sum(len(v) for _, v in CASES)  # every version is still a row
    source = requests.final_source(store, WHERE, BOUND)
    assert ("IN (SELECT request_id" in source) == (keys_max > 0)
    final = _rows(store, f"{store.database}.requests FINAL WHERE {WHERE}")
    assert _rows(store, source) == final
    ids = {r[0] for r in final}
    in_span = {f"c{i}" for i, (case, v) in enumerate(CASES)}
    # what the cases say (beside equality with FINAL): the newest version decides
    assert ids == in_span - {"c1", "c2", "c3", "c4", "c7", "c10"}, ids


def _tenant_rows(store: Store, tenant: str) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """(the rows tenant_rows reads of the tenant in the span, sorted; their hashes, in its
    order)."""
    names = [n for n, _ in REQUEST_COLUMNS]
    table, order = statement_rows.tenant_rows(store, tenant, A_NS, B_NS, names)
    got = sorted(zip(*(c.to_pylist() for c in table.columns), strict=True))
    ordered = table.take(order)
    keys = list(
        zip(
            ordered.column("request_id").to_pylist(),
            ordered.column("attempt").to_pylist(),
            strict=True,
        )
    )
    hashes = [
        store.query_rows("SELECT cityHash64({r:String}, {a:UInt16})", {"r": r, "a": a})[0][0]
        for r, a in keys
    ]
    in_order = [(h, *k) for h, k in zip(hashes, keys, strict=True)]
    assert in_order == sorted(in_order)  # by the key's hash, then the key
    return got, hashes


def _final_of(store: Store, tenant: str) -> list[tuple[Any, ...]]:
    names = [n for n, _ in REQUEST_COLUMNS]
    return sorted(
        store.query_rows(
            f"SELECT {', '.join(names)} FROM {store.database}.requests FINAL "
            f"WHERE tenant = {{t:String}} AND {WHERE}",
            {**BOUND, "t": tenant},
        )
    )


@pytest.mark.parametrize("how", ["grouped", "passes", "probed"])
def test_tenant_rows_reads_finals_rows_of_the_tenant(
    store: Store, how: str, monkeypatch: Any
) -> None:
    """The statement's read (no FINAL: each key's highest version) gives FINAL's rows of
    the tenant, every column, one row per key, whichever way its versions lie, in the
    order of the key's hash; whichever way the other versions are looked for: the table's
    hashes grouped, in one pass or in several (a table of more than SHARED_PASS_ROWS
    rows), or probed (a memory limit the grouping would not fit, the tenant's hashes do)."""
    queries: list[str] = []
    query_arrow = store.query_arrow
    monkeypatch.setattr(
        store, "query_arrow", lambda q, p=None: queries.append(q) or query_arrow(q, p)
    )
    if how == "passes":
        monkeypatch.setattr(statement_rows, "SHARED_PASS_ROWS", 3)
    if how == "probed":  # a limit all the table's rows but one fit in: a tenant's do
        sizes = statement_rows._Read.sizes
        monkeypatch.setattr(
            statement_rows._Read,
            "sizes",
            lambda r: (sizes(r)[0], (sizes(r)[0] - 1) * statement_rows.SHARED_BYTES_PER_ROW),
        )
    names = [n for n, _ in REQUEST_COLUMNS]
    for tenant in ("t1", "t2"):
        got, _ = _tenant_rows(store, tenant)
        assert got == _final_of(store, tenant)
        ids = {r[names.index("request_id")] for r in got}
        n = len(CASES)
        if tenant == "t1":
            assert ids == {f"c{i}" for i in range(n)} - {
                "c1", "c2", "c3", "c4", "c7", "c10", f"c{n - 2}"
            }, ids  # fmt: skip
        else:
            assert ids == {f"c{n - 2}"}, ids
    grouped = [q for q in queries if "HAVING" in q and "PREWHERE" not in q]
    probed = [q for q in queries if "HAVING" in q and "PREWHERE" in q]
    # one read of the other versions per tenant (two tenants), or one per pass
    if how == "probed":
        assert (len(grouped), len(probed)) == (0, 2)
    else:
        assert not probed
        assert len(grouped) == 2 if how == "grouped" else len(grouped) > 2


def test_a_key_sharing_its_hash_with_another_is_told_apart(store: Store) -> None:
    """Two keys with one key_hash (forced: cityHash64 collisions are not found by hand):
    the other key's higher version does not hide this key's only one, nor the other way."""
    db = store.database
    names = ", ".join(n for n, _ in REQUEST_COLUMNS)
    others = ", ".join("'collider'" if n == "request_id" else n for n, _ in REQUEST_COLUMNS)
    # c0 (version 6, tenant t1, in the span): a key of its hash at a higher version
    store.command(
        f"INSERT INTO {db}.requests ({names}, key_hash) SELECT "
        f"{others.replace('revision', '9')}, key_hash FROM {db}.requests "
        "WHERE request_id = 'c0' SETTINGS insert_allow_materialized_columns = 1"
    )
    ((n_hash,),) = store.query_rows(
        f"SELECT uniqExact(request_id) FROM {db}.requests WHERE key_hash = "
        f"(SELECT any(key_hash) FROM {db}.requests WHERE request_id = 'c0')"
    )
    assert n_hash == 2  # the collision is in place
    got, _ = _tenant_rows(store, "t1")
    assert got == _final_of(store, "t1")
    ids = [r[0] for r in got]
    assert "c0" in ids
    assert "collider" in ids


@pytest.mark.parametrize("candidates", [statement_rows.LAST_END_CANDIDATES, 1])
@pytest.mark.parametrize(
    "span",
    [(A_NS, B_NS), (BEFORE_NS - DAY_NS, AFTER_NS + 2 * DAY_NS), (A_NS, AFTER_NS + 1),
     (B_NS, B_NS + 10 * DAY_NS), (A_NS - 10 * DAY_NS, A_NS - 9 * DAY_NS)],
    ids=["span", "days around", "to after", "after the span", "nothing"],
)  # fmt: skip
def test_last_end_is_finals_latest_end(
    store: Store, span: tuple[int, int], candidates: int, monkeypatch: Any
) -> None:
    """The latest end of a last version in the range, as FINAL says, whether found in the
    range's last hour, its last day or the whole of it, from the latest candidates or
    (one candidate: often not a last version) by FINAL itself."""
    monkeypatch.setattr(statement_rows, "LAST_END_CANDIDATES", candidates)
    a, b = span
    ((end, n),) = store.query_rows(
        f"SELECT max(end_unix_ns), count() FROM {store.database}.requests FINAL "
        "WHERE end_unix_ns >= {a:Int64} AND end_unix_ns < {b:Int64}",
        {"a": a, "b": b},
    )
    assert statement_rows.last_end(store, a, b) == (end if n else None)


def test_an_empty_span_reads_nothing(store: Store) -> None:
    bound = {"a": AFTER_NS + DAY_NS, "b": AFTER_NS + 2 * DAY_NS}
    source = requests.final_source(store, WHERE, bound)
    assert store.query_rows(f"SELECT count() FROM {source}", bound) == [(0,)]
