"""The queue cut-off (``Actions.queue_timeout_ms``, issue 35) in ControlMiddleware: a
request of priority >= 1 with no first body byte from the app in time is cancelled and
answered 503 + Retry-After; priority 0, requests without a cut-off and responses whose
body began in time pass untouched. The apps here wait on asyncio events the tests set;
the only timer is the cut-off under test."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from pipeline.contract.control_signal import Actions
from producers.asgi_control import REJECTED_STATE_KEY, ControlMiddleware, Message, Scope
from producers.control_client import NORMAL, Directive
from producers.enforcement import spread_retry_after_s, unit_of
from producers.gateway import LifecycleMiddleware
from tests.ceilings import ceiling
from tests.gateway_fixtures import MemorySink, overloaded

CUTOFF_MS = 30.0


def _directive(**actions: Any) -> Directive:
    return Directive(level=2, phase="degraded", actions=Actions(**actions), scope="m")


CUT = _directive(queue_timeout_ms=[None, CUTOFF_MS, CUTOFF_MS, CUTOFF_MS], retry_after_s=7)


def _scope(priority: int) -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"x-vllm-priority", str(priority).encode()), (b"x-tailguard-session", b"s")],
        "state": {},
    }


async def _receive() -> Message:
    return {"type": "http.request", "body": b"{}", "more_body": False}


@dataclass
class Client:
    """The server side of one request: what the middleware sent, with an event per message."""

    sent: list[Message] = field(default_factory=list)
    got: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, msg: Message) -> None:
        self.sent.append(msg)
        self.got.set()

    async def wait_for(self, n: int) -> None:
        while len(self.sent) < n:
            self.got.clear()
            await self.got.wait()

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


@dataclass
class Upstream:
    """An app that sends its response start at once (as vLLM streams), then each body
    chunk only when the test releases it; it notes how it ended."""

    chunks: list[bytes] = field(default_factory=lambda: [b"data: 1\n\n", b"data: 2\n\n"])
    releases: list[asyncio.Event] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    empty_first: bool = False
    outcome: str | None = None
    task: asyncio.Task[Any] | None = None
    send_seen: Any = None

    def __post_init__(self) -> None:
        self.releases = [asyncio.Event() for _ in self.chunks]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.task, self.send_seen = asyncio.current_task(), send
        await receive()
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            if self.empty_first:  # nothing to send yet: does not start the body
                await send({"type": "http.response.body", "body": b"", "more_body": True})
            self.started.set()
            for chunk, release in zip(self.chunks, self.releases, strict=True):
                await release.wait()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.outcome = "finished"
        except asyncio.CancelledError:
            self.outcome = "cancelled"
            raise


def _mw(app: Any, d: Directive = CUT) -> ControlMiddleware:
    return ControlMiddleware(app, lambda _s: d)


@pytest.mark.parametrize("empty_first", [False, True])
def test_cut_off_cancels_the_app_and_answers_503_with_retry_after(empty_first: bool) -> None:
    async def go() -> None:
        app = Upstream(empty_first=empty_first)
        mw, client, scope = _mw(app), Client(), _scope(3)
        scope["headers"].append((b"x-request-id", b"cut-1"))
        await mw(scope, _receive, client.send)
        assert app.outcome == "cancelled"  # the app saw CancelledError
        assert app.task is not None
        assert app.task.done()
        assert len(client.sent) == 2  # the app's held 200 never went out
        assert client.status == 503
        retry_after_s = spread_retry_after_s(7, unit_of("retry-after:cut-1"))  # 7 s, spread
        assert client.headers[b"retry-after"] == str(retry_after_s).encode()
        assert client.headers[b"content-type"] == b"application/json"
        assert orjson.loads(client.body) == overloaded("queue_timeout", 2, retry_after_s)
        assert client.sent[-1]["more_body"] is False
        assert mw.counters["queue_timeout"] == 1
        assert mw.counters["passed"] == 1
        assert scope["state"][REJECTED_STATE_KEY] == "queue_timeout"

    asyncio.run(go())


def test_priority_0_is_never_cut_off_and_runs_on_the_fast_path() -> None:
    """Priority 0 waits past the cut-off (a priority-3 request started after it on the
    same gateway is cut off meanwhile) and still gets its whole response; its app runs
    in the caller's task with the server's own send: no task, no buffering."""

    async def go() -> None:
        p0, p3 = Upstream(), Upstream()
        mw = _mw(p0)
        c0 = Client()
        t0 = asyncio.ensure_future(mw(_scope(0), _receive, c0.send))
        await p0.started.wait()
        assert c0.status == 200  # not held
        mw.app = p3
        c3 = Client()
        await mw(_scope(3), _receive, c3.send)
        assert (c3.status, p3.outcome) == (503, "cancelled")
        for release in p0.releases:
            release.set()
        await t0
        assert p0.outcome == "finished"
        assert p0.task is t0  # called directly, not as a task of its own
        assert p0.send_seen == c0.send
        assert (c0.status, c0.body) == (200, b"data: 1\n\ndata: 2\n\n")
        assert mw.counters["queue_timeout"] == 1

    asyncio.run(go())


def test_without_a_cut_off_only_shadow_off_and_priority_0_call_the_app_directly() -> None:
    """A request that no cut-off can reach runs in the caller's task with the server's own
    send: priority 0, and any request in shadow or off. In enforce, a request of priority
    >= 1 admitted without a cut-off still runs as a task with its start held until its
    body begins: a later directive may set a cut-off while it waits (next test)."""
    from producers.enforcement import Modes

    async def go() -> None:
        for d in (_directive(retry_after_s=7), _directive(queue_timeout_ms=None)):
            for prio, mode, direct in ((3, "enforce", False), (0, "enforce", True),
                                       (3, "shadow", True), (3, "off", True)):  # fmt: skip
                app = Upstream()
                for release in app.releases:
                    release.set()
                client = Client()
                mw = ControlMiddleware(app, lambda _s, d=d: d, modes=Modes.parse(mode))
                caller = asyncio.ensure_future(mw(_scope(prio), _receive, client.send))
                await caller
                assert (app.task is caller) is direct, (prio, mode)
                assert (app.send_seen == client.send) is direct, (prio, mode)
                assert (client.status, client.body) == (200, b"data: 1\n\ndata: 2\n\n")

    asyncio.run(go())


def test_a_cut_off_set_while_a_request_waits_cuts_it_from_its_call() -> None:
    """Admitted under L0 (no cut-off), still waiting for its first byte when a directive
    with a cut-off for its priority comes into force: cut (503 + Retry-After) as if the
    cut-off had been in force at its call, as the simulator's gateways do. Priority 0 and
    a stream that began are not cut; the app's held 200 never goes out."""

    async def go() -> None:
        in_force = [NORMAL]
        later = _directive(queue_timeout_ms=[None, *[CUTOFF_MS] * 3], retry_after_s=9)
        waiting, p0, begun = Upstream(), Upstream(), Upstream()
        mw = ControlMiddleware(waiting, lambda _s: in_force[0])
        c3, c0, cb = Client(), Client(), Client()
        t3 = asyncio.ensure_future(mw(_scope(3), _receive, c3.send))
        await waiting.started.wait()
        mw.app = p0
        t0 = asyncio.ensure_future(mw(_scope(0), _receive, c0.send))
        await p0.started.wait()
        mw.app = begun
        tb = asyncio.ensure_future(mw(_scope(2), _receive, cb.send))
        await begun.started.wait()
        begun.releases[0].set()
        await cb.wait_for(2)  # its body began under L0
        in_force[0] = later  # the new directive, while the priority-3 request waits
        # (without the later look at the directive, it would wait for ever)
        await asyncio.wait_for(t3, ceiling(30))
        assert (c3.status, waiting.outcome) == (503, "cancelled")
        assert orjson.loads(c3.body)["reason"] == "queue_timeout"
        assert 5 <= int(c3.headers[b"retry-after"]) <= 9  # the later directive's, spread
        assert mw.counters["queue_timeout"] == 1
        for app in (p0, begun):
            for release in app.releases:
                release.set()
        await t0
        await tb
        assert (c0.status, p0.outcome) == (200, "finished")
        assert (cb.status, begun.outcome) == (200, "finished")

    asyncio.run(go())


