"""The statement from columns (``StatementRows`` as a store reader gives them: arrays,
coded columns, in any order; issue 53) is the statement from the records; its digest
(statement version 3) depends on the values and their order only, never on the form of
the columns, and changes with any value; ``Categorical`` and ``RecordColumns.of_fields``
answer as the records do."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.record import RequestRecord
from pipeline.core.slo import (
    CLASSIFY_FIELDS,
    Categorical,
    RecordColumns,
    SLOMatcher,
    boundary_table,
)
from pipeline.core.statement import (
    STATEMENT_FIELDS,
    BudgetEventRow,
    LevelChange,
    StatementRows,
    compute_statement,
)
from tests.unit.test_statement import SPEC, contract, rec
from tests.unit.test_statement_columnar import MIN_NS, NOV_2026_NS, messy_record

_INTS = ("attempt", "end_unix_ns", "ts_unix_ns")


def reader_rows(records: list[RequestRecord]) -> StatementRows:
    """The records' columns in their order, in the forms a store reader gives: never-missing
    integers and ids as numpy arrays, optional numbers as object arrays, the others coded."""
    fields: dict[str, Any] = {}
    for name in STATEMENT_FIELDS:
        values = [getattr(r, name) for r in records]
        if name in _INTS:
            fields[name] = np.array(values, dtype=np.int64)
        elif name in ("request_id", "prompt_tokens", "cold_start_unix_ns"):
            fields[name] = np.array([*values, None], dtype=object)[:-1]
        else:
            fields[name] = Categorical.of(values)
    return StatementRows(fields, boundary_table(records))


@st.composite
def with_cold_starts(draw: st.DrawFn, i: int) -> RequestRecord:
    r = draw(messy_record(i))
    start = draw(st.sampled_from([None, None, NOV_2026_NS + 3 * MIN_NS, NOV_2026_NS + 99 * MIN_NS]))
    host = draw(st.sampled_from(["m-0", "m-1", None]))
    tenant = draw(st.sampled_from([r.tenant, r.tenant, None]))  # (a record of no tenant)
    return msgspec.structs.replace(r, cold_start_unix_ns=start, engine_host=host, tenant=tenant)


@st.composite
def records_and_order(draw: st.DrawFn) -> tuple[list[RequestRecord], list[int]]:
    n = draw(st.integers(0, 50))
    records = [draw(with_cold_starts(i)) for i in range(n)]
    return records, draw(st.permutations(range(n)))


def _window(start_min: int, end_min: int) -> dict[str, object]:
    at = NOV_2026_NS / 1e9
    return {
        "start": dt.datetime.fromtimestamp(at + start_min * 60, tz=dt.UTC),
        "end": dt.datetime.fromtimestamp(at + end_min * 60, tz=dt.UTC),
        "reason": "upgrade",
    }


def _statement(records: Any, zone: str) -> dict[str, Any]:
    c = contract(
        billing={"period": "month", "timezone": zone},
        exemptions={"cold_starts": {"max_per_day": 1}, "maintenance": [_window(60, 300)]},
        budget_exhausted={"lookback": "period"},
    )
    at_ms = (NOV_2026_NS + 20 * 1440 * MIN_NS) // 1_000_000
    s = compute_statement(
        tenant="acme", period="2026-11", contract=c, spec=SPEC, records=records,
        level_changes=[LevelChange("m", NOV_2026_NS // 1_000_000 + 5 * 60_000, 1, 2)],
        budget_events=[BudgetEventRow(n, "budget_exhausted", at_ms) for n in ("total", "compute")],
        observed_until_ns=None, inputs={},
    )  # fmt: skip
    out = s.to_json()
    assert isinstance(out, dict)
    return out


def _without_sums(doc: dict[str, Any]) -> dict[str, Any]:
    """The statement but its incidents' shares (sums of floats: their last bits follow
    the rows' order)."""
    incidents = [
        {k: v for k, v in i.items() if k not in ("queue_share", "compute_share")}
        for i in doc["incidents"]
    ]
    return dict(doc, incidents=incidents)


@settings(max_examples=120, deadline=None)
@given(data=records_and_order(), zone=st.sampled_from(["UTC", "America/New_York"]))
def test_the_statement_of_columns_is_the_statement_of_the_records(
    data: tuple[list[RequestRecord], list[int]], zone: str
) -> None:
    records, order = data
    want = _statement(records, zone)
    by_key = sorted(records, key=lambda r: (r.request_id, r.attempt))
    assert _statement(reader_rows(by_key), zone) == want
    shuffled = [records[i] for i in order]
    got = _statement(reader_rows(shuffled), zone)
    assert _without_sums(got) == _without_sums(want)
    for mine, theirs in zip(got["incidents"], want["incidents"], strict=True):
        for k in ("queue_share", "compute_share"):
            if theirs[k] is None:
                assert mine[k] is None
            else:
                assert mine[k] == pytest.approx(theirs[k], rel=1e-12, abs=1e-15)


