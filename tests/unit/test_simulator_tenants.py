"""The simulator's tenants and per-request SLOs (issue 52): a tenant's flood at one
priority, first-token SLOs drawn per stream, and a gate that tells the enforcement the
tenant and the SLO and measures the first-token prediction's error."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.contract.events import GatewayCompleted, GatewayReceived
from producers.simulator.gate import Arrival, Completion, GatewayGate, directive_of
from producers.simulator.model import SimConfig, Simulator, TenantFlood
from producers.simulator.trace import TraceRequest

START_NS = 1_700_000_000_000_000_000
TRACE = [TraceRequest(i * 500.0, 200, 20) for i in range(600)]  # 300 s at 2/s
MIX = ((300.0, 1.0), (1000.0, 1.0), (5000.0, 1.0))


def _run(**kw: object) -> tuple[list[GatewayReceived], list[GatewayCompleted]]:
    config = SimConfig(start_unix_ns=START_NS, stats_interval_ms=1e12, **kw)  # type: ignore[arg-type]
    events = list(Simulator(TRACE, config).events())
    received = [e for e in events if isinstance(e, GatewayReceived)]
    done = [e for e in events if isinstance(e, GatewayCompleted)]
    return received, done


def test_a_flood_multiplies_one_tenant_at_one_priority_in_its_window() -> None:
    base, _ = _run()
    flood = TenantFlood("tenant-a", 1, 100.0, 200.0, 10.0)
    got, _ = _run(tenant_floods=(flood,))

    def key(e: GatewayReceived) -> tuple[str | None, int, bool]:
        in_window = 100e9 <= e.ts_unix_ns - START_NS < 200e9
        return e.tenant, e.priority, in_window

    before, after = Counter(map(key, base)), Counter(map(key, got))
    assert after[("tenant-a", 1, True)] == 10 * before[("tenant-a", 1, True)] > 0
    # everything else is drawn as without the flood
    for k, n in before.items():
        if k != ("tenant-a", 1, True):
            assert after[k] == n, k


@pytest.mark.parametrize(("factor", "u", "copies"), [(10.0, 0.5, 9), (2.5, 0.4, 2), (2.5, 0.6, 1),
                                                     (1.0, 0.0, 0)])  # fmt: skip
def test_flood_copies(factor: float, u: float, copies: int) -> None:
    flood = TenantFlood("t", 2, 10.0, 20.0, factor)
    assert flood.copies("t", 2, 15_000.0, u) == copies
    assert flood.copies("t", 1, 15_000.0, u) == 0  # another priority
    assert flood.copies("u", 2, 15_000.0, u) == 0  # another tenant
    assert flood.copies("t", 2, 20_000.0, u) == 0  # after its window


def test_first_token_slos_are_drawn_per_stream_from_the_mix() -> None:
    received, done = _run(slo_ttft_mix=MIX)
    stream = {e.request_id: e.stream for e in received}
    slos = Counter(e.slo_ttft_ms for e in done if stream[e.request_id])
    assert set(slos) == {300.0, 1000.0, 5000.0}
    assert min(slos.values()) > 0.2 * sum(slos.values())  # about a third each
    assert all(e.slo_ttft_ms is None for e in done if not stream[e.request_id])
    base_received, _ = _run()
    assert [e.request_id for e in base_received] == [e.request_id for e in received]


@pytest.mark.parametrize(("fair_share", "tenant"), [(True, "tenant-a"), (False, None)])
def test_the_gate_tells_the_tenant_and_measures_the_prediction(
    fair_share: bool, tenant: str | None
) -> None:
    """The gate tells the tenant; the admission tracks it only under a fair directive."""
    gate = GatewayGate()
    gate.set("m", directive_of(1, "degraded", {"admit_rps": 100.0, "ttft_queue_ms": 200.0,
                                               "ttft_service_ms": 50.0,
                                               "fair_share": fair_share}, "m"))  # fmt: skip
    arrival = Arrival("m", 1, "r1", "r1", "g", 100, 0.0, tenant="tenant-a", slo_ttft_ms=1000.0)
    d = gate.decision(arrival)
    assert d.verdict.reason is None
    assert d.verdict.predicted_ttft_ms == 250.0
    admission = next(iter(gate.enforcements["g"]._admissions.values()))
    assert set(admission.tenant_shares_rps(1)) == {"" if tenant is None else tenant}
    gate.on_complete(Completion("m", "g", 1, "r1", 400.0, 400.0, 900.0, "ok"))
    assert gate.prediction_error() == {"n": 1, "p50_ms": -150.0, "p90_ms": -150.0}
