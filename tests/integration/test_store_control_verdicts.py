"""Issue 48 on the real embedded engine: gateway.completed's ``control_mode`` and
``control_verdict`` replayed into a store (``tailguard replay``), stored on the requests'
rows, and shown by ``tailguard report`` (per model and priority: refused in enforce, would
have refused in shadow, served; exact over ``requests``) and ``tailguard explain``.

The events are hand-made, so the expected counts are known without the store: every mode
and verdict over two models and four priorities, requests without a mode (off), a request
whose two gateway.completed conflict (shadow ok, then enforce rejected: the worse one is
kept whole, verdict included), and a request seen twice (a duplicate)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.adapters.store import migrate, open_store, write_requests
from pipeline.cli import main
from pipeline.core.record import build_record
from pipeline.settings import Settings
from tests.factories import T0_NS, completed, finished, received
from tests.measurement_fixtures import gathered, replay_events

pytestmark = pytest.mark.integration

MODES = [None, "shadow", "enforce"]
VERDICTS = [None, "shed_priority", "new_session", "rate_limit", "admission", "queue_timeout"]
MODELS = ["llama-3-8b", "llama-3-70b"]
N = 240
CONFLICTED = "conflicted"


def _request(i: int) -> tuple[dict[str, Any], list[Any]]:
    """Request ``i``: what its record should say, and its events."""
    rid, model, prio = f"q{i:04d}", MODELS[i % 2], (i // 2) % 4
    mode = MODES[(i // 8) % 3]
    verdict = None if mode is None else VERDICTS[(i // 24 + i) % 6]
    t = 500.0 * i  # one request every half second: 2 minutes in all
    refused = mode == "enforce" and verdict is not None
    status = (503 if verdict == "queue_timeout" else 429) if refused else 200
    done = completed(rid, t + 100, total_ms=100.0 if not refused else 2.0, model=model,
                     outcome="rejected" if refused else "ok", http_status=status,
                     ttfb_ms=None if refused else 20.0)  # fmt: skip
    done = done.model_copy(update={"control_mode": mode, "control_verdict": verdict})
    events: list[Any] = [received(rid, t, priority=prio, model=model), done]
    if not refused:
        events.append(finished(rid, t + 98, model=model))
    want = {"request_id": rid, "model": model, "priority": prio, "mode": mode,
            "verdict": verdict, "t_ms": t, "outcome": done.outcome, "status": status}  # fmt: skip
    return want, events


def _conflicted() -> tuple[dict[str, Any], list[Any]]:
    """Shadow ok, then another gateway.completed: enforce rejected 429 (admission)."""
    ok = completed(CONFLICTED, 60_100, model=MODELS[0]).model_copy(
        update={"control_mode": "shadow", "control_verdict": None}
    )
    refused = {"event_id": "twin", "outcome": "rejected", "http_status": 429,
               "control_mode": "enforce", "control_verdict": "admission"}  # fmt: skip
    twin = ok.model_copy(update=refused)
    events = [received(CONFLICTED, 60_000, priority=0, model=MODELS[0]), ok, twin,
              finished(CONFLICTED, 60_098, model=MODELS[0])]  # fmt: skip
    want = {"request_id": CONFLICTED, "model": MODELS[0], "priority": 0, "mode": "enforce",
            "verdict": "admission", "t_ms": 60_000.0, "outcome": "rejected",
            "status": 429}  # fmt: skip
    return want, events


def expected(wants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The report's rows, computed from what the events say (not from the store)."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for w in wants:
        if w["mode"] is None:
            continue
        r = rows.setdefault((w["model"], w["priority"]), {
            "model": w["model"], "priority": w["priority"], "modes": Counter(),
            "requests": 0, "served": 0, "would_refuse": Counter(), "refused": Counter(),
        })  # fmt: skip
        r["modes"][w["mode"]] += 1
        r["requests"] += 1
        if w["mode"] == "enforce" and w["verdict"] is not None:
            r["refused"][w["verdict"]] += 1
        else:
            r["served"] += 1
            if w["verdict"] is not None:
                r["would_refuse"][w["verdict"]] += 1
    return [
        {k: dict(v) if isinstance(v, Counter) else v for k, v in rows[key].items()}
        for key in sorted(rows)
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("control-verdicts")
    wants, events = gathered([*(_request(i) for i in range(N)), _conflicted()])
    # a duplicate: a shadow request's gateway.completed again
    events.append(next(e for e in events if e.event_id == "q0008:c"))
    return {"store": replay_events(tmp, events), "wants": wants}


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(list(args)) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _exact(store_dir: Path, where: str = "1", bound: dict[str, Any] | None = None) -> Counter:
    """(model, priority, mode, verdict) -> requests, counted over ``requests FINAL``."""
    store = open_store(Settings(store_dir=store_dir))
    try:
        rows = store.query_rows(
            "SELECT model, priority, control_mode, control_verdict FROM tailguard.requests "
            f"FINAL WHERE control_mode IS NOT NULL AND {where}",
            bound or {},
        )
    finally:
        store.close()
    return Counter((str(m), int(p), md, v) for m, p, md, v in rows)


def _flat(report_rows: list[dict[str, Any]]) -> Counter:
    """The report's rows back as (model, priority, mode, verdict) -> requests."""
    out: Counter = Counter()
    for r in report_rows:
        key = (r["model"], r["priority"])
        for reason, n in r["refused"].items():
            out[(*key, "enforce", reason)] += n
        for reason, n in r["would_refuse"].items():
            out[(*key, "shadow", reason)] += n
        refused = sum(r["refused"].values()) + sum(r["would_refuse"].values())
        assert sum(r["modes"].values()) == r["requests"]
        assert r["served"] == r["requests"] - sum(r["refused"].values())
        admitted = r["requests"] - refused
        if admitted:
            out[(*key, "admitted", None)] += admitted
    return out


