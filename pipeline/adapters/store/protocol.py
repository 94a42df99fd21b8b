"""The store's ports: what the worker, the tools and the reports need from ClickHouse
(:class:`Store`), and the capability a back-end may add (:class:`FileInsertStore`).

The writers' fast paths ask a store for a capability, never for its class: an in-memory
fake, a wrapper or another back-end without the capability gets the plain column-wise
insert, which every :class:`Store` has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


class StoreError(Exception):
    """Root of store failures (connection, migration, write)."""


class Store(Protocol):
    """What the worker and reports need from ClickHouse."""

    database: str

    def command(self, sql: str) -> Any: ...

    def query_rows(
        self, sql: str, parameters: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]: ...

    def query_arrow(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        """The result as an Arrow table (``pyarrow.Table``; strings as ``string``): no
        Python value per cell (a read of millions of rows, the statement's)."""
        ...

    def insert_columns(
        self,
        table: str,
        columns: Sequence[Sequence[Any]],
        names: Sequence[str],
        types: Sequence[str],
        settings: dict[str, Any] | None = None,
    ) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class FileInsertStore(Store, Protocol):
    """A store whose engine reads files of this host (the embedded engine, chDB in this
    process: :class:`~pipeline.adapters.store.embedded.EmbeddedStore`).

    ``INSERT INTO table (names) SELECT select FROM file(<data>, fmt, structure)``: the
    engine parses and converts ``data`` on its own threads, without the GIL. ``settings``:
    more input-format settings of this insert; ``data``: bytes, or pieces of them;
    ``array_join``: an ``ARRAY JOIN`` clause after the file (one row of the file, several
    rows of the table).
    """

    def insert_from_file(
        self,
        table: str,
        names: Sequence[str],
        select: str,
        data: bytes | Sequence[bytes],
        *,
        fmt: str,
        structure: str,
        settings: dict[str, int] | None = None,
        array_join: str = "",
    ) -> None: ...


def file_inserts(store: Store) -> FileInsertStore | None:
    """``store`` when its engine reads this host's files (:class:`FileInsertStore`), else
    None (the caller inserts column-wise)."""
    return store if isinstance(store, FileInsertStore) else None
