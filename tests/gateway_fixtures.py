"""Test doubles for the gateway: a small OpenAI-compatible upstream, an in-memory sink,
and an ASGI app served by uvicorn on a loopback port in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from pipeline.contract.events import Event
from producers.emit import SinkCounters
from tests.ceilings import ceiling


class MemorySink:
    """An EventSink that keeps the events (thread-safe enough for one event loop)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.counters = SinkCounters()

    def emit(self, event: Event) -> None:
        self.events.append(event)
        self.counters.events_sent += 1

    def flush(self, timeout_s: float = 10.0) -> int:
        return 0

    def close(self) -> None:
        pass

    def of(self, request_id: str) -> dict[str, Any]:
        return {e.kind: e for e in self.events if e.request_id == request_id}


def wait_for(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true (it observes another thread or process); the
    ceiling is ``timeout_s`` scaled (tests/ceilings.py)."""
    timeout_s = ceiling(timeout_s)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1:<free port> in a thread; yield its base URL."""
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
    # (socket.socket()'s default proto 0 does not), and without it every response uvicorn
    # writes in two parts waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def overloaded(reason: str, level: int, retry_after_s: int) -> dict[str, Any]:
    """The JSON body of a request the gateway turned away (429 or 503)."""
    return {"error": "overloaded", "reason": reason, "level": level, "retry_after_s": retry_after_s}
