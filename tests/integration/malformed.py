"""Hypothesis strategies for malformed lifecycle messages (for the fault tests).

Each example is a :class:`Malformed`: either a whole message that carries no valid event
(not JSON, JSON of the wrong shape, events with wrong types, unknown kinds, missing fields,
out-of-range values, invalid UTF-8, oversize), or bad elements to mix into a batch of good
events. :func:`generate` draws a fixed number of them, reproducibly (derandomized).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# A valid event of each lifecycle kind: mutated into invalid ones.
_BASE: dict[str, Any] = {"v": 1, "event_id": "e-1", "ts_unix_ns": 1_763_316_946_680_590_000,
                         "host": "gateway-0", "model": "m", "request_id": "r-1"}  # fmt: skip
TEMPLATES: dict[str, dict[str, Any]] = {
    "gateway.received": _BASE | {"kind": "gateway.received", "priority": 1, "tenant": "t",
                                 "prompt_tokens": 10, "stream": True},
    "gateway.completed": _BASE | {"kind": "gateway.completed", "total_ms": 10.0,
                                  "ttfb_ms": 1.0, "http_status": 200, "outcome": "ok",
                                  "output_tokens": 3},
    "engine.finished": _BASE | {"kind": "engine.finished", "host": "engine-0",
                                "arrival_unix_ns": 1_763_316_946_680_590_000, "queue_ms": 1.0,
                                "prefill_ms": 1.0, "decode_ms": 1.0, "inference_ms": 2.0,
                                "e2e_ms": 3.0, "prompt_tokens": 10, "output_tokens": 3,
                                "finish_reason": "stop"},
}  # fmt: skip
# Values that are wrong for a field whatever its type (strict validation: no coercion).
_WRONG = {
    # True and 1.0 too: the contract takes only the JSON integer 1 (Literal[1] alone let both
    # through; a validator closes that).
    "v": [0, 2, "1", None, [1], {"v": 1}, True, 1.0],
    "event_id": ["", 7, None, ["e"], "x" * 129],
    "ts_unix_ns": [0, -5, "1", 1.5, None, True],
    "host": ["", 1, None, "h" * 257],
    "model": ["", 3, None, {"m": 1}],
    "request_id": ["", 9, None, "r" * 257],
    "kind": ["gateway.started", "engine.stats ", "", 1, None, "GATEWAY.RECEIVED"],
    "priority": [-1, 4, "1", 1.5, None, True],
    "tenant": [5, ["t"], "t" * 257],
    "prompt_tokens": [-1, "10", 1.5],
    "stream": ["yes", 1, None],
    "total_ms": [-1.0, "10", None],
    "ttfb_ms": [-0.5, "1"],
    "http_status": [600, -1, "200", 200.5, None],
    "outcome": ["fine", "", 1, None],
    "output_tokens": [-3, "3", 2.5],
    "arrival_unix_ns": [0, "1", None, -1],
    "queue_ms": [-1.0, "1", None],
    "prefill_ms": [-1.0, None],
    "decode_ms": [-1.0, None],
    "inference_ms": [-2.0, None],
    "e2e_ms": [-3.0, None],
    "finish_reason": ["done", None, 0],
}
_OPTIONAL = {"tenant", "prompt_tokens", "stream", "ttfb_ms", "output_tokens", "priority"}


@dataclass(frozen=True, slots=True)
class Malformed:
    what: str  # the generator branch, for messages
    raw: bytes | None = None  # a whole message
    bad_items: tuple[Any, ...] = ()  # or: JSON values to mix into a batch of good events
    positions: tuple[int, ...] = ()  # where (indices into the mixed batch, in order)


@st.composite
def wrong_field(draw: st.DrawFn) -> dict[str, Any]:
    """A valid-looking event with one field of the wrong type or out of range."""
    kind = draw(st.sampled_from(sorted(TEMPLATES)))
    ev = dict(TEMPLATES[kind])
    field = draw(st.sampled_from(sorted(k for k in ev if k in _WRONG)))
    ev[field] = draw(st.sampled_from(_WRONG[field]))
    return ev


@st.composite
def missing_field(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(TEMPLATES)))
    ev = dict(TEMPLATES[kind])
    required = sorted(k for k in ev if k not in _OPTIONAL)
    for k in draw(st.lists(st.sampled_from(required), min_size=1, max_size=3, unique=True)):
        del ev[k]
    return ev


def unknown_kind() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda base, kind: base | {"kind": kind},
        st.sampled_from(list(TEMPLATES.values())),
        st.text(min_size=0, max_size=20).filter(
            lambda k: k not in TEMPLATES and k != "engine.stats"
        ),
    )


def bad_event() -> st.SearchStrategy[Any]:
    """A JSON value that is not a valid event."""
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    )  # fmt: skip
    return st.one_of(
        wrong_field(),
        missing_field(),
        unknown_kind(),
        scalars,
        st.dictionaries(st.text(max_size=8), scalars, max_size=4),
        st.lists(scalars, max_size=3),
    )


def dumps(value: Any) -> bytes:
    """JSON text of ``value`` (the standard library's: integers of any size)."""
    return json.dumps(value, separators=(",", ":")).encode()


def _orjson_safe(value: Any) -> bool:
    try:
        return orjson.loads(orjson.dumps(value)) == value
    except (TypeError, orjson.JSONDecodeError):
        return False


@st.composite
def not_json(draw: st.DrawFn) -> bytes:
    """Bytes that are not JSON: random binary, truncated events, invalid UTF-8."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        raw = draw(st.binary(max_size=64))
    elif choice == 1:
        full = dumps(draw(st.sampled_from(list(TEMPLATES.values()))))
        raw = full[: draw(st.integers(0, len(full) - 1))]
    elif choice == 2:  # a valid event with invalid UTF-8 inside a string
        full = dumps(draw(st.sampled_from(list(TEMPLATES.values()))))
        at = full.index(b'"m"') + 1
        raw = full[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"])) + full[at:]
    else:
        raw = draw(st.sampled_from([b"", b" ", b"{", b"[", b"[1,", b"nul", b'{"v":1,}']))
    return raw


def malformed(max_message_bytes: int) -> st.SearchStrategy[Malformed]:
    """One malformed example; oversize and mixed batches are rarer (size, carriers)."""
    whole_bad = st.one_of(
        bad_event()
        .filter(lambda v: not isinstance(v, list))
        .map(lambda v: Malformed("bad_event", raw=dumps(v))),
        st.lists(bad_event(), min_size=1, max_size=4).map(
            lambda vs: Malformed("bad_batch", raw=dumps(vs))
        ),
        not_json().map(lambda b: Malformed("not_json", raw=b)),
    )
    oversize = st.builds(
        lambda base, extra: Malformed(
            "oversize", raw=dumps(base | {"pad": " " * (max_message_bytes + extra)})
        ),
        st.sampled_from(list(TEMPLATES.values())),
        st.integers(0, 4096),
    )
    # Elements of a mixed batch must keep the batch valid JSON for orjson (the worker's
    # parser), or the good events beside them would be rejected with them.
    mixed = st.lists(bad_event().filter(_orjson_safe), min_size=1, max_size=3).flatmap(
        lambda items: st.lists(st.integers(0, 40), min_size=len(items), max_size=len(items)).map(
            lambda pos: Malformed(
                "mixed_batch", bad_items=tuple(items), positions=tuple(sorted(pos))
            )
        )
    )
    return st.integers(0, 99).flatmap(
        lambda i: oversize if i == 0 else mixed if i <= 2 else whole_bad
    )


def generate(n: int, max_message_bytes: int) -> list[Malformed]:
    """``n`` examples, the same on every run (derandomized, no example database)."""
    out: list[Malformed] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(malformed(max_message_bytes))
    def collect(m: Malformed) -> None:
        out.append(m)

    collect()
    return out
