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
from tests.paths import REPO
from tests.paths import UNIT_TESTDATA as TESTDATA


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
    # the commands' reference (README.md is the short tour)
    readme = (REPO / "docs" / "commands.md").read_text()
    for name, svc in built.items():
        command = svc["command"]
        assert command[0] in _subcommands(), name
        build_parser().parse_args(command)  # exits (SystemExit) on anything the CLI rejects
        assert f"`tailguard {command[0]}" in readme, f"{name}: not in docs/commands.md"
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
        cwd=REPO,
    )
    assert out.stdout.strip() == "[]"


def test_worker_dependencies_are_an_extra_not_the_base_install() -> None:
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = " ".join(meta["dependencies"])
    worker = " ".join(meta["optional-dependencies"]["worker"])
    for dist in ("faust-streaming", "chdb", "clickhouse-connect", "aiokafka"):
        assert dist not in base
        assert dist in worker


# --- the base install (emitters) and the package boundaries ---------------------------------

# What the base install must not need: the worker's packages (extra `worker`) and the
# worker's settings module (which loads the core, i.e. numpy and ddsketch).
NOT_IN_BASE_DISTS = (
    "numpy",
    "ddsketch",
    "msgspec",
    "faust-streaming",
    "aiokafka",
    "chdb",
    "clickhouse-connect",
    "matplotlib",
    "prometheus-client",
    "rich",
)
NOT_IN_BASE_MODULES = (
    "numpy",
    "ddsketch",
    "msgspec",
    "faust",
    "aiokafka",
    "chdb",
    "clickhouse_connect",
    "matplotlib",
    "prometheus_client",
    "pipeline.settings",
    "pipeline.core",
    "litellm",  # the LiteLLM hook is an extra: importing its module needs no LiteLLM
    "fastapi",
)
BASE_MODULES = (
    "pipeline.contract",
    "pipeline.contract.codec",
    "pipeline.contract.events",
    "pipeline.contract.partitioning",
    "pipeline.kafka_settings",
    "pipeline.app.commands.settings",
    "producers.emit",
    "producers.gateway",
    "producers.gateway_proxy",
    "producers.envoy",
    "producers.vllm_stats",
    "producers.vllm_plugin",
    "producers.vllm_metrics",
    "producers.vllm_scrape",
    "producers.asgi_control",
    "producers.control_client",
    "producers.litellm_hook",
    "pipeline.adapters.reliable",
    "pipeline.cli",
)

# A subprocess in which importing any of the blocked modules fails as if it were not
# installed; vLLM is a stand-in (the plugin's one import of it), as in test_vllm_stats.py.
_BLOCKED_IMPORTS = """
import importlib, sys, types
BLOCKED = {blocked!r}

class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"blocked in this test: {{name}}", name=name)
        return None

sys.meta_path.insert(0, Block())
for name in ("vllm", "vllm.v1", "vllm.v1.metrics", "vllm.v1.metrics.loggers"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["vllm.v1.metrics.loggers"].StatLoggerBase = type("StatLoggerBase", (), {{}})
for name in {modules!r}:
    importlib.import_module(name)
"""


def _run_blocked(body: str, blocked: tuple[str, ...] = NOT_IN_BASE_MODULES) -> str:
    code = _BLOCKED_IMPORTS.format(blocked=blocked, modules=BASE_MODULES) + body
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_base_install_modules_import_without_the_worker_packages() -> None:
    out = _run_blocked(
        "from pipeline.cli import build_parser\n"
        "from pipeline.kafka_settings import EmitterSettings\n"
        "from producers.emit import open_kafka_sink\n"
        "build_parser()\n"
        "s = EmitterSettings(bootstrap_servers='127.0.0.1:1')\n"
        "sink = open_kafka_sink(s, service='test')\n"  # builds the producer, sends nothing
        "sink.close(timeout_s=0)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'ddsketch')))\n"
    )
    assert out.strip() == "[]"


