"""docs/report.md's ``budget_allowed`` says exactly what the report computes (issue 51: it
said ``(1 − objective) × total``, the figure of a report without a spec only): each row of
its *Budget figures* table, the formula as written there, equals
:func:`pipeline.core.budget.window_budget`'s allowance (the one the report shows) case by
case."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from pipeline.core.budget import window_budget
from pipeline.spec.slo import Window
from tests.paths import REPO

H_MS = 3_600_000
D_MS = 24 * H_MS
END_MS = 1_764_547_200_000 + 20 * D_MS + 2 * H_MS  # 2025-12-21T02:00Z: a month under way
OBJECTIVE = 0.99

# basis -> the formula as docs/report.md writes it
DOC: dict[str, str] = {
    "observed": "(1 − objective) × `n`",
    "expected": "max((1 − objective) × `E`, (1 − objective) × `n`)",
    "projected": "(1 − objective) × `n` × `W` / max(`seen`, min(1 h, `W` / 12))",
}
Formula = Callable[[int, int | None, int, int], float]  # (n, E, W ms, seen ms) -> allowed
FORMULA: dict[str, Formula] = {
    "observed": lambda n, e, w, seen: (1 - OBJECTIVE) * n,
    "expected": lambda n, e, w, seen: max((1 - OBJECTIVE) * (e or 0), (1 - OBJECTIVE) * n),
    "projected": lambda n, e, w, seen: (1 - OBJECTIVE) * n * w / max(seen, min(H_MS, w // 12)),
}


@pytest.mark.parametrize(
    ("window", "w_ms", "seen_ms", "n", "expected", "basis"),
    [
        (Window(rolling="1h"), H_MS, H_MS, 5000, None, "observed"),
        (Window(rolling="1h"), H_MS, H_MS, 5000, 10**9, "observed"),  # E ignored once seen
        (Window(rolling="30d"), 30 * D_MS, 2 * H_MS, 5000, None, "projected"),
        (Window(rolling="30d"), 30 * D_MS, 10 * 60_000, 5000, None, "projected"),  # 1 h floor
        (Window(rolling="1h"), H_MS, 2 * 60_000, 5000, None, "projected"),  # W / 12 floor
        (Window(calendar="month"), 31 * D_MS, 20 * D_MS + 2 * H_MS, 5000, None, "projected"),
        (Window(calendar="month"), 31 * D_MS, 3 * H_MS, 5000, None, "projected"),  # data late
        (Window(rolling="30d"), 30 * D_MS, 2 * H_MS, 5000, 2_000_000, "expected"),
        (Window(rolling="30d"), 30 * D_MS, 2 * H_MS, 5000, 10, "expected"),  # more seen
    ],
)
def test_budget_allowed_is_what_the_doc_says(
    window: Window, *, w_ms: int, seen_ms: int, n: int, expected: int | None, basis: str
) -> None:
    first_ms = END_MS - seen_ms  # the first minute with data
    _, allowance = window_budget(
        OBJECTIVE, window, total=n, bad=10.0, first_ms=first_ms, now_ms=END_MS,
        expected_requests=expected,
    )  # fmt: skip
    assert allowance is not None
    assert allowance.basis == basis
    assert allowance.allowed == pytest.approx(FORMULA[basis](n, expected, w_ms, seen_ms))


def test_the_doc_writes_each_basis_formula() -> None:
    text = (REPO / "docs" / "report.md").read_text(encoding="utf-8")
    assert "`budget_allowed` ((1 − objective) × total)" not in text
    rows = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", text, flags=re.M)
    }
    for basis, formula in DOC.items():
        assert rows.get(basis) == formula, (basis, rows.get(basis))
