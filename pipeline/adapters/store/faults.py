"""Fault injection, for tests only: stores whose inserts ClickHouse itself rejects while a
flag file says so (``TAILGUARD_FAULT_STORE_OUTAGE_FILE``, ``TAILGUARD_FAULT_STORE_PARTIAL_FILE``).
Never set in production.

Each works on either back-end: :func:`injecting_store` picks the embedded variant (a
subclass of both, so that the embedded engine's file inserts meet the fault too).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from .client import ClickHouseStore
from .embedded import EmbeddedStore
from .protocol import StoreError

log = logging.getLogger(__name__)

# The injected constraint's name: an outage, not a data error (see retry.is_data_error).
INJECTED_CONSTRAINT = "tailguard_injected_outage"


class OutageInjectingStore(ClickHouseStore):
    """Fault injection, for tests only (``TAILGUARD_FAULT_STORE_OUTAGE_FILE``).

    While the flag file exists, ClickHouse itself rejects every insert: before an
    insert into a table, a ``CHECK 0`` constraint is added to it (the engine then
    fails the insert with ``VIOLATED_CONSTRAINT``, through the real driver, with no
    row, no materialized-view row and no deduplication token recorded). Once the
    file is gone, the next insert drops the constraints again. Queries are not
    affected. A constraint left behind by a killed process is dropped at the first
    insert into its table after the file is gone.
    """

    CONSTRAINT = INJECTED_CONSTRAINT

    def __init__(self, client: Any, database: str, flag: Path) -> None:
        super().__init__(client, database)
        self._flag = flag
        self._blocked: set[str] = set()
        self._cleared: set[str] = set()  # tables known to carry no injected constraint

    def _before_insert(self, table: str) -> None:
        """Add or drop the injected constraint to match the flag file (under the lock)."""
        name = f"{self.database}.{table}"
        if self._flag.exists():
            if table not in self._blocked:
                self._client.command(f"ALTER TABLE {name} ADD CONSTRAINT {self.CONSTRAINT} CHECK 0")
                self._blocked.add(table)
                self._cleared.discard(table)
                log.warning("injected outage: inserts into %s now fail", name)
            return
        for t in sorted(self._blocked | ({table} - self._cleared)):
            self._client.command(
                f"ALTER TABLE {self.database}.{t} DROP CONSTRAINT IF EXISTS {self.CONSTRAINT}"
            )
            self._cleared.add(t)
            if t in self._blocked:
                log.warning("injected outage over: inserts into %s.%s work again", self.database, t)
        self._blocked.clear()


class PartialWriteInjectingStore(ClickHouseStore):
    """Fault injection, for tests only (``TAILGUARD_FAULT_STORE_PARTIAL_FILE``): a write
    that fails after the base table took its rows.

    While the flag file exists, the tables it names (one a line; none named:
    ``latency_1h``), targets of the materialized views, carry a ``CHECK 0`` constraint
    (:attr:`OutageInjectingStore.CONSTRAINT`): an insert into ``window_sketches`` then lands
    in the base table and in the views the engine pushed to before, and fails with
    ``VIOLATED_CONSTRAINT`` in the blocked one, through the real driver (the constraints
    follow the flag file at each insert into ``window_sketches`` and each ``INSERT``
    statement). A line ``kill``:
    right after such a failure the process SIGKILLs itself, before any retry (a worker
    killed between the base table and a view). Once the file is gone, the next insert
    drops the constraints (also those a killed process left behind).
    """

    CONSTRAINT = INJECTED_CONSTRAINT  # an outage, not a data error (is_data_error)
    ROLLUPS = ("slo_windows", "latency_1m", "latency_1h", "slo_1m", "slo_1h")

    def __init__(self, client: Any, database: str, flag: Path) -> None:
        super().__init__(client, database)
        self._flag = flag
        self._blocked: set[str] = set()
        self._cleared = False  # constraints left by an earlier process dropped
        self._kill = False

    def _wanted(self) -> tuple[set[str], bool]:
        try:
            lines = {x.strip() for x in self._flag.read_text().splitlines() if x.strip()}
        except FileNotFoundError:
            return set(), False
        tables = lines - {"kill"}
        unknown = tables - set(self.ROLLUPS)
        if unknown:
            raise StoreError(f"{self._flag}: not a rollup: {sorted(unknown)}")
        return tables or {"latency_1h"}, "kill" in lines

    def _before_insert(self, table: str) -> None:
        """Add or drop the injected constraints to match the flag file (under the lock),
        before an insert into the views' base table (other inserts: untouched; during the
        migrations the rollups may not exist yet)."""
        if table == "window_sketches":
            self._follow_flag()

    def command(self, sql: str) -> Any:
        """A statement; an ``INSERT`` (the rollups' repair) meets the injected constraints
        as the flag file has them."""
        if not sql.lstrip().upper().startswith("INSERT"):
            return super().command(sql)
        with self._lock:
            self._follow_flag()
            return self._client.command(sql)

    def _follow_flag(self) -> None:
        wanted, self._kill = self._wanted()
        stale = set(self.ROLLUPS) if not self._cleared else self._blocked
        for t in sorted(stale - wanted):
            self._client.command(
                f"ALTER TABLE {self.database}.{t} DROP CONSTRAINT IF EXISTS {self.CONSTRAINT}"
            )
            if t in self._blocked:
                log.warning("injected partial writes over: %s.%s takes inserts", self.database, t)
        self._cleared = True
        self._blocked &= wanted
        # every time, IF NOT EXISTS: a migration that creates a rollup again (0017, 0019:
        # renamed, created, refilled) leaves the new table without the constraint
        for t in sorted(wanted):
            self._client.command(
                f"ALTER TABLE {self.database}.{t} "
                f"ADD CONSTRAINT IF NOT EXISTS {self.CONSTRAINT} CHECK 0"
            )
            if t not in self._blocked:
                self._blocked.add(t)
                log.warning(
                    "injected partial writes: inserts into %s.%s now fail", self.database, t
                )

    def insert_columns(self, table: str, *args: Any, **kwargs: Any) -> None:
        """The store's insert; a refusal by the injected constraint kills the process when
        asked to (a crash between the base table and its views)."""
        try:
            super().insert_columns(table, *args, **kwargs)
        except Exception as exc:
            if self._kill and self.CONSTRAINT in str(exc):
                log.error("injected partial write into %s: killing this process", table)  # noqa: TRY400
                logging.shutdown()
                os.kill(os.getpid(), signal.SIGKILL)
            raise


class EmbeddedOutageInjectingStore(OutageInjectingStore, EmbeddedStore):
    """:class:`OutageInjectingStore` on the embedded engine (file inserts meet it too)."""


class EmbeddedPartialWriteInjectingStore(PartialWriteInjectingStore, EmbeddedStore):
    """:class:`PartialWriteInjectingStore` on the embedded engine."""


def injecting_store(
    client: Any,
    database: str,
    *,
    embedded: bool,
    partial_file: Path | None,
    outage_file: Path | None,
) -> ClickHouseStore | None:
    """The fault-injecting store the flag files ask for (a partial write first), or None."""
    if partial_file is not None:
        cls: type[PartialWriteInjectingStore] = (
            EmbeddedPartialWriteInjectingStore if embedded else PartialWriteInjectingStore
        )
        return cls(client, database, partial_file)
    if outage_file is not None:
        outage: type[OutageInjectingStore] = (
            EmbeddedOutageInjectingStore if embedded else OutageInjectingStore
        )
        return outage(client, database, outage_file)
    return None
