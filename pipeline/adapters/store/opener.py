"""Opening the store: :class:`StoreSettings`, narrowed once from the worker's settings;
:func:`open_store`, which picks the back-end (a ClickHouse server, else the embedded
engine) and, in tests only, a fault-injecting store; and :func:`open_for_writing`, the
one way a writer (the worker, ``replay --store``, ``migrate``, the bench) opens it:
migrations applied, the raw events' retention set to the configured one, the rollups
checked."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from .client import ClickHouseStore, http_client
from .embedded import EmbeddedStore, embedded_client
from .faults import injecting_store
from .migrations import migrate
from .retry import is_data_error
from .rollups import RepairResult, check_rollups

if TYPE_CHECKING:
    from pipeline.settings import Settings

log = logging.getLogger(__name__)


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
    cluster: str | None = None
    raw_events_ttl_days: int = 7

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


@dataclass(frozen=True, slots=True)
class WritableStore:
    """A store opened for writing by :func:`open_for_writing`."""

    store: ClickHouseStore
    applied: tuple[str, ...]  # the migrations this opening applied
    # The rollups as checked (None: not checked, the store could not take the repair
    # yet; the flush checks them after its first write of windows: ``rollups_unchecked``).
    rollups: RepairResult | None

    @property
    def rollups_unchecked(self) -> bool:
        return self.rollups is None


def open_for_writing(settings: Settings | StoreSettings) -> WritableStore:
    """Open the store ``settings`` name for writing: pending migrations applied (the
    raw events' retention rendered from ``raw_events_ttl_days``), ``lifecycle_events``
    brought to that retention when an earlier migration rendered another
    (:func:`set_raw_events_ttl`), and the rollups of the windows written last compared
    with their sources and set right (:func:`~.rollups.check_rollups`: a write of
    windows cut short by a kill left them short). A check the store cannot take yet
    (full, say) is put off, logged; a data error raises. Closes the store on failure."""
    cfg = settings if isinstance(settings, StoreSettings) else StoreSettings.of(settings)
    store = open_store(cfg)
    try:
        applied = migrate(store, cfg.cluster, raw_ttl_days=cfg.raw_events_ttl_days)
        set_raw_events_ttl(store, cfg.cluster, cfg.raw_events_ttl_days)
        rollups: RepairResult | None
        try:
            rollups = check_rollups(store)
        except Exception as exc:
            if is_data_error(exc):
                raise
            log.warning("rollups not checked at start-up (%s): checked after a write", exc)
            rollups = None
    except BaseException:
        store.close()
        raise
    return WritableStore(store, tuple(applied), rollups)


# The retention clause of ``lifecycle_events`` (sql/0002_lifecycle_events.sql) as the
# engine shows it in SHOW CREATE TABLE (``INTERVAL n DAY`` reads back as toIntervalDay).
_RAW_TTL_RE = re.compile(r"\bTTL toDateTime\(ts\) \+ toIntervalDay\((\d+)\)")


def raw_events_ttl_days(store: ClickHouseStore) -> int | None:
    """The retention ``lifecycle_events`` has, in days (None: no such table or TTL)."""
    rows = store.query_rows(
        "SELECT create_table_query FROM system.tables "
        f"WHERE database = '{store.database}' AND name = 'lifecycle_events'"
    )
    found = _RAW_TTL_RE.search(str(rows[0][0])) if rows else None
    return int(found.group(1)) if found else None


def set_raw_events_ttl(store: ClickHouseStore, cluster: str | None, days: int) -> bool:
    """Bring ``lifecycle_events`` to a retention of ``days`` when it has another (an
    applied migration is never rendered again: ``migrate`` then a worker with another
    ``TAILGUARD_RAW_EVENTS_TTL_DAYS``); the engine drops the rows past it in the
    background. Returns whether it changed. The expression is 0002's."""
    had = raw_events_ttl_days(store)
    if had is None or had == int(days):
        return False
    on_cluster = f"ON CLUSTER '{cluster}'" if cluster else ""
    store.command(
        f"ALTER TABLE {store.database}.lifecycle_events {on_cluster} "
        f"MODIFY TTL toDateTime(ts) + INTERVAL {int(days)} DAY"
    )
    log.warning("lifecycle_events: retention %d -> %d days (the configured one)", had, days)
    return True
