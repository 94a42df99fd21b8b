"""SQL over stored sketch rows (embedded ClickHouse, chDB) agrees with the Python sketch.

chDB keeps one engine per process and it can only be opened on one data directory
at a time: while another client on a *different* directory is open, opening fails
("EmbeddedServer already initialized with path ..."); after that client is closed,
a new directory opens fine. So this module opens one client for all its tests
(module fixture) and closes it at the end, like the other chDB tests close theirs.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from pipeline.adapters.sketch_sql import (
    SKETCH_TABLE_DDL_EXAMPLE,
    count_sql,
    float_literal,
    merged_state_sql,
    quantile_from_merged_sql,
    quantile_key_sql,
    quantile_sql,
    sketch_column_defs,
    sketch_insert_columns,
    value_of_key_sql,
)
from pipeline.core.sketch import QuantileSketch, bucket_value, mapping_constants

pytestmark = pytest.mark.integration

DB = "tg_sketch_test"
WINDOWS = range(6)
PARTS = range(4)
QS = (0.0, 0.001, 0.05, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ProgrammingError

    path = tmp_path_factory.mktemp("chdb-sketch")
    try:
        c = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    except ProgrammingError as exc:  # pragma: no cover - depends on test order
        pytest.fail(
            f"cannot open chDB at {path}: {exc}; another test left a chDB client open "
            "on a different directory (chDB allows one per process at a time)"
        )
    c.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    try:
        yield c
    finally:
        c.command(f"DROP DATABASE IF EXISTS {DB}")
        c.close()


def _window_sketch(rng: np.random.Generator, win: int, part: int) -> QuantileSketch:
    s = QuantileSketch()
    if (win, part) == (2, 3):
        return s  # an empty sketch row: must not disturb anything
    n = int(rng.integers(50, 3_000))
    latencies = np.clip(np.exp(rng.normal(math.log(300.0 * (1 + win)), 1.2, n)), 5.0, 60_000.0)
    parts = [latencies]
    if part == 1:
        parts.append(np.zeros(int(rng.integers(1, 40))))  # e.g. zero queue time
    if part == 2 or win == 4:
        parts.append(-rng.exponential(2.0, int(rng.integers(1, n // 3 + 2))))  # clock skew
    if (win, part) == (5, 0):
        parts = [-rng.exponential(2.0, 200)]  # only negatives
    values = np.concatenate(parts)
    rng.shuffle(values)
    s.add_many(values)
    return s


@pytest.fixture(scope="module")
def sketches(client: Any) -> dict[tuple[int, int], QuantileSketch]:
    rng = np.random.default_rng(99)
    by_key = {(w, p): _window_sketch(rng, w, p) for w in WINDOWS for p in PARTS}
    client.command(
        f"CREATE TABLE {DB}.sk (win UInt32, part UInt8,\n{sketch_column_defs()})"
        " ENGINE = MergeTree ORDER BY (win, part)"
    )
    for w in WINDOWS:  # one insert per window: several parts, merged in any order
        keys = [(w, p) for p in PARTS]
        names, types, cols = sketch_insert_columns([by_key[k].to_columns() for k in keys])
        client.insert(
            "sk",
            [[k[0] for k in keys], [k[1] for k in keys], *cols],
            column_names=["win", "part", *names],
            column_type_names=["UInt32", "UInt8", *types],
            column_oriented=True,
            database=DB,
        )
    return by_key


def _merged(
    sketches: dict[tuple[int, int], QuantileSketch], keys: list[tuple[int, int]]
) -> QuantileSketch:
    out = QuantileSketch()
    for k in keys:
        out.merge(sketches[k])
    return out


def _select_quantiles(where: str = "1", group_by: str | None = None) -> str:
    cols = ", ".join(f"{quantile_sql(q)}, {quantile_key_sql(q)}" for q in QS)
    head = f"{group_by}, " if group_by else ""
    tail = f" GROUP BY {group_by} ORDER BY {group_by}" if group_by else ""
    return f"SELECT {head}{count_sql()}, {cols} FROM {DB}.sk WHERE {where}{tail}"


def _check_row(row: tuple[Any, ...], expected: QuantileSketch) -> None:
    count, rest = row[0], row[1:]
    assert count == expected.count
    for i, q in enumerate(QS):
        sql_value, sql_key = rest[2 * i], rest[2 * i + 1]
        py_value, py_key = expected.quantile(q), expected.quantile_bucket(q)
        if py_value is None:
            assert sql_value is None
            assert sql_key is None
            continue
        # the bucket: exact, always
        assert tuple(sql_key) == py_key, (q, sql_key, py_key)
        assert bucket_value(*tuple(sql_key)) == py_value
        # the value: ClickHouse's pow() may round 1-2 ulp away from the C library's
        assert abs(sql_value - py_value) <= 2 * math.ulp(py_value), (q, sql_value, py_value)
        assert f"{sql_value:.12g}" == f"{py_value:.12g}"


def test_sql_quantile_of_one_window_equals_python(
    client: Any, sketches: dict[tuple[int, int], QuantileSketch]
) -> None:
    rows = client.query(_select_quantiles(group_by="win")).result_rows
    assert [r[0] for r in rows] == list(WINDOWS)
    for row in rows:
        w = row[0]
        _check_row(row[1:], _merged(sketches, [(w, p) for p in PARTS]))


def test_sql_quantile_of_one_partition_row_equals_python(
    client: Any, sketches: dict[tuple[int, int], QuantileSketch]
) -> None:
    for w, p in [(0, 0), (4, 2), (5, 0), (2, 1)]:
        rows = client.query(_select_quantiles(where=f"win = {w} AND part = {p}")).result_rows
        _check_row(rows[0], sketches[(w, p)])


def test_sql_over_merged_windows_equals_python_merge(
    client: Any, sketches: dict[tuple[int, int], QuantileSketch]
) -> None:
    everything = _merged(sketches, list(sketches))
    _check_row(client.query(_select_quantiles()).result_rows[0], everything)
    some = [(w, p) for w in (1, 2, 3) for p in PARTS]
    _check_row(
        client.query(_select_quantiles(where="win BETWEEN 1 AND 3")).result_rows[0],
        _merged(sketches, some),
    )
    for row in client.query(_select_quantiles(group_by="part")).result_rows:
        p = row[0]
        _check_row(row[1:], _merged(sketches, [(w, p) for w in WINDOWS]))


def test_no_rows_and_empty_rows_give_null(
    client: Any, sketches: dict[tuple[int, int], QuantileSketch]
) -> None:
    assert sketches[(2, 3)].count == 0
    for where in ("win = 999", "win = 2 AND part = 3"):
        row = client.query(_select_quantiles(where=where)).result_rows[0]
        assert row[0] == 0
        assert all(v is None for v in row[1:])


def test_prefix_and_merged_state_forms(
    client: Any, sketches: dict[tuple[int, int], QuantileSketch]
) -> None:
    expected = _merged(sketches, [(w, p) for w in WINDOWS for p in PARTS if w >= 3])
    # a table alias as prefix
    aliased = client.query(
        f"SELECT {quantile_sql(0.99, prefix='s.')} FROM {DB}.sk AS s WHERE s.win >= 3"
    ).result_rows[0][0]
    # merge in a subquery, walk outside
    pos, neg, zero = merged_state_sql()
    outer = quantile_from_merged_sql(0.99, "pm", "nm", "z")
    staged = client.query(
        f"SELECT {outer} FROM (SELECT {pos} AS pm, {neg} AS nm, {zero} AS z "
        f"FROM {DB}.sk WHERE win >= 3)"
    ).result_rows[0][0]
    direct = client.query(f"SELECT {quantile_sql(0.99)} FROM {DB}.sk WHERE win >= 3").result_rows[
        0
    ][0]
    assert aliased == staged == direct
    py = expected.quantile(0.99)
    assert py is not None
    assert abs(direct - py) <= 2 * math.ulp(py)


def test_constants_round_trip_and_key_values_agree_for_every_key(client: Any) -> None:
    rng = np.random.default_rng(1)
    for ra in (0.01, 0.02):
        c = mapping_constants(ra)
        probes = [c.gamma, c.multiplier, c.offset, c.value_factor, 0.999, 1e-5, -2.5]
        probes += rng.normal(0, 1e6, 20).tolist()
        got = client.query("SELECT " + ", ".join(float_literal(x) for x in probes)).result_rows
        assert list(got[0]) == probes  # repr literals parse back bit for bit
        # every key the mapping can produce
        n = c.max_key - c.min_key + 1
        rows = client.query(
            f"SELECT toInt32(number) + ({c.min_key}) AS k, {value_of_key_sql('k', ra)} "
            f"FROM numbers({n}) ORDER BY k"
        ).result_rows
        assert len(rows) == n
        exact = 0
        for key, sql_value in rows:
            py_value = bucket_value(1, key, ra)
            exact += sql_value == py_value
            assert abs(sql_value - py_value) <= 2 * math.ulp(py_value), key
            assert f"{sql_value:.12g}" == f"{py_value:.12g}", key
        assert exact / n > 0.99  # the rest are 1-2 ulp away (ClickHouse pow vs libm pow)


def test_example_ddl_is_valid_and_dedups_with_final(client: Any) -> None:
    ddl = string.Template(SKETCH_TABLE_DDL_EXAMPLE).substitute(
        db=DB, on_cluster="", replicated="", replica_args=""
    )
    ddl = "\n".join(line for line in ddl.splitlines() if not line.lstrip().startswith("--"))
    client.command(ddl)
    s = QuantileSketch()
    s.add_many(np.arange(1.0, 1001.0))
    names, types, cols = sketch_insert_columns([s.to_columns()])
    start = datetime(2025, 1, 1, tzinfo=UTC)
    ident = [[start], [60], ["m"], ["gateway_total_ms"], [0], [0.01]]
    ident_names = ["window_start", "window_seconds", "model", "boundary", "partition"]
    ident_names.append("relative_accuracy")
    ident_types = ["DateTime('UTC')", "UInt32", "LowCardinality(String)"]
    ident_types += ["LowCardinality(String)", "UInt16", "Float64"]
    for _ in range(2):  # a replayed write
        client.insert(
            "latency_sketches",
            [*ident, *cols],
            column_names=[*ident_names, *names],
            column_type_names=[*ident_types, *types],
            column_oriented=True,
            database=DB,
        )
    row = client.query(
        f"SELECT {count_sql()}, {quantile_sql(0.99)} FROM {DB}.latency_sketches FINAL"
    ).result_rows[0]
    assert row[0] == 1000
    assert f"{row[1]:.12g}" == f"{s.quantile(0.99):.12g}"
