"""One opener for every writer (pipeline.adapters.store.open_for_writing): the raw events'
retention is the configured one whoever opened the store first. ``migrate`` then a worker
with another TAILGUARD_RAW_EVENTS_TTL_DAYS used to leave ``lifecycle_events`` at the
retention ``migrate`` rendered (an applied migration is never rendered again); the
opener brings the table to the configured one, as a fresh store would have it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters import store as st
from pipeline.settings import Settings

pytestmark = pytest.mark.integration

_SHOW = "SHOW CREATE TABLE tailguard.lifecycle_events"


def _open(monkeypatch: pytest.MonkeyPatch, store_dir: Path, days: str | None) -> st.WritableStore:
    """The store opened as a process started with TAILGUARD_RAW_EVENTS_TTL_DAYS=days
    (None: unset) opens it."""
    if days is None:
        monkeypatch.delenv("TAILGUARD_RAW_EVENTS_TTL_DAYS", raising=False)
    else:
        monkeypatch.setenv("TAILGUARD_RAW_EVENTS_TTL_DAYS", days)
    return st.open_for_writing(Settings(store_dir=store_dir))


def _ttl_clause(store: st.ClickHouseStore) -> str:
    """The TTL line of the table as the engine reads it back."""
    create = str(store.query_rows(_SHOW)[0][0])
    return next(line for line in create.splitlines() if line.startswith("TTL "))


# (what, the setting `migrate` ran with, the worker's, the TTL clause the table then has)
CASES = [
    ("migrate at the default, worker at 30", None, "30", "TTL toDateTime(ts) + toIntervalDay(30)"),
    ("both at 30: nothing altered", "30", "30", "TTL toDateTime(ts) + toIntervalDay(30)"),
    ("migrate at 30, worker at the default", "30", None, "TTL toDateTime(ts) + toIntervalDay(7)"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_worker_after_migrate_keeps_the_configured_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, str | None, str | None, str]
) -> None:
    what, migrate_days, worker_days, ttl = case
    first = _open(monkeypatch, tmp_path / "store", migrate_days)  # `./tg migrate`
    assert first.applied, what  # a fresh store: every migration applied here
    first.store.close()
    second = _open(monkeypatch, tmp_path / "store", worker_days)  # `./tg worker`
    try:
        assert second.applied == (), what
        assert second.rollups is not None, what  # checked (an empty store: nothing to do)
        assert _ttl_clause(second.store) == ttl, what
        assert st.raw_events_ttl_days(second.store) == int(worker_days or 7), what
        altered = str(second.store.query_rows(_SHOW)[0][0])
    finally:
        second.store.close()
    # the table as the opener left it is the table a fresh store at that retention has
    fresh = _open(monkeypatch, tmp_path / "fresh", worker_days)
    try:
        assert str(fresh.store.query_rows(_SHOW)[0][0]) == altered, what
    finally:
        fresh.store.close()


def test_setting_the_retention_is_idempotent(tmp_path: Path) -> None:
    opened = st.open_for_writing(Settings(store_dir=tmp_path / "store"))
    try:
        assert st.set_raw_events_ttl(opened.store, None, 30) is True
        assert st.set_raw_events_ttl(opened.store, None, 30) is False
        assert st.raw_events_ttl_days(opened.store) == 30
    finally:
        opened.store.close()
