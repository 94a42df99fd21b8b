"""The CLI is one table of commands (pipeline/app/commands/): ``tailguard --help`` lists
each, each one's ``--help`` works, and ``pipeline/cli.py`` only builds the parser from the
table and dispatches."""

from __future__ import annotations

import re

import pytest

from pipeline.app.commands import COMMANDS
from pipeline.cli import build_parser, main
from tests.paths import REPO

NAMES = [c.name for c in COMMANDS]
MAX_CLI_LINES = 200  # issue 50: cli.py only dispatches


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _listed(top_help: str) -> list[str]:
    """The commands the top ``--help`` lists, in its order (one indented line each)."""
    section = top_help.split("positional arguments:", 1)[1]
    return re.findall(r"^    ([a-z][a-z-]*)\b", section, flags=re.MULTILINE)


def test_top_help_lists_every_command_in_the_table_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _listed(_help(["--help"], capsys)) == NAMES


def test_the_listing_check_sees_a_missing_command() -> None:
    """``_listed`` reads the listing itself: a command left out is not found."""
    text = "usage: x\n\npositional arguments:\n  {a,b}\n    a     does a\n\noptions:\n"
    assert _listed(text) == ["a"]


@pytest.mark.parametrize("name", NAMES)
def test_every_command_has_a_working_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _help([name, "--help"], capsys)
    assert out.startswith(f"usage: tailguard {name}")
    one_line = " ".join(out.split())
    assert "-h, --help" in one_line


def test_the_table_has_one_row_per_name_and_the_parser_takes_them_all() -> None:
    assert len(set(NAMES)) == len(NAMES)
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == NAMES  # type: ignore[arg-type]
    for command in COMMANDS:
        parsed = sub.choices[command.name]  # type: ignore[index]
        assert parsed.get_default("func") is command.run


def test_cli_module_only_dispatches() -> None:
    lines = len((REPO / "pipeline" / "cli.py").read_text().splitlines())
    assert lines <= MAX_CLI_LINES, f"pipeline/cli.py is {lines} lines: commands go in app/commands/"