@settings(max_examples=80, deadline=None)
@given(data=records_and_order())
def test_the_digest_follows_the_values_and_their_order_not_the_form(
    data: tuple[list[RequestRecord], list[int]],
) -> None:
    records, order = data
    shuffled = [records[i] for i in order]
    by_key = sorted(records, key=lambda r: (r.request_id, r.attempt))
    assert reader_rows(by_key).digest() == StatementRows.of_records(records).digest()
    assert (
        reader_rows(shuffled).digest()
        == StatementRows(
            {n: [getattr(r, n) for r in shuffled] for n in STATEMENT_FIELDS},
            boundary_table(shuffled),
        ).digest()
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("request_id", "r9x"), ("attempt", 7), ("tenant", None), ("model", "n"),
        ("end_unix_ns", NOV_2026_NS + 1), ("ts_unix_ns", NOV_2026_NS - 5),
        ("engine_host", "m-9"), ("cold_start_unix_ns", NOV_2026_NS), ("source", "engine_only"),
        ("outcome", "error"), ("superseded", True), ("priority", 3), ("ctx_bucket", ">16k"),
        ("stream", None), ("prompt_tokens", 12), ("gateway_total_ms", 100.5),
        ("queue_ms", None), ("tpot_ms", 0.0),
    ],
)  # fmt: skip
def test_the_digest_changes_with_any_value_it_covers(field: str, value: Any) -> None:
    a = [rec(f"r{i}", NOV_2026_NS + i * MIN_NS, priority=1, prompt_tokens=10, tpot_ms=3.0)
         for i in range(3)]  # fmt: skip
    b = [*a[:2], msgspec.structs.replace(a[2], **{field: value})]
    assert getattr(a[2], field) != value or field == "tpot_ms"
    assert StatementRows.of_records(a).digest() != StatementRows.of_records(b).digest()
    assert reader_rows(a).digest() != reader_rows(list(reversed(a))).digest()  # order too


def test_categorical_answers_as_its_values() -> None:
    values = ["a", None, "b", "a", True, False, 1, None]
    c = Categorical.of(values)
    assert list(c) == values
    assert [c[i] for i in range(len(values))] == values
    assert c.take(np.array([3, 1, 0])).tolist() == ["a", None, "a"]
    assert c.where(lambda v: v is None).tolist() == [v is None for v in values]
    twice = Categorical(np.array([0, 1, 2, 1]), ["x", None, "x"])  # "x" coded twice
    assert twice.where(lambda v: v == "x").tolist() == [True, False, True, False]


@settings(max_examples=100, deadline=None)
@given(data=records_and_order())
def test_classify_many_of_fields_is_classify_many_of_the_records(
    data: tuple[list[RequestRecord], list[int]],
) -> None:
    records, _ = data
    rows = reader_rows(records)
    for name in ("total", "compute"):
        m = SLOMatcher(SPEC.slo(name))
        got = m.classify_many(RecordColumns.of_fields(rows.fields, rows.boundaries))
        want = m.classify_many(RecordColumns(records))
        assert [x.tolist() for x in got] == [x.tolist() for x in want]


def test_a_batch_of_columns_without_a_field_says_which() -> None:
    rows = reader_rows([rec("a", NOV_2026_NS)])
    fields = {k: v for k, v in rows.fields.items() if k != "outcome"}
    with pytest.raises(KeyError, match="outcome"):
        SLOMatcher(SPEC.slo("total")).classify_many(
            RecordColumns.of_fields(fields, rows.boundaries)
        )
    assert set(CLASSIFY_FIELDS) <= set(STATEMENT_FIELDS)


def test_the_rows_order_does_not_change_exempted_or_worst() -> None:
    records = [
        rec(f"r{i}", NOV_2026_NS + (i % 7) * MIN_NS, took_ms=0, gateway_total_ms=float(i % 3) * 400,
            cold_start_unix_ns=NOV_2026_NS if i % 4 == 0 else None)
        for i in range(40)
    ]  # fmt: skip
    want = _statement(records, "UTC")
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(records)
        got = _statement(reader_rows(records), "UTC")
        assert got["exempted"] == want["exempted"]
        assert [i["worst"] for i in got["incidents"]] == [i["worst"] for i in want["incidents"]]
