"""The queue one gateway sees (producers/gateway_queue.py, issue 52): forwarded requests
with their own first-token SLO and no first byte yet, over their first bytes' rate
(Little's law), as tables; and the enforcement's deadline rule preferring it to the
directive's reading."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.contract.control_signal import Actions
from producers.asgi_control import ControlMiddleware
from producers.control_client import NORMAL, Directive
from producers.enforcement import Enforcement, RequestFacts
from producers.gateway_queue import MAX_MODELS, MIN_FIRST_BYTES, WINDOW_MS, GatewayQueue

# (case, steps, now ms, wait ms). Steps: ("fwd", t_ms, slo) -> a handle; ("byte", k, t_ms)
# -> the k-th handle's first byte; ("end", k) -> the k-th ends without one.
Step = tuple[Any, ...]
CASES: list[tuple[str, list[Step], float, float | None]] = [
    ("nothing forwarded", [], 1_000.0, None),
    (
        "fewer first bytes than the minimum: no estimate",
        [("fwd", 0.0, 300.0)] * 5 + [("byte", k, 100.0 * k) for k in range(MIN_FIRST_BYTES - 1)],
        20_000.0,
        None,
    ),
    (
        "10 first bytes in the window, 4 waiting: 4 / (10 per 10 s) = 4 s",
        [("fwd", 0.0, 300.0)] * 14 + [("byte", k, 11_000.0 + 100.0 * k) for k in range(10)],
        20_000.0,
        4_000.0,
    ),
    (
        "first bytes older than the window do not count",
        [("fwd", 0.0, 300.0)] * 16 + [("byte", k, 100.0 * k) for k in range(6)]
        + [("byte", 6 + k, 15_000.0 + k) for k in range(MIN_FIRST_BYTES)],
        20_000.0,
        5 * WINDOW_MS / MIN_FIRST_BYTES,
    ),
    (
        "a young gateway's window is since its first forward: 5 bytes in 2 s, 1 waiting",
        [("fwd", 1_000.0, 300.0)] * 6 + [("byte", k, 1_500.0 + 100.0 * k) for k in range(5)],
        3_000.0,
        400.0,
    ),
    (
        "an end without a first byte leaves the queue, and counts no first byte",
        [("fwd", 0.0, 300.0)] * 8 + [("byte", k, 11_000.0 + k) for k in range(5)] + [("end", 5)],
        20_000.0,
        2 * WINDOW_MS / 5,
    ),
    (
        "a first byte after the end, or a second, counts once",
        [("fwd", 0.0, 300.0)] * 7 + [("byte", k, 11_000.0 + k) for k in range(5)]
        + [("end", 0), ("byte", 0, 12_000.0), ("byte", 5, 12_000.0), ("byte", 5, 12_001.0),
           ("end", 5)],
        20_000.0,
        1 * WINDOW_MS / 6,
    ),
    (
        "requests without an own SLO are not counted",
        [("fwd", 0.0, 300.0)] * 5 + [("fwd", 0.0, None)] * 9
        + [("byte", k, 11_000.0 + k) for k in range(5)],
        20_000.0,
        0.0,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("steps", "now_ms", "want"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_the_wait_is_the_waiting_over_the_first_bytes_rate(
    steps: list[Step], now_ms: float, want: float | None
) -> None:
    q = GatewayQueue()
    handles = []
    for step in steps:
        if step[0] == "fwd":
            h = q.forwarded("m", step[2], step[1])
            if h is not None:
                handles.append(h)
        elif step[0] == "byte":
            q.first_byte(handles[step[1]], step[2])
        else:
            q.ended(handles[step[1]])
    got = q.wait_ms("m", now_ms)
    assert got == (None if want is None else pytest.approx(want))
    assert q.wait_ms("other", now_ms) is None  # per model


def test_unknown_models_share_one_scope_and_none_handles_are_ignored() -> None:
    q = GatewayQueue()
    hs = [q.forwarded(None, 300.0, 0.0) for _ in range(6)]
    for k, h in enumerate(hs[:5]):
        q.first_byte(h, 100.0 * (k + 1))
    q.first_byte(None, 1.0)
    q.ended(None)
    assert q.wait_ms(None, 1_000.0) == pytest.approx(1 * 1_000.0 / 5)


def _busy(e: Enforcement, waiting: int, first_bytes: int, now_ms: float) -> None:
    """``first_bytes`` answered in the last second before ``now_ms``, ``waiting`` not."""
    hs = [e.queue.forwarded("m", 1_000.0, now_ms - 1_000.0) for _ in range(waiting + first_bytes)]
    for k, h in enumerate(hs[:first_bytes]):
        e.queue.first_byte(h, now_ms - 900.0 + k)


def _d(**actions: Any) -> Directive:
    return Directive(level=1, phase="degraded", actions=Actions(**actions), scope="m")  # type: ignore[arg-type]


# (case, waiting, first bytes, directive's queue ms, cut-off ms, own SLO, reason, predicted)
RULE = [
    ("the directive's queue when the gateway has seen too few first bytes",
     3, MIN_FIRST_BYTES - 1, 2_000.0, None, 1_000.0, "deadline", 2_100.0),
    ("what the gateway sees over the directive: 1 waiting of 10 per s -> 100 ms",
     1, 10, 2_000.0, None, 1_000.0, None, 200.0),
    ("what the gateway sees makes it late: 20 waiting of 10 per s -> 2 s",
     20, 10, 0.0, None, 1_000.0, "deadline", 2_100.0),
    ("it would wait past its cut-off: late whatever its own SLO",
     10, 10, 0.0, 500.0, 5_000.0, "deadline", 1_100.0),
    ("within the cut-off and the margin",
     6, 10, 0.0, 500.0, 5_000.0, None, 700.0),
]  # fmt: skip


@pytest.mark.parametrize("row", [c[1:] for c in RULE], ids=[c[0] for c in RULE])
def test_the_deadline_rule_uses_the_queue_the_gateway_sees(row: tuple[Any, ...]) -> None:
    waiting, first_bytes, directive_ms, cutoff_ms, slo, reason, predicted = row
    e = Enforcement()
    now_ms = 50_000.0
    _busy(e, waiting, first_bytes, now_ms)
    cutoffs = {} if cutoff_ms is None else {"queue_timeout_ms": [None, *[cutoff_ms] * 3]}
    d = _d(ttft_queue_ms=directive_ms, ttft_service_ms=100.0, deadline_margin=0.25, **cutoffs)
    r = RequestFacts(model="m", priority=2, request_key="k", slo_ttft_ms=slo)
    verdict = e.decide(d, r, now_ms).verdict
    assert verdict.reason == reason
    if reason is None:
        assert verdict.predicted_ttft_ms == pytest.approx(predicted)
    else:  # refused: Retry-After the excess, at least 1 s
        assert verdict.retry_after_s >= 1


def test_the_middleware_counts_a_request_until_its_first_body_bytes() -> None:
    """The ASGI middleware (so the reference proxy) reports each admitted request with its
    own first-token SLO to the queue it sees: from the call to its first body bytes, or
    to its end without any (an app that fails)."""
    now = [1_000.0]
    release = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/fail":
            raise RuntimeError("upstream gone")
        if scope["path"] == "/wait":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": False})

    mw = ControlMiddleware(app, lambda _m: NORMAL, clock_ms=lambda: now[0])

    async def sent(msg: Any) -> None:
        return None

    async def receive() -> Any:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    def scope(path: str, slo: bool = True) -> dict[str, Any]:
        headers = [(b"x-tailguard-model", b"m"), (b"x-vllm-priority", b"1")]
        if slo:
            headers.append((b"x-llm-d-slo-ttft-ms", b"500"))
        return {"type": "http", "method": "POST", "path": path, "headers": headers, "state": {}}

    async def go() -> None:
        for _ in range(MIN_FIRST_BYTES):
            await mw(scope("/now"), receive, sent)
        await mw(scope("/now", slo=False), receive, sent)  # not counted
        now[0] = 2_000.0
        waiting = asyncio.ensure_future(mw(scope("/wait"), receive, sent))
        while mw.enforcement.queue.wait_ms("m", now[0]) == 0.0:
            await asyncio.sleep(0)
        assert mw.enforcement.queue.wait_ms("m", now[0]) == pytest.approx(1_000.0 / 5)
        release.set()
        await waiting
        assert mw.enforcement.queue.wait_ms("m", now[0]) == 0.0
        failing = asyncio.ensure_future(mw(scope("/fail"), receive, sent))
        with pytest.raises(RuntimeError):
            await failing
        assert mw.enforcement.queue.wait_ms("m", now[0]) == 0.0

    asyncio.run(asyncio.wait_for(go(), 60))


def test_models_are_bounded_and_a_forgotten_ones_reports_are_ignored() -> None:
    q = GatewayQueue()
    first = q.forwarded("model-0", 300.0, 0.0)
    for k in range(1, MAX_MODELS + 1):  # one more model than kept: model-0 is forgotten
        q.forwarded(f"model-{k}", 300.0, 0.0)
    q.first_byte(first, 1.0)
    q.ended(first)
    hs = [q.forwarded("model-0", 300.0, 2.0) for _ in range(MIN_FIRST_BYTES + 1)]
    for h in hs[:MIN_FIRST_BYTES]:
        q.first_byte(h, 3.0)
    assert q.wait_ms("model-0", 3.0) == pytest.approx(1 * 1.0 / MIN_FIRST_BYTES)
