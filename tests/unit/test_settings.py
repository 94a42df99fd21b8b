"""Settings: the emitters' Kafka-only settings, the worker's on top, the controller's keys."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from pipeline.adapters.controller import ControllerSettings, KeySettings, load_keyring
from pipeline.adapters.flush import FlushSettings
from pipeline.adapters.store.opener import StoreSettings
from pipeline.adapters.worker import WorkerSettings
from pipeline.contract.control_signal import KeyConfigError
from pipeline.kafka_settings import EmitterSettings, KafkaSettings
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from pipeline.shipped import DEFAULT_BURN_RULES, DEFAULT_POLICY, DEFAULT_TRACE, SQL_DIR
from tests.paths import REPO

K1 = base64.b64encode(b"1" * 32).decode()
K2 = base64.b64encode(b"2" * 32).decode()


def test_worker_settings_build_on_the_emitters_settings() -> None:
    kafka = set(KafkaSettings.model_fields)
    emitter = set(EmitterSettings.model_fields)
    worker = set(Settings.model_fields)
    assert kafka < emitter < worker
    assert {"bootstrap_servers", "sasl_password", "lifecycle_topic", "control_topic"} <= kafka
    assert {"engine_host", "metrics_exporter"} <= emitter - kafka
    # the emitters' objects know nothing of the store, the worker or the controller
    assert not {"store_dir", "clickhouse_password", "slo_spec", "control_keys"} & emitter


@pytest.mark.parametrize("cls", [KafkaSettings, EmitterSettings, Settings])
def test_every_level_reads_the_environment_is_frozen_and_masks_secrets(
    cls: type[KafkaSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAILGUARD_BOOTSTRAP_SERVERS", "kafka-1:9093")
    monkeypatch.setenv("TAILGUARD_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("TAILGUARD_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("TAILGUARD_SASL_USERNAME", "u")
    monkeypatch.setenv("TAILGUARD_SASL_PASSWORD", "hunter2")
    s = cls()
    assert s.kafka_config()["bootstrap.servers"] == "kafka-1:9093"
    assert s.kafka_config()["sasl.password"] == "hunter2"
    assert "hunter2" not in json.dumps(s.redacted())
    assert "hunter2" not in repr(s)
    assert s.to_env()["TAILGUARD_SASL_PASSWORD"] == "hunter2"  # for a child process
    with pytest.raises(ValidationError):
        s.bootstrap_servers = "other:9092"  # type: ignore[misc]


@pytest.mark.parametrize("cls", [KafkaSettings, EmitterSettings, Settings])
def test_bad_kafka_settings_fail_at_start_with_the_reason(cls: type[KafkaSettings]) -> None:
    with pytest.raises(ValidationError, match="SASL_\\* needs sasl_mechanism"):
        cls(security_protocol="SASL_SSL")
    with pytest.raises(ValidationError, match="no_such_field"):
        cls(no_such_field=1)  # type: ignore[call-arg]


def test_emitter_settings_reject_the_worker_fields() -> None:
    with pytest.raises(ValidationError, match="store_dir"):
        EmitterSettings(store_dir=Path("x"))  # type: ignore[call-arg]


def test_shipped_defaults_are_the_top_level_files_in_a_checkout() -> None:
    settings = Settings()
    assert settings.slo_spec == DEFAULT_SLO_SPEC == REPO / "specs" / "slo-default.yaml"
    assert settings.policy_file == DEFAULT_POLICY == REPO / "specs" / "policy-default.yaml"
    assert settings.burn_rules_file == DEFAULT_BURN_RULES == REPO / "specs" / "burn-rules.yaml"
    assert SQL_DIR == REPO / "sql"
    assert DEFAULT_TRACE == REPO / "data" / "azure-llm-2023" / "conv.csv"
    for path in (DEFAULT_SLO_SPEC, DEFAULT_POLICY, DEFAULT_BURN_RULES, DEFAULT_TRACE):
        assert path.is_file(), path
    assert sorted(p.name for p in SQL_DIR.glob("*.sql"))


# --- the controller's keys come from Settings ------------------------------------------------


def _keys_file(tmp_path: Path) -> Path:
    f = tmp_path / "keys.json"
    f.write_text(json.dumps({"active": "k2", "keys": {"k1": K1, "k2": K2}}))
    return f


@pytest.mark.parametrize(
    ("env", "active", "kids"),
    [
        ({"TAILGUARD_CONTROL_KEYS": f"k1:{K1},k2:{K2}", "TAILGUARD_CONTROL_ACTIVE_KID": "k1"},
         "k1", ("k1", "k2")),
        ({"TAILGUARD_CONTROL_KEYS": f" k2:{K2} ", "TAILGUARD_CONTROL_ACTIVE_KID": "k2"},
         "k2", ("k2",)),
        ({"TAILGUARD_CONTROL_KEYS_FILE": "<file>"}, "k2", ("k1", "k2")),
    ],
)  # fmt: skip
def test_controller_keys_come_from_settings(
    env: dict[str, str],
    active: str,
    kids: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value.replace("<file>", str(_keys_file(tmp_path))))
    settings = Settings()
    keyring = load_keyring(KeySettings.of(settings))
    assert (keyring.active_kid, keyring.kids) == (active, kids)
    assert K1 not in json.dumps(settings.redacted())
    assert K1 not in repr(settings)
    assert K1 not in repr(ControllerSettings.of(settings))


def test_keys_given_to_settings_not_the_environment_are_what_the_controller_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAILGUARD_CONTROL_KEYS", f"k1:{K1}")  # overridden below
    monkeypatch.setenv("TAILGUARD_CONTROL_ACTIVE_KID", "k1")
    settings = Settings(control_keys=f"k2:{K2}", control_active_kid="k2")  # type: ignore[arg-type]
    assert load_keyring(KeySettings.of(settings)).kids == ("k2",)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"control_keys": f"k1:{K1}"}, "control_keys needs control_active_kid"),
        ({"control_active_kid": "k1"}, "control_active_kid goes with control_keys"),
        ({"control_keys": f"k1:{K1}", "control_active_kid": "k1", "control_keys_file": "k.json"},
         "either control_keys_file or control_keys"),
    ],
)  # fmt: skip
def test_inconsistent_control_keys_fail_at_start(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**fields)


def test_no_keys_is_a_clear_error_when_the_controller_starts() -> None:
    with pytest.raises(KeyConfigError, match="no control keys: set TAILGUARD_CONTROL_KEYS_FILE"):
        load_keyring(KeySettings())
    with pytest.raises(KeyConfigError, match="not valid base64"):
        load_keyring(KeySettings(control_keys=SecretStr("k1:***"), control_active_kid="k1"))


def test_a_heartbeat_whose_signals_outlive_max_ttl_fails_at_start() -> None:
    assert Settings(control_heartbeat_ms=100_000).control_max_ttl_ms == 300_000
    with pytest.raises(ValidationError, match="longer than control_max_ttl_ms 300000"):
        Settings(control_heartbeat_ms=100_001)
    assert Settings(control_heartbeat_ms=200_000, control_max_ttl_ms=600_000)


def test_query_port_limits_come_from_settings() -> None:
    from pipeline.adapters.query_server import QueryLimits

    limits = QueryLimits.from_settings(
        Settings(query_max_execution_s=5, query_max_memory_mb=64, query_max_result_mb=8)
    )
    assert limits.settings() | {"max_threads": 0} == {
        "max_execution_time": 5,
        "timeout_overflow_mode": "throw",
        "max_memory_usage": 64 << 20,
        "max_result_bytes": 8 << 20,
        "result_overflow_mode": "throw",
        "max_threads": 0,
        "os_thread_priority": 0,
    }
    assert QueryLimits.from_settings(Settings()).threads >= 1


SECRETS = {
    "control_keys": f"k1:{K1}",
    "control_active_kid": "k1",
    "alert_webhook_url": "https://hooks.example/x",
    "alert_webhook_secret": "webhook-secret-value",
    "clickhouse_url": "https://ch.example:8443",
    "clickhouse_password": "clickhouse-secret-value",
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "PLAIN",
    "sasl_username": "u",
    "sasl_password": "sasl-secret-value",
}


@pytest.mark.parametrize(
    "narrow", [ControllerSettings, KeySettings, StoreSettings, FlushSettings, WorkerSettings]
)
def test_each_adapters_settings_are_its_fields_of_the_settings_and_show_no_secret(
    narrow: Any,
) -> None:
    """Built once from Settings (``of``): every field that is a setting has its value, and
    no secret shows in the repr."""
    settings = Settings(**SECRETS)
    built = narrow.of(settings)
    for f in dataclasses.fields(built):
        if f.name in Settings.model_fields:
            assert getattr(built, f.name) == getattr(settings, f.name), f.name
    shown = repr(built)
    for secret in (K1, "webhook-secret-value", "clickhouse-secret-value", "sasl-secret-value"):
        assert secret not in shown


def test_the_kafka_part_is_kafka_settings_of_the_same_values() -> None:
    settings = Settings(**SECRETS, lifecycle_topic="lc-x", dlq_topic="dlq-x")
    kafka = settings.kafka_only()
    assert type(kafka) is KafkaSettings
    assert kafka.kafka_config() == settings.kafka_config()
    assert (kafka.lifecycle_topic, kafka.dlq_topic) == ("lc-x", "dlq-x")
    assert "sasl-secret-value" not in repr(kafka)
    assert ControllerSettings.of(settings).kafka == kafka


def test_a_narrow_settings_type_naming_no_setting_fails_at_once() -> None:
    @dataclasses.dataclass(frozen=True)
    class Wrong:
        no_such_setting: int

    with pytest.raises(AttributeError, match="no_such_setting"):
        Settings().narrowed(Wrong)


def test_query_port_caps_fail_at_start_when_inconsistent() -> None:
    from pipeline.adapters.query_server import QueryLimits

    limits = QueryLimits.from_settings(
        Settings(query_concurrency=3, query_per_client=2, query_queue_wait_s=2.5, query_nice=7)
    )
    assert (limits.concurrency, limits.per_client, limits.queue_wait_s, limits.nice) == (
        3,
        2,
        2.5,
        7,
    )
    with pytest.raises(
        ValidationError, match="query_per_client 3 is more than query_concurrency 2"
    ):
        Settings(query_per_client=3)
    for bad in ({"query_concurrency": 0}, {"query_queue_wait_s": 0}, {"query_nice": 20}):
        with pytest.raises(ValidationError):
            Settings(**bad)
