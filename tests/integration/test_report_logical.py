"""Issue 47 on the real embedded engine: attempt chains replayed into a store (``tailguard
replay``) and ``tailguard report``'s per-logical-request figures (pipeline/core/logical.py
over the stored rows), equal to what the events say and to an exact SQL count over
``requests`` (one row per attempt, grouped by the logical key with ClickHouse's argMax).

Chains (one every 2 s): served after one retry on one gateway; never served (three
refusals, an idempotency key); refused on one gateway and served by another; a retry with
no logical id (two requests); one attempt served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.adapters.store import open_store
from pipeline.cli import main
from pipeline.contract.wire import from_model
from pipeline.core.join import JoinConfig, Joiner
from pipeline.settings import Settings
from tests.factories import T0_NS, completed, finished, received
from tests.measurement_fixtures import gathered, replay_events

pytestmark = pytest.mark.integration

N = 100  # chains, 20 of each kind
KINDS = ("retried", "never", "two_gateways", "no_logical_id", "single")


def _attempt(  # noqa: PLR0917
    rid: str, t: float, k: int, lid: str | None, ok: bool, host: str = "gw-0"
) -> list[Any]:
    rcv = received(rid, t).model_copy(
        update={"host": host, "client_attempt": k, "logical_request_id": lid}
    )
    if not ok:
        return [rcv, completed(rid, t + 3, total_ms=3.0, ttfb_ms=3.0, outcome="rejected",
                               http_status=429).model_copy(update={"host": host})]  # fmt: skip
    return [rcv, completed(rid, t + 100).model_copy(update={"host": host}), finished(rid, t + 98)]


def _chain(i: int) -> tuple[str, list[Any]]:
    kind, t = KINDS[i % 5], 2_000.0 * i
    if kind == "retried":
        return kind, [*_attempt(f"a{i}", t, 0, None, False),
                      *_attempt(f"a{i}~retry1", t + 900, 1, f"a{i}", True)]  # fmt: skip
    if kind == "never":
        return kind, [
            e for k in range(3) for e in _attempt(f"k{i}.{k}", t + 400 * k, k, f"K{i}", False)
        ]
    if kind == "two_gateways":
        return kind, [*_attempt(f"b{i}", t, 0, f"B{i}", False, "gw-0"),
                      *_attempt(f"b{i}r", t + 900, 1, f"B{i}", True, "gw-1")]  # fmt: skip
    if kind == "no_logical_id":
        return kind, [*_attempt(f"c{i}", t, 0, None, False),
                      *_attempt(f"c{i}x", t + 900, 1, None, True)]  # fmt: skip
    return kind, _attempt(f"d{i}", t, 0, None, True)


def _expected(kinds: list[str]) -> dict[str, Any]:
    """What the events say, by construction (not from the store nor the rule)."""
    n = {k: kinds.count(k) for k in KINDS}
    return {
        "attempts": 2 * n["retried"] + 3 * n["never"] + 2 * n["two_gateways"]
        + 2 * n["no_logical_id"] + n["single"],
        "requests": sum(n.values()) + n["no_logical_id"],
        "retried": n["retried"] + n["never"] + n["two_gateways"],
        "never_served": n["never"] + n["no_logical_id"],
        "latency": {"from_first": n["retried"] + n["never"], "final_only": n["two_gateways"]},
    }  # fmt: skip


_ORDER = "(client_attempt, ts_unix_ns, attempt, request_id)"


def _exact(store_dir: Path, lo_ns: int | None = None, hi_ns: int | None = None) -> dict[str, Any]:
    """The same figures by SQL alone over requests FINAL (final attempt by argMax)."""
    store = open_store(Settings(store_dir=store_dir))
    try:
        ((total, attempts, retried, never, from_first, final_only),) = store.query_rows(
            "SELECT count(), sum(n), countIf(n > 1), countIf(o NOT IN ('ok', 'client_abort')), "
            "countIf(n > 1 AND h = 1), countIf(n > 1 AND h > 1) FROM ("
            f"SELECT argMax(outcome, {_ORDER}) AS o, argMax(end_unix_ns, {_ORDER}) AS e, "
            "count() AS n, uniqExact(gateway_host) AS h FROM tailguard.requests FINAL "
            "GROUP BY ifNull(logical_request_id, request_id)) "
            "WHERE e >= {lo:Int64} AND e < {hi:Int64}",
            {"lo": lo_ns or 0, "hi": hi_ns or 2**63 - 1},
        )
    finally:
        store.close()
    return {"attempts": int(attempts), "requests": int(total), "retried": int(retried),
            "never_served": int(never),
            "latency": {"from_first": int(from_first), "final_only": int(final_only)}}  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("logical")
    kinds, events = gathered(_chain(i) for i in range(N))
    events.sort(key=lambda e: e.ts_unix_ns)
    return {"store": replay_events(tmp, events), "kinds": kinds}


def _report(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["report", "--json", *args]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _figures(logical: dict[str, Any]) -> dict[str, Any]:
    return {k: logical[k] for k in ("attempts", "requests", "retried", "never_served", "latency")}


def test_report_counts_each_logical_request_once(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = _report(capsys, "--store", str(built["store"]))
    assert out["requests"] == _expected(built["kinds"])["attempts"]  # per attempt
    assert _figures(out["logical"]) == _expected(built["kinds"]) == _exact(built["store"])
    assert out["logical"]["slos"]  # every SLO of the spec, recounted per logical request


def test_a_range_counts_a_chain_by_its_final_attempt(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A range that starts between the attempts of chains 50.. (their first tries end
    before it): those chains are counted whole, once, with their first attempts."""
    lo_s, hi_s = T0_NS / 1e9 + 100.5, T0_NS / 1e9 + 160.5
    out = _report(capsys, "--store", str(built["store"]), "--since", str(lo_s),
                  "--until", str(hi_s))  # fmt: skip
    exact = _exact(built["store"], int(lo_s * 1e9), int(hi_s * 1e9))
    assert _figures(out["logical"]) == exact
    assert exact["requests"] > 0
    assert exact["latency"]["from_first"] > 0


