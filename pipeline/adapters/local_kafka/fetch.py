"""Kafka's jars, fetched once from Maven Central with ``mvn``, and the ``java`` that runs
them (Java 17+): nothing else is needed on the machine (no Kafka distribution, no Docker).

The cache (:func:`default_cache_dir`): ``$TAILGUARD_KAFKA_CACHE``; in a checkout
``<repo>/.cache/kafka`` (git-ignored, where ``./tg`` fetches them); in an installed
package ``$XDG_CACHE_HOME/tailguard/kafka`` (``~/.cache/tailguard/kafka``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

KAFKA_VERSION = "4.1.1"
SCALA_BINARY_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"
# Pinned so a fresh machine resolves the same plugin as a warm one.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MIN_JAVA_MAJOR = 17

JARS_MARKER = "JARS.txt"
FETCH_TIMEOUT_S = 1800.0

ENV_CACHE_DIR = "TAILGUARD_KAFKA_CACHE"
ENV_MAVEN_REPO = "TAILGUARD_MAVEN_REPO"

log = logging.getLogger(__name__)


class KafkaLocalError(RuntimeError):
    """The local broker could not be fetched, started or stopped."""


def checkout_root() -> Path | None:
    """The tailguard checkout this package runs from (``./tg`` beside ``pyproject.toml``),
    or None when it is installed."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "tg").is_file() and (root / "pyproject.toml").is_file() else None


def default_cache_dir() -> Path:
    """``$TAILGUARD_KAFKA_CACHE``, else ``<checkout>/.cache/kafka`` (git-ignored), else
    ``$XDG_CACHE_HOME/tailguard/kafka`` (``~/.cache/tailguard/kafka``)."""
    value = os.environ.get(ENV_CACHE_DIR)
    if value:
        return Path(value)
    root = checkout_root()
    if root is not None:
        return root / ".cache" / "kafka"
    user_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(user_cache) / "tailguard" / "kafka"


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
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created) while the block runs: concurrent
    fetches serialise on it."""
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
    with file_lock(version_dir / ".fetch.lock"):
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
            try:
                rc = run_logged(cmd, cwd=tmp, log_path=mvn_log, timeout_s=timeout)
            except subprocess.TimeoutExpired as exc:
                raise KafkaLocalError(
                    f"Maven did not finish fetching Kafka {version} within {timeout:.0f}s; "
                    f"last output:\n{tail(mvn_log)}"
                ) from exc
            if rc != 0:
                raise KafkaLocalError(
                    f"Maven failed (exit {rc}) fetching Kafka {version} jars; "
                    f"last output:\n{tail(mvn_log)}"
                )
            jars = sorted(p.name for p in out_dir.glob("*.jar"))
            main_jar = f"kafka_{SCALA_BINARY_VERSION}-{version}.jar"
            if main_jar not in jars:
                raise KafkaLocalError(
                    f"Maven succeeded but {main_jar} is missing from {out_dir}; "
                    f"last output:\n{tail(mvn_log)}"
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


_CONFIG_DUMP_LINE = re.compile(r"^\t[\w.-]+ = ")  # Kafka logs every config value at start


def run_logged(cmd: list[str], *, cwd: Path, log_path: Path, timeout_s: float) -> int:
    """``cmd``'s exit status, run in ``cwd`` with its output (stdout and stderr) into
    ``log_path``; ``subprocess.TimeoutExpired`` past ``timeout_s``."""
    with log_path.open("wb") as fh:
        return subprocess.run(
            cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
            timeout=timeout_s, check=False,
        ).returncode  # fmt: skip


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` of a log, less Kafka's dump of its configuration."""
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
