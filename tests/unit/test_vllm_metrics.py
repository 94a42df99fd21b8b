# ruff: noqa: E501  (exposition lines are as long as vLLM writes them)
"""vLLM's own /metrics -> engine.stats (producers.vllm_metrics), table-driven on exposition
texts in vLLM's names, types, labels and HELP strings (V1 engine: vllm/v1/metrics/
loggers.py; prometheus_client's text format 0.0.4 with its ``_created`` samples), and the
scraper's round over fake endpoints."""

from __future__ import annotations

import pytest

from pipeline.contract.events import EngineStats
from producers.vllm_metrics import (
    EngineGauges,
    ExpositionError,
    ScrapeStats,
    parse_exposition,
)
from producers.vllm_scrape import VllmScraper, default_host

# vLLM >= 0.11, V1 engine, one engine: what `curl engine:8000/metrics` shows (abridged:
# process_* and most histograms left out; one histogram kept, it must be skipped).
V1 = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 48.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 17.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.8125
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 200000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 1.7650e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 50000.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 3.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen2.5-7B-Instruct"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen2.5-7B-Instruct"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 1.5
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="8192"} 1.0
"""

# vLLM 0.9 / 0.10: the deprecated names beside the new ones (the new ones win).
V010_BOTH = V1.replace(
    "# HELP vllm:kv_cache_usage_perc",
    "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage."
    "DEPRECATED: Use vllm:kv_cache_usage_perc instead.\n"
    "# TYPE vllm:gpu_cache_usage_perc gauge\n"
    'vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.5\n'
    "# HELP vllm:kv_cache_usage_perc",
)

# Data parallel: two engines behind one API server (label engine="0", "1").
DP2 = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 8.0
vllm:num_requests_running{engine="1",model_name="llama"} 6.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 0.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.1
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.2
"""