def test_report_text_and_html_show_the_section(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["report", "--store", str(built["store"])]) == 0
    text = capsys.readouterr().out
    assert "per logical request" in text
    assert "never served" in text
    html = tmp_path / "r.html"
    assert main(["report", "--store", str(built["store"]), "--html", str(html)]) == 0
    assert "per logical request" in html.read_text()


@pytest.mark.parametrize(
    ("rid", "attempt", "logical", "note"),
    [("a0~retry1", 1, "a0", "client: retry 1 of logical request a0"),
     ("k1.0", 0, "K1", "client: first try of logical request K1"),
     ("c3x", 1, None, "client: retry 1 (no logical request id"),
     ("d4", 0, None, None)],
)  # fmt: skip
def test_explain_shows_the_attempt(  # noqa: PLR0917
    built: dict[str, Any], capsys: pytest.CaptureFixture[str], rid: str, attempt: int,
    logical: str | None, note: str | None,
) -> None:  # fmt: skip
    assert main(["explain", rid, "--store", str(built["store"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["client_attempt"], doc["logical_request_id"]) == (attempt, logical)
    assert main(["explain", rid, "--store", str(built["store"])]) == 0
    text = capsys.readouterr().out
    if note is None:
        assert doc["client_note"] is None
        assert "client:" not in text
    else:
        assert doc["client_note"].startswith(note)
        assert note in text


def test_the_simulators_chains_agree_in_the_backtests_rule_and_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The simulator's clients retry every refusal (the gate sheds priorities 2 and 3
    always): each first try is one logical request, those of priority 2-3 are never served
    (the simulator knows it: not the rule). The backtest's figures (the rule over the
    join's records) and the report's (over the store, after ``replay``) are the same."""
    from pipeline.cli import BACKTEST_START_UNIX_NS, DEFAULT_TRACE
    from pipeline.core.logical import counts, logical_requests
    from pipeline.settings import DEFAULT_SLO_SPEC
    from pipeline.spec.slo import load_spec_file
    from producers.simulator.gate import GatewayGate, directive_of
    from producers.simulator.model import SimConfig, Simulator
    from producers.simulator.trace import read_trace

    gate = GatewayGate()
    gate.set("*", directive_of(1, "degraded",
                               {"shed_priorities_at_or_above": 2, "retry_after_s": 1}))  # fmt: skip
    sim = Simulator(read_trace(DEFAULT_TRACE)[:400],
                    SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=5), gate)  # fmt: skip
    events = list(sim.events())
    firsts = [e for e in events if e.kind == "gateway.received" and e.client_attempt == 0]
    assert sim.retries > 0
    assert all(e.logical_request_id is None for e in firsts)
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    j = Joiner(JoinConfig(timeout_ms=5_000))
    recs = {}
    lifecycle = [e for e in events if e.kind != "engine.stats"]
    for i, e in enumerate(lifecycle):
        r = j.add(from_model(e), i)
        if r is not None:
            recs[(r.request_id, r.attempt)] = r
    for r in j.drain():
        recs[(r.request_id, r.attempt)] = r
    backtest = counts(spec, logical_requests(recs.values()))
    assert backtest["requests"] == len(firsts) == 400
    assert backtest["attempts"] == len(firsts) + sim.retries
    assert backtest["never_served"] == sum(e.priority >= 2 for e in firsts)
    store_dir = replay_events(tmp_path, events)
    capsys.readouterr()
    report = _report(capsys, "--store", str(store_dir))
    assert report["logical"] == backtest
