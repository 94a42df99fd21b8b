"""``tailguard envoy --follow``: the tail -F reader (rotation, truncation, partial lines,
resuming from a saved position) and the command end to end (a real process, SIGTERM,
restart): every request once, bad lines in the DLQ file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from producers.envoy import Follower, Position, load_position, save_position
from tests.ceilings import ceiling
from tests.paths import REPO as ROOT


def line(rid: str) -> bytes:
    doc = {"request_id": rid, "start_time": "1767225600.250000", "total_us": 1500,
           "ttfb_us": 200, "response_code": 200, "response_flags": "-", "model": "m"}  # fmt: skip
    return orjson.dumps(doc) + b"\n"


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as fh:
        fh.write(data)


def _following(tmp_path: Path, first: list[bytes]) -> tuple[Path, Follower]:
    """``access.log`` holding ``first``, and a follower that has read those lines."""
    log = tmp_path / "access.log"
    append(log, b"".join(first))
    f = Follower(log)
    assert f.read_available() == first
    return log, f


def test_lines_partial_lines_and_position(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    f = Follower(log)
    assert f.read_available() == []  # no file yet: wait for it
    append(log, b"a\nb\npart")
    assert f.read_available() == [b"a\n", b"b\n"]
    assert f.read_available() == []  # "part" has no newline yet
    append(log, b"ial\n")
    assert f.read_available() == [b"partial\n"]
    pos = f.position()
    assert pos is not None
    assert pos.offset == len(b"a\nb\npartial\n")
    f.close()
    # resume: same file -> from the position
    append(log, b"c\n")
    g = Follower(log, pos)
    assert g.read_available() == [b"c\n"]
    g.close()


def test_rotation_reads_the_old_file_to_its_end_first(tmp_path: Path) -> None:
    log, f = _following(tmp_path, [b"1\n"])
    writer = log.open("ab")  # Envoy keeps writing to the renamed file until it reopens
    log.rename(tmp_path / "access.log.1")
    writer.write(b"2\n")
    writer.flush()
    append(log, b"3\n")  # the new file
    writer.write(b"4-late\n")  # after the new file appeared: still read, before "3"
    writer.close()
    assert f.read_available() == [b"2\n", b"4-late\n", b"3\n"]
    assert f.rotations == 1
    append(log, b"5\n")
    assert f.read_available() == [b"5\n"]
    f.close()


def test_rotation_with_no_new_file_yet(tmp_path: Path) -> None:
    log, f = _following(tmp_path, [b"1\n"])
    log.rename(tmp_path / "old")
    assert f.read_available() == []
    append(log, b"2\n")
    assert f.read_available() == [b"2\n"]
    f.close()


def test_truncation_starts_over(tmp_path: Path) -> None:
    log, f = _following(tmp_path, [b"one\n", b"two\n"])
    with log.open("r+b") as fh:  # copytruncate
        fh.truncate(0)
    append(log, b"3\n")
    assert f.read_available() == [b"3\n"]
    assert f.truncations == 1
    f.close()


def test_position_of_another_file_or_past_its_end_is_ignored(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    append(log, b"x\ny\n")
    st = os.stat(log)
    for pos in (Position(st.st_dev, st.st_ino + 1, 2), Position(st.st_dev, st.st_ino, 99)):
        f = Follower(log, pos)
        assert f.read_available() == [b"x\n", b"y\n"]
        f.close()
    saved = tmp_path / "pos"
    save_position(saved, Position(1, 2, 3))
    assert load_position(saved) == Position(1, 2, 3)
    saved.write_text("{broken")
    assert load_position(saved) is None


# --- the command --------------------------------------------------------------------------


def wait_until(fn: Any, what: str, timeout_s: float = 60.0) -> None:
    """Poll a file the follower writes (the only way to see its progress from outside)."""
    deadline = time.monotonic() + ceiling(timeout_s)
    while not fn():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def request_ids(out: Path) -> Counter[str]:
    ids: Counter[str] = Counter()
    if not out.exists():
        return ids
    for raw in out.read_bytes().splitlines():
        msg = orjson.loads(raw)
        for ev in msg if isinstance(msg, list) else [msg]:
            if ev["kind"] == "gateway.completed":
                ids[ev["request_id"]] += 1
    return ids


def start(log: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "envoy", str(log), "--follow", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def stop(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()
    stats: dict[str, Any] = orjson.loads(stdout.splitlines()[-1])
    return stats


def test_follow_survives_rotation_truncation_and_restart(tmp_path: Path) -> None:
    log, out = tmp_path / "access.log", tmp_path / "events.jsonl"
    append(log, line("r0") + line("r1") + b"not json\n")
    proc = start(log, out)
    try:
        wait_until(lambda: set(request_ids(out)) == {"r0", "r1"}, "r0, r1")
        writer = log.open("ab")
        log.rename(tmp_path / "access.log.1")  # rotation: Envoy writes on, then reopens
        writer.write(line("r2"))
        writer.close()
        append(log, line("r3"))
        wait_until(lambda: set(request_ids(out)) == {"r0", "r1", "r2", "r3"}, "after rotation")
    finally:
        first = stop(proc)
    assert first["requests"] == 4
    assert first["dead"] == 1
    # stopped: the log grows and is truncated (copytruncate) only after a restart read it
    append(log, line("r4"))
    proc = start(log, out)
    try:
        wait_until(lambda: "r4" in request_ids(out), "r4 after restart")
        with log.open("r+b") as fh:
            fh.truncate(0)
        append(log, line("r5"))
        wait_until(lambda: "r5" in request_ids(out), "r5 after truncation")
    finally:
        second = stop(proc)
    assert second["requests"] == 2  # r3 (already read before the stop) is not read again
    ids = request_ids(out)
    assert ids == Counter({f"r{i}": 1 for i in range(6)})  # no loss, no duplicate
    dlq = [orjson.loads(x) for x in (tmp_path / "events.jsonl.dlq.jsonl").read_bytes().splitlines()]
    assert [d["raw"] for d in dlq] == ["not json"]
    assert dlq[0]["reason"].startswith("not JSON")
    assert dlq[0]["source"].endswith("access.log:3")


def test_read_once_writes_the_dlq_file_with_out(tmp_path: Path) -> None:
    log, out = tmp_path / "access.log", tmp_path / "events.jsonl"
    append(log, line("a") + b"{}\n")
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "envoy", str(log), "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert set(request_ids(out)) == {"a"}
    (dead,) = (tmp_path / "events.jsonl.dlq.jsonl").read_bytes().splitlines()
    assert orjson.loads(dead)["reason"].startswith("request_id")