# The V0 engine (before 0.10): no engine label, gpu_cache_usage_perc, swapped requests.
V0 = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama-2-7b"} 2.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="llama-2-7b"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama-2-7b"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama-2-7b"} 0.25
"""

# Escapes in a label value, a timestamp after the value, OpenMetrics' # EOF.
ODD = """\
vllm:num_requests_running{model_name="a \\"quoted\\" \\\\ name}",engine="0"} 1 1765000000000
vllm:num_requests_waiting{model_name="a \\"quoted\\" \\\\ name}",engine="0"} 2e0
vllm:kv_cache_usage_perc{model_name="a \\"quoted\\" \\\\ name}",engine="0"} NaN
# EOF
"""

Q = "Qwen/Qwen2.5-7B-Instruct"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (V1, [EngineGauges(Q, "0", 48, 17, 0.8125, 200_000, 50_000, 3)]),
        (V010_BOTH, [EngineGauges(Q, "0", 48, 17, 0.8125, 200_000, 50_000, 3)]),
        (
            DP2,
            [
                EngineGauges("llama", "0", 8, 0, 0.1, None, None, None),
                EngineGauges("llama", "1", 6, 4, 0.2, None, None, None),
            ],
        ),
        (V0, [EngineGauges("llama-2-7b", "0", 2, 1, 0.25, None, None, None)]),
    ],
    ids=["v1", "v0.10-both-names", "data-parallel", "v0-engine"],
)
def test_parse_exposition(text: str, want: list[EngineGauges]) -> None:
    assert parse_exposition(text) == want


def test_escapes_timestamps_and_nan() -> None:
    (g,) = parse_exposition(ODD)
    assert g.model == 'a "quoted" \\ name}'
    assert (g.num_running, g.num_waiting) == (1, 2)
    assert g.kv_cache_usage is not None
    (ev,) = ScrapeStats("h").events([g], 1)
    assert ev.kv_cache_usage == 0.0  # NaN: unknown, sent as 0 as the plugin does


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# TYPE up gauge\nup 1\n",  # another exporter
        "<html>404</html>\n",  # not exposition at all
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n',  # no waiting
        'vllm:num_requests_running{engine="0" 1.0\nvllm:num_requests_waiting{engine=0} 1\n',
        "vllm:num_requests_running 1.0\nvllm:num_requests_waiting one\n",
    ],
    ids=["empty", "not-vllm", "html", "half", "bad-labels", "bad-value"],
)
def test_what_is_not_vllm_is_refused(text: str) -> None:
    with pytest.raises(ExpositionError):
        parse_exposition(text)


def _g(queries: float | None, hits: float | None, preempt: float | None = None) -> EngineGauges:
    return EngineGauges("m", "0", 4, 2, 0.5, queries, hits, preempt)


@pytest.mark.parametrize(
    ("scrapes", "want_rates", "want_preempted"),
    [
        # first scrape: no rate (nothing to take a difference from)
        ([_g(100, 50)], [None], [None]),
        ([_g(100, 50), _g(300, 150)], [None, 0.5], [None, None]),
        # no new lookups: unknown, not 0
        ([_g(100, 50), _g(100, 50)], [None, None], [None, None]),
        # a restarted engine (counters reset): unknown, then from the new base
        ([_g(100, 50), _g(10, 1), _g(20, 11)], [None, None, 1.0], [None] * 3),
        # an engine without the counters
        ([_g(None, None), _g(None, None)], [None, None], [None, None]),
        # preemptions since the previous scrape; a reset (5 -> 1) is unknown, not 0
        ([_g(0, 0, 2), _g(0, 0, 5), _g(0, 0, 1), _g(0, 0, 4), _g(0, 0, 4)], [None] * 5,
         [None, 3, None, 3, 0]),
        # the counter appears later (an engine upgraded in place): from its first value
        ([_g(0, 0), _g(0, 0, 7), _g(0, 0, 9)], [None] * 3, [None, None, 2]),
    ],
    ids=["first", "half", "idle", "reset", "absent", "preemptions", "late-counter"],
)  # fmt: skip
def test_scrapes_to_events(
    scrapes: list[EngineGauges],
    want_rates: list[float | None],
    want_preempted: list[int | None],
) -> None:
    conv = ScrapeStats("engine-1:8000")
    rates, preempted = [], []
    for i, g in enumerate(scrapes):
        (ev,) = conv.events([g], 1_000 + i)
        assert isinstance(ev, EngineStats)
        assert (ev.kind, ev.host, ev.model, ev.ts_unix_ns) == (
            "engine.stats", "engine-1:8000", "m", 1_000 + i,
        )  # fmt: skip
        assert (ev.num_running, ev.num_waiting, ev.kv_cache_usage) == (4, 2, 0.5)
        assert ev.gpu_memory_used_fraction is None
        rates.append(ev.prefix_cache_hit_rate)
        preempted.append(ev.preemptions)
    assert rates == want_rates
    assert preempted == want_preempted
    assert conv.preemptions == sum(n or 0 for n in want_preempted)


def test_engines_of_one_endpoint_are_hosts_of_their_own() -> None:
    conv = ScrapeStats("node-7", model="served-name")
    events = conv.events(parse_exposition(DP2), 5)
    assert [(e.host, e.model, e.num_waiting) for e in events] == [
        ("node-7/0", "served-name", 0),
        ("node-7/1", "served-name", 4),
    ]
    assert len({e.event_id for e in events}) == 2


class _Sink:
    def __init__(self) -> None:
        self.events: list[EngineStats] = []

    def emit(self, event: EngineStats) -> None:  # type: ignore[override]
        self.events.append(event)

    def flush(self, timeout_s: float = 10.0) -> int:
        return 0

    def close(self) -> None:
        pass


def test_a_failing_endpoint_is_counted_and_the_others_go_on() -> None:
    pages = {"http://a:8000/metrics": V1, "http://b:8000/metrics": "<html>502</html>"}
    sink = _Sink()
    scraper = VllmScraper(list(pages), sink, get=pages.__getitem__, wall_ns=lambda: 42)
    assert scraper.scrape_once() == 1
    assert scraper.scrape_once() == 1
    (a, b) = scraper.endpoints
    assert (a.failures, b.failures, b.scrapes) == (0, 2, 2)
    assert [e.host for e in sink.events] == ["a:8000", "a:8000"]
    assert default_host("http://engine-1:8000/metrics") == "engine-1:8000"
    with pytest.raises(ValueError, match="one host name per --url"):
        VllmScraper(list(pages), sink, hosts=["x"], get=pages.__getitem__)
