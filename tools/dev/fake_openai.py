"""A small OpenAI-compatible upstream for tests and benchmarks (stands in for vLLM's server).

``python -m tools.dev.fake_openai --port N`` serves it on 127.0.0.1 with uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import orjson


async def read_request(scope: Any, receive: Any) -> tuple[dict[str, str], bytes]:
    """An ASGI HTTP request's headers (names as sent) and its whole body."""
    headers = {bytes(k).decode(): bytes(v).decode() for k, v in scope["headers"]}
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return headers, body


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
        headers, body = await read_request(scope, receive)
        doc = orjson.loads(body) if body else {}
        rid = headers.get("x-request-id", "")
        self.seen[rid] = {"headers": headers, "body": doc, "path": scope["path"]}
        if scope["path"] not in ("/v1/chat/completions", "/v1/completions"):
            await _json(send, 404, {"error": "not found"})
            return
        n = int(doc.get("max_tokens", 5))
        if not doc.get("stream"):
            self.finished.add(rid)  # before the answer is sent (see the stream's end)
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
            if (doc.get("stream_options") or {}).get("include_usage") is True:
                usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
                last = {"id": f"chatcmpl-{rid}", "choices": [], "usage": usage}
                data = b"data: " + orjson.dumps(last) + b"\n\n"
                await send({"type": "http.response.body", "body": data, "more_body": True})
            # Finished before the last send: the gateway may relay [DONE] and its client
            # read it before this coroutine runs again (a test asserting "finished" once it
            # has the whole stream failed so under load).
            self.finished.add(rid)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
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


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(
        FakeOpenAI(), host="127.0.0.1", port=args.port, log_level="warning", access_log=False
    )


if __name__ == "__main__":
    main()
