"""A real Prometheus and ``promtool`` on 127.0.0.1 for tests (built once from its Go module).

Prometheus is the Go module ``github.com/prometheus/prometheus`` (:data:`PROM_VERSION`:
the module's ``v0.X.Y`` is Prometheus ``3.X.Y``), fetched from the Go module proxy with
``go mod download`` and built with ``go build`` into an ignored cache folder
(``<repo>/.cache/prometheus/<version>/bin/{prometheus,promtool}``), the way
:mod:`tools.dev.alertmanager_local` builds Alertmanager. Built with the ``remove_all_sd``
tag (no cloud service discovery: static targets are all the tests use; it leaves out
most of the dependencies) and without the web UI's assets (the API is all the tests use).
Measured on the busy 2-core machine: 9 min for both binaries from nothing (downloads
included), 17 s again with Go's build cache.

Library use::

    promtool()                                   # the binary's path (built if missing)
    with LocalPrometheus(run_dir, targets=["127.0.0.1:9464"], rule_files=[path],
                         alertmanager="127.0.0.1:9093") as prom:
        prom.query("up")                         # GET /api/v1/query
        prom.alerts()                            # GET /api/v1/alerts

Command line::

    python -m tools.dev.prometheus_local fetch   # build once (prints the bin folder)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tools.dev.go_server import HOST, LocalServer, build_once, fetch_main, run
from tools.dev.kafka_local import env_or_repo_path

PROM_MODULE = "github.com/prometheus/prometheus"
PROM_VERSION = "v0.316.0"  # Prometheus 3.16.0
ENV_CACHE_DIR = "TAILGUARD_PROMETHEUS_CACHE"
BINARIES = ("prometheus", "promtool")


class PrometheusLocalError(RuntimeError):
    """The local Prometheus could not be built, started or stopped."""


def default_cache_dir() -> Path:
    """``$TAILGUARD_PROMETHEUS_CACHE`` or ``<repo>/.cache/prometheus`` (git-ignored)."""
    return env_or_repo_path(ENV_CACHE_DIR, ".cache", "prometheus")


def bin_dir(cache_dir: Path | None = None, version: str = PROM_VERSION) -> Path:
    return (cache_dir or default_cache_dir()) / version / "bin"


def ensure_prometheus(cache_dir: Path | None = None, *, version: str = PROM_VERSION) -> Path:
    """The folder holding ``prometheus`` and ``promtool``, built first when missing."""
    out = bin_dir(cache_dir, version)
    root = out.parent

    def build(go_bin: str, env: dict[str, str], module_dir: Path) -> None:
        tmp = root / "bin.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        # the module cache is read-only; go build writes nothing into the source
        cmd = [go_bin, "build", "-trimpath", "-tags", "remove_all_sd", "-o", f"{tmp}/"]
        run([*cmd, "./cmd/prometheus", "./cmd/promtool"], module_dir, env)
        out.mkdir(parents=True, exist_ok=True)
        for b in BINARIES:
            (tmp / b).replace(out / b)

    return build_once(
        root, out, lambda: all(os.access(out / b, os.X_OK) for b in BINARIES), build,
        module=PROM_MODULE, version=version, title="Prometheus", error=PrometheusLocalError,
        env={"GOWORK": "off"},  # the module ships a go.work for its own development: not ours
    )  # fmt: skip


def promtool() -> Path:
    return ensure_prometheus() / "promtool"


def run_promtool(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` (not checked: the caller reads the exit status and output)."""
    return subprocess.run(
        [str(promtool()), *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


class LocalPrometheus(LocalServer):
    """One Prometheus on 127.0.0.1 scraping ``targets`` every ``interval``, evaluating
    ``rule_files`` as often, alerting ``alertmanager`` (``host:port``); stopped by PID."""

    name = "prometheus"
    error = PrometheusLocalError

    def __init__(
        self,
        run_dir: Path,
        *,
        targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        interval: str = "1s",
        port: int = 0,
        ready_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(run_dir, port=port, ready_timeout_s=ready_timeout_s)
        self.targets = list(targets)
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.alertmanager = alertmanager
        self.interval = interval

    def config(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "scrape_configs": [
                {"job_name": "tailguard", "static_configs": [{"targets": self.targets}]}
            ],
            "rule_files": [str(p) for p in self.rule_files],
        }
        if self.alertmanager:
            doc["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": [self.alertmanager]}]}]
            }
        return doc

    def command(self) -> list[str]:
        binary = ensure_prometheus() / "prometheus"
        conf = self.run_dir / "prometheus.yml"
        conf.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        return [
            str(binary),
            f"--config.file={conf}",
            f"--storage.tsdb.path={self.run_dir / 'data'}",
            f"--web.listen-address={HOST}:{self.port}",
            # resolved alerts reach Alertmanager on the next evaluation, not a minute on
            "--rules.alert.resend-delay=1s",
        ]

    def _get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:  # noqa: S310
            doc = json.loads(r.read())
        if doc.get("status") != "success":
            raise PrometheusLocalError(f"{path}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        data = self._get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v1/alerts``: the alerts pending or firing now."""
        alerts: list[dict[str, Any]] = self._get("/api/v1/alerts")["alerts"]
        return alerts


def main(argv: Sequence[str] | None = None) -> int:
    return fetch_main(
        argv,
        prog="tools.dev.prometheus_local",
        description=f"Local Prometheus ({PROM_MODULE}@{PROM_VERSION}) and promtool on {HOST}.",
        help_text="build prometheus and promtool into the cache (once)",
        ensure=ensure_prometheus,
        error=PrometheusLocalError,
    )


if __name__ == "__main__":
    sys.exit(main())
