"""Gateway-only records (issue 16): tokens from the gateway's usage, ctx bucket, TPOT,
and the request's own llm-d objectives."""

from __future__ import annotations

import pytest

from pipeline.contract.events import GatewayCompleted, GatewayReceived
from pipeline.core.record import build_record


def _events(
    *, stream: bool, prompt: int | None, output: int | None, ttfb: float | None = 100.0
) -> tuple[GatewayReceived, GatewayCompleted]:
    rec = GatewayReceived(
        v=1, kind="gateway.received", event_id="r", ts_unix_ns=10**18, host="gw",
        model="m", request_id="q", priority=2, stream=stream,
    )  # fmt: skip
    done = GatewayCompleted(
        v=1, kind="gateway.completed", event_id="c", ts_unix_ns=10**18 + 10**9, host="gw",
        model="m", request_id="q", total_ms=1100.0, ttfb_ms=ttfb, http_status=200,
        outcome="ok", prompt_tokens=prompt, output_tokens=output, slo_ttft_ms=250.0,
        slo_tpot_ms=40.0,
    )  # fmt: skip
    return rec, done


@pytest.mark.parametrize(
    ("stream", "prompt", "output", "ttfb", "bucket", "tpot"),
    [
        (True, 700, 41, 100.0, "512-4k", 25.0),  # (1100 - 100) / 40
        (True, 9000, 2, 100.0, "8k-16k", 1000.0),
        (True, 100, 1, 100.0, "<512", None),  # one token: no inter-token time
        (False, 700, 41, 100.0, "512-4k", None),  # not streamed: first byte = whole body
        (True, None, None, 100.0, "unknown", None),  # no usage read
        (True, 700, 41, None, "512-4k", None),  # no first byte
    ],
)
def test_gateway_only_tokens_bucket_tpot(
    *, stream: bool, prompt: int | None, output: int | None, ttfb: float | None, bucket: str,
    tpot: float | None,
) -> None:  # fmt: skip
    rec, done = _events(stream=stream, prompt=prompt, output=output, ttfb=ttfb)
    r = build_record("q", rec, done, None)
    assert r.source == "gateway_only"
    assert (r.prompt_tokens, r.output_tokens) == (prompt, output)
    assert r.ctx_bucket == bucket
    assert r.tpot_ms == tpot
    assert (r.slo_ttft_ms, r.slo_tpot_ms) == (250.0, 40.0)
