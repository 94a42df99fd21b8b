"""Static checks of what ships beside the code: compose file, CLI, SQL."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from jsonschema import Draft7Validator

from pipeline.adapters.store import load_migrations, template_params
from pipeline.cli import build_parser, main
from pipeline.settings import Settings

REPO = Path(__file__).resolve().parents[2]
TESTDATA = Path(__file__).parent / "testdata"


def _subcommands() -> set[str]:
    parser = build_parser()
    for action in parser._actions:
        if action.dest == "command":
            return set(action.choices)  # type: ignore[arg-type]
    raise AssertionError("no subcommands")


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return doc


def test_compose_services_run_the_documented_cli() -> None:
    compose = _compose()
    services = compose["services"]
    built = {n: s for n, s in services.items() if "build" in s}
    assert {"worker", "migrate", "topics", "simulate"} <= set(built)
    readme = (REPO / "README.md").read_text()
    for name, svc in built.items():
        command = svc["command"]
        assert command[0] in _subcommands(), name
        build_parser().parse_args(command)  # exits (SystemExit) on anything the CLI rejects
        assert f"`tailguard {command[0]}" in readme, f"{name}: README does not document it"
    for svc in services.values():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), "publish on loopback only"
    # The list: Kafka (KRaft), a ClickHouse server, Grafana with the plugin.
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_INSTALL_PLUGINS"]
    # Workers scale: no fixed name, no published port.
    worker = services["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker
    assert services["migrate"]["depends_on"]["clickhouse"]["condition"] == "service_healthy"


def test_compose_workers_use_the_clickhouse_server_over_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compose = _compose()
    clickhouse_port = compose["services"]["clickhouse"]["ports"][0].rsplit(":", 1)[1]
    for name in ("worker", "migrate", "report"):
        with monkeypatch.context() as m:
            for key, value in compose["services"][name]["environment"].items():
                m.setenv(key, _interpolate(str(value), {}))
            settings = Settings()  # as the container builds it: from its environment
        assert settings.clickhouse_url == f"http://clickhouse:{clickhouse_port}", name
        assert settings.bootstrap_servers == "kafka:9092"
        assert settings.clickhouse_password.get_secret_value() == "tailguard"
        assert not settings.control_enabled


_COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _interpolate(text: str, environ: dict[str, str]) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` (enough for this file)."""
    return _COMPOSE_VAR.sub(lambda m: environ.get(m.group(1)) or (m.group(2) or ""), text)


def test_compose_file_is_valid_for_the_compose_spec() -> None:
    """The schema docker compose validates with (compose-go v2.9.1, vendored)."""
    schema = orjson.loads((TESTDATA / "compose-spec" / "compose-spec.json").read_bytes())
    Draft7Validator.check_schema(schema)
    text = _interpolate((REPO / "docker-compose.yml").read_text(), {})
    validator = Draft7Validator(schema)
    doc = yaml.safe_load(text)
    assert [e.message for e in validator.iter_errors(doc)] == []
    broken = yaml.safe_load(text)
    broken["services"]["worker"]["commandd"] = ["worker"]
    broken["services"]["migrate"]["depends_on"]["clickhouse"]["condition"] = "healthy"
    assert len(list(validator.iter_errors(broken))) == 2


def _compose_cli() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    return [exe] if exe else None


@pytest.mark.skipif(
    _compose_cli() is None,
    reason="no Docker Compose CLI here (neither `docker compose` nor `docker-compose`); "
    "the compose-spec schema test covers the file",
)
def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    cli = _compose_cli()
    assert cli is not None
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    ok = subprocess.run(
        [*cli, "-f", str(REPO / "docker-compose.yml"), "--profile", "tools", "config", "-q"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    services = subprocess.run(
        [*cli, "-f", str(REPO / "docker-compose.yml"), "--profile", "tools", "config",
         "--services"], capture_output=True, text=True, env=env, check=True,
    ).stdout.split()  # fmt: skip
    assert set(services) == set(_compose()["services"])
    # ... and it does reject a broken file.
    bad = tmp_path / "docker-compose.yml"
    bad.write_text((REPO / "docker-compose.yml").read_text().replace(
        "condition: service_healthy", "condition: healthy", 1))  # fmt: skip
    rejected = subprocess.run([*cli, "-f", str(bad), "config", "-q"], capture_output=True,
                              text=True, env=env, check=False)  # fmt: skip
    assert rejected.returncode != 0
    assert "condition" in rejected.stderr


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
            if cluster and not stmt.startswith("INSERT"):
                # DDL on every node; an INSERT moves data once (replication copies it)
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


WORKER_ONLY = ("faust", "chdb", "clickhouse_connect", "aiokafka")


def test_emitters_import_nothing_of_the_worker() -> None:
    """A vLLM host or a gateway installs the base package: no Faust, no ClickHouse engine."""
    code = (
        "import sys\n"
        "import producers.emit, producers.gateway, producers.gateway_proxy, producers.envoy\n"
        "import producers.vllm_stats, producers.asgi_control, producers.control_client\n"
        "import pipeline.cli, pipeline.adapters.reliable, pipeline.adapters.telemetry\n"
        "pipeline.cli.build_parser()\n"
        f"print(sorted(m for m in {WORKER_ONLY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]"


def test_worker_dependencies_are_an_extra_not_the_base_install() -> None:
    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())[
        "project"
    ]
    base = " ".join(meta["dependencies"])
    worker = " ".join(meta["optional-dependencies"]["worker"])
    for dist in ("faust-streaming", "chdb", "clickhouse-connect", "aiokafka"):
        assert dist not in base
        assert dist in worker
