"""The emitters' settings: Kafka only (no core, no numpy, no store), built once at the CLI.

:class:`KafkaSettings` is how to reach Kafka and the topics' names; :class:`EmitterSettings`
adds what an emitter (gateway, Envoy ingester, vLLM plugin) needs beside it. The worker's
full :class:`pipeline.settings.Settings` builds on them. Every field can be set by an
environment variable ``TAILGUARD_<FIELD>`` (upper case); the CLI's flags override the
environment. Secrets are ``SecretStr`` and never logged (``redacted()`` is what logs show).
Invalid settings fail at start-up with the field name in the message.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.contract.topics import TOPICS

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Narrow = TypeVar("Narrow", bound="DataclassInstance")

# Each topic's default name, by the setting that renames it (the table of topics).
_TOPIC = {t.setting: t.name for t in TOPICS}


class KafkaSettings(BaseSettings):
    # each field's docstring is its description: its environment variable and meaning
    model_config = SettingsConfigDict(
        env_prefix="TAILGUARD_", frozen=True, extra="forbid", use_attribute_docstrings=True
    )

    bootstrap_servers: str = "127.0.0.1:9092"
    """TAILGUARD_BOOTSTRAP_SERVERS: Kafka bootstrap host:port list."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """TAILGUARD_SECURITY_PROTOCOL"""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """TAILGUARD_SASL_MECHANISM"""
    sasl_username: str | None = None
    """TAILGUARD_SASL_USERNAME"""
    sasl_password: SecretStr | None = None
    """TAILGUARD_SASL_PASSWORD (secret)"""
    ssl_cafile: Path | None = None
    """TAILGUARD_SSL_CAFILE: CA bundle for TLS."""
    lifecycle_topic: str = _TOPIC["lifecycle_topic"]
    """TAILGUARD_LIFECYCLE_TOPIC"""
    engine_stats_topic: str = _TOPIC["engine_stats_topic"]
    """TAILGUARD_ENGINE_STATS_TOPIC"""
    dlq_topic: str = _TOPIC["dlq_topic"]
    """TAILGUARD_DLQ_TOPIC"""
    summaries_topic: str = _TOPIC["summaries_topic"]
    """TAILGUARD_SUMMARIES_TOPIC"""
    ledger_topic: str = _TOPIC["ledger_topic"]
    """TAILGUARD_LEDGER_TOPIC: requests counted per partition, for workers that take a partition
    over (shared by workers with separate stores)."""
    control_topic: str = _TOPIC["control_topic"]
    """TAILGUARD_CONTROL_TOPIC"""

    @model_validator(mode="after")
    def _check_kafka(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL") and not (
            self.sasl_mechanism and self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                "security_protocol SASL_* needs sasl_mechanism, sasl_username and sasl_password"
            )
        return self

    def kafka_config(self) -> dict[str, Any]:
        """librdkafka (confluent-kafka) client configuration."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
            conf["sasl.username"] = self.sasl_username
            conf["sasl.password"] = (
                self.sasl_password.get_secret_value() if self.sasl_password else ""
            )
        if self.ssl_cafile:
            conf["ssl.ca.location"] = str(self.ssl_cafile)
        return conf

    def to_env(self) -> dict[str, str]:
        """These settings as ``TAILGUARD_*`` variables, for a child process (secrets included)."""
        out = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            out[f"TAILGUARD_{name.upper()}"] = str(value)
        return out

    def redacted(self) -> dict[str, Any]:
        """What logs show: secrets masked."""
        return self.model_dump(mode="json")  # SecretStr serialises as '**********'

    def kafka_only(self) -> KafkaSettings:
        """These settings' Kafka part alone (the connection and the topics' names), for an
        adapter that only reaches Kafka: from a worker's or an emitter's settings, a
        :class:`KafkaSettings` of the same values (not read from the environment again)."""
        if type(self) is KafkaSettings:
            return self
        return KafkaSettings.model_construct(
            **{name: getattr(self, name) for name in KafkaSettings.model_fields}
        )

    def narrowed(self, cls: type[Narrow], **derived: Any) -> Narrow:
        """An adapter's own settings, the frozen dataclass ``cls``, built once where the
        worker or the CLI wires the adapter: each field is the setting of its name, but
        those given in ``derived`` (what the adapter takes computed from the settings)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name not in derived]
        return cls(**{name: getattr(self, name) for name in names}, **derived)


class EmitterSettings(KafkaSettings):
    """What the gateway, the Envoy ingester and the vLLM plugin read (the base install)."""

    # --- the emitter's own telemetry (OpenTelemetry) -------------------------
    metrics_exporter: Literal["none", "console", "otlp"] = "none"
    """TAILGUARD_METRICS_EXPORTER: the process's own OpenTelemetry metrics."""
    metrics_file: Path | None = None
    """TAILGUARD_METRICS_FILE: console exporter output (default stdout)."""
    metrics_interval_ms: Annotated[int, Field(ge=100)] = 10_000
    """TAILGUARD_METRICS_INTERVAL_MS: export period."""

    # --- a gateway's control (producers/enforcement.py; the worker's too) -----
    control_mode: Literal["off", "shadow", "enforce"] = "off"
    """TAILGUARD_CONTROL_MODE: what a gateway (tailguard gateway, the LiteLLM hook) does with the
    directives: off (not read), shadow (decide and count what it would refuse, serve everything)
    or enforce."""
    control_enforce_from_priority: Annotated[int, Field(ge=0, le=3)] = 0
    """TAILGUARD_CONTROL_ENFORCE_FROM_PRIORITY: in enforce, only priorities at or above this tier
    number are enforced, the others shadowed (3: the rollout's first step; 0: all)."""
    control_mode_scopes: str | None = None
    """TAILGUARD_CONTROL_MODE_SCOPES: per-model modes over TAILGUARD_CONTROL_MODE, e.g.
    llama=enforce,qwen=shadow."""
    control_retry_budget_ratio: Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)] = 0.2
    """TAILGUARD_CONTROL_RETRY_BUDGET_RATIO: while a directive is in force, a gateway admits
    retries (x-stainless-retry-count > 0, or a repeated idempotency-key / x-client-request-id)
    per model at most this fraction of the first attempts of the last 10 s (Envoy's retry
    budget: 0.2); a retry over it gets 429 with x-should-retry: false. Priority 0 never."""
    control_retry_budget_min_retries: Annotated[int, Field(ge=0)] = 3
    """TAILGUARD_CONTROL_RETRY_BUDGET_MIN_RETRIES: retries per model and 10 s a gateway always
    admits, whatever the ratio (a trickle is never refused; Envoy's min_retry_concurrency)."""
    control_max_ttl_ms: Annotated[int, Field(ge=1000)] = 300_000
    """TAILGUARD_CONTROL_MAX_TTL_MS: the controller never signs a signal that lives longer (it
    must cover 3 heartbeats); gateways enforce no signal longer than that after it was issued:
    give them the issuers' value."""

    # --- vLLM stat-logger plugin (producers/vllm_plugin.py) -----------------
    engine_host: Annotated[str | None, Field(min_length=1, max_length=200)] = None
    """TAILGUARD_ENGINE_HOST: host name in engine events (default: the hostname); the plugin appends
    /engine<index>."""
    engine_stats_interval_ms: Annotated[int, Field(ge=0)] = 1000
    """TAILGUARD_ENGINE_STATS_INTERVAL_MS: engine.stats at most this often per engine (0 = never).
    """
    cold_start_window_ms: Annotated[int, Field(ge=0)] = 10_000
    """TAILGUARD_COLD_START_WINDOW_MS: requests reaching a vLLM engine within this long of its start
    are marked as served during a cold start (engine.finished cold_start_unix_ns; contracts may
    exempt them); 0 = never."""
