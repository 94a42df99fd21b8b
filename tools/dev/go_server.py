"""What the local Go servers for tests share: building with ``go`` and running one process.

:mod:`tools.dev.alertmanager_local` and :mod:`tools.dev.prometheus_local` build their
binary from a Go module into ``<repo>/.cache`` once (:func:`build_once`) and run it on
127.0.0.1 as a :class:`LocalServer`: started with its log in ``<run_dir>/<name>.out`` and
its PID in ``<run_dir>/<name>.pid``, ready when ``GET /-/ready`` answers 200, stopped by
its PID (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from pipeline.adapters.local_kafka import free_port
from pipeline.adapters.local_kafka.fetch import file_lock

HOST = "127.0.0.1"
BUILD_TIMEOUT_S = 1800.0

log = logging.getLogger(__name__)


def go() -> str:
    """The ``go`` binary's path (on PATH, or Go's own install folder)."""
    found = shutil.which("go")
    if found is None and Path("/usr/local/go/bin/go").exists():
        found = "/usr/local/go/bin/go"
    if found is None:
        raise RuntimeError(
            "`go` not found on PATH: the local Prometheus and Alertmanager are built from "
            "their Go modules (install Go 1.25+, e.g. `apt-get install golang-go`)"
        )
    return found


def run(cmd: list[str], cwd: Path | None, env: dict[str, str]) -> str:
    """``cmd``'s standard output; a ``RuntimeError`` with its last output when it fails."""
    try:
        out = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {exc}") from exc
    if out.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(cmd)}` exited {out.returncode}:\n{(out.stderr or out.stdout)[-4000:]}"
        )
    return out.stdout


def build_once(
    root: Path,
    out: Path,
    built: Callable[[], bool],
    build: Callable[[str, dict[str, str], Path], None],
    *,
    module: str,
    version: str,
    title: str,
    error: type[RuntimeError],
    env: Mapping[str, str] | None = None,
) -> Path:
    """``out``, built first when ``built()`` says it is not (minutes, once): under the
    cache's build lock (``<root>/../.build.lock``; another process may be building it, so
    ``built()`` is asked again inside), ``module@version`` is downloaded with ``go mod
    download`` and ``build(go, env, module_dir)`` makes ``out`` from the module's folder
    (read-only, in Go's module cache); ``<root>/BUILD.txt`` says how long it took. ``go``
    missing or failing: ``error``. ``env``: added to Go's environment."""
    if built():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root.parent / ".build.lock"):
        if built():
            return out
        go_env = dict(os.environ, GOFLAGS="-mod=mod -buildvcs=false", CGO_ENABLED="0")
        go_env.update(env or {})
        t0 = time.monotonic()
        try:
            go_bin = go()
            download = [go_bin, "mod", "download", "-json", f"{module}@{version}"]
            info = json.loads(run(download, None, go_env))
            build(go_bin, go_env, Path(info["Dir"]))
        except RuntimeError as exc:
            raise error(str(exc)) from exc
        took = time.monotonic() - t0
        (root / "BUILD.txt").write_text(f"{module}@{version} built in {took:.0f} s\n")
        log.info("built %s %s in %.0f s: %s", title, version, took, out)
    return out


def fetch_main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    help_text: str,
    ensure: Callable[[], Path],
    error: type[RuntimeError],
) -> int:
    """A tool's command line, ``fetch`` only: build into the cache once (``ensure``, its
    progress logged at INFO on standard error) and print the path; 1 with the ``error``
    on standard error when it fails."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help=help_text)
    args = parser.parse_args(argv)
    if args.command == "fetch":
        try:
            print(ensure())
        except error as exc:
            print(f"{prog.rsplit('.', 1)[-1]}: {exc}", file=sys.stderr)
            return 1
    return 0


class LocalServer:
    """One server process on 127.0.0.1, run in ``run_dir``; a subclass names it, says
    which error it raises and gives its command line (:meth:`command`)."""

    name: ClassVar[str]
    error: ClassVar[type[RuntimeError]]

    def __init__(self, run_dir: Path, *, port: int = 0, ready_timeout_s: float = 60.0) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.port = port or free_port()
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        """The command line (building the binary first when missing, writing its config)."""
        raise NotImplementedError

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        out = (self.run_dir / f"{self.name}.out").open("ab")
        self.proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.run_dir
        )
        out.close()
        (self.run_dir / f"{self.name}.pid").write_text(f"{self.proc.pid}\n")
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise self.error(
                    f"{self.name} exited {self.proc.returncode}; see {self.run_dir}/{self.name}.out"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r,  # noqa: S310
            ):
                if r.status == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise self.error(f"{self.name} not ready in {self.ready_timeout_s} s")
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

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
