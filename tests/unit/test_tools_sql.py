"""``tailguard sql``'s output and error formatting (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.app.sql import clean_error, parse_tsv, to_tsv, tsv_field, user_format


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("plain", "plain"),
        ("a\nb", "a\\nb"),
        ("a\tb", "a\\tb"),
        ("back\\slash", "back\\\\slash"),
        ("cr\r", "cr\\r"),
        ("nul\0", "nul\\0"),
        ("\\N", "\\\\N"),  # the text \N is not NULL
        (None, "\\N"),
        (3, "3"),
        (["a\tb", 1], '["a\\\\tb",1]'),
    ],
)
def test_tsv_field_escapes_like_clickhouse(value: object, field: str) -> None:
    assert tsv_field(value) == field


@given(
    st.lists(st.text(), min_size=1, max_size=4).flatmap(
        lambda names: st.tuples(
            st.just(names),
            st.lists(
                st.lists(st.one_of(st.none(), st.text()), min_size=len(names), max_size=len(names)),
                max_size=5,
            ),
        )
    )
)
def test_tsv_round_trips_any_text(data: tuple[list[str], list[list[str | None]]]) -> None:
    names, rows = data
    out = to_tsv(names, [tuple(r) for r in rows])
    assert out.count("\n") == len(rows) + 1  # one line per row, whatever the values hold
    assert parse_tsv(out) == (names, rows)


@pytest.mark.parametrize(
    ("sql", "fmt"),
    [
        ("SELECT 1 FORMAT JSON", "JSON"),
        ("SELECT 1 format JSONEachRow;", "JSONEachRow"),
        ("SELECT 1\nFORMAT  CSV\n", "CSV"),
        ("SELECT 'FORMAT JSON'", None),
        ("SELECT 1", None),
    ],
)
def test_user_format(sql: str, fmt: str | None) -> None:
    assert user_format(sql) == fmt


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        (
            "Received ClickHouse exception, code: 164, server response: Code: 164. "
            "DB::Exception: the query port runs reads only (SELECT), not DROP "
            "(for url http://127.0.0.1:41001)",
            "the query port runs reads only (SELECT), not DROP (code 164)",
        ),
        (
            "HTTPDriver for http://127.0.0.1:5555 received ClickHouse error code 62\n"
            " Code: 62. DB::Exception: Code: 62. DB::Exception: Syntax error: failed at "
            "position 8 ('JSON'): JSON\n FORMAT Native. Expected one of: a, b, c, d, e, f, g, "
            "h, i. (SYNTAX_ERROR) (version 26.9.2.1)",
            "Syntax error: failed at position 8 ('JSON'): JSON. Expected one of: a, b, c, d, "
            "e, f, .... (SYNTAX_ERROR) (code 62)",
        ),
        ("no store at /x", "no store at /x"),
    ],
)
def test_clean_error_is_one_line_without_internals(raw: str, clean: str) -> None:
    out = clean_error(raw)
    assert out == clean
    assert "\n" not in out
    assert "127.0.0.1" not in out
    assert "FORMAT Native" not in out