def test_the_blocking_import_hook_does_block() -> None:
    """The test above can fail: a module that needs numpy does not import under the hook."""
    third_party = tuple(m for m in NOT_IN_BASE_MODULES if not m.startswith("pipeline"))
    code = _BLOCKED_IMPORTS.format(blocked=third_party, modules=()) + (
        "import pipeline.core.sketch\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert done.returncode != 0
    assert "blocked in this test: numpy" in done.stderr


def test_base_dependencies_list_none_of_the_worker_packages() -> None:
    import tomllib

    from packaging.requirements import Requirement

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {Requirement(r).name.lower() for r in meta["dependencies"]}
    worker = {Requirement(r).name.lower() for r in meta["optional-dependencies"]["worker"]}
    assert base.isdisjoint(NOT_IN_BASE_DISTS), base & set(NOT_IN_BASE_DISTS)
    assert set(NOT_IN_BASE_DISTS) <= worker, set(NOT_IN_BASE_DISTS) - worker
    assert meta["optional-dependencies"]["all"] == ["tailguard[worker,dev]"]


def _modules(*roots: str) -> dict[str, Path]:
    found = {}
    for root in roots:
        for path in (REPO / root).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ``known`` that ``path`` imports, anywhere in the file (lazy
    imports inside functions and ``TYPE_CHECKING`` blocks included)."""
    import ast

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        out.update(r for r in map(resolve, names) if r is not None)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _graph(*roots: str) -> dict[str, set[str]]:
    known = _modules(*roots)
    return {m: _imports(p, known) - {m} for m, p in known.items()}


def test_no_import_cycles_between_modules() -> None:
    assert _cycles(_graph("pipeline", "producers", "tools")) == []
    # ... and the check finds one where there is one
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# What the emitters may use of `pipeline`: the contract and the Kafka settings.
PRODUCERS_MAY_IMPORT = ("pipeline.contract", "pipeline.kafka_settings")


def test_producers_use_only_the_contract_and_the_kafka_settings_of_pipeline() -> None:
    graph = _graph("pipeline", "producers")
    for module, deps in graph.items():
        if not module.startswith("producers"):
            continue
        used = {d for d in deps if d.startswith("pipeline")}
        bad = {d for d in used if not d.startswith(PRODUCERS_MAY_IMPORT)}
        assert not bad, f"{module} imports {sorted(bad)}"
    # nothing those modules import leads back into producers
    seen, todo = set(), [m for m in graph if m.startswith(PRODUCERS_MAY_IMPORT)]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert not {m for m in seen if m.startswith("producers")}


CLI = ("pipeline.cli", "pipeline.app.commands")  # the command line: nothing else imports it


def _within(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def _forbidden_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(module, import)`` where a shipped module (``pipeline``, ``producers``) imports the
    dev tools or the tests, or a shipped module outside the CLI imports the CLI."""
    bad = set()
    for m, deps in graph.items():
        if not _within(m, ("pipeline", "producers")):
            continue
        for d in deps:
            if _within(d, ("tools", "tests")) or (_within(d, CLI) and not _within(m, CLI)):
                bad.add((m, d))
    return bad


def test_the_shipped_package_imports_neither_the_dev_tools_nor_the_tests_nor_the_cli() -> None:
    """Lazy imports and ``TYPE_CHECKING`` blocks count (an AST scan of every file)."""
    assert _forbidden_imports(_graph("pipeline", "producers", "tools", "tests")) == set()


@pytest.mark.parametrize(
    ("module", "imports", "forbidden"),
    [
        ("pipeline.app.demo", "tools.dev.kafka_local", True),
        ("producers.emit", "tests.factories", True),
        ("pipeline.app.report", "pipeline.cli", True),
        ("pipeline.adapters.store", "pipeline.app.commands.settings", True),
        ("pipeline.app.commands.report", "pipeline.app.commands.settings", False),
        ("pipeline.cli", "pipeline.app.commands", False),
        ("pipeline.app.commands.demo", "pipeline.app.demo", False),
        ("pipeline.app.report", "pipeline.cli_like", False),  # a name, not the CLI
        ("tools.dev.demo_vs_backtest", "pipeline.cli", False),  # not shipped
        ("tests.unit.test_x", "tools.dev.kafka_local", False),
    ],
)
def test_the_import_rule_says_what_is_forbidden(module: str, imports: str, forbidden: bool) -> None:
    """The scan above can fail: these imports are found (or allowed) as the rule says."""
    assert _forbidden_imports({module: {imports}}) == ({(module, imports)} if forbidden else set())


def test_the_wheel_builds_with_setuptools_alone() -> None:
    """Pure Python (issue 50): the build needs no Rust toolchain, nor anything but
    setuptools and wheel."""
    import tomllib

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    build = {Requirement(r).name for r in pyproject["build-system"]["requires"]}
    assert build == {"setuptools", "wheel"}
    assert not (REPO / "setup.py").exists()  # everything is declared in pyproject.toml
    # the wheel test builds without build isolation: what it needs is in the dev venv
    dev = {Requirement(r).name for r in pyproject["project"]["optional-dependencies"]["dev"]}
    assert build <= dev
    pinned = {
        Requirement(line).name.lower()
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.strip()
    }
    assert build <= pinned
