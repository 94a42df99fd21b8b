"""Hypothesis strategies for SLO specs and request records (shared by the SLO and window
tests)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from msgspec.structs import replace  # records are msgspec Structs

from pipeline.core.record import RequestRecord, Source, build_record, ctx_bucket
from pipeline.spec.slo import SLOSpec
from tests.factories import completed, finished, received


def slo_data(**kw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "s",
        "boundary": "gateway_total_ms",
        "threshold_ms": 400,
        "objective": 0.99,
    }
    data.update(kw)
    return data


# total 100, ttfb 20; queue 10, prefill 8, decode 70 -> inference 78, e2e 88, ttft 18
JOINED = build_record(
    "r", received("r", priority=1, tenant="t1"), completed("r"), finished("r", prompt_tokens=100)
)


VALUES = st.none() | st.sampled_from([0.0, 100.0, 250.0, 400.0, 600.0]) | st.floats(0, 2000)
THRESHOLDS = [100.0, 250.0, 400.0, 600.0]
PROP_BOUNDARIES = [
    "gateway_total_ms",
    "gateway_ttfb_ms",
    "inference_ms",
    "queue_ms",
    "gateway_overhead_ms",
]


@st.composite
def records(draw: st.DrawFn, retries: bool = False) -> RequestRecord:
    """``retries``: some records are attempts of a retried request (superseded or not)."""
    sources: list[Source] = ["joined", "gateway_only", "engine_only"]
    source = draw(st.sampled_from(sources))
    gateway = source != "engine_only"
    engine = source != "gateway_only"

    def value(present: bool) -> float | None:
        return draw(VALUES) if present else None

    prompt = draw(st.none() | st.integers(0, 40_000))
    retry = (
        {"superseded": draw(st.booleans()), "attempt": draw(st.integers(1, 2))} if retries else {}
    )
    return replace(
        JOINED,
        **retry,
        source=source,
        outcome=draw(st.sampled_from(["ok", "ok", "error", "client_abort", "timeout", "rejected"])),
        model=draw(st.sampled_from(["m", "n"])),
        priority=draw(st.none() | st.integers(0, 3)),
        tenant=draw(st.sampled_from([None, "t1", "t2"])),
        stream=draw(st.sampled_from([None, True, False])),
        prompt_tokens=prompt,
        ctx_bucket=ctx_bucket(prompt),
        gateway_total_ms=value(gateway),
        gateway_ttfb_ms=value(gateway),
        inference_ms=value(engine),
        queue_ms=value(engine),
        gateway_overhead_ms=value(source == "joined"),
    )


@st.composite
def slo_dicts(draw: st.DrawFn, name: str) -> dict[str, Any]:
    filt: dict[str, Any] = {}
    if draw(st.booleans()):
        filt["model"] = draw(st.lists(st.sampled_from(["m", "n", "o"]), min_size=1, max_size=2))
    if draw(st.booleans()):
        filt["priority"] = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    if draw(st.booleans()):
        filt["tenant"] = draw(st.lists(st.sampled_from(["t1", "t2"]), min_size=1, max_size=2))
    if draw(st.booleans()):
        filt["ctx_bucket"] = draw(
            st.lists(st.sampled_from(["<512", "512-4k", ">16k", "unknown"]), min_size=1)
        )
    if draw(st.booleans()):
        filt["stream"] = draw(st.booleans())
    data = slo_data(
        name=name,
        boundary=draw(st.sampled_from(PROP_BOUNDARIES)),
        threshold_ms=draw(st.sampled_from(THRESHOLDS)),
        errors=draw(st.sampled_from(["bad", "exclude"])),
        client_abort=draw(st.sampled_from(["measure", "exclude"])),
    )
    if draw(st.booleans()):
        data["threshold_strict"] = True  # good iff value < threshold (OpenSLO op: lt)
    if filt:
        data["filter"] = filt
    if draw(st.booleans()):
        data["exclude"] = {"prompt_tokens_over": draw(st.sampled_from([512, 16000]))}
    return data


@st.composite
def specs(draw: st.DrawFn, retries: bool = False) -> SLOSpec:
    """``retries``: SLOs may count only the last attempt of each request."""
    slos = [draw(slo_dicts(f"s{i}")) for i in range(draw(st.integers(2, 4)))]
    if retries:
        for data in slos:
            data["attempts"] = draw(st.sampled_from(["every", "last"]))
    weight = draw(st.sampled_from([0.0, 0.7, 1.0]))
    return spec_from(slos, weight)


def spec_from(slos: list[dict[str, Any]], weight: float) -> SLOSpec:
    return SLOSpec.model_validate(
        {
            "apiVersion": "tailguard/v1",
            "kind": "SLOSpec",
            "slos": slos,
            "tiers": {
                "blended": {
                    "primary": "s0",
                    "secondary": "s1",
                    "secondary_weight": weight,
                    "objective": 0.99,
                },
                "other": {
                    "primary": "s1",
                    "secondary": "s0",
                    "secondary_weight": weight,
                    "objective": 0.9,
                },
            },
        }
    )