def _as_exact_keys(c: Counter) -> Counter:
    """``_exact``'s counts with admitted requests (no verdict) of both modes together."""
    out: Counter = Counter()
    for (m, p, mode, verdict), n in c.items():
        out[(m, p, "admitted" if verdict is None else mode, verdict)] += n
    return out


@pytest.mark.parametrize(
    ("args", "keep"),
    [
        ((), lambda w: True),
        (("--model", MODELS[1]), lambda w: w["model"] == MODELS[1]),
        # request end times: the engine's (or the gateway's) end, ~100 ms after the start
        (("--since", str(T0_NS / 1e9 + 30), "--until", str(T0_NS / 1e9 + 90)),
         lambda w: 30_000 <= w["t_ms"] + 98 < 90_000),
    ],
    ids=["all", "model", "span"],
)  # fmt: skip
def test_report_counts_equal_the_events_and_an_exact_count(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str], args: tuple[str, ...], keep: Any
) -> None:
    out = _cli_json(capsys, "report", "--store", str(built["store"]), "--json", *args)
    want = expected([w for w in built["wants"] if keep(w)])
    assert want  # the case has requests with a mode
    assert out["control_verdicts"] == want
    if not args:
        assert _flat(out["control_verdicts"]) == _as_exact_keys(_exact(built["store"]))
    elif args[0] == "--model":
        exact = _exact(built["store"], "model = {m:String}", {"m": MODELS[1]})
        assert _flat(out["control_verdicts"]) == _as_exact_keys(exact)


def test_the_conflict_keeps_the_worse_completed_whole(built: dict[str, Any]) -> None:
    store = open_store(Settings(store_dir=built["store"]))
    try:
        rows = store.query_rows(
            "SELECT outcome, http_status, control_mode, control_verdict, conflicts "
            "FROM tailguard.requests FINAL WHERE request_id = {r:String}",
            {"r": CONFLICTED},
        )
    finally:
        store.close()
    assert rows == [("rejected", 429, "enforce", "admission", 1)]