def test_a_stream_begun_before_the_cut_off_is_never_cut_and_passes_untouched() -> None:
    """The start waits for the first body chunk, then both go out as the app sent them;
    the stream then outlives the cut-off (a second priority-3 request, started after the
    first chunk, is cut off meanwhile) and every chunk arrives."""

    async def go() -> None:
        app, other = Upstream(), Upstream()
        d = _directive(queue_timeout_ms=[None, *[CUTOFF_MS * 4] * 3], retry_after_s=7)
        mw, client = _mw(app, d), Client()
        task = asyncio.ensure_future(mw(_scope(2), _receive, client.send))
        await app.started.wait()
        assert client.sent == []  # the start is held until the body begins
        app.releases[0].set()
        await client.wait_for(2)
        assert client.sent == [
            {"type": "http.response.start", "status": 200, "headers": []},
            {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
        ]
        assert app.task is not task  # ran as a task of its own
        mw.app = other
        cut = Client()
        await mw(_scope(3), _receive, cut.send)  # takes the whole cut-off
        assert cut.status == 503
        assert not task.done()
        app.releases[1].set()
        await task
        assert app.outcome == "finished"
        assert client.status == 200
        assert client.body == b"data: 1\n\ndata: 2\n\n"
        assert [m["type"] for m in client.sent].count("http.response.start") == 1
        assert client.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert mw.counters["queue_timeout"] == 1

    asyncio.run(go())


def test_a_whole_response_in_one_message_passes() -> None:
    async def go() -> None:
        async def app(scope: Scope, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 201, "headers": [(b"a", b"b")]})
            await send({"type": "http.response.body", "body": b'{"ok":1}'})

        mw, client = _mw(app), Client()
        await mw(_scope(1), _receive, client.send)
        assert client.sent == [
            {"type": "http.response.start", "status": 201, "headers": [(b"a", b"b")]},
            {"type": "http.response.body", "body": b'{"ok":1}'},
        ]
        assert mw.counters["queue_timeout"] == 0

    asyncio.run(go())


