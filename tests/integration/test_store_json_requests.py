"""The embedded store takes request records as JSON the engine converts (off the GIL):
every stored value equals what the column-wise insert (the path a ClickHouse server over
HTTP takes) stores for the same records, on the real engine."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from pipeline.adapters import store as st
from pipeline.core.record import RequestRecord, build_record, revision_of_version, store_version
from pipeline.settings import Settings
from tests.factories import completed, finished, received

pytestmark = pytest.mark.integration

_ALL = "SELECT {} FROM tailguard.requests ORDER BY request_id, attempt, revision".format(
    ", ".join(n for n, _ in st.REQUEST_COLUMNS)
)


def _records() -> list[RequestRecord]:
    """Records with every kind of value: joined, partial, missing tenant and hosts, flags,
    retried attempts, per-request objectives, a cold start, control modes and verdicts,
    client attempts and logical ids, awkward floats and strings."""
    replace = msgspec.structs.replace
    joined = build_record("a", received("a"), completed("a"), finished("a"))
    partial = build_record("b", received("b", tenant=None), completed("b"), None)
    engine_only = build_record("c", None, None, finished("c"))
    return [
        joined,
        partial,
        engine_only,
        replace(joined, request_id="d", flags=("e2e_lt_queue", "negative_gateway_overhead")),
        replace(joined, request_id="e", attempt=2, superseded=True, revision=3),
        replace(
            joined,
            request_id="f",
            slo_ttft_ms=250.0,
            slo_tpot_ms=30.5,
            cold_start_unix_ns=1_700_000_000_123_456_789,
        ),
        replace(
            joined,
            request_id='g "quoted" \\ \u00e9\u4e2d',
            queue_ms=0.1 + 0.2,
            tpot_ms=1e-300,
            gateway_total_ms=123456.78901234567,
            tenant="t\nx",
        ),
        replace(partial, request_id="h", gateway_host=None, engine_host=None, stream=None),
        replace(joined, request_id="i", control_mode="shadow", control_verdict="admission"),
        replace(
            partial,
            request_id="j",
            control_mode="enforce",
            control_verdict="rate_limit",
            outcome="rejected",
            http_status=429,
        ),
        replace(partial, request_id="k", control_mode="shadow"),
        replace(joined, request_id="l~retry2", client_attempt=2, logical_request_id="l"),
        replace(partial, request_id="m", logical_request_id='idem "\u00e9"\t\\'),
    ]


def test_json_insert_stores_what_the_column_insert_stores(tmp_path: Path) -> None:
    store = st.open_store(Settings(store_dir=tmp_path / "store"))
    try:
        st.migrate(store)
        assert store.embedded
        recs = _records()
        st.write_requests(store, recs)  # the embedded path: JSON into the engine
        by_json = store.query_rows(_ALL)
        store.command("TRUNCATE TABLE tailguard.requests")
        st._insert_columns(store, "requests", st.REQUEST_COLUMNS, st.request_columns(recs))
        by_columns = store.query_rows(_ALL)
        assert len(by_json) == len(recs)
        assert by_json == by_columns
        # and each row reads back as its record
        back = {(r.request_id, r.attempt): r for r in map(st.record_from_row, by_json)}
        for rec in recs:
            assert back[rec.request_id, rec.attempt] == rec
    finally:
        store.close()


@pytest.mark.parametrize("twice", [False, True], ids=["each request once", "a request twice"])
def test_a_batch_stores_one_row_per_request_as_the_column_insert_does(
    tmp_path: Path, twice: bool
) -> None:
    """The JSON insert skips the engine's in-block merge only for a batch without a repeated
    request: a partial record and its joined upgrade in one batch still leave one row, the
    upgrade, in the part written (no FINAL, no background merge), as the column-wise
    insert does."""
    store = st.open_store(Settings(store_dir=tmp_path / "store"))
    try:
        st.migrate(store)
        recs = _records()
        if twice:  # request "b" again, joined now (same attempt, a higher revision)
            upgrade = build_record("b", received("b", tenant=None), completed("b"), finished("b"))
            recs.append(upgrade)
        st.write_requests(store, recs)
        by_json = store.query_rows(_ALL)
        store.command("TRUNCATE TABLE tailguard.requests")
        st._insert_columns(store, "requests", st.REQUEST_COLUMNS, st.request_columns(recs))
        assert by_json == store.query_rows(_ALL)
        assert len(by_json) == len(_records())
        rows = {r.request_id: r for r in map(st.record_from_row, by_json)}
        assert rows["b"] == recs[-1 if twice else 1]
        parts = "SELECT count() FROM system.parts WHERE active AND table = 'requests'"
        assert store.query_rows(parts) == [(1,)]  # one part: nothing merged in the background
    finally:
        store.close()


def test_version_sql_is_store_version(tmp_path: Path) -> None:
    store = st.open_store(Settings(store_dir=tmp_path / "store"))
    try:
        for revision in range(4):
            for superseded in (False, True):
                for conflicts in (0, 1, 3):
                    sql = f"SELECT {st.REQUEST_VERSION_SQL} FROM (SELECT {revision} AS revision, "
                    sql += f"CAST({int(superseded)}, 'Bool') AS superseded, "
                    sql += f"CAST({conflicts}, 'UInt16') AS conflicts)"
                    want = store_version(revision, superseded, conflicts > 0)
                    assert store.query_rows(sql) == [(want,)], (revision, superseded, conflicts)
                    assert revision_of_version(want) == revision
    finally:
        store.close()
