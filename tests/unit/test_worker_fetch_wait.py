"""The worker's Kafka consumer waits for fetches as long as its settings say, not Faust's
fixed 1500 ms (which delivered the lifecycle input in chunks up to 1.5 s apart)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.adapters.faust_wiring import build_app
from pipeline.settings import Settings


def _consumer_of(settings: Settings) -> Any:
    """The aiokafka consumer the worker's Faust app builds (not started)."""
    app, _ = build_app(settings)

    async def create() -> Any:
        thread = app.consumer._new_consumer_thread()  # type: ignore[attr-defined]
        return thread._create_worker_consumer(app.transport)

    return asyncio.run(create())


@pytest.mark.parametrize("wait_ms", [1, 50, 1500])
def test_the_worker_consumer_fetch_wait_follows_the_settings(wait_ms: int) -> None:
    consumer = _consumer_of(Settings(fetch_max_wait_ms=wait_ms))
    assert consumer._fetch_max_wait_ms == wait_ms  # what its fetcher is started with


def test_the_default_fetch_wait_is_short() -> None:
    assert Settings().fetch_max_wait_ms <= 100


@pytest.mark.parametrize("bad", [0, -1, 60_001])
def test_a_fetch_wait_out_of_range_fails_at_start_up(bad: int) -> None:
    with pytest.raises(ValueError, match="fetch_max_wait_ms"):
        Settings(fetch_max_wait_ms=bad)


@pytest.mark.parametrize("fetch_bytes", [65_536, 4_194_304, 16_777_216])
def test_the_worker_consumer_partition_fetch_size_follows_the_settings(fetch_bytes: int) -> None:
    consumer = _consumer_of(Settings(fetch_max_partition_bytes=fetch_bytes))
    assert consumer._max_partition_fetch_bytes == fetch_bytes  # what its fetcher is given


@pytest.mark.parametrize("bad", [0, 65_535, 268_435_457])
def test_a_partition_fetch_size_out_of_range_fails_at_start_up(bad: int) -> None:
    with pytest.raises(ValueError, match="fetch_max_partition_bytes"):
        Settings(fetch_max_partition_bytes=bad)
