"""Migrations 0020 (``requests``' ``by_tenant`` projection and ``key_hash``) and 0021 (a
bloom filter on ``request_id``), issue 53, upgrade a store written before them: every
existing row gets its key hash, every existing part the projection; a tenant's read goes
through the projection and gives ``FINAL``'s rows, for rows written before and after;
a key lookup skips the parts without the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from pipeline.adapters.queries import statement_rows
from pipeline.adapters.store import REQUEST_COLUMNS, migrate, open_store
from pipeline.adapters.store.requests import write_requests
from pipeline.core.record import RequestRecord, build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received
from tests.integration.migrations import migrate_before

pytestmark = pytest.mark.integration

S_NS = 1_000_000_000
DAY_NS = 86_400 * S_NS
A_NS = 1_796_000_000 * S_NS
_BASE = build_record("x", received("x"), completed("x"), finished("x"))
NAMES = [n for n, _ in REQUEST_COLUMNS]


def _records(prefix: str, revision: int) -> list[RequestRecord]:
    """Three tenants' requests over three days (three partitions)."""
    return [
        msgspec.structs.replace(
            _BASE,
            request_id=f"{prefix}{i}",
            revision=revision,
            tenant=("t1", "t2", "t3")[i % 3],
            end_unix_ns=A_NS + (i % 3) * DAY_NS + i * S_NS,
            ts_unix_ns=A_NS + (i % 3) * DAY_NS + i * S_NS - 100_000_000,
        )
        for i in range(60)
    ]


def _read(store: Any, tenant: str) -> list[tuple[Any, ...]]:
    table, _ = statement_rows.tenant_rows(store, tenant, A_NS, A_NS + 3 * DAY_NS, NAMES)
    return sorted(zip(*(c.to_pylist() for c in table.columns), strict=True))


def _final(store: Any, tenant: str) -> list[tuple[Any, ...]]:
    return sorted(
        store.query_rows(
            f"SELECT {', '.join(NAMES)} FROM {store.database}.requests FINAL WHERE tenant = "
            "{t:String} AND end_unix_ns >= {a:Int64} AND end_unix_ns < {b:Int64}",
            {"t": tenant, "a": A_NS, "b": A_NS + 3 * DAY_NS},
        )
    )


def test_0020_gives_old_rows_their_hash_and_projection(tmp_path: Path) -> None:
    store = open_store(Settings(store_dir=tmp_path / "store"))
    db = store.database
    try:
        migrate_before(store, tmp_path, 20)
        old = _records("old", 1)  # partial versions, upgraded after the migration
        write_requests(store, old)
        write_requests(store, [msgspec.structs.replace(r, revision=3) for r in old[30:40]])
        # a reader newer than the store (the worker migrates it): the key's hash computed
        for tenant in ("t1", "t2", "t3"):
            assert _read(store, tenant) == _final(store, tenant)
        assert migrate(store)[:3] == [  # (and any later ones)
            "0020_requests_by_tenant",
            "0021_requests_id_bloom",
            "0022_by_tenant_granularity",
        ]
        write_requests(store, _records("new", 1))
        write_requests(store, [msgspec.structs.replace(r, revision=2) for r in old[:30]])

        ((wrong,),) = store.query_rows(
            f"SELECT countIf(key_hash != cityHash64(request_id, attempt)) FROM {db}.requests"
        )
        assert wrong == 0
        ((rows,),) = store.query_rows(f"SELECT count() FROM {db}.requests")
        ((in_projection,),) = store.query_rows(
            f"SELECT sum(rows) FROM system.projection_parts WHERE database = '{db}' "
            "AND table = 'requests' AND name = 'by_tenant' AND active"
        )
        assert in_projection == rows

        for tenant in ("t1", "t2", "t3"):
            got = _read(store, tenant)
            assert got == _final(store, tenant)
            assert len(got) == 40  # 20 old keys (upgraded or not) and 20 new

        # the projection can answer a tenant's read (the planner picks it when it reads
        # fewer marks: on a store this small it need not)
        count = f"SELECT count() FROM {db}.requests WHERE tenant = 't1' AND end_unix_ns >= {A_NS}"
        ((n,),) = store.query_rows(count + " SETTINGS force_optimize_projection = 1")
        assert n > 40  # every version (old keys upgraded twice, at both ends)
        assert store.query_rows(count + " SETTINGS optimize_use_projections = 0") == [(n,)]
        plan = "\n".join(
            str(r[0])
            for r in store.query_rows(
                f"EXPLAIN indexes = 1 SELECT * FROM {db}.requests WHERE request_id = 'old7'"
            )
        )
        assert "idx_request_id" in plan
    finally:
        store.close()
