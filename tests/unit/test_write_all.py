"""store.write_all: every piece, in order, whatever the count and the kernel's short writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.adapters import store as st


def _pieces(n: int) -> list[bytes]:
    return [b"%d;" % i * (1 + i % 7) for i in range(n)]


def _written(path: Path, pieces: list[bytes]) -> bytes:
    """What write_all leaves in a new file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        st.write_all(fd, pieces)
    finally:
        os.close(fd)
    return path.read_bytes()


@pytest.mark.parametrize(
    "n", [0, 1, 2, st._IOV_MAX - 1, st._IOV_MAX, st._IOV_MAX + 1, 3 * st._IOV_MAX + 5]
)
def test_every_piece_in_order(tmp_path: Path, n: int) -> None:
    pieces = _pieces(n)
    assert _written(tmp_path / "f", pieces) == b"".join(pieces)


@pytest.mark.parametrize("cut", [0, 1, 17, 1000])
def test_a_short_write_is_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    """writev may write less than asked: the rest follows, nothing twice."""
    real = os.writev
    calls: list[int] = []

    def short(fd: int, bufs: list[bytes]) -> int:
        data = b"".join(bufs)
        calls.append(len(data))
        return os.write(fd, data[: min(cut, len(data))]) if cut < len(data) else real(fd, bufs)

    monkeypatch.setattr(os, "writev", short)
    pieces = _pieces(2 * st._IOV_MAX + 3)
    assert _written(tmp_path / "f", pieces) == b"".join(pieces)
    assert len(calls) == 3  # one writev per IOV_MAX pieces
