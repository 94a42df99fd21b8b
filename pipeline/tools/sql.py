"""``tailguard sql "..."``: read-only SQL against the store, as a table, TSV or JSON."""

from __future__ import annotations

import datetime as dt
from typing import Any


def run(client: Any, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows, from a clickhouse-connect client
    (:func:`pipeline.adapters.query_server.read_only_client`)."""
    result = client.query(sql)
    return list(result.column_names), [tuple(r) for r in result.result_rows]


def _plain(v: Any) -> Any:
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


def to_json(names: list[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [{n: _plain(v) for n, v in zip(names, r, strict=True)} for r in rows]


def to_tsv(names: list[str], rows: list[tuple[Any, ...]]) -> str:
    lines = ["\t".join(names)]
    lines += ["\t".join("\\N" if v is None else str(_plain(v)) for v in r) for r in rows]
    return "\n".join(lines) + "\n"


def render(names: list[str], rows: list[tuple[Any, ...]]) -> Any:
    from rich.table import Table

    t = Table(caption=f"{len(rows)} row{'' if len(rows) == 1 else 's'}")
    for n in names:
        t.add_column(n)
    for r in rows:
        t.add_row(*("NULL" if v is None else str(_plain(v)) for v in r))
    return t
