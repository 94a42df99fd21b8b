"""The files a local broker runs from, in its run directory: ``server.properties`` (one
KRaft broker+controller on 127.0.0.1), ``log4j2.xml``, and the formatted KRaft storage."""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

from pipeline.adapters.local_kafka.fetch import KafkaLocalError, run_logged, tail

HOST = "127.0.0.1"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def new_cluster_id() -> str:
    while True:
        cid = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode("ascii")
        if not cid.startswith("-"):  # would be read as an option by the storage tool
            return cid


def server_config(port: int, controller_port: int, data_dir: Path, extra: Mapping[str, str]) -> str:
    """``server.properties`` of a single-node broker+controller; ``extra`` over it."""
    cfg: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
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
    cfg.update(extra)
    body = "".join(f"{k}={v}\n" for k, v in cfg.items())
    return f"# written by {__name__}\n{body}"


def log4j2_xml(log_file: Path) -> str:
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


def format_storage(
    java: Path,
    classpath: str,
    log4j: str,
    *,
    cluster_id: str,
    server_properties: Path,
    run_dir: Path,
    data_dir: Path,
) -> None:
    """Format the KRaft storage of ``data_dir`` for ``cluster_id`` (the first start only)."""
    fmt_log = run_dir / "format.log"
    cmd = [
        str(java),
        "-Xmx256m",
        log4j,
        "-cp",
        classpath,
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(server_properties),
    ]
    try:
        rc = run_logged(cmd, cwd=run_dir, log_path=fmt_log, timeout_s=120)
    except subprocess.TimeoutExpired as exc:
        raise KafkaLocalError(f"formatting KRaft storage timed out; see {fmt_log}") from exc
    if rc != 0:
        raise KafkaLocalError(
            f"formatting KRaft storage in {data_dir} failed (exit {rc}):\n{tail(fmt_log)}"
        )
