"""The reference gateway proxy end to end on loopback: a client -> `build_gateway` (uvicorn)
-> a small OpenAI-compatible upstream (uvicorn). Events go to an in-memory sink here; the
Kafka side is in test_gateway_kafka.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from pipeline.contract.control_signal import Actions
from producers.admission import MIN_BURST_TOKENS
from producers.control_client import Directive
from producers.enforcement import spread_retry_after_s, unit_of
from producers.gateway_proxy import HEALTH_PATH, build_gateway
from tests.gateway_fixtures import MemorySink, overloaded, serve, wait_for
from tools.dev.fake_openai import FakeOpenAI, read_request

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def completed(sink: MemorySink, rid: str) -> dict[str, Any]:
    """The request's events once the middleware emitted the last one (after the app returned;
    the client may have read the last byte a moment earlier)."""
    wait_for(lambda: "gateway.completed" in sink.of(rid), what=f"gateway.completed of {rid}")
    return sink.of(rid)


@pytest.fixture
def stack() -> Iterator[tuple[str, FakeOpenAI, MemorySink]]:
    upstream = FakeOpenAI()
    sink = MemorySink()
    with serve(upstream) as upstream_url:
        app, _proxy, _mw = build_gateway(upstream_url, sink, host="gw-test")
        with serve(app) as gateway_url:
            yield gateway_url, upstream, sink


def test_non_streaming_request_passes_through_with_both_events(
    stack: tuple[str, FakeOpenAI, MemorySink],
) -> None:
    url, upstream, sink = stack
    body = {"model": "llama-3-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}
    r = httpx.post(
        f"{url}/v1/chat/completions?x=1",
        json=body,
        headers={"X-Vllm-Priority": "2", "X-Tenant-Id": "acme", "traceparent": TRACEPARENT},
    )
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 7
    rid = r.headers["x-request-id"]
    assert len(rid) == 32  # created by the gateway
    seen = upstream.seen[rid]
    assert seen["body"] == body
    assert seen["path"] == "/v1/chat/completions"
    assert seen["headers"]["x-vllm-priority"] == "2"
    assert seen["headers"]["traceparent"].split("-")[1] == TRACE_ID  # same trace continues
    ev = completed(sink, rid)
    assert set(ev) == {"gateway.received", "gateway.completed"}
    rec, done = ev["gateway.received"], ev["gateway.completed"]
    assert (rec.model, rec.priority, rec.tenant, rec.stream, rec.host) == (
        "llama-3-8b",
        2,
        "acme",
        False,
        "gw-test",
    )
    assert (done.http_status, done.outcome, done.model) == (200, "ok", "llama-3-8b")
    assert done.ttfb_ms is not None
    assert 0 <= done.ttfb_ms <= done.total_ms
    assert done.ts_unix_ns >= rec.ts_unix_ns


def test_client_request_id_is_kept(stack: tuple[str, FakeOpenAI, MemorySink]) -> None:
    url, upstream, sink = stack
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "m", "prompt": "p"},
        headers={"X-Request-Id": "client-chosen-42"},
    )
    assert r.headers["x-request-id"] == "client-chosen-42"
    assert "client-chosen-42" in upstream.seen
    assert set(completed(sink, "client-chosen-42")) == {"gateway.received", "gateway.completed"}


def test_streaming_relays_every_chunk_and_measures_ttfb(
    stack: tuple[str, FakeOpenAI, MemorySink],
) -> None:
    url, upstream, sink = stack
    body = {"model": "m", "prompt": "p", "stream": True, "max_tokens": 6}
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"x-test-chunk-delay-ms": "100"}
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        rid = r.headers["x-request-id"]
        text = b"".join(r.iter_raw()).decode()
    events = [line for line in text.split("\n\n") if line]
    assert len(events) == 7
    assert events[-1] == "data: [DONE]"
    assert orjson.loads(events[0][len("data: ") :])["id"] == f"chatcmpl-{rid}"
    done = completed(sink, rid)["gateway.completed"]
    assert sink.of(rid)["gateway.received"].stream is True
    assert done.outcome == "ok"
    assert done.http_status == 200
    # First chunk at once, then 5 gaps of 100 ms before the last byte. The gateway may
    # read the first chunk late on a loaded machine (the upstream's gaps run meanwhile:
    # 185 ms late at load 14 once), so the bound is half the streaming time: a TTFB
    # taken at the last byte instead of the first gives ~0 and fails it.
    assert done.ttfb_ms is not None
    assert done.ttfb_ms < done.total_ms
    assert done.total_ms - done.ttfb_ms >= 5 * 100 * 0.5
    assert rid in upstream.finished


def test_gateway_only_tokens_default_priority_and_routes(
    stack: tuple[str, FakeOpenAI, MemorySink],
) -> None:
    """Issue 16: usage from the stream's last chunk; untagged traffic in the default tier;
    GET /v1/models (404 upstream) passes through unrecorded."""
    url, upstream, sink = stack
    body = {"model": "m", "prompt": "p", "stream": True, "max_tokens": 4,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
        rid = r.headers["x-request-id"]
        text = b"".join(r.iter_raw()).decode()
    assert '"usage"' in text
    ev = completed(sink, rid)
    assert ev["gateway.received"].priority == 2
    assert (ev["gateway.completed"].prompt_tokens, ev["gateway.completed"].output_tokens) == (
        3,
        4,
    )
    before = len(sink.events)
    r = httpx.get(f"{url}/v1/models", headers={"X-Request-Id": "models-1"})
    assert r.status_code == 404
    assert "models-1" in upstream.seen  # forwarded
    # a recorded request after it: once its events are in, the 404's would be too
    httpx.post(f"{url}/v1/completions", json={"model": "m"}, headers={"X-Request-Id": "after"})
    completed(sink, "after")
    assert sink.of("models-1") == {}  # not recorded
    assert len(sink.events) == before + 2


def test_client_disconnect_mid_stream_is_a_client_abort(
    stack: tuple[str, FakeOpenAI, MemorySink],
) -> None:
    url, upstream, sink = stack
    body = {"model": "m", "prompt": "p", "stream": True, "max_tokens": 1000}
    with (
        httpx.Client() as client,
        client.stream(
            "POST", f"{url}/v1/completions", json=body, headers={"x-test-chunk-delay-ms": "20"}
        ) as r,
    ):
        rid = r.headers["x-request-id"]
        first = next(r.iter_raw())
        assert first.startswith(b"data: ")
        # leaving the block closes the connection before the response is complete
    done = completed(sink, rid)["gateway.completed"]
    assert (done.outcome, done.http_status) == ("client_abort", 0)
    assert done.ttfb_ms is not None
    assert done.total_ms >= done.ttfb_ms
    # the proxy closed its upstream request too (vLLM would abort the generation)
    wait_for(lambda: rid in upstream.abandoned, what="upstream to see the disconnect")
    assert rid not in upstream.finished


def test_upstream_down_is_502_and_an_error(tmp_path: object) -> None:
    sink = MemorySink()
    app, _proxy, _mw = build_gateway("http://127.0.0.1:9", sink, host="gw")  # discard port
    with serve(app) as url:
        r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "p"})
        assert r.status_code == 502
        rid = r.headers["x-request-id"]
        done = completed(sink, rid)["gateway.completed"]
    assert (done.outcome, done.http_status, done.model) == ("error", 502, "m")


def test_health_endpoint_is_not_recorded(stack: tuple[str, FakeOpenAI, MemorySink]) -> None:
    url, _upstream, sink = stack
    r = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "p"})
    completed(sink, r.headers["x-request-id"])
    r = httpx.get(f"{url}{HEALTH_PATH}")
    assert r.status_code == 200
    doc = r.json()
    assert doc["producer"]["events_sent"] == 2
    assert doc["middleware"]["requests"] == 1
    assert len(sink.events) == 2


def test_admission_429_with_retry_after_and_priority_0_always_passes() -> None:
    """Capacity-aware admission (issue 35) over real HTTP: a directive admits 5 rps at
    this one gateway; on a fake clock, a burst of priority 3 gets the rate then 429s
    with Retry-After; priority 0 always gets 200, before and after the warm-up."""
    directive = Directive(
        level=1,
        phase="degraded",
        actions=Actions(admit_rps=5.0, admit_gateways=1, retry_after_s=30),
        scope="m",
    )
    now_ms = [0.0]
    upstream = FakeOpenAI()
    sink = MemorySink()
    with serve(upstream) as upstream_url:
        app, _proxy, _mw = build_gateway(
            upstream_url,
            sink,
            host="gw-adm",
            control=lambda _scope: directive,
            control_clock_ms=lambda: now_ms[0],
        )
        with serve(app) as url, httpx.Client(base_url=url) as client:

            def post(priority: int, t_ms: float) -> httpx.Response:
                now_ms[0] = t_ms
                return client.post(
                    "/v1/completions",
                    json={"model": "m", "prompt": "p", "max_tokens": 1},
                    headers={"X-Vllm-Priority": str(priority)},
                )

            # warm-up: one second's tokens (5) but at least MIN_BURST_TOKENS (10), first
            # come first served, priority 0 exempt
            burst = int(max(MIN_BURST_TOKENS, 5.0))
            assert [post(3, 0.0).status_code for _ in range(burst)] == [200] * burst
            r = post(3, 0.0)
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"  # the next token in 0.2 s
            assert r.json() == overloaded("admission", 1, 1)
            assert [post(0, 0.0).status_code for _ in range(3)] == [200] * 3
            # then priority 0 asks for 10 rps, twice the rate: all of it passes, and
            # priority 3 is turned away for as long as the directive allows
            p0 = [post(0, 1_000.0 + 100.0 * i).status_code for i in range(15)]
            assert p0 == [200] * 15
            r = post(3, 2_500.0)
            assert r.status_code == 429
            rid = r.headers["x-request-id"]  # the gateway's id, the request key
            # no share left for priority 3: the most, spread per request key
            want = spread_retry_after_s(30, unit_of("retry-after:" + rid))
            assert r.headers["retry-after"] == str(want)
            assert r.json()["reason"] == "admission"
            assert rid not in upstream.seen  # never reached the engine
    done = completed(sink, rid)["gateway.completed"]
    assert (done.outcome, done.http_status) == ("rejected", 429)


@dataclass
class HeldUpstream:
    """A streaming upstream that sends its response start at once (as vLLM does) and its
    first chunk only once the test calls :meth:`release`; notes which requests it finished
    and which saw their client (the gateway) go away first."""

    finished: set[str] = field(default_factory=set)
    abandoned: set[str] = field(default_factory=set)
    _loop: asyncio.AbstractEventLoop | None = None
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._released.set)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                self._loop = asyncio.get_running_loop()
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers, _body = await read_request(scope, receive)
        rid = headers["x-request-id"]
        start = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": start})

        async def gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(gone())
        released = asyncio.ensure_future(self._released.wait())
        await asyncio.wait({watcher, released}, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done():
            self.abandoned.add(rid)
            released.cancel()
            return
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        self.finished.add(rid)
        watcher.cancel()


def test_queue_cut_off_503_for_priority_3_while_priority_0_waits_for_its_first_byte() -> None:
    """The queue cut-off (issue 35) over real HTTP: a directive cuts off at 200 ms; the
    upstream holds every first chunk until released. A priority-3 request gets 503 with
    Retry-After after the cut-off (its upstream request closed), while a priority-0
    stream opened before it, so kept waiting longer than the cut-off, gets its 200 and
    its body once released."""
    directive = Directive(
        level=1,
        phase="degraded",
        actions=Actions(queue_timeout_ms=[None, 200.0, 200.0, 200.0], retry_after_s=12),
        scope="m",
    )
    upstream = HeldUpstream()
    sink = MemorySink()
    body = {"model": "m", "prompt": "p", "stream": True}
    with serve(upstream) as upstream_url:
        app, _proxy, _mw = build_gateway(
            upstream_url, sink, host="gw-cut", control=lambda _scope: directive
        )
        with serve(app) as url, httpx.Client(base_url=url, timeout=10.0) as client:
            with client.stream(
                "POST",
                "/v1/completions",
                json=body,
                headers={"X-Vllm-Priority": "0", "X-Request-Id": "p0"},
            ) as r0:
                assert r0.status_code == 200  # not held: the upstream's start at once
                r3 = client.post(
                    "/v1/completions",
                    json=body,
                    headers={"X-Vllm-Priority": "3", "X-Request-Id": "p3"},
                )
                assert r3.status_code == 503
                want = spread_retry_after_s(12, unit_of("retry-after:p3"))  # 12 s, spread
                assert r3.headers["retry-after"] == str(want)
                assert r3.json() == overloaded("queue_timeout", 1, want)
                # the cut-off closed p3's upstream request: the upstream sees it go
                # before anything is released (else a release could race the disconnect)
                wait_for(lambda: "p3" in upstream.abandoned, what="the cut-off to close upstream")
                upstream.release()
                text = b"".join(r0.iter_raw())
            assert text == b"data: x\n\ndata: [DONE]\n\n"
            wait_for(lambda: upstream.finished == {"p0"}, what="p0 to finish upstream")
    cut = completed(sink, "p3")["gateway.completed"]
    assert (cut.outcome, cut.http_status) == ("rejected", 503)
    assert cut.ttfb_ms is not None
    assert cut.ttfb_ms >= 200.0 * 0.95  # the loop's timer, against the gateway's clock
    p0 = completed(sink, "p0")["gateway.completed"]
    assert (p0.outcome, p0.http_status) == ("ok", 200)
    assert p0.ttfb_ms is not None
    assert p0.ttfb_ms > cut.ttfb_ms  # waited past the cut-off and was not cut
