"""``tailguard sql "..."``: read-only SQL against the store, as a table, TSV or JSON.

A query ending in its own ``FORMAT X`` is answered in that format, as ClickHouse
writes it (``--format`` is then ignored). ``--format tsv`` is ClickHouse's
``TabSeparatedWithNames``: backslash, tab, newline, carriage return, NUL,
backspace and form feed inside a value are escaped (``\\\\ \\t \\n \\r \\0 \\b \\f``),
NULL is ``\\N``, so every row is one line and :func:`parse_tsv` reads it back.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import orjson

_USER_FORMAT_RE = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*;?\s*$", re.IGNORECASE)
_TSV_ESCAPES = {
    "\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0", "\b": "\\b", "\f": "\\f",
}  # fmt: skip
_TSV_UNESCAPES = {v[1]: k for k, v in _TSV_ESCAPES.items()}
_TSV_ESCAPE_RE = re.compile("[\\\\\t\n\r\0\b\f]")
_TSV_UNESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def user_format(sql: str) -> str | None:
    """The query's own trailing ``FORMAT X``, if it has one."""
    m = _USER_FORMAT_RE.search(sql.strip())
    return m.group(1) if m else None


def run(client: Any, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows, from a clickhouse-connect client
    (:func:`pipeline.adapters.query_server.read_only_client`)."""
    result = client.query(sql)
    return list(result.column_names), [tuple(r) for r in result.result_rows]


def run_raw(client: Any, sql: str) -> bytes:
    """The answer to a query that names its own format, as the engine wrote it."""
    return bytes(client.raw_query(sql))


def clean_error(text: str) -> str:
    """One line from a ClickHouse (or clickhouse-connect) error: the engine's message and
    code, without the client's URL, the repeated ``Code: N. DB::Exception:`` prefixes,
    the server version or the ``FORMAT Native`` the client appends to each query."""
    code = re.search(r"(?i)\bcode:? (\d+)", text)
    i = text.rfind("DB::Exception: ")
    message = text[i + len("DB::Exception: ") :] if i >= 0 else text
    message = re.sub(r"\s*\(for url [^)]*\)", "", message)
    message = re.sub(r"https?://127\.0\.0\.1:\d+\S*", "the store", message)
    message = re.sub(r"\s*\(version [^)]*\)", "", message)
    message = re.sub(r"\s*\bFORMAT Native\b", "", message)
    message = re.sub(
        r"(Expected one of: )((?:[^,:]+, ){6})[^:]*?(?=: |\. \(|$)", r"\1\2...", message
    )
    message = " ".join(message.split()).rstrip(". ")
    return f"{message} (code {code.group(1)})" if code else message


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


def tsv_field(v: Any) -> str:
    """One value as a TabSeparated field (ClickHouse's escaping)."""
    if v is None:
        return "\\N"
    p = _plain(v)
    text = orjson.dumps(p).decode() if isinstance(p, list | dict) else str(p)
    return _TSV_ESCAPE_RE.sub(lambda m: _TSV_ESCAPES[m.group(0)], text)


def tsv_unescape(field: str) -> str | None:
    """A TabSeparated field back to its text (``\\N`` -> None)."""
    if field == "\\N":
        return None
    return _TSV_UNESCAPE_RE.sub(lambda m: _TSV_UNESCAPES.get(m.group(1), m.group(1)), field)


def to_tsv(names: list[str], rows: list[tuple[Any, ...]]) -> str:
    lines = ["\t".join(tsv_field(n) for n in names)]
    lines += ["\t".join(tsv_field(v) for v in r) for r in rows]
    return "\n".join(lines) + "\n"


def parse_tsv(text: str) -> tuple[list[str], list[list[str | None]]]:
    """:func:`to_tsv`'s output read back (names, rows of texts)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    names = [tsv_unescape(f) or "" for f in lines[0].split("\t")] if lines else []
    return names, [[tsv_unescape(f) for f in line.split("\t")] for line in lines[1:]]


def render(names: list[str], rows: list[tuple[Any, ...]]) -> Any:
    from rich.table import Table

    t = Table(caption=f"{len(rows)} row{'' if len(rows) == 1 else 's'}")
    for n in names:
        t.add_column(n, overflow="fold")  # wrap, never cut, a long value
    for r in rows:
        t.add_row(*("NULL" if v is None else str(_plain(v)) for v in r))
    return t
