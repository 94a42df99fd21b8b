"""Every command's missing-input path: one line on stderr, a non-zero exit, nothing
created; a reader that goes away (``| head``) ends the command without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import REPO

pytestmark = pytest.mark.integration


def tg(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        check=False,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )


MISSING = [
    ("report", "--store", "nowhere"),
    ("report", "--store", "nowhere", "--json"),
    ("report", "--store", "nowhere", "--html", "out.html"),
    ("explain", "req-1", "--store", "nowhere"),
    ("explain", "req-1", "--store", "nowhere", "--json"),
    ("capacity", "--store", "nowhere"),
    ("sql", "SELECT 1", "--store", "nowhere"),
    ("replay", "missing.jsonl", "--store", "nowhere"),
    ("replay", "missing.jsonl", "--no-store"),
    ("replay", "events.jsonl", "--no-store", "--slo", "missing.yaml"),
    ("replay", "events.jsonl", "--no-store", "--policy", "missing.yaml"),
    ("validate", "missing.yaml"),
    ("validate", "."),
    ("simulate", "--trace", "missing.csv", "--out", "out.jsonl"),
    ("backtest", "--trace", "missing.csv"),
    ("backtest", "--slo", "missing.yaml", "--limit", "10"),
    ("envoy", "missing.log", "--out", "out.jsonl"),
    ("demo", "--trace", "missing.csv", "--workdir", "demo"),
]


@pytest.mark.parametrize("args", MISSING, ids=" ".join)
def test_missing_input_is_one_line_and_a_failure(args: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("")
    before = set(tmp_path.iterdir())
    p = tg(*args, cwd=tmp_path)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"tailguard {args[0]}: ")
    assert "Traceback" not in p.stderr
    assert any(word in lines[0] for word in ("missing", "nowhere", "Is a directory")), lines[0]
    assert set(tmp_path.iterdir()) == before  # no store, DLQ or output file left behind


@pytest.mark.parametrize("args", [("schema",), ("explain", "--help")])
def test_a_reader_that_goes_away_is_no_traceback(args: tuple[str, ...], tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # `| head` that read nothing: every write meets EPIPE
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    assert "BrokenPipeError" not in err, err
    assert proc.returncode != 0 or args[-1] == "--help"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--p99-ms", "-5"), "--p99-ms: must be > 0, got -5"),
        (("--p99-ms", "nan"), "--p99-ms: must be > 0, got nan"),
        (("--qps", "0"), "--qps: must be > 0, got 0"),
        (("--utilisation", "1.5"), "--utilisation: must be > 0 and <= 1, got 1.5"),
        (("--bucket-s", "0"), "--bucket-s: must be > 0, got 0"),
        (("--min-requests", "0"), "--min-requests: must be >= 1, got 0"),
    ],
)
def test_capacity_refuses_inputs_out_of_range(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    p = tg("capacity", "--store", "nowhere", *args, cwd=tmp_path)
    assert p.returncode == 2
    assert message in p.stderr
    assert "Traceback" not in p.stderr
