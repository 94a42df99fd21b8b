from __future__ import annotations

from pathlib import Path

import orjson

from pipeline.app.replay import replay_file
from pipeline.cli import main
from pipeline.contract.codec import encode_batch, encode_event
from pipeline.core.join import JoinConfig
from pipeline.core.processor import StreamProcessor
from tests.factories import completed, finished, received


def test_processor_tracks_offsets_per_partition_and_dead_letters() -> None:
    p = StreamProcessor("t", JoinConfig(timeout_ms=1000))
    out = p.process(
        [
            (0, 5, encode_batch([received("a"), completed("a")])),
            (1, 7, encode_event(received("b"))),
            (0, 6, b"garbage"),
            (0, 7, encode_event(finished("a"))),
        ],
        wall_ms=0,
    )
    assert [r.request_id for r in out.records] == ["a"]
    assert [(d.source.partition, d.source.offset) for d in out.dead] == [(0, 6)]
    # a is in an open window (offset 5); b still waits for its partner (offset 7)
    assert p.safe_offsets() == {0: 5, 1: 7}
    closed = p.tick(60_000).windows  # event time moves on while idle: a's window closes
    assert [(w.partition, w.records[("*", "*", "*")]) for w in closed] == [(0, 1)]
    assert p.safe_offsets() == {0: 8, 1: 7}
    p.revoke([1])
    assert p.safe_offsets() == {0: 8}


def test_idle_partition_times_out_on_wall_clock() -> None:
    p = StreamProcessor("t", JoinConfig(timeout_ms=1000))
    p.process([(0, 0, encode_event(completed("a")))], wall_ms=10_000)
    assert p.tick(10_500).records == []
    (rec,) = p.tick(11_001).records
    assert rec.source == "gateway_only"


def _write(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_replay_sends_malformed_lines_to_the_dlq_and_keeps_the_rest(tmp_path: Path) -> None:
    good = [
        encode_batch([received(f"r{i}"), finished(f"r{i}"), completed(f"r{i}")]) for i in range(50)
    ]
    bad = [b"{oops", b'{"v":1,"kind":"gateway.completed"}', b"[1,2,3]", b"null"]
    clean, dirty = tmp_path / "clean.jsonl", tmp_path / "dirty.jsonl"
    _write(clean, good)
    _write(dirty, good[:20] + bad + good[20:])
    dlq = tmp_path / "dlq.jsonl"
    with dlq.open("wb") as fh:
        res = replay_file(dirty, dlq_out=fh)
    ref = replay_file(clean)
    assert res.dead_letters == 1 + 1 + 3 + 1
    lines = [orjson.loads(x) for x in dlq.read_bytes().splitlines()]
    assert len(lines) == res.dead_letters
    assert all(x["reason"] and x["source"]["offset"] == 21 for x in lines[:1])
    assert res.summary()["boundaries"] == ref.summary()["boundaries"]
    assert res.summary()["requests"] == 50


def test_replay_cli_prints_json(tmp_path: Path, capsys: object) -> None:
    f = tmp_path / "e.jsonl"
    _write(
        f,
        [
            encode_batch([received("a"), completed("a", outcome="client_abort", http_status=0)]),
            b"bad",
        ],
    )
    assert main(["replay", str(f), "--json", "--no-store"]) == 0
    out = orjson.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert out["requests"] == 1
    assert out["dead_letters"] == 1
    assert out["outcomes"] == {"client_abort": 1}
    assert out["boundaries"]["gateway_total_ms"]["count"] == 1
    assert out["boundaries"]["queue_ms"]["count"] == 0


def test_worker_telemetry_reports_its_instruments() -> None:
    from pipeline.adapters.telemetry import WorkerTelemetry

    t = WorkerTelemetry("test", lag=lambda: 7, pending=lambda: 3)
    t.events.add(10)
    t.dead_letters.add(2)
    t.write_duration.record(12.5)
    snap = t.snapshot()
    assert snap["tailguard.events"] == 10
    assert snap["tailguard.dead_letters"] == 2
    assert snap["tailguard.consumer.lag"] == 7
    assert snap["tailguard.join.pending"] == 3
    assert snap["tailguard.clickhouse.write.duration"] == {"count": 1, "sum": 12.5}
    t.shutdown()