def test_app_exceptions_propagate_under_a_cut_off() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        raise KeyError("app bug")

    async def go() -> None:
        with pytest.raises(KeyError):
            await _mw(app)(_scope(3), _receive, Client().send)

    asyncio.run(go())


def test_lifecycle_records_the_cut_off_as_rejected_503() -> None:
    async def go() -> None:
        sink = MemorySink()
        app = Upstream()
        lifecycle = LifecycleMiddleware(_mw(app), sink, host="gw")
        client = Client()
        scope = {**_scope(3), "headers": [(b"x-vllm-priority", b"3"), (b"x-request-id", b"r1")]}
        await lifecycle(scope, _receive, client.send)
        assert client.status == 503
        done = sink.of("r1")["gateway.completed"]
        assert (done.http_status, done.outcome) == (503, "rejected")
        assert done.ttfb_ms is not None
        assert done.ttfb_ms >= CUTOFF_MS * 0.9

    asyncio.run(go())


def test_an_app_ending_without_a_body_gets_its_start_sent_at_once() -> None:
    """No body at all (a protocol slip of the app): its start goes out as it sent it, when
    the app ends, not at the cut-off (an hour here; the guard fails the test long before)."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})

    async def go() -> None:
        mw, client = _mw(app, _directive(queue_timeout_ms=[None, *[3_600_000.0] * 3])), Client()
        async with asyncio.timeout(10):
            await mw(_scope(3), _receive, client.send)
        assert client.sent == [{"type": "http.response.start", "status": 204, "headers": []}]
        assert mw.counters["queue_timeout"] == 0

    asyncio.run(go())


class StepClock:
    """The middleware's clock, moved by the app under test (no wall time involved)."""

    def __init__(self) -> None:
        self.now_ms = 0.0

    def __call__(self) -> float:
        return self.now_ms


@pytest.mark.parametrize(
    ("first_body_after_ms", "fails", "counted"),
    [
        (10.0, False, False),  # first byte within the cut-off: enforce would not cut
        (45.0, False, True),  # later: enforce would have cut it off
        (5.0, True, False),  # the app failed at once, no body: no cut-off either
        (45.0, True, True),  # failed with no body past the cut-off: enforce would have cut
    ],
)
def test_shadow_counts_a_cut_off_only_past_its_time(
    first_body_after_ms: float, fails: bool, counted: bool
) -> None:
    """Shadow serves the response untouched and counts a would-have queue_timeout exactly
    when enforce would have cut the request off."""
    from producers.enforcement import Modes

    clock = StepClock()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        clock.now_ms += first_body_after_ms
        if fails:
            raise RuntimeError("upstream broke")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    mw = ControlMiddleware(app, lambda _m: CUT, clock_ms=clock, modes=Modes("shadow"))
    client = Client()
    scope = _scope(2)
    if fails:
        with pytest.raises(RuntimeError):
            asyncio.run(mw(scope, _receive, client.send))
    else:
        asyncio.run(mw(scope, _receive, client.send))
        assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]
        assert client.sent[0]["status"] == 200  # served as without control
    would = {k: n for k, n in mw.enforcement.refusals.items() if k[0] == "shadow"}
    assert would == ({("shadow", "*", 2, "queue_timeout"): 1} if counted else {})
    assert scope["state"]["tailguard.control"] == ("shadow", "queue_timeout" if counted else None)
    assert REJECTED_STATE_KEY not in scope["state"]
