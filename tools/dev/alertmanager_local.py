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

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tools.dev.kafka_local import _file_lock, env_or_repo_path

AM_MODULE = "github.com/prometheus/alertmanager"
AM_VERSION = "v0.35.0"
HOST = "127.0.0.1"
BUILD_TIMEOUT_S = 1800.0
ENV_CACHE_DIR = "TAILGUARD_ALERTMANAGER_CACHE"

log = logging.getLogger(__name__)


class AlertmanagerLocalError(RuntimeError):
    """The local Alertmanager could not be built, started or stopped."""


def default_cache_dir() -> Path:
    """``$TAILGUARD_ALERTMANAGER_CACHE`` or ``<repo>/.cache/alertmanager`` (git-ignored)."""
    return env_or_repo_path(ENV_CACHE_DIR, ".cache", "alertmanager")


def binary_path(cache_dir: Path | None = None, version: str = AM_VERSION) -> Path:
    return (cache_dir or default_cache_dir()) / version / "bin" / "alertmanager"


def _go() -> str:
    found = shutil.which("go")
    if found is None and Path("/usr/local/go/bin/go").exists():
        found = "/usr/local/go/bin/go"
    if found is None:
        raise AlertmanagerLocalError(
            "`go` not found on PATH: Alertmanager is built from its Go module "
            "(install Go 1.25+, e.g. `apt-get install golang-go`)"
        )
    return found


def _run(cmd: list[str], cwd: Path | None, env: dict[str, str]) -> str:
    try:
        out = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AlertmanagerLocalError(f"`{' '.join(cmd)}` failed: {exc}") from exc
    if out.returncode != 0:
        raise AlertmanagerLocalError(
            f"`{' '.join(cmd)}` exited {out.returncode}:\n{(out.stderr or out.stdout)[-4000:]}"
        )
    return out.stdout


def ensure_alertmanager(cache_dir: Path | None = None, *, version: str = AM_VERSION) -> Path:
    """The built binary, building it first when the cache lacks it (minutes, once)."""
    binary = binary_path(cache_dir, version)
    if os.access(binary, os.X_OK):
        return binary
    root = binary.parents[1]
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root.parent / ".build.lock"):
        if os.access(binary, os.X_OK):
            return binary
        go = _go()
        env = dict(os.environ, GOFLAGS="-mod=mod -buildvcs=false", CGO_ENABLED="0")
        t0 = time.monotonic()
        download = [go, "mod", "download", "-json", f"{AM_MODULE}@{version}"]
        info = json.loads(_run(download, None, env))
        src = root / "src"
        if src.exists():
            shutil.rmtree(src)
        shutil.copytree(info["Dir"], src)
        for p in [src, *src.rglob("*")]:  # the module cache is read-only
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
        for sub in ("elm", "mantine"):
            page = src / "ui" / "app" / "dist" / sub / "index.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text("<!doctype html><p>Alertmanager built by tailguard: API only.</p>\n")
        tmp = binary.with_suffix(".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        _run([go, "build", "-trimpath", "-o", str(tmp), "./cmd/alertmanager"], src, env)
        tmp.replace(binary)
        shutil.rmtree(src, ignore_errors=True)
        took = time.monotonic() - t0
        (root / "BUILD.txt").write_text(f"{AM_MODULE}@{version} built in {took:.0f} s\n")
        log.info("built Alertmanager %s in %.0f s: %s", version, took, binary)
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


CONFIG = """\
route:
  receiver: "null"
  group_by: ["alertname", "slo", "scope"]
  group_wait: 1s
receivers:
  - name: "null"
"""


class LocalAlertmanager:
    """One Alertmanager process on 127.0.0.1 (clustering off), stopped by its PID."""

    def __init__(
        self,
        run_dir: Path,
        *,
        port: int = 0,
        binary: Path | None = None,
        ready_timeout_s: float = 60.0,
        config: str = CONFIG,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.port = port or free_port()
        self.binary = binary
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        binary = self.binary or ensure_alertmanager()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "alertmanager.yml").write_text(self.config)
        out = (self.run_dir / "alertmanager.out").open("ab")
        self.proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={self.run_dir / 'alertmanager.yml'}",
                f"--storage.path={self.run_dir / 'data'}",
                f"--web.listen-address={HOST}:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        out.close()
        (self.run_dir / "alertmanager.pid").write_text(f"{self.proc.pid}\n")
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AlertmanagerLocalError(
                    f"alertmanager exited {self.proc.returncode}; "
                    f"see {self.run_dir}/alertmanager.out"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r,  # noqa: S310
            ):
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise AlertmanagerLocalError(f"alertmanager not ready in {self.ready_timeout_s} s")
            time.sleep(0.1)  # polling a readiness endpoint: nothing to await

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
        self.proc = None

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts`` (``active``, ``silenced``, ``inhibited``, ``unprocessed``)."""
        query = "&".join(f"{k}={v}" for k, v in filters.items())
        url = f"{self.url}/api/v2/alerts?{query}"  # http://127.0.0.1 only
        with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310
            doc: list[dict[str, Any]] = json.loads(r.read())
        return doc

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.dev.alertmanager_local",
        description=f"Local Prometheus Alertmanager {AM_VERSION} on {HOST} (built from Go).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="build Alertmanager from its Go module into the cache (once)")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        try:
            print(ensure_alertmanager())
        except AlertmanagerLocalError as exc:
            print(f"alertmanager_local: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
