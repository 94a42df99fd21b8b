"""docs/schema.md's tables section is what the migrations make (issue 50)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.dev import schema_doc

PAGE = Path(__file__).resolve().parents[2] / "docs" / "schema.md"


def test_the_schema_page_is_what_the_migrations_make() -> None:
    text = PAGE.read_text()
    assert schema_doc.replace_block(text, schema_doc.generate()) == text, (
        "docs/schema.md is stale: run `python -m tools.dev.schema_doc --write docs/schema.md`"
    )


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "CREATE MATERIALIZED VIEW tailguard.slo_1m_mv TO tailguard.slo_1m AS SELECT x "
            "FROM tailguard.slo_windows GROUP BY x",
            "`slo_windows` → `slo_1m`",
        ),
        ("CREATE MATERIALIZED VIEW v TO t AS SELECT 1 FROM s", "`s` → `t`"),
    ],
)
def test_a_view_line_names_its_source_and_target(sql: str, expected: str) -> None:
    assert schema_doc._mv_line(sql) == expected


def test_a_table_without_a_line_is_refused() -> None:
    class OneTable:
        def query_rows(self, sql: str, params: object) -> list[tuple[object, ...]]:
            if "system.tables" in sql:
                return [("mystery", "MergeTree", "k", "", "MergeTree ORDER BY k", "CREATE")]
            return []

    with pytest.raises(SystemExit, match="mystery"):
        schema_doc.render(OneTable())  # type: ignore[arg-type]
