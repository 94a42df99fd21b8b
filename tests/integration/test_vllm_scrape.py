"""``tailguard vllm-scrape`` over HTTP: an endpoint serving vLLM's /metrics text (the
unit tests' V1 sample) scraped twice into JSON Lines ``engine.stats`` events that the
contract's decoder reads back; a refused endpoint is counted, not fatal."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.cli import main
from pipeline.contract.codec import SourceRef, decode_message
from tests.unit.test_vllm_metrics import V1
from tools.dev.go_server import free_port

pytestmark = pytest.mark.integration


class _VllmMetrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = V1.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _VllmMetrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_scrape_into_jsonl(engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "stats.jsonl"
    refused = f"http://127.0.0.1:{free_port()}/metrics"  # nobody listens there
    argv = ["vllm-scrape", "--url", engine, "--host", "gpu-1", "--url", refused,
            "--host", "gpu-2", "--rounds", "2", "--interval-s", "0", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "2 engine.stats events, 2 failed scrapes" in capsys.readouterr().out
    events = [ev for line in out.read_bytes().splitlines() for ev in orjson.loads(line)]
    assert len(events) == 2
    for raw in events:
        decoded = decode_message(orjson.dumps(raw), SourceRef("t", 0, 0))
        assert decoded.dead == []
        (ev,) = decoded.events
        assert (ev.kind, ev.host, ev.model) == ("engine.stats", "gpu-1", "Qwen/Qwen2.5-7B-Instruct")
        assert (ev.num_running, ev.num_waiting, ev.kv_cache_usage) == (48, 17, 0.8125)
    # the same counters twice: no lookups between the scrapes, no hit rate
    assert [e.get("prefix_cache_hit_rate") for e in events] == [None, None]
    # vllm:num_preemptions_total sent as the preemptions since the previous scrape (3, then 3)
    assert [e.get("preemptions") for e in events] == [None, 0]
