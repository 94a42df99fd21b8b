"""The SDKs' retry headers, read once for every gateway: producers/client_retry.py."""

from __future__ import annotations

import pytest

from producers.client_retry import FIRST_ATTEMPT, ClientAttempt, client_attempt

CASES = [
    # (id, headers, expected)
    ("none", {}, FIRST_ATTEMPT),
    ("openai-first-try", {"x-stainless-retry-count": "0"}, FIRST_ATTEMPT),
    ("openai-second-retry", {"x-stainless-retry-count": "2"}, ClientAttempt(2, None)),
    ("padded", {"x-stainless-retry-count": " 1 "}, ClientAttempt(1, None)),
    ("malformed-is-first", {"x-stainless-retry-count": "-1"}, FIRST_ATTEMPT),
    ("not-a-number", {"x-stainless-retry-count": "two"}, FIRST_ATTEMPT),
    ("huge-is-clamped", {"x-stainless-retry-count": "99999"}, ClientAttempt(1000, None)),
    ("idempotency-key", {"idempotency-key": "k1"}, ClientAttempt(0, "k1")),
    (
        "idempotency-key-wins",
        {"idempotency-key": "k1", "x-client-request-id": "c1", "x-stainless-retry-count": "1"},
        ClientAttempt(1, "k1"),
    ),
    ("client-request-id", {"x-client-request-id": "c1"}, ClientAttempt(0, "c1")),
    ("blank-id", {"x-client-request-id": "  "}, FIRST_ATTEMPT),
    ("long-id-cut", {"idempotency-key": "x" * 300}, ClientAttempt(0, "x" * 256)),
]


@pytest.mark.parametrize(("headers", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_client_attempt(headers: dict[str, str], want: ClientAttempt) -> None:
    got = client_attempt(headers.get)
    assert got == want
    assert got.is_retry == (want.attempt > 0)
