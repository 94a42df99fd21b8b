"""Unit tests of the trace shapes (producers.simulator.trace) and tools/dev/make_trace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from producers.simulator.trace import (
    TraceRequest,
    burst_shape,
    code_shape,
    format_timestamp_ns,
    parse_timestamp_ns,
    rate_shape,
    read_trace,
    write_trace,
)
from tests.paths import SHARED_TRACE
from tools.dev import make_trace

START_NS = 1_700_158_546_680_590_000


@pytest.fixture(scope="module")
def shared_trace() -> list[TraceRequest]:
    return read_trace(SHARED_TRACE)


SHAPES: dict[str, Callable[[list[TraceRequest], int], list[TraceRequest]]] = {
    "code": lambda t, seed: code_shape(t, seed=seed),
    "rate3": lambda t, _seed: rate_shape(t, times=3),
    "burst": lambda t, seed: burst_shape(t, seed=seed),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_shapes_are_pure_and_deterministic(shape: str, shared_trace: list[TraceRequest]) -> None:
    before = list(shared_trace)
    a = SHAPES[shape](shared_trace, 7)
    assert shared_trace == before  # the input is left alone
    assert a == SHAPES[shape](shared_trace, 7)
    offsets = [t.arrival_offset_ms for t in a]
    assert offsets == sorted(offsets)
    if shape != "rate3":  # rate3 draws nothing
        assert a != SHAPES[shape](shared_trace, 8)


@pytest.mark.parametrize(
    ("context", "generated", "want_context", "want_generated"),
    [
        (100, 80, 400, {10}),
        (3_999, 800, 15_996, {100}),
        (4_000, 8, 16_000, {1}),
        (12_000, 8, 16_000, {1}),  # capped
        (10, 0, 40, {1}),  # at least 1
        (10, 7, 40, {1}),  # 0.875 rounds to 0 or 1: at least 1
        (10, 12, 40, {1, 2}),  # 1.5: 1 or 2 with even odds
    ],
)
def test_code_shape_per_request(
    context: int, generated: int, want_context: int, want_generated: set[int]
) -> None:
    rows = [TraceRequest(float(i), context, generated) for i in range(200)]
    got = code_shape(rows)
    assert [r.arrival_offset_ms for r in got] == [r.arrival_offset_ms for r in rows]
    assert {r.context_tokens for r in got} == {want_context}
    assert {r.generated_tokens for r in got} == want_generated


def test_code_shape_keeps_the_mean_output_over_8(shared_trace: list[TraceRequest]) -> None:
    got = code_shape(shared_trace)
    mean_in = sum(t.generated_tokens for t in shared_trace) / len(shared_trace)
    mean_out = sum(t.generated_tokens for t in got) / len(got)
    assert mean_out == pytest.approx(mean_in / 8, rel=0.05)


def test_rate_shape_triples_the_rate_over_the_same_hour(
    shared_trace: list[TraceRequest],
) -> None:
    got = rate_shape(shared_trace, times=3)
    assert len(got) == 3 * len(shared_trace)
    span = shared_trace[-1].arrival_offset_ms
    assert got[0].arrival_offset_ms == 0.0
    assert got[-1].arrival_offset_ms <= span * 1.001  # the same hour
    # every 10-minute window carries about three times the trace's mean rate
    per_window = [0] * 6
    for t in got:
        per_window[min(5, int(t.arrival_offset_ms // (span / 6)))] += 1
    mean = len(shared_trace) / 6
    assert all(2.4 * mean < n < 3.6 * mean for n in per_window)
    # copy 0 is the trace itself
    assert set(shared_trace) <= set(got)


def test_rate_shape_small() -> None:
    rows = [TraceRequest(0.0, 1, 1), TraceRequest(300.0, 2, 2)]  # period 600 ms
    got = rate_shape(rows, times=3)
    assert [(r.arrival_offset_ms, r.context_tokens) for r in got] == [
        (0.0, 1),
        (100.0, 2),  # copy 2 of row 2 wraps: (300 + 400) % 600
        (200.0, 1),
        (300.0, 2),
        (400.0, 1),
        (500.0, 2),
    ]
    assert rate_shape([], times=3) == []
    with pytest.raises(ValueError, match="times"):
        rate_shape(rows, times=0)


@pytest.mark.parametrize(("factor", "lo", "hi"), [(5.0, 5.0, 5.0), (2.5, 2.3, 2.7), (1.0, 1, 1)])
def test_burst_shape_multiplies_the_window_only(
    shared_trace: list[TraceRequest], factor: float, lo: float, hi: float
) -> None:
    at_ms, dur_ms = 25 * 60_000.0, 60_000.0
    got = burst_shape(shared_trace, factor=factor)

    def inside(rows: list[TraceRequest]) -> int:
        return sum(1 for r in rows if at_ms <= r.arrival_offset_ms < at_ms + dur_ms)

    base = inside(shared_trace)
    assert base > 100
    assert lo * base <= inside(got) <= hi * base
    assert len(got) - len(shared_trace) == inside(got) - base  # nothing added outside


@pytest.mark.parametrize(
    "text",
    ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:46.0000000", "1970-01-01 00:00:01.0000001"],
)
def test_format_timestamp_inverts_parse(text: str) -> None:
    assert format_timestamp_ns(parse_timestamp_ns(text)) == text


def test_write_trace_round_trips(tmp_path: Path, shared_trace: list[TraceRequest]) -> None:
    path = tmp_path / "t.csv"
    head = shared_trace[:500]
    write_trace(path, head, START_NS)
    back = read_trace(path)
    assert [(r.context_tokens, r.generated_tokens) for r in back] == [
        (r.context_tokens, r.generated_tokens) for r in head
    ]
    pairs = zip(back, head, strict=True)
    assert all(abs(a.arrival_offset_ms - b.arrival_offset_ms) < 1e-4 for a, b in pairs)


@pytest.mark.parametrize("shape", ["code", "rate3", "burst"])
def test_make_trace_cli_writes_a_readable_trace(
    shape: str, tmp_path: Path, shared_trace: list[TraceRequest]
) -> None:
    out = tmp_path / f"{shape}.csv"
    assert make_trace.main(["--shape", shape, "--out", str(out), "--trace", str(SHARED_TRACE)]) == 0
    first_line = SHARED_TRACE.read_text().splitlines()[:2]
    lines = out.read_text().splitlines()
    assert lines[:1] == first_line[:1]  # the same header
    assert lines[1].split(",")[0] == first_line[1].split(",")[0]  # the same start
    back = read_trace(out)
    want = SHAPES[shape](shared_trace, 0)
    assert len(back) == len(want)
    assert [r.context_tokens for r in back] == [r.context_tokens for r in want]
    again = tmp_path / "again.csv"
    make_trace.main(["--shape", shape, "--out", str(again), "--trace", str(SHARED_TRACE)])
    assert again.read_bytes() == out.read_bytes()  # deterministic


def test_make_trace_cli_rejects_an_unknown_shape(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        make_trace.main(["--shape", "wave", "--out", str(tmp_path / "x.csv")])
