"""Static checks of what ships beside the code: compose file, CLI, SQL."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from pipeline.adapters.store import load_migrations, template_params
from pipeline.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def _subcommands() -> set[str]:
    parser = build_parser()
    for action in parser._actions:
        if action.dest == "command":
            return set(action.choices)  # type: ignore[arg-type]
    raise AssertionError("no subcommands")


def test_compose_services_run_the_documented_cli() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    built = {n: s for n, s in compose["services"].items() if "build" in s}
    assert {"worker", "migrate", "topics", "simulate"} <= set(built)
    for name, svc in built.items():
        assert svc["command"][0] in _subcommands(), name
    for svc in compose["services"].values():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), "publish on loopback only"


def test_schema_command_prints_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    schema = orjson.loads(capsys.readouterr().out)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert "oneOf" in schema


@pytest.mark.parametrize("cluster", [None, "prod"])
def test_migrations_render_for_single_node_and_cluster(cluster: str | None) -> None:
    migrations = load_migrations()
    assert [m.version for m in migrations] == sorted(m.version for m in migrations)
    for m in migrations:
        for stmt in m.statements(template_params("tailguard", cluster)):
            assert "${" not in stmt
            if cluster:
                assert "ON CLUSTER 'prod'" in stmt
                if stmt.startswith("CREATE TABLE") and " AS " not in stmt.split("(")[0]:
                    assert "Replicated" in stmt, stmt[:80]


def test_validate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO / "specs" / "slo-example.yaml")]) == 0
    assert capsys.readouterr().out.startswith("ok:")
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "apiVersion: tailguard/v1\nkind: SLOSpec\nslos:\n"
        "  - {name: a, boundary: gateway_total_ms, threshold_ms: -5, objective: 0.99}\n"
    )
    assert main(["validate", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "slos[0].threshold_ms" in err
