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
    topic_partitions: int = Field(
        8, ge=1, le=1024, description="TAILGUARD_TOPIC_PARTITIONS: partitions for created topics."
    )
    replication_factor: int = Field(1, ge=1, description="TAILGUARD_REPLICATION_FACTOR")
    group_id: str = Field(
        "tailguard-worker", min_length=1, description="TAILGUARD_GROUP_ID: worker consumer group."
    )
    max_message_bytes: int = Field(
        1_048_576,
        ge=1024,
        description="TAILGUARD_MAX_MESSAGE_BYTES: larger messages go to the DLQ.",
    )

    # --- ClickHouse --------------------------------------------------------
    store_dir: Path = Field(
        Path("var/store"),
        description="TAILGUARD_STORE_DIR: embedded ClickHouse (chDB) data directory.",
    )
    clickhouse_url: str | None = Field(
        None,
        description="TAILGUARD_CLICKHOUSE_URL: http(s)://host:port of a ClickHouse server; "
        "when set it replaces the embedded store.",
    )
    clickhouse_user: str = Field("default", description="TAILGUARD_CLICKHOUSE_USER")
    clickhouse_password: SecretStr = Field(
        SecretStr(""), description="TAILGUARD_CLICKHOUSE_PASSWORD (secret)"
    )
    database: str = Field(
        "tailguard", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="TAILGUARD_DATABASE"
    )
    cluster: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$",
        description="TAILGUARD_CLUSTER: apply DDL ON CLUSTER with Replicated engines.",
    )

    # --- Worker ------------------------------------------------------------
    join_timeout_ms: int = Field(
        15_000, gt=0, description="TAILGUARD_JOIN_TIMEOUT_MS: wait for the partner event."
    )
    inflight_ttl_ms: int = Field(
        600_000, gt=0, description="TAILGUARD_INFLIGHT_TTL_MS: drop a lone gateway.received."
    )
    flush_interval_ms: int = Field(
        1000, ge=50, description="TAILGUARD_FLUSH_INTERVAL_MS: write + commit period."
    )
    flush_max_rows: int = Field(
        20_000, ge=1, description="TAILGUARD_FLUSH_MAX_ROWS: flush early at this many rows."
    )
    take_max_messages: int = Field(
        1000, ge=1, description="TAILGUARD_TAKE_MAX_MESSAGES: messages per processing batch."
    )
    max_pending: int = Field(
        1_000_000,
        ge=1,
        description="TAILGUARD_MAX_PENDING: pending joins per worker (all its partitions); "
        "beyond it the oldest are resolved early and counted as evicted.",
    )
    topic_check_interval_ms: int = Field(
        2000,
        ge=100,
        description="TAILGUARD_TOPIC_CHECK_INTERVAL_MS: how often the worker checks that its "
        "lifecycle topic was not deleted or recreated (and then resubscribes).",
    )
    fault_store_outage_file: Path | None = Field(
        None,
        description="TAILGUARD_FAULT_STORE_OUTAGE_FILE: fault injection, for tests only: while "
        "this file exists, ClickHouse rejects the worker's inserts (see "
        "pipeline.adapters.store.OutageInjectingStore). Never set in production.",
    )
    worker_web_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="TAILGUARD_WORKER_WEB_PORT: Faust web UI (off when unset).",
    )
    query_port: int = Field(
        0,
        ge=-1,
        le=65535,
        description="TAILGUARD_QUERY_PORT: the worker's read-only query port on 127.0.0.1 for "
        "tools reading its embedded store (0 = an ephemeral port, -1 = off).",
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=6000,
        description="TAILGUARD_SESSION_TIMEOUT_MS: a dead worker's partitions move after this.",
    )
    window_size_ms: int = Field(
        10_000, gt=0, description="TAILGUARD_WINDOW_SIZE_MS: base tumbling window."
    )
    window_grace_ms: int = Field(
        30_000, ge=0, description="TAILGUARD_WINDOW_GRACE_MS: lateness accepted before closing."
    )
    max_event_ahead_ms: int = Field(
        300_000,
        gt=0,
        description="TAILGUARD_MAX_EVENT_AHEAD_MS: an event stamped further ahead of its "
        "partition's clock is quarantined to the DLQ (ts_out_of_range).",
    )
    max_window_keys: int = Field(
        1000, ge=1, description="TAILGUARD_MAX_WINDOW_KEYS: keys per window, then __other__."
    )
    slo_spec: Path | None = Field(
        DEFAULT_SLO_SPEC,
        description="TAILGUARD_SLO_SPEC: SLO spec YAML (default: specs/slo-default.yaml).",
    )
    policy_file: Path | None = Field(
        DEFAULT_POLICY, description="TAILGUARD_POLICY_FILE: control policy (None: no control)."
    )
    burn_rules_file: Path = Field(
        DEFAULT_BURN_RULES, description="TAILGUARD_BURN_RULES_FILE: multiwindow burn-rate rules."
    )
    queue_capacity: int = Field(
        64, ge=1, description="TAILGUARD_QUEUE_CAPACITY: num_waiting of a full engine queue."
    )
    control_enabled: bool = Field(
        False,
        description="TAILGUARD_CONTROL_ENABLED: run the controller and publish signed directives "
        "(needs control keys: TAILGUARD_CONTROL_KEYS_FILE, or TAILGUARD_CONTROL_KEYS + "
        "TAILGUARD_CONTROL_ACTIVE_KID).",
    )
    control_keys_file: Path | None = Field(
        None,
        description="TAILGUARD_CONTROL_KEYS_FILE: HMAC keys for control signals (secret): "
        "{active: k2, keys: {k1: <base64>, k2: <base64>}} as JSON or YAML.",
    )
    control_keys: SecretStr | None = Field(
        None,
        description="TAILGUARD_CONTROL_KEYS: the same keys inline, k1:<base64>,k2:<base64> "
        "(secret; instead of a keys file, with TAILGUARD_CONTROL_ACTIVE_KID).",
    )
    control_active_kid: str | None = Field(
        None,
        description="TAILGUARD_CONTROL_ACTIVE_KID: the key of TAILGUARD_CONTROL_KEYS that signs.",
    )
    control_provisional_ms: int = Field(
        100,
        ge=0,
        description="TAILGUARD_CONTROL_PROVISIONAL_MS: period of the snapshots of ended windows "
        "sent to the controller, so it decides without waiting for the grace period "
        "(0: decide on closed windows only, window + grace later).",
    )
    control_decision_delay_ms: int = Field(
        100,
        ge=0,
        description="TAILGUARD_CONTROL_DECISION_DELAY_MS: with snapshots, decide on a window "
        "this long after every partition's clock passed its end.",
    )
    control_heartbeat_ms: int = Field(
        10_000, ge=100, description="TAILGUARD_CONTROL_HEARTBEAT_MS: re-issue period of directives."
    )
    store_raw_events: bool = Field(
        True, description="TAILGUARD_STORE_RAW_EVENTS: keep raw lifecycle events in ClickHouse."
    )
    raw_events_ttl_days: int = Field(
        7, ge=1, description="TAILGUARD_RAW_EVENTS_TTL_DAYS: retention of raw events."
    )

    # --- Prometheus / Alertmanager (the controller; issue 16) --------------
    prometheus_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="TAILGUARD_PROMETHEUS_PORT: the controller's OpenMetrics /metrics "
        "(off when unset; 0 = an ephemeral port).",
    )
    prometheus_host: str = Field(
        "127.0.0.1",
        description="TAILGUARD_PROMETHEUS_HOST: address /metrics listens on (loopback by "
        "default; set 0.0.0.0 only behind a network policy).",
    )
    alertmanager_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="TAILGUARD_ALERTMANAGER_URL: Alertmanager base URL; burn-rate alerts are "
        "posted to <url>/api/v2/alerts (off when unset).",
    )
    alert_webhook_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="TAILGUARD_ALERT_WEBHOOK_URL: generic webhook for the same alerts, signed "
        "with TAILGUARD_ALERT_WEBHOOK_SECRET (off when unset).",
    )
    alert_webhook_secret: SecretStr | None = Field(
        None, description="TAILGUARD_ALERT_WEBHOOK_SECRET: HMAC-SHA256 key (secret)."
    )

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
