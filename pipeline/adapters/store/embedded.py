"""The embedded back-end: chDB in this process (``chdb://DIR``; one process per
directory), through clickhouse-connect like a server, plus what only a local engine can
do: read files of this host (:class:`~pipeline.adapters.store.protocol.FileInsertStore`).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .client import ClickHouseStore
from .protocol import StoreError


class EmbeddedStore(ClickHouseStore):
    """The embedded engine's store: sends plain column types (the engine builds the
    ``LowCardinality`` dictionaries itself, in C++ off the GIL) and inserts from files
    (the :class:`~pipeline.adapters.store.protocol.FileInsertStore` capability)."""

    embedded = True

    def _after_failure(self) -> None:
        """chDB (4.4) hands what a failed query had written of its answer (a format's
        header, first blocks: Arrow, Parquet, JSON, ...) to the next query of the session,
        ahead of that query's own answer: a throwaway query takes it."""
        with contextlib.suppress(Exception):
            self._client.raw_query("SELECT 1", fmt="TSVRaw")

    def _sent_types(self, types: Sequence[str]) -> Sequence[str]:
        """The engine builds the dictionaries (C++, off the GIL): see :func:`_plain_type`."""
        return [_PLAIN_TYPES.get(t) or _plain_type(t) for t in types]

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
    ) -> None:
        """``INSERT INTO table (names) SELECT select FROM file(<data>, fmt, structure)``:
        the engine parses and converts ``data`` on its own threads, without the GIL (the
        embedded engine only: the file is written on this host). ``settings``: more
        input-format settings of this insert; ``data``: bytes, or pieces of them;
        ``array_join``: an ``ARRAY JOIN`` clause after the file (one row of the file,
        several rows of the table)."""
        fd, path = tempfile.mkstemp(prefix="tailguard-insert-", suffix=f".{fmt.lower()}")
        try:
            try:
                write_all(fd, [data] if isinstance(data, bytes) else data)
            finally:
                os.close(fd)
            sql = (
                f"INSERT INTO {self.database}.{table} ({', '.join(names)}) SELECT {select} "
                f"FROM file({_quote(path)}, {fmt}, {_quote(structure)}) {array_join} "
                # floats as msgspec wrote them (shortest round-trip), read back exactly
                "SETTINGS precise_float_parsing = 1, "
                # one parsing thread: parallel parsing first scans the whole text for row
                # ends, a second pass over it (lifecycle_events, the raw events' payloads:
                # 3.8 against 5.0 µs of engine CPU per event; requests: the same CPU)
                "input_format_parallel_parsing = 0"
                + "".join(f", {k} = {int(v)}" for k, v in (settings or {}).items())
            )
            with self._lock:
                self._before_insert(table)
                self._client.command(sql)
        finally:
            os.unlink(path)


# Pieces per writev(2) call: the system's IOV_MAX (1024 on Linux).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


def write_all(fd: int, pieces: Sequence[bytes]) -> None:
    """Write ``pieces`` to ``fd``, one after the other, in as few system calls as the
    kernel allows (``writev``, up to :data:`_IOV_MAX` pieces a call).

    Each system call releases the GIL and takes it back after: a thread that takes it
    back while the event loop computes waits for the loop's switch interval (5 ms). A
    buffered file's ``writelines`` made one call per 8 KiB, thousands a flush: measured
    (``bench.core_speed`` workload, a thread spinning in Python beside the writer) the raw
    events' write took 70-100 µs of wall time an event against 3.4-5.4 alone; the worker
    catching up spent ~14 s of a 25 s run writing raw events for ~8 s of CPU."""
    for i in range(0, len(pieces), _IOV_MAX):
        chunk = pieces[i : i + _IOV_MAX]
        done = os.writev(fd, chunk)
        total = sum(map(len, chunk))
        if done < total:  # a short write (a regular file: very large writes only)
            rest = memoryview(b"".join(chunk))[done:]
            while rest:
                rest = rest[os.write(fd, rest) :]


_LOW_CARDINALITY = re.compile(r"LowCardinality\(((?:[^()]|\([^()]*\))*)\)")
_PLAIN_TYPES: dict[str, str] = {}


def _plain_type(ch_type: str) -> str:
    """``ch_type`` without its ``LowCardinality`` wrappers: what the embedded engine is
    sent (it converts the column into the table's type itself), so that clickhouse-connect
    builds no dictionary in Python, the writer's costliest step for such columns."""
    plain = _PLAIN_TYPES[ch_type] = _LOW_CARDINALITY.sub(r"\1", ch_type)
    return plain


def _quote(text: str) -> str:
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def embedded_client(store_dir: Path) -> Any:
    """A clickhouse-connect client of the embedded engine on ``store_dir`` (created)."""
    import clickhouse_connect  # adapter-only import

    store_dir.mkdir(parents=True, exist_ok=True)
    try:
        return clickhouse_connect.get_client(dsn=f"chdb://{store_dir.resolve()}")
    except Exception as exc:
        raise StoreError(
            f"cannot open embedded store {store_dir}: {exc} "
            "(chDB allows one process per data directory: is a worker running on it?)"
        ) from exc
