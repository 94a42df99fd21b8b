"""ClickHouse adapter: connection, versioned migrations, batched record writes.

One API for both back-ends through clickhouse-connect: the embedded engine
(chDB, ``chdb://DIR``; one process per directory) and a ClickHouse server over
HTTP. Inserts name their columns and types explicitly so that no round trip
asks the server for the table's columns.

The modules, and what each owns:

* :mod:`~.protocol`: :class:`Store` (the port), :class:`StoreError`, and the
  :class:`FileInsertStore` capability the writers' fast paths ask for (never a class);
* :mod:`~.client`: :class:`ClickHouseStore`, the lock-serialised clickhouse-connect
  client (the HTTP back-end as is); :mod:`~.embedded`: :class:`EmbeddedStore` (chDB in
  this process: plain column types, inserts from files of this host);
* :mod:`~.opener`: :class:`StoreSettings`, :func:`open_store` and :func:`open_for_writing`
  (the one way a writer opens it: migrations, retention, rollups checked);
  :mod:`~.rollups`: each rollup compared with its source, and set right;
  :mod:`~.faults`: fault injection, for tests only;
* :mod:`~.migrations`: ``sql/*.sql`` applied in order; :mod:`~.retry`: backoff, data
  errors and their isolation;
* one module per table family, each table's column list next to the builder of its rows
  (:mod:`~.inserts` is what they share): :mod:`~.requests`, :mod:`~.windows`
  (``window_sketches``: sketches, SLO counts, the ledger), :mod:`~.events`
  (``lifecycle_events``), :mod:`~.checkpoints`, :mod:`~.audit` (``control_signals``,
  ``budget_events``).

Every public name is importable from here; the modules import each other relatively
(``bench/store_speed.py`` loads another commit's package under another name).
"""

from __future__ import annotations

from .audit import BUDGET_EVENT_COLUMNS, CONTROL_COLUMNS, BudgetEventRow, ControlRow, write_audit
from .checkpoints import CHECKPOINT_COLUMNS, Checkpoint, write_checkpoints
from .client import ClickHouseStore
from .embedded import _IOV_MAX, EmbeddedStore, write_all
from .events import (
    EVENT_COLUMNS,
    EventRow,
    KeptEvent,
    kept_events,
    raw_event_columns,
    write_events,
    write_raw_events,
    write_raw_isolating,
    write_raw_messages,
)
from .faults import (
    EmbeddedOutageInjectingStore,
    EmbeddedPartialWriteInjectingStore,
    OutageInjectingStore,
    PartialWriteInjectingStore,
)
from .inserts import Columns, _insert, _insert_columns
from .migrations import Migration, load_migrations, migrate, template_params
from .opener import (
    StoreSettings,
    WritableStore,
    open_for_writing,
    open_store,
    raw_events_ttl_days,
    set_raw_events_ttl,
)
from .protocol import FileInsertStore, Store, StoreError, file_inserts
from .requests import (
    REQUEST_COLUMNS,
    REQUEST_VERSION_SQL,
    clickhouse_type,
    record_columns,
    record_from_row,
    records_from_columns,
    request_columns,
    write_requests,
    write_with_retry,
)
from .retry import is_data_error, with_retry, write_isolating
from .rollups import (
    RepairResult,
    check_rollups,
    repair_rollups,
    write_windows_repairing,
)
from .windows import (
    CLOCK_SKEW_FIELDS,
    REQUEST_COUNT_FIELDS,
    SLO_BAD_FIELDS,
    SLO_COUNT_FIELDS,
    SLO_ROW_BOUNDARY,
    WINDOW_COLUMNS,
    WindowRow,
    window_columns,
    window_rows,
    windows_columns,
    write_windows,
)

__all__ = [
    "BUDGET_EVENT_COLUMNS",
    "CHECKPOINT_COLUMNS",
    "CLOCK_SKEW_FIELDS",
    "CONTROL_COLUMNS",
    "EVENT_COLUMNS",
    "REQUEST_COLUMNS",
    "REQUEST_COUNT_FIELDS",
    "REQUEST_VERSION_SQL",
    "SLO_BAD_FIELDS",
    "SLO_COUNT_FIELDS",
    "SLO_ROW_BOUNDARY",
    "WINDOW_COLUMNS",
    "_IOV_MAX",
    "BudgetEventRow",
    "Checkpoint",
    "ClickHouseStore",
    "Columns",
    "ControlRow",
    "EmbeddedOutageInjectingStore",
    "EmbeddedPartialWriteInjectingStore",
    "EmbeddedStore",
    "EventRow",
    "FileInsertStore",
    "KeptEvent",
    "Migration",
    "OutageInjectingStore",
    "PartialWriteInjectingStore",
    "RepairResult",
    "Store",
    "StoreError",
    "StoreSettings",
    "WindowRow",
    "WritableStore",
    "_insert",
    "_insert_columns",
    "check_rollups",
    "clickhouse_type",
    "file_inserts",
    "is_data_error",
    "kept_events",
    "load_migrations",
    "migrate",
    "open_for_writing",
    "open_store",
    "raw_event_columns",
    "raw_events_ttl_days",
    "record_columns",
    "record_from_row",
    "records_from_columns",
    "repair_rollups",
    "request_columns",
    "set_raw_events_ttl",
    "template_params",
    "window_columns",
    "window_rows",
    "windows_columns",
    "with_retry",
    "write_all",
    "write_audit",
    "write_checkpoints",
    "write_events",
    "write_isolating",
    "write_raw_events",
    "write_raw_isolating",
    "write_raw_messages",
    "write_requests",
    "write_windows",
    "write_windows_repairing",
    "write_with_retry",
]
