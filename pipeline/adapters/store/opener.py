"""Opening the store: :class:`StoreSettings`, narrowed once from the worker's settings,
and :func:`open_store`, which picks the back-end (a ClickHouse server, else the embedded
engine) and, in tests only, a fault-injecting store."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from .client import ClickHouseStore, http_client
from .embedded import EmbeddedStore, embedded_client
from .faults import injecting_store

if TYPE_CHECKING:
    from pipeline.settings import Settings


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """What opening the store takes of :class:`~pipeline.settings.Settings` (see there
    for each field's meaning): built once, by :meth:`of`."""

    database: str
    store_dir: Path
    clickhouse_url: str | None = None
    clickhouse_user: str = "default"
    clickhouse_password: SecretStr = field(default_factory=lambda: SecretStr(""))
    fault_store_outage_file: Path | None = None
    fault_store_partial_file: Path | None = None

    @classmethod
    def of(cls, settings: Settings) -> StoreSettings:
        return settings.narrowed(cls)

    @property
    def embedded(self) -> bool:
        """The embedded engine on :attr:`store_dir` (no ClickHouse server named)."""
        return not self.clickhouse_url


def open_store(settings: Settings | StoreSettings) -> ClickHouseStore:
    """The store ``settings`` name: a ClickHouse server when ``clickhouse_url`` is set,
    else the embedded engine on ``store_dir`` (one process per directory)."""
    cfg = settings if isinstance(settings, StoreSettings) else StoreSettings.of(settings)
    if cfg.clickhouse_url:
        client = http_client(
            cfg.clickhouse_url, cfg.clickhouse_user, cfg.clickhouse_password.get_secret_value()
        )
    else:
        client = embedded_client(cfg.store_dir)
    injecting = injecting_store(
        client,
        cfg.database,
        embedded=cfg.embedded,
        partial_file=cfg.fault_store_partial_file,
        outage_file=cfg.fault_store_outage_file,
    )
    if injecting is not None:
        return injecting
    return (
        EmbeddedStore(client, cfg.database)
        if cfg.embedded
        else ClickHouseStore(client, cfg.database)
    )
