"""Issue 5's end-to-end: a client -> the tailguard gateway proxy -> an OpenAI-compatible
upstream whose engine is vLLM's real front-end stats path (OutputProcessor +
StatLoggerManager loading the tailguard plugin from its entry point) -> both sides' events
on the real broker -> the real worker joins them into complete request records. Client
aborts mid-stream become gateway-only records with outcome ``client_abort``.

Needs ``vllm``: run by ``./tg vllm-test`` (skipped in ``./tg test``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

pytest.importorskip("vllm", reason="needs vllm: run ./tg vllm-test")

from pipeline.adapters.store import open_store
from producers.emit import open_kafka_sink
from producers.gateway_proxy import build_gateway
from tests.gateway_fixtures import serve, wait_for
from tests.integration.harness import WorkerProcess, make_settings
from tests.kafka_fixture import KafkaUnderTest
from tests.vllm_driver import DrivenRequest, VllmDriver
from tools.dev.fake_openai import FakeOpenAI, read_request

pytestmark = pytest.mark.integration

MODEL = "tiny-chat"


class VllmBackedUpstream:
    """Chat completions answered by driving vLLM's real stats path under the id the gateway
    forwarded (vLLM names it ``chatcmpl-<X-Request-Id>``); streams go to the fake (slow)."""

    def __init__(self, driver: VllmDriver) -> None:
        self.driver = driver
        self.stream = FakeOpenAI()
        self.driven: dict[str, DrivenRequest] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.stream(scope, receive, send)
            return
        headers, body = await read_request(scope, receive)
        doc = orjson.loads(body)
        if doc.get("stream"):
            replay = [{"type": "http.request", "body": body, "more_body": False}]

            async def again() -> Any:
                return replay.pop() if replay else await receive()

            await self.stream(scope, again, send)
            return
        rid = headers["x-request-id"]
        n = int(doc.get("max_tokens", 4))
        req = DrivenRequest(
            f"chatcmpl-{rid}", prompt_tokens=10 + n, output_tokens=n, queue_s=0.002,
            prefill_s=0.003, tpot_s=0.001, finish_reason="length",
        )  # fmt: skip
        self.driven[rid] = req
        await asyncio.to_thread(self.driver.run, [req])
        out = orjson.dumps(
            {"id": f"chatcmpl-{rid}", "object": "chat.completion", "model": MODEL,
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "x" * n}}],
             "usage": {"prompt_tokens": 10 + n, "completion_tokens": n}}
        )  # fmt: skip
        await send(
            {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/json")]}
        )  # fmt: skip
        await send({"type": "http.response.body", "body": out})


def test_gateway_proxy_and_real_vllm_events_join_into_complete_records(
    kafka: KafkaUnderTest, tmp_path: Path
) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path, engine_host="vllm-node")
    driver = VllmDriver(s, served_model_name=MODEL)
    upstream = VllmBackedUpstream(driver)
    gateway_sink = open_kafka_sink(s, service="gateway")
    served: list[str] = []
    aborted: list[str] = []
    try:
        with serve(upstream) as upstream_url:
            app, _proxy, _mw = build_gateway(upstream_url, gateway_sink, host="gw-e2e")
            with serve(app) as url, httpx.Client(timeout=60) as client:
                for i in range(12):
                    r = client.post(
                        f"{url}/v1/chat/completions",
                        json={"model": MODEL, "messages": [{"role": "user", "content": str(i)}],
                              "max_tokens": 2 + i % 5},
                        headers={"x-vllm-priority": str(i % 4)},
                    )  # fmt: skip
                    assert r.status_code == 200, r.text
                    rid = r.headers["x-request-id"]
                    assert r.json()["id"] == f"chatcmpl-{rid}"  # the gateway's id, end to end
                    served.append(rid)
                for _ in range(2):
                    with client.stream(
                        "POST", f"{url}/v1/chat/completions",
                        json={"model": MODEL, "messages": [], "stream": True, "max_tokens": 500},
                        headers={"x-test-chunk-delay-ms": "20"},
                    ) as r:  # fmt: skip
                        aborted.append(r.headers["x-request-id"])
                        next(r.iter_raw())  # then hang up mid-stream
                wait_for(lambda: set(aborted) <= upstream.stream.abandoned, 10, "upstream aborts")
        assert driver.flush() == 0
    finally:
        driver.close()
        gateway_sink.close(timeout_s=10)
    assert gateway_sink.counters.events_sent == 2 * (len(served) + len(aborted))
    assert set(upstream.driven) == set(served)

    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        worker.wait_caught_up(120)
    finally:
        worker.stop()
    store = open_store(s)
    try:
        rows = store.query_rows(
            "SELECT request_id, source, outcome, http_status, gateway_host, engine_host, "
            "priority, queue_ms, prefill_ms, output_tokens, gateway_total_ms "
            f"FROM {s.database}.requests FINAL"
        )
    finally:
        store.close()
    by_id = {r[0]: r for r in rows}
    assert set(by_id) == set(served) | set(aborted)
    for i, rid in enumerate(served):
        _, source, outcome, status, gw_host, eng_host, prio, queue, prefill, out_tok, total = by_id[
            rid
        ]
        assert (source, outcome, status, gw_host, eng_host) == (
            "joined", "ok", 200, "gw-e2e", "vllm-node/engine0",
        ), rid  # fmt: skip
        assert prio == i % 4
        assert queue == pytest.approx(2.0, abs=1e-3)
        assert prefill == pytest.approx(3.0, abs=1e-3)
        assert out_tok == upstream.driven[rid].output_tokens
        assert total is not None
        assert total > 0
    for rid in aborted:
        assert by_id[rid][1:5] == ("gateway_only", "client_abort", 0, "gw-e2e"), by_id[rid]
