"""Test doubles for the gateway: a small OpenAI-compatible upstream, an in-memory sink,
and an ASGI app served by uvicorn on a loopback port in a thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn

from pipeline.contract.events import Event
from producers.emit import SinkCounters


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


@dataclass
class FakeOpenAI:
    """OpenAI-compatible upstream: ``/v1/chat/completions`` and ``/v1/completions``.

    ``"stream": true`` -> ``max_tokens`` server-sent-event chunks (default 5), the first
    at once, then one every ``x-test-chunk-delay-ms`` ms (header, default 0), then
    ``data: [DONE]``. Like vLLM, it stops generating when its client disconnects.
    Records the headers and body each request id arrived with, and which finished or
    were abandoned.
    """

    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    abandoned: set[str] = field(default_factory=set)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        headers = {bytes(k).decode(): bytes(v).decode() for k, v in scope["headers"]}
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        doc = orjson.loads(body) if body else {}
        rid = headers.get("x-request-id", "")
        self.seen[rid] = {"headers": headers, "body": doc, "path": scope["path"]}
        if scope["path"] not in ("/v1/chat/completions", "/v1/completions"):
            await _json(send, 404, {"error": "not found"})
            return
        n = int(doc.get("max_tokens", 5))
        if not doc.get("stream"):
            await _json(
                send,
                200,
                {
                    "id": f"chatcmpl-{rid}",
                    "object": "chat.completion",
                    "model": doc.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * n}}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3},
                },
            )
            self.finished.add(rid)
            return
        delay_s = float(headers.get("x-test-chunk-delay-ms", "0")) / 1000
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        try:
            for i in range(n):
                if i and delay_s:
                    with suppress(TimeoutError):
                        await asyncio.wait_for(gone.wait(), delay_s)
                if gone.is_set():
                    self.abandoned.add(rid)
                    return
                chunk = {"id": f"chatcmpl-{rid}", "choices": [{"delta": {"content": "x"}}]}
                data = b"data: " + orjson.dumps(chunk) + b"\n\n"
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            self.finished.add(rid)
        finally:
            watcher.cancel()


async def _json(send: Any, status: int, doc: Any) -> None:
    body = orjson.dumps(doc)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def wait_for(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true (it observes another thread or process)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1:<free port> in a thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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