def test_report_text_shows_the_section(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--store", str(built["store"])]) == 0
    text = capsys.readouterr().out
    assert "would have refused (shadow)" in text
    assert "refused (enforce)" in text


def test_a_store_without_modes_has_no_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store_dir = replay_events(tmp_path, _request(0)[1])  # off
    capsys.readouterr()
    out = _cli_json(capsys, "report", "--store", str(store_dir), "--json")
    assert out["requests"] == 1
    assert "control_verdicts" not in out
    assert main(["report", "--store", str(store_dir)]) == 0
    assert "would have refused" not in capsys.readouterr().out


def test_versions_of_a_request_count_once_with_the_last_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records written straight into the store, as the worker writes versions of one
    request: a partial, its joined upgrade, a conflict's correction (enforce rejected
    where the first gateway.completed said shadow ok). The report counts the last version
    once (``FINAL``), like an exact count over ``requests``."""
    store_dir = tmp_path / "store"
    store = open_store(Settings(store_dir=store_dir))
    try:
        migrate(store)
        shadow = completed("v").model_copy(
            update={"control_mode": "shadow", "control_verdict": "rate_limit"}
        )
        refused = shadow.model_copy(update={
            "event_id": "v:c2", "outcome": "rejected", "http_status": 429,
            "control_mode": "enforce", "control_verdict": "new_session",
        })  # fmt: skip
        partial = build_record("v", received("v", priority=3), shadow, None)
        joined = build_record("v", received("v", priority=3), shadow, finished("v"))
        fixed = build_record("v", received("v", priority=3), refused, finished("v"), conflicts=1)
        other = build_record("w", received("w", priority=3), shadow, finished("w"))
        for batch in ([partial, other], [joined], [fixed], [joined]):  # the last: a re-delivery
            write_requests(store, batch)
        ((raw,),) = store.query_rows("SELECT count() FROM tailguard.requests")
        assert raw > 2  # versions not merged yet: only FINAL counts the last
        exact = _exact(store_dir)
    finally:
        store.close()
    assert exact == Counter({("m", 3, "enforce", "new_session"): 1,
                             ("m", 3, "shadow", "rate_limit"): 1})  # fmt: skip
    out = _cli_json(capsys, "report", "--store", str(store_dir), "--json")
    assert out["control_verdicts"] == [{
        "model": "m", "priority": 3, "modes": {"enforce": 1, "shadow": 1}, "requests": 2,
        "served": 1, "would_refuse": {"rate_limit": 1}, "refused": {"new_session": 1},
    }]  # fmt: skip


def _first(wants: list[dict[str, Any]], mode: str, verdict: str | None) -> dict[str, Any]:
    return next(w for w in wants if (w["mode"], w["verdict"]) == (mode, verdict))


@pytest.mark.parametrize(
    ("mode", "verdict", "note"),
    [
        ("shadow", "admission", "shadow: would have been refused (admission)"),
        ("shadow", None, "shadow: would have been admitted"),
        ("enforce", "shed_priority", "enforce: refused 429 (shed_priority)"),
        ("enforce", "queue_timeout", "enforce: refused 503 (queue_timeout)"),
        ("enforce", None, "enforce: admitted"),
        (None, None, None),
    ],
)
def test_explain_shows_the_mode_and_verdict(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str], mode: str | None,
    verdict: str | None, note: str | None,
) -> None:  # fmt: skip
    rid = _first(built["wants"], mode, verdict)["request_id"]  # type: ignore[arg-type]
    out = _cli_json(capsys, "explain", rid, "--store", str(built["store"]), "--json")
    if note is None:
        assert out["gateway_control"] is None
    else:
        assert out["gateway_control"]["mode"] == mode
        assert out["gateway_control"]["verdict"] == verdict
        assert out["gateway_control"]["note"].startswith(note)
    assert main(["explain", rid, "--store", str(built["store"])]) == 0
    text = capsys.readouterr().out
    if note is None:
        assert "gateway control" not in text
    else:
        assert f"gateway control: {note}" in text
