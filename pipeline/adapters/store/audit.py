"""The control audit: ``control_signals`` and ``budget_events`` rows and their writer."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from .inserts import _insert
from .protocol import Store

CONTROL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("scope", "LowCardinality(String)"),
    ("seq", "UInt64"),
    ("level", "UInt8"),
    ("phase", "LowCardinality(String)"),
    ("issued_at", "DateTime64(3, 'UTC')"),
    ("expires_at", "DateTime64(3, 'UTC')"),
    ("event_time", "DateTime64(3, 'UTC')"),
    ("reason", "String"),
    ("figures", "String"),
    ("actions", "String"),
    ("notify_customer", "Bool"),
    ("budget_exhausted", "Bool"),
    ("heartbeat", "Bool"),
    ("kid", "LowCardinality(String)"),
    ("signal", "String"),
)


class ControlRow(NamedTuple):
    """One ``control_signals`` row (:data:`CONTROL_COLUMNS`); build it by keyword."""

    scope: str
    seq: int
    level: int
    phase: str
    issued_at: datetime
    expires_at: datetime
    event_time: datetime
    reason: str
    figures: str  # JSON
    actions: str  # JSON
    notify_customer: bool
    budget_exhausted: bool
    heartbeat: bool
    kid: str  # "replay": decided by `tailguard replay`, not published
    signal: str  # the signed message as published ("" for a replay)


BUDGET_EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("slo", "LowCardinality(String)"),
    ("event", "LowCardinality(String)"),
    ("event_time", "DateTime64(3, 'UTC')"),
    ("details", "String"),
)


class BudgetEventRow(NamedTuple):
    """One ``budget_events`` row (:data:`BUDGET_EVENT_COLUMNS`); build it by keyword."""

    slo: str
    event: str  # e.g. budget_exhausted
    event_time: datetime
    details: str  # the event as JSON


def write_audit(
    store: Store, control_rows: Sequence[ControlRow], event_rows: Sequence[BudgetEventRow]
) -> None:
    _insert(store, "control_signals", CONTROL_COLUMNS, control_rows)
    _insert(store, "budget_events", BUDGET_EVENT_COLUMNS, event_rows)
