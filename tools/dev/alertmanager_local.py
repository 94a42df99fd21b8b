"""A real Prometheus Alertmanager on 127.0.0.1 for tests (built once from its Go module).

Alertmanager is the Go module ``github.com/prometheus/alertmanager`` (:data:`AM_VERSION`),
fetched from the Go module proxy with ``go mod download`` and built with ``go build`` into
an ignored cache folder (``<repo>/.cache/alertmanager/<version>/bin/alertmanager``), the
way :mod:`tools.dev.kafka_local` fetches Kafka's jars. Nothing else is needed on
the machine but ``go``: no release tarball, no Docker.

The module on the proxy has no built web UI (``ui/app/dist`` is made by npm in the
project's release process); the build copies the module's source, puts a one-line
placeholder page there and builds the server with it. The API is all the tests use.

Library use::

    with LocalAlertmanager(run_dir) as am:        # port=0 picks a free port
        use(am.url)                               # "http://127.0.0.1:<port>"
        am.alerts()                               # GET /api/v2/alerts

Command line::

    python -m tools.dev.alertmanager_local fetch     # build once (prints the path)
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.dev.go_server import HOST, LocalServer, build_once, fetch_main, run
from tools.dev.kafka_local import env_or_repo_path

AM_MODULE = "github.com/prometheus/alertmanager"
AM_VERSION = "v0.35.0"
ENV_CACHE_DIR = "TAILGUARD_ALERTMANAGER_CACHE"


class AlertmanagerLocalError(RuntimeError):
    """The local Alertmanager could not be built, started or stopped."""


def default_cache_dir() -> Path:
    """``$TAILGUARD_ALERTMANAGER_CACHE`` or ``<repo>/.cache/alertmanager`` (git-ignored)."""
    return env_or_repo_path(ENV_CACHE_DIR, ".cache", "alertmanager")


def binary_path(cache_dir: Path | None = None, version: str = AM_VERSION) -> Path:
    return (cache_dir or default_cache_dir()) / version / "bin" / "alertmanager"


def ensure_alertmanager(cache_dir: Path | None = None, *, version: str = AM_VERSION) -> Path:
    """The built binary, building it first when the cache lacks it (minutes, once)."""
    binary = binary_path(cache_dir, version)
    root = binary.parents[1]

    def build(go_bin: str, env: dict[str, str], module_dir: Path) -> None:
        src = root / "src"
        if src.exists():
            shutil.rmtree(src)
        shutil.copytree(module_dir, src)
        for p in [src, *src.rglob("*")]:  # the module cache is read-only
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
        for sub in ("elm", "mantine"):
            page = src / "ui" / "app" / "dist" / sub / "index.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text("<!doctype html><p>Alertmanager built by tailguard: API only.</p>\n")
        tmp = binary.with_suffix(".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        run([go_bin, "build", "-trimpath", "-o", str(tmp), "./cmd/alertmanager"], src, env)
        tmp.replace(binary)
        shutil.rmtree(src, ignore_errors=True)

    return build_once(
        root, binary, lambda: os.access(binary, os.X_OK), build,
        module=AM_MODULE, version=version, title="Alertmanager", error=AlertmanagerLocalError,
    )  # fmt: skip


CONFIG = """\
route:
  receiver: "null"
  group_by: ["alertname", "slo", "scope"]
  group_wait: 1s
receivers:
  - name: "null"
"""


class LocalAlertmanager(LocalServer):
    """One Alertmanager process on 127.0.0.1 (clustering off), stopped by its PID."""

    name = "alertmanager"
    error = AlertmanagerLocalError

    def __init__(
        self,
        run_dir: Path,
        *,
        port: int = 0,
        binary: Path | None = None,
        ready_timeout_s: float = 60.0,
        config: str = CONFIG,
    ) -> None:
        super().__init__(run_dir, port=port, ready_timeout_s=ready_timeout_s)
        self.config = config
        self.binary = binary

    def command(self) -> list[str]:
        binary = self.binary or ensure_alertmanager()
        (self.run_dir / "alertmanager.yml").write_text(self.config)
        return [
            str(binary),
            f"--config.file={self.run_dir / 'alertmanager.yml'}",
            f"--storage.path={self.run_dir / 'data'}",
            f"--web.listen-address={HOST}:{self.port}",
            "--cluster.listen-address=",
        ]

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts`` (``active``, ``silenced``, ``inhibited``, ``unprocessed``)."""
        query = "&".join(f"{k}={v}" for k, v in filters.items())
        url = f"{self.url}/api/v2/alerts?{query}"  # http://127.0.0.1 only
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310
            doc: list[dict[str, Any]] = json.loads(r.read())
        return doc


def main(argv: Sequence[str] | None = None) -> int:
    return fetch_main(
        argv,
        prog="tools.dev.alertmanager_local",
        description=f"Local Prometheus Alertmanager {AM_VERSION} on {HOST} (built from Go).",
        help_text="build Alertmanager from its Go module into the cache (once)",
        ensure=ensure_alertmanager,
        error=AlertmanagerLocalError,
    )


if __name__ == "__main__":
    sys.exit(main())
