"""What a request is measured at and bucketed by: names every wire and row format shares.

``BOUNDARIES`` are the latency boundaries of a request record (the columns of the
``requests`` table, the ``boundary`` of a window row, the keys of a window summary's
sketches, an SLO's ``boundary``); ``CTX_BUCKETS`` the context-length buckets that
windows, SLO matchers and the ``ctx_bucket`` column use.
"""

from __future__ import annotations

from typing import Final

BOUNDARIES: Final = (
    "gateway_total_ms",
    "gateway_ttfb_ms",
    "engine_e2e_ms",
    "queue_ms",
    "prefill_ms",
    "decode_ms",
    "inference_ms",
    "ttft_engine_ms",
    "tpot_ms",
    "gateway_overhead_ms",
)

# The boundaries whose span includes the engine queue: a burn on one of them can be
# load-caused (the bad requests' queue time says how much); a burn on any other
# (prefill, decode, tpot, ...) is compute- or length-caused by construction.
QUEUE_BOUNDARIES: Final = frozenset(
    {"gateway_total_ms", "gateway_ttfb_ms", "engine_e2e_ms", "queue_ms", "ttft_engine_ms"}
)

CTX_BUCKETS: Final = ("<512", "512-4k", "4k-8k", "8k-16k", ">16k", "unknown")


def ctx_bucket(prompt_tokens: int | None) -> str:
    """Context-length bucket: <512 (fast lane), 512-4k, 4k-8k, 8k-16k (long), >16k (async)."""
    if prompt_tokens is None:
        return "unknown"
    if prompt_tokens < 512:
        return "<512"
    if prompt_tokens < 4096:
        return "512-4k"
    if prompt_tokens < 8192:
        return "4k-8k"
    if prompt_tokens <= 16384:
        return "8k-16k"
    return ">16k"
