"""A real single-node Apache Kafka (KRaft) broker on 127.0.0.1 for the demo, CI and tests.

Kafka's jars are fetched once from Maven Central with ``mvn`` into an ignored cache folder
(``<repo>/.cache/kafka/<version>/libs``); the broker runs from them with ``java``. Nothing
else is needed on the machine: no Kafka distribution, no Docker, no internet besides Maven.

Library use::

    with LocalKafka(run_dir) as kafka:          # port=0 picks a free port
        use(kafka.bootstrap_servers)            # "127.0.0.1:<port>"
        kafka.restart()                         # same port, same data

Command line (``start`` leaves the broker running after it exits; ``stop`` finds it by
``<dir>/kafka.pid``)::

    python -m tools.dev.kafka_local fetch
    python -m tools.dev.kafka_local start [--dir DIR] [--port N]   # prints bootstrap
    python -m tools.dev.kafka_local status [--dir DIR]
    python -m tools.dev.kafka_local stop [--dir DIR]

Files in the run directory: ``server.properties``, ``log4j2.xml``, ``data/`` (the KRaft log
dir), ``kafka.pid``, ``kafka.json`` (ports and cluster id, reused on restart),
``kafka.out`` (the JVM's stdout/stderr), ``server.log`` (Kafka's INFO log), ``format.log``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from xml.sax.saxutils import escape as xml_escape

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pipeline.processes import pid_alive

KAFKA_VERSION = "4.1.1"
SCALA_BINARY_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"
# Pinned so a fresh machine resolves the same plugin as a warm one.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MIN_JAVA_MAJOR = 17

HOST = "127.0.0.1"
JARS_MARKER = "JARS.txt"
PID_FILE = "kafka.pid"
STATE_FILE = "kafka.json"
DEFAULT_HEAP = "1g"
DEFAULT_READY_TIMEOUT_S = 60.0
DEFAULT_STOP_TIMEOUT_S = 20.0
FETCH_TIMEOUT_S = 1800.0

ENV_CACHE_DIR = "TAILGUARD_KAFKA_CACHE"
ENV_RUN_DIR = "TAILGUARD_KAFKA_DIR"
ENV_MAVEN_REPO = "TAILGUARD_MAVEN_REPO"

log = logging.getLogger(__name__)


class KafkaLocalError(RuntimeError):
    """The local broker could not be fetched, started or stopped."""


# --------------------------------------------------------------------------------- paths


def repo_root() -> Path:
    """The repository checkout this module lives in."""
    return Path(__file__).resolve().parents[2]


def env_or_repo_path(env: str, *default: str) -> Path:
    """The directory ``$env`` names, else ``<repo>/<default>``."""
    value = os.environ.get(env)
    return Path(value) if value else repo_root().joinpath(*default)


def default_cache_dir() -> Path:
    """``$TAILGUARD_KAFKA_CACHE`` or ``<repo>/.cache/kafka`` (git-ignored)."""
    return env_or_repo_path(ENV_CACHE_DIR, ".cache", "kafka")


def default_run_dir() -> Path:
    """``$TAILGUARD_KAFKA_DIR`` or ``<repo>/var/kafka`` (git-ignored)."""
    return env_or_repo_path(ENV_RUN_DIR, "var", "kafka")


# ---------------------------------------------------------------------------------- java


def find_java() -> Path:
    """``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` on PATH (Java >= 17)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if not os.access(candidate, os.X_OK):
            raise KafkaLocalError(
                f"JAVA_HOME is set to {java_home!r} but {candidate} is not an executable; "
                "fix or unset JAVA_HOME"
            )
        java = candidate
    else:
        found = shutil.which("java")
        if found is None:
            raise KafkaLocalError(
                f"`java` not found on PATH (and JAVA_HOME is unset); Kafka {KAFKA_VERSION} "
                f"needs Java {MIN_JAVA_MAJOR}+, e.g. `apt-get install openjdk-17-jre-headless`"
            )
        java = Path(found)
    major = _java_major(str(java))
    if major is not None and major < MIN_JAVA_MAJOR:
        raise KafkaLocalError(
            f"{java} is Java {major}; Kafka {KAFKA_VERSION} needs Java {MIN_JAVA_MAJOR}+"
        )
    return java


@functools.cache
def _java_major(java: str) -> int | None:
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaLocalError(f"cannot run `{java} -version`: {exc}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_392" style
        major = int(match.group(2))
    return major


# --------------------------------------------------------------------------------- fetch


def _pom(version: str) -> str:
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tailguard.devtools</groupId>
  <artifactId>kafka-local-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{SCALA_BINARY_VERSION}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""


def _listed_jars(libs: Path) -> list[str] | None:
    """The jars named by the marker, or None when the cache is absent or incomplete."""
    marker = libs / JARS_MARKER
    try:
        names = [n for n in marker.read_text().splitlines() if n.strip()]
    except OSError:
        return None
    if not names or not all((libs / n).is_file() for n in names):
        return None
    return names


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_kafka_jars(
    cache_dir: Path | None = None,
    *,
    version: str = KAFKA_VERSION,
    maven_repo: Path | None = None,
    timeout: float = FETCH_TIMEOUT_S,
) -> Path:
    """Return ``<cache_dir>/<version>/libs``, fetching Kafka's runtime jars with Maven once.

    ``cache_dir`` defaults to :func:`default_cache_dir`. The fetch goes into a temporary
    folder beside the target and is renamed into place only when complete, with a marker
    (``JARS.txt``) listing the jars; a present, complete folder is reused without running
    Maven. Concurrent callers serialise on a lock file. ``maven_repo`` (or
    ``$TAILGUARD_MAVEN_REPO``) sets Maven's local repository; by default Maven's own
    (``~/.m2/repository``) is used, so its downloads are shared with other projects.
    """
    cache_dir = (cache_dir if cache_dir is not None else default_cache_dir()).resolve()
    version_dir = cache_dir / version
    libs = version_dir / "libs"
    if _listed_jars(libs) is not None:
        return libs

    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaLocalError(
            f"Kafka {version} jars are not cached in {libs} and `mvn` is not on PATH to fetch "
            "them from Maven Central; install Maven (e.g. `apt-get install maven`)"
        )
    find_java()  # Maven needs it too; fail with the clear message first
    if maven_repo is None and os.environ.get(ENV_MAVEN_REPO):
        maven_repo = Path(os.environ[ENV_MAVEN_REPO])

    version_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(version_dir / ".fetch.lock"):
        if _listed_jars(libs) is not None:  # another process fetched while we waited
            return libs
        for stale in version_dir.glob(".fetch-*"):  # left by an interrupted fetch
            shutil.rmtree(stale, ignore_errors=True)
        if libs.exists():  # a folder without a complete marker was never ours to trust
            shutil.rmtree(libs)

        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=version_dir))
        try:
            (tmp / "pom.xml").write_text(_pom(version))
            out_dir = tmp / "libs"
            mvn_log = tmp / "mvn.log"
            cmd = [
                mvn,
                "-B",
                "--no-transfer-progress",
                "-Dstyle.color=never",
                "-f",
                str(tmp / "pom.xml"),
                f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                f"-DoutputDirectory={out_dir}",
                "-DincludeScope=runtime",
            ]
            if maven_repo is not None:
                cmd.append(f"-Dmaven.repo.local={Path(maven_repo).resolve()}")
            log.info("fetching Kafka %s jars from Maven Central into %s", version, libs)
            started = time.monotonic()
            with mvn_log.open("wb") as fh:
                try:
                    rc = subprocess.run(
                        cmd,
                        cwd=tmp,
                        stdin=subprocess.DEVNULL,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        timeout=timeout,
                        check=False,
                    ).returncode
                except subprocess.TimeoutExpired as exc:
                    raise KafkaLocalError(
                        f"Maven did not finish fetching Kafka {version} within {timeout:.0f}s; "
                        f"last output:\n{_tail(mvn_log)}"
                    ) from exc
            if rc != 0:
                raise KafkaLocalError(
                    f"Maven failed (exit {rc}) fetching Kafka {version} jars; "
                    f"last output:\n{_tail(mvn_log)}"
                )
            jars = sorted(p.name for p in out_dir.glob("*.jar"))
            main_jar = f"kafka_{SCALA_BINARY_VERSION}-{version}.jar"
            if main_jar not in jars:
                raise KafkaLocalError(
                    f"Maven succeeded but {main_jar} is missing from {out_dir}; "
                    f"last output:\n{_tail(mvn_log)}"
                )
            (out_dir / JARS_MARKER).write_text("\n".join(jars) + "\n")
            shutil.copyfile(mvn_log, version_dir / "mvn.log")
            os.rename(out_dir, libs)
            log.info(
                "fetched %d jars for Kafka %s in %.1fs",
                len(jars),
                version,
                time.monotonic() - started,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return libs


# ------------------------------------------------------------------------------- helpers


_CONFIG_DUMP_LINE = re.compile(r"^\t[\w.-]+ = ")  # Kafka logs every config value at start


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return f"({path} is missing)"
    kept = [ln for ln in text.splitlines() if not _CONFIG_DUMP_LINE.match(ln)]
    return "\n".join(kept[-lines:]) or f"({path} is empty)"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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


def _new_cluster_id() -> str:
    while True:
        cid = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode("ascii")
        if not cid.startswith("-"):  # would be read as an option by the storage tool
            return cid


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _log4j2_xml(log_file: Path) -> str:
    path = xml_escape(str(log_file), {'"': "&quot;"})
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <RollingFile name="file" fileName="{path}" filePattern="{path}.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="64 MB"/></Policies>
      <DefaultRolloverStrategy max="2"/>
    </RollingFile>
    <Console name="stderr" target="SYSTEM_ERR">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <ThresholdFilter level="error"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="info">
      <AppenderRef ref="file"/>
      <AppenderRef ref="stderr"/>
    </Root>
    <Logger name="kafka.request.logger" level="warn"/>
    <Logger name="org.apache.kafka.clients" level="warn"/>
  </Loggers>
</Configuration>
"""


# --------------------------------------------------------------------------- the broker


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
        _write_atomic(self.state_file, json.dumps(state, indent=2) + "\n")

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
            self.cluster_id = _new_cluster_id()
        self._write_config()
        self._save_state(pid=None)
        classpath = f"{libs}{os.sep}*"
        log4j = f"-Dlog4j2.configurationFile={self.run_dir / 'log4j2.xml'}"
        if not formatted:
            self._format(java, classpath, log4j)

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
        _write_atomic(self.pid_file, f"{self._proc.pid}\n")
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
        cfg: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",  # the project creates topics explicitly
            "delete.topic.enable": "true",
            "log.cleaner.enable": "true",  # compacted topics
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "2",
            # After kill() the controller refuses the new broker incarnation until the old
            # one's session expires (DUPLICATE_BROKER_REGISTRATION); the default 9 s session
            # made kill+start take ~12 s. Heartbeats every 0.5 s keep fencing unlikely.
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "4000",
        }
        cfg.update(self.extra_config)
        body = "".join(f"{k}={v}\n" for k, v in cfg.items())
        _write_atomic(self.server_properties, f"# written by {__name__}\n{body}")
        _write_atomic(self.run_dir / "log4j2.xml", _log4j2_xml(self.server_log))

    def _format(self, java: Path, classpath: str, log4j: str) -> None:
        assert self.cluster_id is not None
        fmt_log = self.run_dir / "format.log"
        cmd = [
            str(java),
            "-Xmx256m",
            log4j,
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.cluster_id,
            "-c",
            str(self.server_properties),
        ]
        with fmt_log.open("wb") as fh:
            try:
                rc = subprocess.run(
                    cmd,
                    cwd=self.run_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    timeout=120,
                    check=False,
                ).returncode
            except subprocess.TimeoutExpired as exc:
                raise KafkaLocalError(f"formatting KRaft storage timed out; see {fmt_log}") from exc
        if rc != 0:
            raise KafkaLocalError(
                f"formatting KRaft storage in {self.data_dir} failed (exit {rc}):\n{_tail(fmt_log)}"
            )

    def _died_error(self, why: str) -> KafkaLocalError:
        return KafkaLocalError(
            f"{why}\n--- {self.stdout_log} (tail) ---\n{_tail(self.stdout_log, 20)}"
            f"\n--- {self.server_log} (tail) ---\n{_tail(self.server_log)}"
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


# ------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.dev.kafka_local",
        description=f"Local single-node Apache Kafka {KAFKA_VERSION} (KRaft) on {HOST}.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="fetch Kafka's jars with Maven (once)")
    p_fetch.add_argument("--cache-dir", type=Path, default=None, help="default: .cache/kafka")
    for name, text in (
        ("start", "start a detached broker and print its bootstrap address"),
        ("stop", "stop the broker recorded in DIR/kafka.pid"),
        ("status", "print the bootstrap address if running (exit 0), else exit 1"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", type=Path, default=None, help="run dir; default: var/kafka")
        if name == "start":
            p.add_argument("--port", type=int, default=0, help="0 = a free port (default)")
            p.add_argument("--cache-dir", type=Path, default=None)
            p.add_argument("--timeout", type=float, default=DEFAULT_READY_TIMEOUT_S)
        if name == "stop":
            p.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return _run(args, parser.prog)
    except KafkaLocalError as exc:
        log.error("error: %s", exc)  # noqa: TRY400 - the message is the diagnosis
        return 2


def _run(args: argparse.Namespace, prog: str) -> int:
    if args.command == "fetch":
        t0 = time.monotonic()
        libs = ensure_kafka_jars(args.cache_dir)
        print(libs)
        log.info("jars ready in %.1fs", time.monotonic() - t0)
        return 0
    run_dir = args.dir if args.dir is not None else default_run_dir()
    if args.command == "start":
        kafka = LocalKafka(
            run_dir, port=args.port, cache_dir=args.cache_dir, ready_timeout=args.timeout
        )
        if kafka.is_running():
            log.info("already running (pid %s) from %s", kafka.pid, kafka.run_dir)
        else:
            kafka.start()
            log.info("logs: %s; stop with: %s stop --dir %s", kafka.server_log, prog, kafka.run_dir)
        print(kafka.bootstrap_servers)
        return 0
    if args.command == "stop":
        state = "stopped the broker" if stop_kafka(run_dir, args.timeout) else "no broker running"
        log.info("%s in %s", state, Path(run_dir).resolve())
        return 0
    kafka = LocalKafka(run_dir)  # status
    if not kafka.is_running():
        log.info("not running (%s)", kafka.run_dir)
        return 1
    log.info("running: pid %s, data %s", kafka.pid, kafka.data_dir)
    print(kafka.bootstrap_servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
