"""Issue 36 item 4: every dead letter ``tailguard replay`` counts is a line of its DLQ file,
with its reason -- on every kind of bad input the tests feed it: malformed lines, the
hypothesis-generated malformed messages, events quarantined for an out-of-range time
(held ahead of the clock until the end of the file, or released mid-file), the messy
traffic of the event-time tests, and a record the store rejects.

The DLQ file is one JSON object a line (``pipeline.contract.codec.dead_letter_record``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.cli import main
from pipeline.contract.codec import encode_batch, event_to_dict
from pipeline.settings import Settings
from tests.disorder import HOUR_NS, YEAR_NS, stamp_request, write_layout
from tests.factories import completed, finished, received
from tests.integration.faults import batches, lifecycle_events
from tests.integration.malformed import generate
from tests.integration.test_event_time import _messy
from tests.integration.test_fault_poison import _add_strict_constraint, _single
from tests.measurement_fixtures import load_events, simulate_jsonl

pytestmark = pytest.mark.integration


def _write(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines) + b"\n")


def _malformed_lines(path: Path, store: Settings) -> None:
    good = [encode_batch([received(f"r{i}"), finished(f"r{i}"), completed(f"r{i}")])
            for i in range(50)]  # fmt: skip
    bad = [b"{oops", b'{"v":1,"kind":"gateway.completed"}', b"[1,2,3]", b"null"]
    _write(path, good[:20] + bad + good[20:])


def _hypothesis_malformed(path: Path, store: Settings) -> None:
    """Whole malformed messages between valid ones, bad elements inside valid batches."""
    carriers = list(batches(lifecycle_events(400, seed=5), 1, 20))
    lines: list[bytes] = []
    for k, m in enumerate(generate(400, 128 * 1024)):
        _, chunk = carriers[k % len(carriers)]
        if m.raw is not None:
            lines += [m.raw.replace(b"\n", b" "), encode_batch(chunk)]
        else:
            items: list[Any] = [event_to_dict(e) for e in chunk]
            for pos, item in zip(m.positions, m.bad_items, strict=True):
                items.insert(min(pos, len(items)), item)
            lines.append(orjson.dumps(items))
    _write(path, lines)


def _simulated(path: Path, ahead: dict[int, int], limit: int = 400) -> None:
    simulate_jsonl(path, seed=11, limit=limit)
    events = load_events(path)
    rids = list(dict.fromkeys(e["request_id"] for e in events if e["request_id"]))  # in order
    for at, delta_ns in ahead.items():
        events = stamp_request(events, rids[at], delta_ns)
    write_layout(path, events, "lines")


def _quarantined_at_the_end(path: Path, store: Settings) -> None:
    """Held ahead of the clock, nothing confirms them: quarantined when the file ends."""
    _simulated(path, {-1: YEAR_NS, -2: HOUR_NS})


def _quarantined_mid_file(path: Path, store: Settings) -> None:
    """Early requests (after the clock's bootstrap) stamped ahead: quarantined once enough
    in-range events passed them."""
    _simulated(path, {60: YEAR_NS, 70: HOUR_NS})


def _messy_traffic(path: Path, store: Settings) -> None:
    simulate_jsonl(path, seed=11, limit=1500)
    write_layout(path, _messy(load_events(path)), "arrays", seed=3)


def _store_rejected(path: Path, store: Settings) -> None:
    events = lifecycle_events(300, seed=75)
    victim = next(ev for ev in events if ev.kind == "engine.finished")
    events = [
        ev.model_copy(update={"preemptions": 65_000}) if ev is victim else ev for ev in events
    ]
    lines = [encode_batch(events[i : i + 50]) for i in range(0, len(events), 50)]
    lines.append(_single(victim, preemptions=70_000, request_id="p-1"))  # over the contract
    _write(path, lines)
    _add_strict_constraint(store)  # a store stricter than the contract


BAD_INPUTS: dict[str, Callable[[Path, Settings], None]] = {
    "malformed-lines": _malformed_lines,
    "hypothesis-malformed": _hypothesis_malformed,
    "quarantined-at-the-end": _quarantined_at_the_end,
    "quarantined-mid-file": _quarantined_mid_file,
    "messy-traffic": _messy_traffic,
    "store-rejected": _store_rejected,
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_every_dead_letter_counted_is_a_line_of_the_dlq_file(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "events.jsonl"
    store = Settings(store_dir=tmp_path / "store")
    BAD_INPUTS[name](path, store)
    assert main(["replay", str(path), "--store", str(store.store_dir), "--json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    dead = [orjson.loads(x) for x in Path(summary["dlq_file"]).read_bytes().splitlines()]
    assert summary["dead_letters"] > 0
    assert summary["dead_letters"] == len(dead)
    assert all(d["reason"] for d in dead)
    reasons = [d["reason"].split(":")[0] for d in dead]
    assert reasons.count("ts_out_of_range") == summary["windows"]["quarantined_events"]
    assert reasons.count("store_rejected") == summary.get("store_rejected", 0)
    if name.startswith("quarantined") or name == "messy-traffic":
        assert summary["windows"]["quarantined_events"] > 0
