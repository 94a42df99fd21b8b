"""Issue 53: the statement counted in the engine (version 4,
``pipeline.adapters.queries.statement_engine``) says what version 3 (the rows handed over,
judged record by record in the core) says, on a store made messy on purpose: every way the
versions of a request can lie (``test_final_source``'s cases, spread over the period and
its edges), values on each SLO's threshold and either side of it, missing values and
first bytes, failures, aborts, retries, prompts over the exclusion, unknown priorities
and streams, cold starts over the daily cap, a maintenance window, and budget
exhaustions with incidents. Only the version and the requests digest differ."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from pipeline.adapters.queries import statement_engine
from pipeline.adapters.queries.statement_engine import EngineSource, StoreChangedError
from pipeline.adapters.store import migrate, open_store
from pipeline.adapters.store.audit import BudgetEventRow, write_audit
from pipeline.adapters.store.requests import write_requests
from pipeline.app.statement import build_statement
from pipeline.core.record import RequestRecord
from pipeline.core.statement import compute_statement
from pipeline.settings import Settings
from pipeline.shipped import EXAMPLE_CONTRACT
from pipeline.spec.contract import LoadedContract, load_contract_file, period_bounds_ns
from tests.integration.test_final_source import _BASE, A_NS, B_NS, CASES, IN_NS

pytestmark = pytest.mark.integration

TZ = "Europe/Berlin"
P_START, P_END = period_bounds_ns("2026-11", TZ)
MIN_NS = 60 * 10**9
HOUR_NS = 60 * MIN_NS
DAY_NS = 24 * HOUR_NS
# the example contract's maintenance window: 2026-11-14 02:00-04:00 +01:00
WINDOW_NS = int(dt.datetime(2026, 11, 14, 1, tzinfo=dt.UTC).timestamp()) * 10**9
THRESHOLDS = (250.0, 400.0, 600.0)  # the example SLOs' (compute, gateway, first byte)
EXHAUSTED_NS = tuple(P_START + d * DAY_NS + 5 * HOUR_NS for d in (3, 9, 20))


def _value(rng: random.Random) -> float | None:
    """A latency: missing, on a threshold, or anywhere (both sides of each)."""
    pick = rng.random()
    if pick < 0.1:
        return None
    if pick < 0.3:
        return rng.choice(THRESHOLDS)
    return round(rng.uniform(0.0, 900.0), 3)


def _records(seed: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    out: list[RequestRecord] = []
    ends = [P_START - HOUR_NS, P_START, P_END - 1, P_END, WINDOW_NS, WINDOW_NS + 2 * HOUR_NS]
    for i in range(3_000):
        end = rng.choice(ends) if i % 50 == 0 else rng.randrange(P_START, P_END)
        if i % 7 == 0:  # a maintenance window's rows
            end = WINDOW_NS + rng.randrange(0, 2 * HOUR_NS)
        cold = None
        if i % 11 == 0:  # cold starts: 3 a day on 2 hosts (the cap is 2 a day)
            day = (end - P_START) // DAY_NS
            cold = P_START + day * DAY_NS + rng.randrange(3) * HOUR_NS
        out.append(
            msgspec.structs.replace(
                _BASE,
                request_id=f"r{i:05d}",
                attempt=rng.choice((1, 1, 1, 2)),
                superseded=rng.random() < 0.05,
                tenant=rng.choice(("t1", "t1", "t2", None)),
                model=rng.choice(("m-a", "m-b")),
                priority=rng.choice((0, 1, 2, None)),
                ctx_bucket=rng.choice(("short", "long")),
                stream=rng.choice((True, False, None)),
                source=rng.choice(("joined", "joined", "gateway_only", "engine_only")),
                outcome=rng.choice(("ok",) * 6 + ("error", "timeout", "client_abort")),
                prompt_tokens=rng.choice((None, 100, 16_384, 16_385, 30_000)),
                engine_host=rng.choice(("h1", "h2", None)) if cold is None else f"h{i % 2}",
                cold_start_unix_ns=cold,
                end_unix_ns=end,
                ts_unix_ns=end - rng.choice((10**8, 2 * MIN_NS, 2 * HOUR_NS)),
                gateway_total_ms=_value(rng),
                gateway_ttfb_ms=_value(rng),
                inference_ms=_value(rng),
                ttft_engine_ms=_value(rng),
                queue_ms=_value(rng),
            )
        )
    # each tenant's bad requests in the hour before each budget exhaustion
    for k, at in enumerate(EXHAUSTED_NS):
        for j in range(8):
            end = at - (j + 1) * 5 * MIN_NS
            out.append(
                msgspec.structs.replace(
                    _BASE,
                    request_id=f"x{k}-{j}",
                    tenant=("t1", "t2")[j % 2],
                    stream=True,
                    end_unix_ns=end,
                    ts_unix_ns=end - 10**9,
                    gateway_total_ms=950.0 + j,
                    gateway_ttfb_ms=None if j % 3 == 0 else 700.0 + j,
                )
            )
    # every way versions lie (test_final_source, its span [A, B) put at the period's
    # start, then ending at the period's end), one key each
    for where, a_ns in (("s", P_START), ("e", P_END - (B_NS - A_NS))):
        for n, (_, versions) in enumerate(CASES):
            for v in versions:
                end = a_ns + v.get("end_ns", IN_NS) - A_NS
                out.append(
                    msgspec.structs.replace(
                        _BASE,
                        request_id=f"v{where}{n:03d}",
                        attempt=v.get("attempt", 1),
                        revision=v["version"] // 2,
                        superseded=bool(v["version"] % 2),
                        end_unix_ns=end,
                        ts_unix_ns=end - 10**8,
                        outcome=v.get("outcome", "ok"),
                        tenant=v.get("tenant", "t1"),
                        gateway_total_ms=450.0 if n % 2 else 350.0,
                    )
                )
    return out


def example_contract(tmp_path: Path, tenants: list[str]) -> LoadedContract:
    """The shipped example contract for ``tenants`` (its SLO spec by absolute path)."""
    spec = EXAMPLE_CONTRACT.parent / "slo-example.yaml"
    path = tmp_path / "contract.yaml"
    text = EXAMPLE_CONTRACT.read_text().replace(
        "tenants: [tenant-a, tenant-b, tenant-c, tenant-d]", f"tenants: [{', '.join(tenants)}]"
    )
    path.write_text(text.replace("slo_spec: slo-example.yaml", f"slo_spec: {spec}"))
    return load_contract_file(path)


def _doc(statement: Any) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(orjson.dumps(statement.to_json()))
    doc.pop("statement_version")
    doc["inputs"].pop("requests_digest")
    return doc


@pytest.mark.parametrize(("seed", "select"), [(1, "nth"), (2, "nth"), (1, "sort")])
def test_the_engines_statement_is_the_rows_statement(
    tmp_path: Path, seed: int, select: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 4 (counted in the engine) says what version 3 (the rows) says; its
    percentiles selected at the nearest rank ("nth"), or, where the selection's rank is
    not the core's (forced here: levels that select another rank), sorted ("sort")."""
    reads: list[bool] = []
    rows_of = statement_engine.EngineSource._percentile_rows

    def percentile_rows(self: Any, *args: Any, sort: bool) -> Any:
        reads.append(sort)
        return rows_of(self, *args, sort=sort)

    monkeypatch.setattr(statement_engine.EngineSource, "_percentile_rows", percentile_rows)
    if select == "sort":
        monkeypatch.setattr(statement_engine, "_levels", lambda p: ("0.5", "0.5"))
    records = _records(seed)
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate(store)
        for k in range(0, len(records), 500):  # parts of their own: versions stay rows
            write_requests(store, records[k : k + 500])
        write_audit(
            store,
            [],
            [
                BudgetEventRow(
                    slo=slo,
                    event="budget_exhausted",
                    event_time=dt.datetime.fromtimestamp(t / 1e9, dt.UTC),
                    details="{}",
                )
                for t in EXHAUSTED_NS
                for slo in ("tier1-gateway", "tier3-ttft")
            ],
        )
        loaded = example_contract(tmp_path, ["t1", "t2", "t3"])
        # a tenant without a request in the period: nothing counted, the same on both
        empty = [build_statement(store, loaded, "t3", "2026-11", version=v) for v in (3, 4)]
        assert _doc(empty[0]) == _doc(empty[1])
        assert empty[1].requests == 0
        for tenant in ("t1", "t2"):
            v3 = build_statement(store, loaded, tenant, "2026-11", version=3)
            v4 = build_statement(store, loaded, tenant, "2026-11", version=4)
            assert v4.statement_version == 4
            assert v4.inputs["requests_digest"].startswith("cityhash64-sum:")
            a, b = _doc(v3), _doc(v4)
            assert a == b, sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            assert v3.requests > 0
            assert v3.exempted
            assert any(c.exempted for c in v3.cold_starts)
            assert any(not c.exempted for c in v3.cold_starts)  # over the cap: counted
            assert v3.incidents
        assert reads
        # nth: one read per statement, none sorted; sort: a selection that missed the
        # core's rank (n = 1 cannot miss) read again sorted
        if select == "nth":
            assert reads == [False] * len(reads)
        else:
            assert True in reads
    finally:
        store.close()


