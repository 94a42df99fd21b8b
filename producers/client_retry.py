"""What a request's headers say about the client's retries (issue 47): one parser for
every gateway (the ASGI middleware, the reference proxy, the LiteLLM hook) and the
simulator's clients, so a retry is recognised the same way everywhere.

Pure: a header getter in, plain values out.

The headers are the SDKs' own:

* ``x-stainless-retry-count``: the OpenAI (and Anthropic, and every Stainless-generated)
  SDK sends the number of retries already taken on every attempt (0 on the first).
* ``idempotency-key``: sent by SDKs that have one (Anthropic's, Stripe-style clients;
  OpenAI's Python SDK 2.x generates ``stainless-python-retry-<uuid>`` but sends no
  idempotency header for OpenAI), and by clients that set it themselves; the same on
  every attempt of one logical request.
* ``x-client-request-id``: a client-chosen id of the logical request (OpenAI's API
  documents it), the same on every attempt.

A response may carry ``x-should-retry: false``: the OpenAI/Stainless SDKs then do not
retry (``_should_retry`` obeys it before looking at the status). Those SDKs also give up
when ``Retry-After`` exceeds two minutes (``MAX_RETRY_AFTER_DELAY``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

RETRY_COUNT_HEADER: Final = "x-stainless-retry-count"
IDEMPOTENCY_KEY_HEADER: Final = "idempotency-key"
CLIENT_REQUEST_ID_HEADER: Final = "x-client-request-id"
SHOULD_RETRY_HEADER: Final = "x-should-retry"
MAX_ATTEMPT: Final = 1_000  # a retry count above this is taken as this (a bad header)
MAX_LOGICAL_ID_CHARS: Final = 256


@dataclass(frozen=True, slots=True)
class ClientAttempt:
    """``attempt``: 0 = the first try (or unknown), k = the client's k-th retry;
    ``logical_id``: the id shared by every attempt of one logical request, if the
    client sent one."""

    attempt: int = 0
    logical_id: str | None = None

    @property
    def is_retry(self) -> bool:
        return self.attempt > 0


FIRST_ATTEMPT: Final = ClientAttempt()


def client_attempt(header: Callable[[str], str | None]) -> ClientAttempt:
    """Read the attempt from ``header(lowercase name) -> value | None``. A malformed
    retry count is 0 (a first attempt: never refuse on a header we cannot read)."""
    raw = header(RETRY_COUNT_HEADER)
    attempt = 0
    if raw is not None:
        text = raw.strip()
        if text.isdigit():
            attempt = min(int(text), MAX_ATTEMPT)
    logical = header(IDEMPOTENCY_KEY_HEADER) or header(CLIENT_REQUEST_ID_HEADER)
    if logical is not None:
        logical = logical.strip()[:MAX_LOGICAL_ID_CHARS] or None
    if attempt == 0 and logical is None:
        return FIRST_ATTEMPT
    return ClientAttempt(attempt=attempt, logical_id=logical)


# A retry's request id when the gateway adopts the client's X-Request-Id (issue 47): a
# client that reuses its id on a retry would make two attempts share one request id (the
# engine would be sent the same id twice, and the join could not tell the retry's engine
# event from the first try's), so the k-th retry's id is ``<the client's id>~retry<k>``
# (at most 128 + 10 characters: the contract's request_id allows 256).
RETRY_ID_SUFFIX: Final = "~retry"


def attempt_request_id(client_request_id: str, attempt: ClientAttempt) -> str:
    """The request id of an attempt whose gateway adopted the client's ``X-Request-Id``:
    the client's id on a first try, ``<id>~retry<k>`` on its k-th retry."""
    if attempt.attempt == 0:
        return client_request_id
    return f"{client_request_id}{RETRY_ID_SUFFIX}{attempt.attempt}"


def logical_request_id(attempt: ClientAttempt, client_request_id: str | None) -> str | None:
    """``gateway.received``'s ``logical_request_id``: the client's own (``Idempotency-Key``,
    else ``x-client-request-id``); else, on a retry, the ``X-Request-Id`` it reused (its
    retries' request ids are suffixed: :func:`attempt_request_id`); else None. A first try
    without one is its own logical request, keyed by its request id, which is then the
    client's id its retries name (pipeline/core/logical.py)."""
    if attempt.logical_id is not None:
        return attempt.logical_id
    if attempt.attempt > 0 and client_request_id is not None:
        return client_request_id
    return None
