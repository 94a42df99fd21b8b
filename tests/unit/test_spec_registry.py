"""pipeline.spec.registry: kinds found by module, `tailguard validate` dispatches through it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.spec.registry import DEFAULT_KIND, discover, kind_of, kinds, validate_path
from tests.paths import SPECS


def test_the_four_kinds_are_found() -> None:
    assert sorted(kinds()) == ["BurnRules", "Contract", "ControlPolicy", "SLOSpec"]
    assert DEFAULT_KIND in kinds()


@pytest.mark.parametrize(
    ("file", "kind", "message"),
    [
        ("slo-example.yaml", "SLOSpec", "ok: 7 SLOs, 1 blended tier"),
        ("slo-default.yaml", "SLOSpec", "ok: 5 SLOs, 0 blended tiers"),
        ("policy-default.yaml", "ControlPolicy", "ok: 3 levels, 3 enter / 7 exit conditions"),
        ("policy-static-levels.yaml", "ControlPolicy", "ok: 3 levels, 5 enter / 4 exit"),
        ("burn-rules.yaml", "BurnRules", "ok: burn rules"),
        ("contract-example.yaml", "Contract", "ok: contract, 4 tenants, 3 SLOs"),
    ],
)
def test_shipped_files_validate_as_their_kind(file: str, kind: str, message: str) -> None:
    assert kind_of(SPECS / file) == kind
    ok, text = validate_path(SPECS / file)
    assert ok, text
    assert text.startswith(message)
    assert text.endswith(f"({SPECS / file})")


@pytest.mark.parametrize(
    ("text", "kind", "line"),
    [
        ("", DEFAULT_KIND, "{f}: a spec must be a YAML mapping, got empty"),
        ("kind: [1\n", DEFAULT_KIND, "{f}: YAML error: while parsing a flow sequence"),
        # an unknown kind is validated as an SLO spec, which says which kind it wants
        ("apiVersion: tailguard/v1\nkind: Foo\n", "Foo", "{f}: slos: Field required (line 1)"),
        (
            "apiVersion: tailguard/v1\nkind: BurnRules\nrules: [{kind: x}]\n",
            "BurnRules",
            "{f}: rules[0].kind: unknown kind 'x'; known: burn_rate, budget_fraction, "
            "compliance_below (line 3)",
        ),
        (
            "apiVersion: tailguard/v1\nkind: ControlPolicy\nlevels: []\n",
            "ControlPolicy",
            "{f}: levels: List should have at least 1 item after validation, not 0 (line 3)",
        ),
    ],
)
def test_broken_files_report_where(tmp_path: Path, text: str, kind: str, line: str) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(text)
    assert kind_of(f) == kind
    ok, message = validate_path(f)
    assert not ok
    assert any(m.startswith(line.format(f=f)) for m in message.splitlines()), message


def test_cli_validate_prints_what_the_registry_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(SPECS / "burn-rules.yaml")]) == 0
    assert capsys.readouterr().out == f"ok: burn rules ({SPECS / 'burn-rules.yaml'})\n"
    broken = tmp_path / "p.yaml"
    broken.write_text("apiVersion: tailguard/v1\nkind: ControlPolicy\nlevels: []\n")
    assert main(["validate", str(broken)]) == 1
    assert capsys.readouterr().err == validate_path(broken)[1] + "\n"


def test_a_new_kind_is_one_new_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "morespecs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("X = 1\n")  # no SPEC_KIND: not a kind
    (pkg / "quota.py").write_text(
        "from pipeline.spec.registry import SpecKind\n"
        "SPEC_KIND = SpecKind('Quota', lambda path: (True, f'ok: quota ({path})'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = discover("morespecs")
        assert list(found) == ["Quota"]
        assert found["Quota"].validate("q.yaml") == (True, "ok: quota (q.yaml)")
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "morespecs"]:
            del sys.modules[name]


def test_a_kind_defined_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "twicespecs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "from pipeline.spec.registry import SpecKind\nSPEC_KIND = SpecKind('Q', print)\n"
    (pkg / "a.py").write_text(body)
    (pkg / "b.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match="spec kind 'Q' defined twice"):
            discover("twicespecs")
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "twicespecs"]:
            del sys.modules[name]