def test_a_store_written_between_the_reads_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 4 reads the period several times. Rows written between the first read and
    the statement's end (a live store) are noticed (``StoreChangedError``), and
    ``build_statement`` reads again."""
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate(store)
        records = [r for r in _records(3) if r.tenant == "t1" and r.request_id.startswith("r")]
        write_requests(store, records[:-50])
        loaded = example_contract(tmp_path, ["t1"])
        # rows written after the groups were read: the percentiles' read sees them
        source = EngineSource(
            store, loaded.contract, loaded.spec, tenant="t1", from_unix_ns=P_START,
            until_unix_ns=P_END,
        )  # fmt: skip
        write_requests(store, records[-50:])
        with pytest.raises(StoreChangedError):
            build_and_check(source, loaded)
        # build_statement reads again: its first source sees the store change under it
        built: list[EngineSource] = []
        real = statement_engine.EngineSource

        def changing(*args: Any, **kwargs: Any) -> EngineSource:
            got = real(*args, **kwargs)
            if not built:
                end = P_START + 5 * DAY_NS
                late = msgspec.structs.replace(
                    _BASE, request_id="late", tenant="t1", outcome="ok", stream=True,
                    end_unix_ns=end, ts_unix_ns=end - 10**8, gateway_total_ms=100.0,
                    gateway_ttfb_ms=50.0, inference_ms=80.0, prompt_tokens=10,
                )  # fmt: skip
                write_requests(store, [late])
            built.append(got)
            return got

        monkeypatch.setattr(statement_engine, "EngineSource", changing)
        again = build_statement(store, loaded, "t1", "2026-11")
        assert len(built) == 2
        monkeypatch.undo()
        assert _doc(again) == _doc(build_statement(store, loaded, "t1", "2026-11", version=3))
    finally:
        store.close()


def build_and_check(source: EngineSource, loaded: Any) -> None:
    """The core's statement of a source (no audit, no budget events), then the source's
    check that the store did not change meanwhile (a read may see the change first)."""
    compute_statement(
        tenant="t1", period="2026-11", contract=loaded.contract, spec=loaded.spec,
        records=source, level_changes=[], budget_events=[], observed_until_ns=None,
        inputs={},
    )  # fmt: skip
    source.check_unchanged()
