"""tools/dev/admission_scenarios.py's selection (issue 52): ``--seed`` reaches the
simulator, ``--run`` runs only the named runs, and a name that no chosen scenario has is
an error, not an empty table. The backtest itself is stubbed: nothing here runs a loop."""

from __future__ import annotations

from typing import Any

import pytest

from tools.dev import admission_scenarios as tool


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """(seed, loop) of every run_loop call; the trace read is stubbed too."""
    seen: list[tuple[int, str]] = []

    def run_loop(_trace: Any, config: Any, *_a: Any, loop: str, **_k: Any) -> dict[str, Any]:
        seen.append((config.seed, loop))
        return {"loop": loop}

    monkeypatch.setattr(tool, "run_loop", run_loop)
    monkeypatch.setattr(tool, "read_trace", lambda _path: [])
    return seen


@pytest.mark.parametrize(
    ("scenario", "seed", "only", "expected"),
    [
        # every run of the scenario, seed 0 by default
        ("deadline", 0, None, ["no control", "static levels", "AIMD", "tailguard today",
                               "tailguard deadline"]),
        # the flood check's two runs, on another seed
        ("flood", 2, {"tailguard, no flood", "tailguard fair"},
         ["tailguard, no flood", "tailguard fair"]),
        # a run of another scenario: none of this one's
        ("normal", 1, {"tailguard fair"}, []),
    ],
)  # fmt: skip
def test_run_selects_runs_and_seed(
    calls: list[tuple[int, str]], scenario: str, seed: int, only: set[str] | None,
    expected: list[str],
) -> None:  # fmt: skip
    out = tool.run(scenario, seed, only)
    assert list(out) == expected
    assert [s for s, _ in calls] == [seed] * len(expected)


@pytest.mark.parametrize(
    "argv",
    [
        ["nosuch"],  # unknown scenario
        ["flood", "--run", "tailguard deadline"],  # a run the flood scenario does not have
        ["--run", "tailguard, no flood", "--run", "typo"],  # one name unknown
    ],
)
def test_unknown_names_are_errors(calls: list[tuple[int, str]], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        tool.main(argv)
    assert e.value.code == 2
    assert calls == []  # refused before any run
