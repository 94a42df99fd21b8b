"""``migrate``: apply the SQL migrations to the store."""

from __future__ import annotations

import argparse

from pipeline.app.commands.common import Command, add_store
from pipeline.app.commands.settings import worker_settings


def cmd_migrate(args: argparse.Namespace) -> int:
    from pipeline.adapters.store import open_for_writing

    opened = open_for_writing(worker_settings(args))
    opened.store.close()
    applied = opened.applied
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))
    return 0


MIGRATE = Command(
    "migrate", "apply sql/ migrations to ClickHouse (idempotent)", add_store, cmd_migrate
)
