"""The tools' side of the port: find the live worker serving a store directory and read
through its port, else open the directory (or a ClickHouse server) directly."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.adapters.query_server.port import DISCOVERY_FILE, HOST, QueryServer
from pipeline.adapters.query_server.session import QueryLimits
from pipeline.processes import pid_alive

log = logging.getLogger("tailguard.query_server")


@dataclass(frozen=True, slots=True)
class LiveWorker:
    port: int
    pid: int
    token: str = ""


def find_live_worker(store_dir: Path, timeout_s: float = 2.0) -> LiveWorker | None:
    """The worker serving ``store_dir``'s query port, if its discovery file
    names a live process that answers for this directory."""
    import urllib.request

    path = Path(store_dir) / DISCOVERY_FILE
    try:
        info = json.loads(path.read_text())
        port, pid, token = int(info["port"]), int(info["pid"]), str(info.get("token", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pid_alive(pid):
        return None
    request = urllib.request.Request(
        f"http://{HOST}:{port}/tailguard", headers={"X-ClickHouse-Key": token}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (http://127.0.0.1)
            served = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    if served.get("pid") != pid or served.get("store") != os.path.realpath(store_dir):
        return None  # a stale file and a port reused by someone else
    return LiveWorker(port, pid, token)


def _http_client(port: int, token: str, database: str) -> Any:
    import clickhouse_connect

    return clickhouse_connect.get_client(
        host=HOST,
        port=port,
        interface="http",
        compress=False,
        username=f"tailguard-{os.getpid()}",  # each tool process its own turn on the port
        password=token,
        database=database,
    )


def _http_store(live: LiveWorker, database: str) -> Any:
    from pipeline.adapters.store import ClickHouseStore

    return ClickHouseStore(_http_client(live.port, live.token, database), database)


def _live_or_owner(settings: Any, wait_s: float) -> tuple[LiveWorker | None, Any]:
    """(the live worker serving ``store_dir``, None), else (None, the store opened here).
    A directory locked by a process that has not published its port yet (a worker
    starting) is tried again for up to ``wait_s``."""
    from pipeline.adapters.store import StoreError, open_store

    if not Path(settings.store_dir).is_dir():
        raise StoreError(f"no store at {settings.store_dir} (run a worker or `replay` first)")
    deadline = time.monotonic() + wait_s
    while True:
        live = find_live_worker(settings.store_dir)
        if live is not None:
            log.debug(
                "reading %s through worker %d's port %d", settings.store_dir, live.pid, live.port
            )
            return live, None
        try:
            return None, open_store(settings)
        except StoreError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _open_embedded_or_port(settings: Any, wait_s: float) -> tuple[Any, bool]:
    """(store, through_port): the live worker's port, else the directory itself."""
    live, owner = _live_or_owner(settings, wait_s)
    if live is not None:
        return _http_store(live, settings.database), True
    return owner, False


def open_reader(settings: Any, *, wait_s: float = 10.0) -> Any:
    """A :class:`~pipeline.adapters.store.ClickHouseStore` for the tools' own queries.

    A ClickHouse server when ``clickhouse_url`` is set; else the live worker's
    query port for ``store_dir``; else the directory itself. If the directory
    is locked by a process that has not published its port yet, wait up to
    ``wait_s`` for the port.
    """
    from pipeline.adapters.store import open_store

    if settings.clickhouse_url:
        return open_store(settings)
    return _open_embedded_or_port(settings, wait_s)[0]


@contextlib.contextmanager
def read_only_client(settings: Any, *, wait_s: float = 10.0) -> Iterator[Any]:
    """A clickhouse-connect client on which only reads run (``tailguard sql``).

    A ClickHouse server: the session setting ``readonly = 1``. A live worker:
    its port. Otherwise this process opens the directory and serves itself the
    same read-only port (unpublished), so the rules are the same either way.
    """
    import clickhouse_connect

    if settings.clickhouse_url:
        client = clickhouse_connect.get_client(
            dsn=settings.clickhouse_url,
            username=settings.clickhouse_user,
            password=settings.clickhouse_password.get_secret_value(),
            database=settings.database,
            settings={"readonly": 1},
        )
        try:
            yield client
        finally:
            client.close()
        return
    live, owner = _live_or_owner(settings, wait_s)
    if live is not None:
        client = _http_client(live.port, live.token, settings.database)
        try:
            yield client
        finally:
            client.close()
        return
    try:
        server = QueryServer(
            settings.store_dir,
            owner.lock,
            database=settings.database,
            limits=QueryLimits.from_settings(settings),
        ).start(publish=False)
        try:
            client = _http_client(server.port, server.token, settings.database)
            try:
                yield client
            finally:
                client.close()
        finally:
            server.stop()
    finally:
        owner.close()
