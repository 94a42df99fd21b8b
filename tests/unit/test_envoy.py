"""Envoy JSON access-log lines -> gateway events (table-driven), and the shipped config."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import yaml

from producers.envoy import JSON_FORMAT, LineError, ingest, parse_line
from tests.gateway_fixtures import MemorySink
from tests.paths import REPO as ROOT

BASE: dict[str, Any] = {
    "request_id": "req-1",
    "start_time": "1700000000.250000",
    "total_us": 812345,
    "ttfb_us": 120500,
    "duration_ms": 812,
    "response_duration_ms": 119,
    "response_code": 200,
    "response_flags": "-",
    "model": "llama-3-8b",
    "priority": "1",
    "tenant": "acme",
    "stream": "true",
    "bytes_sent": 1234,
    "hostname": "envoy-7",
    "retry_count": "-",
    "idempotency_key": "-",
    "client_request_id": "-",
}


def line(**over: Any) -> bytes:
    doc = {**BASE, **over}
    return orjson.dumps({k: v for k, v in doc.items() if v is not ...})


def test_a_complete_line_becomes_both_events() -> None:
    rec, done = parse_line(line(), host="envoy", default_model="d")
    assert rec.kind == "gateway.received"
    assert done.kind == "gateway.completed"
    assert rec.ts_unix_ns == 1_700_000_000_250_000_000
    assert (rec.request_id, rec.model, rec.priority, rec.tenant, rec.stream, rec.host) == (
        "req-1",
        "llama-3-8b",
        1,
        "acme",
        True,
        "envoy-7",
    )
    assert done.total_ms == pytest.approx(812.345)
    assert done.ttfb_ms == pytest.approx(120.5)
    assert (done.http_status, done.outcome) == (200, "ok")
    assert done.ts_unix_ns == rec.ts_unix_ns + 812_345_000


@pytest.mark.parametrize(
    ("over", "status", "outcome"),
    [
        ({"response_code": 0}, 0, "client_abort"),
        ({"response_code": 200, "response_flags": "DC"}, 0, "client_abort"),
        ({"response_code": 503, "response_flags": "UF,DC"}, 0, "client_abort"),
        ({"response_code": 504, "response_flags": "UT"}, 504, "timeout"),
        ({"response_code": 408}, 408, "timeout"),
        ({"response_code": 429}, 429, "rejected"),
        ({"response_code": 503, "response_flags": "UH"}, 503, "error"),
        ({"response_code": "404"}, 404, "error"),
        ({"response_code": 302}, 302, "ok"),
    ],
)
def test_outcomes(over: dict[str, Any], status: int, outcome: str) -> None:
    _rec, done = parse_line(line(**over), host="e", default_model="d")
    assert (done.http_status, done.outcome) == (status, outcome)


def test_older_envoy_fields_are_the_fallback() -> None:
    _rec, done = parse_line(line(total_us=..., ttfb_us=...), host="e", default_model="d")
    assert (done.total_ms, done.ttfb_ms) == (812.0, 119.0)


def test_missing_optional_headers_take_defaults() -> None:
    rec, done = parse_line(
        line(
            model="-",
            priority=None,
            tenant="-",
            stream="-",
            hostname=...,
            ttfb_us="-",
            response_duration_ms="-",
        ),
        host="envoy-x",
        default_model="fallback-model",
    )
    assert (rec.model, rec.priority, rec.tenant, rec.stream, rec.host) == (
        "fallback-model",
        2,  # untagged: the default tier (issue 16), not 0 (gold)
        None,
        False,
        "envoy-x",
    )
    assert done.ttfb_ms is None
    assert done.model == "fallback-model"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (line(request_id="-"), "request_id"),
        (line(request_id="has space"), "request_id"),
        (line(start_time=None), "start_time"),
        (line(total_us=..., duration_ms=...), "total_us/duration_ms"),
        (line(total_us=-5), "total_us/duration_ms"),
        (line(total_us="abc"), "total_us: not a number"),
        (line(response_code=True), "response_code: not a number"),
        (line(ttfb_us=-1), "ttfb"),
    ],
)
def test_bad_lines_raise_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(LineError, match=reason.split(":", maxsplit=1)[0]) as err:
        parse_line(raw, host="e", default_model="d")
    assert str(err.value).startswith(reason)


def test_event_ids_are_stable_so_reingesting_is_idempotent() -> None:
    a = parse_line(line(), host="e", default_model="d")
    b = parse_line(line(), host="e", default_model="d")
    c = parse_line(line(start_time="1700000001.0"), host="e", default_model="d")
    assert [e.event_id for e in a] == [e.event_id for e in b]
    assert a[0].event_id != a[1].event_id
    assert a[0].event_id != c[0].event_id


def test_ingest_counts_and_dead_letters_and_keeps_going() -> None:
    sink = MemorySink()
    dead: list[tuple[bytes, str, int]] = []
    lines = [line(), b"", b"garbage\n", line(request_id="r2", response_code=0)]
    stats = ingest(lines, sink, dead=lambda raw, why, n: dead.append((raw, why, n)))
    assert stats.to_json() == {
        "lines": 3,
        "requests": 2,
        "dead": 1,
        "reasons": {"not JSON": 1},
        "outcomes": {"ok": 1, "client_abort": 1},
    }
    assert [(raw, n) for raw, _why, n in dead] == [(b"garbage", 3)]
    assert len(sink.events) == 4


def test_shipped_envoy_config_logs_exactly_the_fields_we_parse() -> None:
    doc = yaml.safe_load((ROOT / "producers" / "envoy-access-log.yaml").read_text())
    fmt = doc["access_log"][0]["typed_config"]["log_format"]["json_format"]
    assert fmt == JSON_FORMAT
    assert set(JSON_FORMAT) == set(BASE)


def test_default_priority_is_configurable() -> None:
    rec, _ = parse_line(line(priority=None), host="e", default_model="m", default_priority=3)
    assert rec.priority == 3
    rec, _ = parse_line(line(priority="0"), host="e", default_model="m", default_priority=3)
    assert rec.priority == 0
