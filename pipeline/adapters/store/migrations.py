"""Versioned migrations: ``sql/NNNN_name.sql`` applied in order, once each
(``schema_migrations``), with the ``${...}`` placeholders of :func:`template_params`."""

from __future__ import annotations

import logging
import re
import string
from dataclasses import dataclass
from pathlib import Path

from pipeline.shipped import SQL_DIR

from .protocol import Store, StoreError

log = logging.getLogger(__name__)

_MIGRATION_RE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    def statements(self, params: dict[str, str]) -> list[str]:
        text = string.Template(self.sql).substitute(params)
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
        return [s.strip() for s in text.split(";") if s.strip()]


def load_migrations(sql_dir: Path = SQL_DIR) -> list[Migration]:
    found = []
    for path in sorted(sql_dir.glob("*.sql")):
        m = _MIGRATION_RE.match(path.name)
        if not m:
            raise StoreError(f"migration file name must look like 0001_name.sql: {path}")
        found.append(Migration(int(m.group(1)), path.stem, path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise StoreError(f"duplicate migration versions in {sql_dir}")
    return found


def template_params(database: str, cluster: str | None, raw_ttl_days: int = 7) -> dict[str, str]:
    """Values for the ``${...}`` placeholders of ``sql/*.sql``."""
    common = {"db": database, "raw_ttl_days": str(int(raw_ttl_days))}
    if cluster:
        path = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"
        return common | {
            "on_cluster": f"ON CLUSTER '{cluster}'",
            "replicated": "Replicated",
            "replica_args": f"{path}, ",
            "replica_args_only": path,
            "dedup_window_setting": "replicated_deduplication_window = 10000",
        }
    return common | {
        "on_cluster": "",
        "replicated": "",
        "replica_args": "",
        "replica_args_only": "",
        "dedup_window_setting": "non_replicated_deduplication_window = 10000",
    }


def migrate(
    store: Store, cluster: str | None = None, sql_dir: Path = SQL_DIR, raw_ttl_days: int = 7
) -> list[str]:
    """Apply pending migrations in order; idempotent. Returns the names applied."""
    db = store.database
    on_cluster = f"ON CLUSTER '{cluster}'" if cluster else ""
    store.command(f"CREATE DATABASE IF NOT EXISTS {db} {on_cluster}")
    engine = (
        "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')"
        if cluster
        else "ReplacingMergeTree"
    )
    store.command(
        f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations {on_cluster} "
        "(version UInt32, name String, applied_at DateTime64(3) DEFAULT now64(3)) "
        f"ENGINE = {engine} ORDER BY version"
    )
    done = {int(r[0]) for r in store.query_rows(f"SELECT version FROM {db}.schema_migrations")}
    params = template_params(db, cluster, raw_ttl_days)
    applied = []
    for mig in load_migrations(sql_dir):
        if mig.version in done:
            continue
        for stmt in mig.statements(params):
            store.command(stmt)
        store.insert_columns(
            "schema_migrations",
            [[mig.version], [mig.name]],
            ["version", "name"],
            ["UInt32", "String"],
        )
        applied.append(mig.name)
        log.info("applied migration %s", mig.name)
    return applied
