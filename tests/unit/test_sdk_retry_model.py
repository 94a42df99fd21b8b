"""The simulated clients retry as the OpenAI Python SDK 2.x does (producers/simulator/
model.py: sdk_retry_delay_ms), a table from openai 2.54.0's _base_client.py."""

from __future__ import annotations

from typing import Any

import pytest

from producers.simulator.model import SimConfig, sdk_retry_delay_ms

CFG = SimConfig(start_unix_ns=1)

SDK = [
    # (id, retries taken, status, Retry-After s, x-should-retry, u, want wait ms | None)
    ("429-honours-retry-after", 0, 429, 30, None, 0.9, 30_000.0),
    ("503-honours-retry-after", 1, 503, 7, None, 0.0, 7_000.0),
    ("retry-after-120-still-honoured", 0, 429, 120, None, 0.5, 120_000.0),
    ("retry-after-over-120-no-retry", 0, 429, 121, None, 0.5, None),
    ("over-120-beats-should-retry-true", 0, 429, 121, True, 0.5, None),
    ("should-retry-false-stops", 0, 429, 5, False, 0.5, None),
    ("should-retry-true-any-status", 0, 400, 5, True, 0.5, 5_000.0),
    ("400-not-retried", 0, 400, None, None, 0.5, None),
    ("408-retried", 0, 408, None, None, 0.0, 500.0),
    ("409-retried", 0, 409, None, None, 0.0, 500.0),
    ("two-retries-at-most", 2, 429, 5, None, 0.5, None),
    ("no-retry-after-backoff-0", 0, 429, None, None, 0.0, 500.0),
    ("backoff-doubles", 1, 500, None, None, 0.0, 1_000.0),
    ("backoff-jitter-takes-up-to-a-quarter", 1, 500, None, None, 1.0, 750.0),
    ("retry-after-0-is-backoff", 0, 429, 0, None, 0.5, 437.5),
]


@pytest.mark.parametrize("case", [c[1:] for c in SDK], ids=[c[0] for c in SDK])
def test_retries_as_the_openai_sdk(case: tuple[Any, ...]) -> None:
    taken, status, retry_after, should, u, want = case
    got = sdk_retry_delay_ms(CFG, retries_taken=taken, http_status=status,
                             retry_after_s=retry_after, should_retry=should, u=u)  # fmt: skip
    assert got == (None if want is None else pytest.approx(want))


def test_backoff_is_capped_at_8_s_when_more_retries_are_allowed() -> None:
    cfg = SimConfig(start_unix_ns=1, client_max_retries=10)
    got = [sdk_retry_delay_ms(cfg, retries_taken=n, http_status=503, retry_after_s=None,
                              should_retry=None, u=0.0) for n in range(6)]  # fmt: skip
    assert got == [500.0, 1_000.0, 2_000.0, 4_000.0, 8_000.0, 8_000.0]


def test_defaults_are_the_sdks() -> None:
    assert (CFG.client_max_retries, CFG.client_backoff_ms, CFG.client_max_backoff_ms,
            CFG.client_max_retry_after_ms) == (2, 500.0, 8_000.0, 120_000.0)  # fmt: skip
    with pytest.raises(ValueError, match="client_max_backoff_ms"):
        SimConfig(start_unix_ns=1, client_max_backoff_ms=float("nan"))
