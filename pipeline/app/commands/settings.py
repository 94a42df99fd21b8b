"""Settings built at the CLI: its flags over the ``TAILGUARD_*`` environment.

The one place settings are built from flags, for every command of
:mod:`pipeline.app.commands` (the CLI; nothing below it imports this). The emitters'
commands build :class:`~pipeline.kafka_settings.EmitterSettings` (the base install: no
core, no numpy); the worker's commands the full :class:`~pipeline.settings.Settings`,
imported only then.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from pipeline.kafka_settings import EmitterSettings, KafkaSettings

if TYPE_CHECKING:
    from pipeline.settings import Settings

S = TypeVar("S", bound=KafkaSettings)

# flag -> field; a flag sets its field only where the settings class has it
_FLAGS = (
    ("bootstrap", "bootstrap_servers"),
    ("store", "store_dir"),
    ("partitions", "topic_partitions"),
    ("group", "group_id"),
    ("control_mode", "control_mode"),
    ("control_enforce_from_priority", "control_enforce_from_priority"),
    ("control_mode_scopes", "control_mode_scopes"),
)


def settings_from_args(args: argparse.Namespace, cls: type[S]) -> S:
    """``cls`` from the environment with the command's flags over it; invalid: exit, saying why."""
    overrides: dict[str, Any] = {}
    for flag, field in _FLAGS:
        value = getattr(args, flag, None)
        if value is not None and field in cls.model_fields:
            overrides[field] = value
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise SystemExit(f"tailguard: invalid settings:\n{exc}") from None


def worker_settings(args: argparse.Namespace) -> Settings:
    from pipeline.settings import Settings

    return settings_from_args(args, Settings)


def emitter_settings(args: argparse.Namespace) -> EmitterSettings:
    return settings_from_args(args, EmitterSettings)
