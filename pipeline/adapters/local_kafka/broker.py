"""One local Apache Kafka broker (KRaft, single node) on 127.0.0.1: started from its run
directory, waited on until it serves *our* cluster, stopped by PID (also one a previous
process left running: the PID file and the process's command line say which).

Files in the run directory: ``server.properties``, ``log4j2.xml``, ``data/`` (the KRaft log
dir), ``kafka.pid``, ``kafka.json`` (ports and cluster id, reused on restart),
``kafka.out`` (the JVM's stdout/stderr), ``server.log`` (Kafka's INFO log), ``format.log``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pipeline.adapters.local_kafka.config import (
    HOST,
    format_storage,
    log4j2_xml,
    new_cluster_id,
    server_config,
    write_atomic,
)
from pipeline.adapters.local_kafka.fetch import (
    KAFKA_VERSION,
    KafkaLocalError,
    ensure_kafka_jars,
    find_java,
    tail,
)
from pipeline.processes import pid_alive

PID_FILE = "kafka.pid"
STATE_FILE = "kafka.json"
DEFAULT_HEAP = "1g"
DEFAULT_READY_TIMEOUT_S = 60.0
DEFAULT_STOP_TIMEOUT_S = 20.0

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM does
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def _accepts_tcp(port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


class LocalKafka:
    """One single-node KRaft broker+controller on 127.0.0.1, run from ``run_dir``.

    ``port``/``controller_port`` 0 pick free ports on the first start; the chosen ports and
    the cluster id are kept in ``run_dir/kafka.json`` so :meth:`restart` (and a later
    ``LocalKafka`` on the same directory) reuses them together with the data.
    """

    def __init__(
        self,
        run_dir: Path | str,
        *,
        port: int = 0,
        controller_port: int = 0,
        cache_dir: Path | None = None,
        libs_dir: Path | None = None,
        heap: str = DEFAULT_HEAP,
        jvm_opts: Sequence[str] = (),
        extra_config: Mapping[str, str] | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT_S,
    ) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.cache_dir = cache_dir
        self.libs_dir = libs_dir
        self.heap = heap
        self.jvm_opts = tuple(jvm_opts)
        self.extra_config = dict(extra_config or {})
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.last_ready_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        state = self._load_state()
        self.port: int = port or int(state.get("port", 0))
        self.controller_port: int = controller_port or int(state.get("controller_port", 0))
        self.cluster_id: str | None = state.get("cluster_id")

    # -- paths ---------------------------------------------------------------------------

    @property
    def pid_file(self) -> Path:
        return self.run_dir / PID_FILE

    @property
    def state_file(self) -> Path:
        return self.run_dir / STATE_FILE

    @property
    def data_dir(self) -> Path:
        return self.run_dir / "data"

    @property
    def server_properties(self) -> Path:
        return self.run_dir / "server.properties"

    @property
    def stdout_log(self) -> Path:
        return self.run_dir / "kafka.out"

    @property
    def server_log(self) -> Path:
        return self.run_dir / "server.log"

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``; known once started (or when a port was given)."""
        if not self.port:
            raise KafkaLocalError("the broker's port is chosen on start(); start it first")
        return f"{HOST}:{self.port}"

    # -- state ---------------------------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_state(self, pid: int | None) -> None:
        state = {
            "kafka_version": KAFKA_VERSION,
            "bootstrap_servers": self.bootstrap_servers,
            "port": self.port,
            "controller_port": self.controller_port,
            "cluster_id": self.cluster_id,
            "pid": pid,
        }
        write_atomic(self.state_file, json.dumps(state, indent=2) + "\n")

    @property
    def pid(self) -> int | None:
        """The PID of this directory's running broker, or None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not pid_alive(pid) or not self._is_our_broker(pid):
            return None
        return pid

    def _is_our_broker(self, pid: int) -> bool:
        """Guard against a recycled PID: the process must be kafka.Kafka on our config."""
        args = _cmdline(pid)
        if args is None:  # no /proc: trust the pid file
            return True
        return "kafka.Kafka" in args and str(self.server_properties) in args

    def is_running(self) -> bool:
        return self.pid is not None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Self:
        """Configure, format (first time only), launch, and wait until it serves requests."""
        if self.is_running():
            raise KafkaLocalError(
                f"a broker is already running from {self.run_dir} (pid {self.pid}, "
                f"{self.bootstrap_servers}); stop it first"
            )
        self.pid_file.unlink(missing_ok=True)  # stale
        libs = self.libs_dir or ensure_kafka_jars(self.cache_dir)
        java = find_java()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)

        if not self.port:
            self.port = free_port()
        if not self.controller_port:
            self.controller_port = free_port()
            while self.controller_port == self.port:
                self.controller_port = free_port()
        for what, p in (("broker", self.port), ("controller", self.controller_port)):
            if not _port_is_free(p):
                raise KafkaLocalError(f"{what} port {HOST}:{p} is already in use")

        formatted = (self.data_dir / "meta.properties").exists()
        if not formatted or not self.cluster_id:
            if formatted:  # data without a known cluster id: start over
                shutil.rmtree(self.data_dir)
                self.data_dir.mkdir()
            self.cluster_id = new_cluster_id()
        self._write_config()
        self._save_state(pid=None)
        classpath = f"{libs}{os.sep}*"
        log4j = f"-Dlog4j2.configurationFile={self.run_dir / 'log4j2.xml'}"
        if not formatted:
            assert self.cluster_id is not None  # a new one, above
            format_storage(
                java, classpath, log4j, cluster_id=self.cluster_id,
                server_properties=self.server_properties, run_dir=self.run_dir,
                data_dir=self.data_dir,
            )  # fmt: skip

        cmd = [
            str(java),
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            log4j,
            *self.jvm_opts,
            "-cp",
            classpath,
            "kafka.Kafka",
            str(self.server_properties),
        ]
        t0 = time.monotonic()
        with self.stdout_log.open("ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting broker\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.run_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group; outlives a detached CLI
                close_fds=True,
            )
        write_atomic(self.pid_file, f"{self._proc.pid}\n")
        self._save_state(pid=self._proc.pid)
        try:
            self._wait_ready(t0 + self.ready_timeout)
        except BaseException:
            self.kill()
            raise
        self.last_ready_seconds = time.monotonic() - t0
        log.info(
            "Kafka %s ready on %s (pid %d) in %.1fs",
            KAFKA_VERSION,
            self.bootstrap_servers,
            self._proc.pid,
            self.last_ready_seconds,
        )
        return self

    def _write_config(self) -> None:
        text = server_config(self.port, self.controller_port, self.data_dir, self.extra_config)
        write_atomic(self.server_properties, text)
        write_atomic(self.run_dir / "log4j2.xml", log4j2_xml(self.server_log))

    def _died_error(self, why: str) -> KafkaLocalError:
        return KafkaLocalError(
            f"{why}\n--- {self.stdout_log} (tail) ---\n{tail(self.stdout_log, 20)}"
            f"\n--- {self.server_log} (tail) ---\n{tail(self.server_log)}"
        )

    def _wait_ready(self, deadline: float) -> None:
        """Poll until the broker answers a metadata request for *our* cluster id."""
        proc = self._proc
        assert proc is not None

        def check_alive() -> None:
            rc = proc.poll()
            if rc is not None:
                raise self._died_error(f"Kafka broker exited with code {rc} during startup")

        # 1) the listener is bound (cheap; keeps librdkafka's connect errors out of the way)
        while not _accepts_tcp(self.port, timeout=0.5):
            check_alive()
            if time.monotonic() > deadline:
                raise self._died_error(
                    f"Kafka did not listen on {self.bootstrap_servers} within "
                    f"{self.ready_timeout:.0f}s"
                )
            time.sleep(0.1)
        # 2) it serves metadata, and it is the broker we formatted
        admin = AdminClient(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "log_level": 0,
                "reconnect.backoff.max.ms": 500,
                "socket.connection.setup.timeout.ms": 2000,
            }
        )
        last_error = "no answer"
        while True:
            check_alive()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._died_error(
                    f"Kafka on {self.bootstrap_servers} did not serve metadata within "
                    f"{self.ready_timeout:.0f}s (last: {last_error})"
                )
            try:
                md = admin.list_topics(timeout=min(2.0, max(0.2, remaining)))
            except KafkaException as exc:
                last_error = str(exc)
                continue
            if md.cluster_id != self.cluster_id:
                raise KafkaLocalError(
                    f"{self.bootstrap_servers} is answered by another cluster "
                    f"({md.cluster_id!r}, expected {self.cluster_id!r})"
                )
            if md.brokers:
                return
            last_error = "no brokers in metadata"

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM (controlled shutdown), wait up to ``timeout`` s, then SIGKILL."""
        self._signal_and_wait(signal.SIGTERM, self.stop_timeout if timeout is None else timeout)

    def kill(self) -> None:
        """SIGKILL the broker now (an unclean crash; data is recovered on the next start)."""
        self._signal_and_wait(signal.SIGKILL, 0.0)

    def restart(self) -> Self:
        """Stop, then start on the same ports and data directory."""
        self.stop()
        return self.start()

    def _signal_and_wait(self, sig: signal.Signals, grace: float) -> None:
        pid = self.pid
        if pid is not None:
            log.info("sending %s to Kafka pid %d", sig.name, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if not self._wait_exit(pid, grace) and sig != signal.SIGKILL:
                log.warning("Kafka pid %d still alive after %.0fs; sending SIGKILL", pid, grace)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not self._wait_exit(pid, 15.0):
                raise KafkaLocalError(f"Kafka pid {pid} did not exit after SIGKILL")
        self._proc = None
        self.pid_file.unlink(missing_ok=True)
        if self.port:
            self._save_state(pid=None)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        proc = self._proc
        if proc is not None and proc.pid == pid:  # our child: wait() also reaps it
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalKafka(run_dir={str(self.run_dir)!r}, port={self.port}, pid={self.pid})"


def start_kafka(run_dir: Path | str, port: int = 0, **kwargs: Any) -> LocalKafka:
    """Start a broker from ``run_dir`` and return it once it serves requests."""
    return LocalKafka(run_dir, port=port, **kwargs).start()


def stop_kafka(run_dir: Path | str, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> bool:
    """Stop the broker recorded in ``run_dir/kafka.pid``; False when none was running."""
    kafka = LocalKafka(run_dir)
    was_running = kafka.is_running()
    kafka.stop(timeout)
    return was_running
