"""The worker's settings: one frozen object, built once at the CLI.

:class:`Settings` builds on the emitters' :class:`pipeline.kafka_settings.EmitterSettings`
(Kafka connection, topics, the emitters' own fields) and adds the store, the worker, the
controller and alerting. Every field can be set by an environment variable
``TAILGUARD_<FIELD>`` (upper case); the CLI's flags override the environment. Secrets are
``SecretStr`` and never logged (``Settings.redacted()`` is what logs show). Invalid
settings fail at start-up with the field name in the message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, model_validator

from pipeline.core.eventtime import ClockConfig
from pipeline.core.join import JoinConfig
from pipeline.core.windows import WindowConfig
from pipeline.kafka_settings import EmitterSettings
from pipeline.shipped import (
    DEFAULT_BURN_RULES,
    DEFAULT_POLICY,
    DEFAULT_SLO_SPEC,
    EXAMPLE_POLICY,
    EXAMPLE_SLO_SPEC,
    SPECS_DIR,
)

__all__ = [
    "DEFAULT_BURN_RULES",
    "DEFAULT_POLICY",
    "DEFAULT_SLO_SPEC",
    "EXAMPLE_POLICY",
    "EXAMPLE_SLO_SPEC",
    "SPECS_DIR",
    "Settings",
]


class Settings(EmitterSettings):
    # --- Kafka (the worker's side: topics it creates, its consumer group) ------
    topic_partitions: Annotated[int, Field(ge=1, le=1024)] = 8
    """TAILGUARD_TOPIC_PARTITIONS: partitions for created topics."""
    replication_factor: Annotated[int, Field(ge=1)] = 1
    """TAILGUARD_REPLICATION_FACTOR"""
    group_id: Annotated[str, Field(min_length=1)] = "tailguard-worker"
    """TAILGUARD_GROUP_ID: worker consumer group."""
    max_message_bytes: Annotated[int, Field(ge=1024)] = 1_048_576
    """TAILGUARD_MAX_MESSAGE_BYTES: larger messages go to the DLQ."""

    # --- ClickHouse --------------------------------------------------------
    store_dir: Path = Path("var/store")
    """TAILGUARD_STORE_DIR: embedded ClickHouse (chDB) data directory."""
    clickhouse_url: str | None = None
    """TAILGUARD_CLICKHOUSE_URL: http(s)://host:port of a ClickHouse server; when set it replaces
    the embedded store."""
    clickhouse_user: str = "default"
    """TAILGUARD_CLICKHOUSE_USER"""
    clickhouse_password: SecretStr = SecretStr("")
    """TAILGUARD_CLICKHOUSE_PASSWORD (secret)"""
    database: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "tailguard"
    """TAILGUARD_DATABASE"""
    cluster: Annotated[str | None, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")] = None
    """TAILGUARD_CLUSTER: apply DDL ON CLUSTER with Replicated engines."""

    # --- Worker ------------------------------------------------------------
    join_timeout_ms: Annotated[int, Field(gt=0)] = 15_000
    """TAILGUARD_JOIN_TIMEOUT_MS: wait for the partner event."""
    inflight_ttl_ms: Annotated[int, Field(gt=0)] = 600_000
    """TAILGUARD_INFLIGHT_TTL_MS: drop a lone gateway.received."""
    flush_interval_ms: Annotated[int, Field(ge=50)] = 1000
    """TAILGUARD_FLUSH_INTERVAL_MS: write + commit period."""
    flush_max_rows: Annotated[int, Field(ge=1)] = 20_000
    """TAILGUARD_FLUSH_MAX_ROWS: flush early at this many rows."""
    take_max_messages: Annotated[int, Field(ge=1)] = 100
    """TAILGUARD_TAKE_MAX_MESSAGES: messages per processing batch. Batched producers put up to
    200 events in a message: 100 messages are ~0.4 s of processing at most, so the flush,
    commit and controller timers run between batches (1000 held the loop for ~6 s)."""
    fetch_max_wait_ms: Annotated[int, Field(ge=1, le=60_000)] = 50
    """TAILGUARD_FETCH_MAX_WAIT_MS: how long the broker may hold the worker's fetch for data. A
    fetch request names every partition without buffered records, so while the lifecycle
    partitions' records are being processed it names only quiet ones (summaries, stats) and
    waits this long; the lifecycle records then reach the worker in chunks this far apart.
    Faust's own 1500 ms made the input arrive 0.6-1.6 s late at 50,000 events/s (bench
    detection)."""
    fetch_max_partition_bytes: Annotated[int, Field(ge=65_536, le=268_435_456)] = 4_194_304
    """TAILGUARD_FETCH_MAX_PARTITION_BYTES: the most a fetch returns of one partition (Kafka's
    max.partition.fetch.bytes; a larger first batch still comes whole). The consumer asks a
    partition again only once its fetched records are taken: with Faust's 1 MiB (~70 batched
    messages, ~0.25 s of processing) the event loop waited on fetches, and each fetch cost
    the consumer thread a GIL handoff. Measured catching up 1.16 M events, alternating runs:
    1 MiB 41.7 / 41.7 / 46.0k events/s, 4 MiB 49.4 / 50.5 / 49.9k, 8 MiB 46.6 / 47.5k."""
    max_pending: Annotated[int, Field(ge=1)] = 1_000_000
    """TAILGUARD_MAX_PENDING: pending joins per worker (all its partitions); beyond it the oldest
    are resolved early and counted as evicted."""
    topic_check_interval_ms: Annotated[int, Field(ge=100)] = 2000
    """TAILGUARD_TOPIC_CHECK_INTERVAL_MS: how often the worker checks that its lifecycle topic was
    not deleted or recreated (and then resubscribes)."""
    fault_store_outage_file: Path | None = None
    """TAILGUARD_FAULT_STORE_OUTAGE_FILE: fault injection, for tests only: while this file exists,
    ClickHouse rejects the worker's inserts (see pipeline.adapters.store.OutageInjectingStore).
    Never set in production."""
    fault_store_partial_file: Path | None = None
    """TAILGUARD_FAULT_STORE_PARTIAL_FILE: fault injection, for tests only: while this file
    exists, the rollups it names (one table a line; none named: latency_1h) reject every
    insert, so that a write of windows lands in window_sketches and fails in a view (a real
    partial write); a line ``kill``: the process SIGKILLs itself right after such a write
    (see pipeline.adapters.store.PartialWriteInjectingStore). Never set in production."""
    worker_web_port: Annotated[int | None, Field(ge=1, le=65535)] = None
    """TAILGUARD_WORKER_WEB_PORT: Faust web UI (off when unset)."""
    query_port: Annotated[int, Field(ge=-1, le=65535)] = 0
    """TAILGUARD_QUERY_PORT: the worker's read-only query port on 127.0.0.1 for tools reading its
    embedded store (0 = an ephemeral port, -1 = off)."""
    query_max_execution_s: Annotated[int, Field(ge=1, le=3600)] = 30
    """TAILGUARD_QUERY_MAX_EXECUTION_S: a query on the query port is stopped after this
    (max_execution_time; the port answers 159 itself 1 s later should the engine not)."""
    query_max_memory_mb: Annotated[int, Field(ge=16)] = 512
    """TAILGUARD_QUERY_MAX_MEMORY_MB: memory one query on the query port may use in the worker's
    process (max_memory_usage; past it the engine stops it, code 241)."""
    query_max_result_mb: Annotated[int, Field(ge=1)] = 256
    """TAILGUARD_QUERY_MAX_RESULT_MB: the largest answer of one query on the query port
    (max_result_bytes; past it code 396)."""
    query_max_threads: Annotated[int, Field(ge=0, le=1024)] = 0
    """TAILGUARD_QUERY_MAX_THREADS: engine threads of one query on the query port (0 = a quarter
    of the cores, at least 1), so that a heavy query leaves the writer its cores."""
    query_nice: Annotated[int, Field(ge=0, le=19)] = 0
    """TAILGUARD_QUERY_NICE: the nice value of the engine's threads while they run a query of the
    query port (os_thread_priority; 19 lets the writer's threads, at 0, have the cores first).
    A query is stopped at its memory limit once it has allocated that much, which takes CPU time:
    at 19 a memory bomb beside busy processes ran 9-30 s, at 0 1-11 s (docs/configuration.md)."""
    query_concurrency: Annotated[int, Field(ge=1, le=16)] = 2
    """TAILGUARD_QUERY_CONCURRENCY: queries the query port runs at once, each on a read-only chDB
    session of its own (the port's queries use at most this many times query_max_memory_mb)."""
    query_per_client: Annotated[int, Field(ge=1, le=16)] = 1
    """TAILGUARD_QUERY_PER_CLIENT: queries one client (its user name and User-Agent) runs at once on
    the query port; more wait in a round-robin queue across clients. At most
    query_concurrency."""
    query_queue_wait_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    """TAILGUARD_QUERY_QUEUE_WAIT_S: a query waits this long at most for its turn on the query port,
    then is answered code 202 (TOO_MANY_SIMULTANEOUS_QUERIES)."""
    session_timeout_ms: Annotated[int, Field(ge=6000)] = 10_000
    """TAILGUARD_SESSION_TIMEOUT_MS: a dead worker's partitions move after this."""
    window_size_ms: Annotated[int, Field(gt=0)] = 10_000
    """TAILGUARD_WINDOW_SIZE_MS: base tumbling window."""
    window_grace_ms: Annotated[int, Field(ge=0)] = 30_000
    """TAILGUARD_WINDOW_GRACE_MS: lateness accepted before closing."""
    max_event_ahead_ms: Annotated[int, Field(gt=0)] = 300_000
    """TAILGUARD_MAX_EVENT_AHEAD_MS: an event stamped further ahead of its partition's clock is
    quarantined to the DLQ (ts_out_of_range)."""
    max_window_keys: Annotated[int, Field(ge=1)] = 1000
    """TAILGUARD_MAX_WINDOW_KEYS: keys per window, then __other__."""
    slo_spec: Path | None = DEFAULT_SLO_SPEC
    """TAILGUARD_SLO_SPEC: SLO spec YAML (default: specs/slo-default.yaml)."""
    policy_file: Path | None = DEFAULT_POLICY
    """TAILGUARD_POLICY_FILE: control policy (None: no control)."""
    burn_rules_file: Path = DEFAULT_BURN_RULES
    """TAILGUARD_BURN_RULES_FILE: multiwindow burn-rate rules."""
    queue_capacity: Annotated[int, Field(ge=1)] = 64
    """TAILGUARD_QUEUE_CAPACITY: num_waiting of a full engine queue."""
    gateway_instances: Annotated[int, Field(ge=1, le=10_000)] = 1
    """TAILGUARD_GATEWAY_INSTANCES: gateway instances (processes) enforcing directives; a
    directive's admission rate is split equally among them (Actions.admit_gateways)."""
    control_enabled: bool = False
    """TAILGUARD_CONTROL_ENABLED: run the controller and publish signed directives (needs control
    keys: TAILGUARD_CONTROL_KEYS_FILE, or TAILGUARD_CONTROL_KEYS + TAILGUARD_CONTROL_ACTIVE_KID)."""
    control_keys_file: Path | None = None
    """TAILGUARD_CONTROL_KEYS_FILE: HMAC keys for control signals (secret): {active: k2, keys: {k1:
    <base64>, k2: <base64>}} as JSON or YAML."""
    control_keys: SecretStr | None = None
    """TAILGUARD_CONTROL_KEYS: the same keys inline, k1:<base64>,k2:<base64> (secret; instead of a
    keys file, with TAILGUARD_CONTROL_ACTIVE_KID)."""
    control_active_kid: str | None = None
    """TAILGUARD_CONTROL_ACTIVE_KID: the key of TAILGUARD_CONTROL_KEYS that signs."""
    control_provisional_ms: Annotated[int, Field(ge=0)] = 100
    """TAILGUARD_CONTROL_PROVISIONAL_MS: period of the snapshots of ended windows sent to the
    controller, so it decides without waiting for the grace period (0: decide on closed windows
    only, window + grace later)."""
    control_decision_delay_ms: Annotated[int, Field(ge=0)] = 100
    """TAILGUARD_CONTROL_DECISION_DELAY_MS: with snapshots, decide on a window this long after every
    partition's clock passed its end."""
    control_heartbeat_ms: Annotated[int, Field(ge=100)] = 10_000
    """TAILGUARD_CONTROL_HEARTBEAT_MS: re-issue period of directives (a signal lives 3 of them)."""
    store_raw_events: bool = True
    """TAILGUARD_STORE_RAW_EVENTS: keep raw lifecycle events in ClickHouse."""
    raw_events_ttl_days: Annotated[int, Field(ge=1)] = 7
    """TAILGUARD_RAW_EVENTS_TTL_DAYS: retention of raw events; whoever opens the store to
    write (worker, migrate, replay --store) sets lifecycle_events to it (MODIFY TTL when
    an earlier start rendered another)."""

    # --- Prometheus / Alertmanager (the controller; issue 16) --------------
    prometheus_port: Annotated[int | None, Field(ge=0, le=65535)] = None
    """TAILGUARD_PROMETHEUS_PORT: the worker's /metrics: its SLO counters and latency histograms,
    and the controller's gauges where it runs (docs/alerting.md; off when unset; 0 = an
    ephemeral port)."""
    prometheus_host: str = "127.0.0.1"
    """TAILGUARD_PROMETHEUS_HOST: address /metrics listens on (loopback by default; set 0.0.0.0 only
    behind a network policy)."""
    alertmanager_url: Annotated[str | None, Field(pattern=r"^https?://")] = None
    """TAILGUARD_ALERTMANAGER_URL: Alertmanager base URL; burn-rate alerts are posted to
    <url>/api/v2/alerts (off when unset)."""
    alert_webhook_url: Annotated[str | None, Field(pattern=r"^https?://")] = None
    """TAILGUARD_ALERT_WEBHOOK_URL: generic webhook for the same alerts, signed with
    TAILGUARD_ALERT_WEBHOOK_SECRET (off when unset)."""
    alert_webhook_secret: SecretStr | None = None
    """TAILGUARD_ALERT_WEBHOOK_SECRET: HMAC-SHA256 key (secret)."""

    @model_validator(mode="after")
    def _check_worker(self) -> Settings:
        if self.control_keys_file is not None and self.control_keys is not None:
            raise ValueError("set either control_keys_file or control_keys, not both")
        if self.control_keys is not None and not self.control_active_kid:
            raise ValueError("control_keys needs control_active_kid (the key id that signs)")
        if self.control_active_kid and self.control_keys is None:
            raise ValueError(
                "control_active_kid goes with control_keys (a keys file names its own active key)"
            )
        if 3 * self.control_heartbeat_ms > self.control_max_ttl_ms:
            raise ValueError(
                f"control_heartbeat_ms {self.control_heartbeat_ms}: a signal lives 3 heartbeats, "
                f"longer than control_max_ttl_ms {self.control_max_ttl_ms}"
            )
        if self.query_per_client > self.query_concurrency:
            raise ValueError(
                f"query_per_client {self.query_per_client} is more than query_concurrency "
                f"{self.query_concurrency} (the queries the port runs at once)"
            )
        if self.alert_webhook_url and not (
            self.alert_webhook_secret and self.alert_webhook_secret.get_secret_value()
        ):
            raise ValueError("alert_webhook_url needs alert_webhook_secret (the signing key)")
        return self

    def window_config(self) -> WindowConfig:
        return WindowConfig(
            size_ms=self.window_size_ms,
            grace_ms=self.window_grace_ms,
            max_keys=self.max_window_keys,
        )

    def clock_config(self) -> ClockConfig:
        return ClockConfig(max_ahead_ms=self.max_event_ahead_ms)

    def join_config(self) -> JoinConfig:
        return JoinConfig(timeout_ms=self.join_timeout_ms, inflight_ttl_ms=self.inflight_ttl_ms)
