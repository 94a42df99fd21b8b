"""The ``requests`` table: its columns (the record's fields, typed from their annotations),
the records' rows both ways, and their writer (JSON lines into the embedded engine,
column-wise otherwise)."""

from __future__ import annotations

import operator
import time
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from pipeline.core.record import CONFLICTED_VERSION, RequestRecord, revision_of_version

from .inserts import _JSON, _NO_INSERT_MERGE, _insert_columns
from .protocol import Store, file_inserts
from .retry import with_retry

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
    "control_mode": "LowCardinality(Nullable(String))",
    "control_verdict": "LowCardinality(Nullable(String))",
    "client_attempt": "UInt16",
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


# Positions in a row of the columns record_from_row converts (the columns are the record's
# fields, in its order: the record is built positionally, without a dict per row; on a
# month of requests the dict's version cost ~35 µs a row, issue 53).
_EMPTY_IF_NONE_AT: Final = tuple(i for i, n in enumerate(_REQUEST_NAMES) if n in _EMPTY_IF_NONE)
_FLAGS_AT: Final = _REQUEST_NAMES.index("flags")
_REVISION_AT: Final = _REQUEST_NAMES.index("revision")


def _none_if_empty(v: Any) -> Any:
    return v or None


# A stored value as the record's: by position, the columns whose value is not the field's
# as stored ("" for a missing tenant or host, the flags' array, the store version:
# store_version); the others are the field's value as they are.
_FROM_STORED: Final[tuple[tuple[int, Callable[[Any], Any]], ...]] = (
    *((i, _none_if_empty) for i in _EMPTY_IF_NONE_AT),
    (_FLAGS_AT, tuple),
    (_REVISION_AT, revision_of_version),
)


def record_from_row(row: Sequence[Any]) -> RequestRecord:
    """A ``requests`` row (columns in :data:`REQUEST_COLUMNS` order) as its record."""
    if len(row) != len(_REQUEST_NAMES):
        raise ValueError(f"a requests row has {len(_REQUEST_NAMES)} columns, got {len(row)}")
    v = list(row)
    for i, convert in _FROM_STORED:
        v[i] = convert(v[i])
    return RequestRecord(*v)


def records_from_columns(columns: Sequence[Sequence[Any]]) -> list[RequestRecord]:
    """``requests`` columns (:data:`REQUEST_COLUMNS` order) as their records: what
    :func:`record_from_row` makes of each row, column by column (one C-level pass per
    converted column, none for the others; no row tuples)."""
    if len(columns) != len(_REQUEST_NAMES):
        raise ValueError(f"requests has {len(_REQUEST_NAMES)} columns, got {len(columns)}")
    fields = list(columns)
    for i, convert in _FROM_STORED:
        fields[i] = list(map(convert, fields[i]))
    return list(map(RequestRecord, *fields))


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
_REQUEST_ID = operator.attrgetter("request_id")


def write_requests(store: Store, records: Sequence[RequestRecord]) -> None:
    if not records:
        return
    # JSON by field name needs records msgspec encodes by name (the core's RequestRecord);
    # anything else that has the attributes goes column-wise
    files = file_inserts(store)
    if files is not None and all(type(r) is RequestRecord for r in records):
        # one record per request id: none repeats the key (request_id, attempt)
        unique = len(set(map(_REQUEST_ID, records))) == len(records)
        files.insert_from_file(
            "requests", _REQUEST_NAMES, _REQUEST_SELECT, _JSON.encode(records), fmt="JSONEachRow",
            structure=_REQUEST_STRUCTURE, settings=_NO_INSERT_MERGE if unique else None,
        )  # fmt: skip
    else:
        _insert_columns(store, "requests", REQUEST_COLUMNS, request_columns(records))


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
