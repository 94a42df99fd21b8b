"""The chaos run's end (:mod:`bench.chaos`): the store's checks
(:mod:`tools.dev.fault_checks`) against the producers' own record of what the broker
acknowledged (:class:`bench.chaos_traffic.Acks`), and the figures.

A topic deleted mid-run takes with it what the worker had not read yet: nobody can read
it again. Those requests are told apart from the ones it read and lost by position, not
by guess: the worker logs, when it finishes a deleted generation, where its reading
stopped on each partition (``read up to offsets``); a request whose first terminal event
(``gateway.completed`` or ``engine.finished``) was acknowledged at or past that offset
was never read (a lone ``gateway.received`` read before it is dropped by the join, as at
its TTL), and one before it was read and must be stored. Malformed messages alike: one
dead letter per position read.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos_traffic import BAD_EVERY_S
from bench.common import REPO
from bench.results import Figure, at_most
from pipeline.contract.codec import DLQ_OFFSET, DLQ_PARTITION, DLQ_TOPIC_ID

# The worker's line when it finished a deleted generation (pipeline.adapters.generations).
_FINISHED = re.compile(
    r"finished from topic \S+'s generation (\S+): .*?read up to offsets (\{[^}]*\})"
)
Position = tuple[int, int, int]  # (topic generation, partition, offset)


def read_positions(log_text: str, topic_ids: Mapping[int, str]) -> dict[int, dict[int, int]]:
    """Per topic generation (by index in ``topic_ids``), per partition, the offset where
    the worker's reading stopped when it finished that generation (the furthest, when it
    finished it more than once), from its log."""
    gen_of = {tid: gen for gen, tid in topic_ids.items()}
    out: dict[int, dict[int, int]] = {}
    for tid, offsets in _FINISHED.findall(log_text):
        if tid not in gen_of:
            continue
        read = out.setdefault(gen_of[tid], {})
        for p, o in json.loads(offsets).items():
            read[int(p)] = max(read.get(int(p), 0), int(o))
    return out


def was_read(where: Position, current: int, read_to: Mapping[int, Mapping[int, int]]) -> bool:
    """Whether the worker read the message at ``where``: always on the current generation
    (it drained to the end), before the offset its reading stopped at on a deleted one
    (never, when it logged no finish of that generation: nothing of it was held)."""
    gen, p, offset = where
    if gen >= current:
        return True
    return offset < read_to.get(gen, {}).get(p, 0)


def split_missing(
    missing: Sequence[str],
    first_terminal: Mapping[str, Position],
    current: int,
    read_to: Mapping[int, Mapping[int, int]],
) -> tuple[list[str], list[str]]:
    """The missing requests as (lost: read by the worker, never read: their topic
    generation deleted before the worker read their first terminal event)."""
    lost: list[str] = []
    never: list[str] = []
    for rid in missing:
        where = first_terminal.get(rid, (current, 0, 0))
        (lost if was_read(where, current, read_to) else never).append(rid)
    return lost, never


@dataclass(frozen=True)
class Letters:
    """The malformed messages' positions against the dead letters."""

    acknowledged: int
    read: int  # of those, read by the worker (see was_read)
    one_each: int  # read, with exactly one letter
    unmatched: int  # letters at no malformed message's position
    letters: int


def match_letters(
    bad: Sequence[tuple[str, int, int]],
    letters: Sequence[dict[str, Any]],
    topic_ids: Mapping[int, str],
    current: int,
    read_to: Mapping[int, Mapping[int, int]],
) -> Letters:
    per_pos: dict[tuple[str, int, int], int] = {}
    for letter in letters:
        if DLQ_OFFSET in letter:
            key = (
                letter.get(DLQ_TOPIC_ID, ""),
                int(letter[DLQ_PARTITION]),
                int(letter[DLQ_OFFSET]),
            )
            per_pos[key] = per_pos.get(key, 0) + 1
    gen_of = {tid: gen for gen, tid in topic_ids.items()}
    read = [pos for pos in bad if was_read((gen_of.get(pos[0], current), pos[1], pos[2]),
                                           current, read_to)]  # fmt: skip
    return Letters(
        acknowledged=len(bad),
        read=len(read),
        one_each=sum(1 for pos in read if per_pos.get(pos, 0) == 1),
        unmatched=sum(c for pos, c in per_pos.items() if pos not in set(bad)),
        letters=len(letters),
    )


def store_checks(store_dir: Path, ids_file: Path) -> dict[str, Any]:
    """:mod:`tools.dev.fault_checks` over the stopped worker's store (a subprocess: chDB
    holds one data directory per process)."""
    out = subprocess.run(
        [sys.executable, "-m", "tools.dev.fault_checks", str(store_dir), "--ids", str(ids_file)],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=1200,
    )  # fmt: skip
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@dataclass(frozen=True)
class Ending:
    """What the run measured at its end, besides the store."""

    traffic_s: float
    rate: float
    received: int  # requests handed to the producer
    events_acked: int
    events_failed: int
    dropped: int  # by the producer
    failed: int  # by the producer, for good (a delivery error it did not send again)
    left: int  # undelivered at the end
    drained: bool
    drain_s: float
    drain_timeout_s: float
    baseline_s: float
    rc: int


def figures(
    end: Ending,
    doc: dict[str, Any],
    *,
    expected: int,
    lost: list[str],
    never: list[str],
    read_to: Mapping[int, Mapping[int, int]],
    letters: Letters,
) -> list[Figure]:
    eo, bounds, drift = doc["exactly_once"], doc["boundaries"], doc["rollup_drift"]
    diff_bounds = {b: v for b, v in bounds.items() if len(set(v)) > 1}
    stored = eo["stored"]
    kinds = "; ".join(f"{k or 'none'}: {n:,}" for k, n in doc.get("missing_read_kinds", {}).items())
    return [
        Figure(
            "requests acknowledged by the broker (delivery callbacks)",
            expected,
            "",
            note=f"{end.traffic_s / 60:.1f} min of traffic: "
            f"{end.received / end.traffic_s:,.0f} requests/s handed to the producer "
            f"(target {end.rate:,.0f}); {end.events_acked:,} lifecycle events "
            f"acknowledged; {end.events_failed:,} delivery errors reported, "
            f"{end.failed:,} of them for good (the rest sent again: the topic was gone); "
            f"{end.dropped:,} dropped by the producer, {end.left:,} undelivered at the end",
        ),
        at_most(
            "acknowledged requests read by the worker and missing from `requests`",
            len(lost),
            "",
            0,
            ", ".join(lost[:3]),
        ),
        Figure(
            "acknowledged requests never read: their topic was deleted first",
            len(never),
            "",
            note=f"first terminal event acknowledged at or past where the worker's reading "
            f"stopped on the deleted generation ({json.dumps(read_to)}); of all "
            f"{len(eo['missing']):,} missing, {len(doc['missing_read']):,} have raw events "
            f"stored, by kinds: {kinds or 'none'}",
        ),
        at_most("requests stored more than once", len(eo["twice"]), "", 0),
        at_most(
            "requests stored that were never acknowledged",
            len(eo["extra"]),
            "",
            0,
            ", ".join(eo["extra"][:3]),
        ),
        at_most(
            "window totals (`__slo__` records) minus stored requests",
            abs(eo["window_total"] - stored),
            "",
            0,
            f"{eo['window_total']:,} in windows, {stored:,} stored",
        ),
        at_most("windows written twice", eo["windows"] - eo["windows_distinct"], "", 0),
        at_most(
            "boundaries whose windows ≠ requests or rollups",
            len(diff_bounds),
            "",
            0,
            "; ".join(f"{b} windows/requests/1m/1h {v}" for b, v in diff_bounds.items())
            or f"{len(bounds)} boundaries equal",
        ),
        at_most(
            "rollups differing from their source",
            len(drift),
            "",
            0,
            "; ".join(f"{k} {v}" for k, v in drift.items()),
        ),
        Figure(
            "bad positions read by the worker with exactly one dead letter",
            letters.one_each,
            "",
            f"= {letters.read}",
            letters.one_each == letters.read,
            f"{letters.acknowledged} malformed messages acknowledged, "
            f"{letters.acknowledged - letters.read} of them never read (their topic deleted "
            f"first); {letters.letters} letters, {letters.unmatched} at no bad position",
        ),
        Figure(
            "time to drain (traffic stopped → every partition committed to its end)",
            end.drain_s,
            "s",
            f"≤ {end.drain_timeout_s:.0f} s",
            end.drained,
            f"steady delay produced → committed before the faults: {end.baseline_s:.0f} s "
            "(windows close after size + grace)",
        ),
        Figure("worker exit status at the end (SIGTERM)", end.rc, "", "= 0", end.rc == 0),
    ]


def run_text(
    rate: float, minutes: float, seed: int, *, kinds: Sequence[str], faults: int, loads: list[float]
) -> str:
    """What ran: the traffic, the faults' reading guide, the load."""
    loads = sorted(loads)
    load = (
        f" Load average (1 min) during the run: min {loads[0]:.1f}, median "
        f"{loads[len(loads) // 2]:.1f}, max {loads[-1]:.1f} on {os.cpu_count()} cores "
        "shared with other engineers' work."
        if loads
        else ""
    )
    return (
        f"Traffic: the simulator's events at {rate:,.0f} requests/s through "
        f"`open_kafka_sink` for {minutes:g} min, seed {seed}, faults "
        f"{', '.join(kinds) or 'none'}; one malformed message every {BAD_EVERY_S:.0f} s."
        f"{load} Faults ({faults}, in seeded order; 'caught up after': from the fault's end "
        "until the group committed the end offsets of that moment, which takes the steady "
        "delay above at least; the next fault waits for its trigger and for the worker to "
        "commit after the previous fault's end, not for that catch-up, so faults may "
        "overlap; 'peak lag': messages produced and not committed, from the fault's start "
        "to its catch-up):"
    )


def store_check_profile(store_dir: Path) -> tuple[str, str]:
    """``../shared/tools/store-check`` over the store (when that tool is there)."""
    sc = REPO.parent / "shared" / "tools" / "store-check"
    if not sc.exists():
        return ("store-check", f"not run: {sc} does not exist")
    r = subprocess.run(
        [str(sc), str(store_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=dict(os.environ, TG=str(Path(sys.executable).with_name("tailguard"))),
    )
    return (f"store-check (exit {r.returncode})", r.stdout + r.stderr)


def fault_table(done: Sequence[Any]) -> str:
    """The faults as fired (:class:`bench.chaos.Done`), one row each."""
    rows = ["| fault | at | acked then | held | caught up after | peak lag | notes |",
            "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for d in done:
        rec_s = "n/a" if d.recovered_s is None else f"{d.recovered_s:.1f} s"
        at = "—" if math.isnan(d.at_s) else f"{d.at_s / 60:.1f} min"
        held = "—" if math.isnan(d.held_s) else f"{d.held_s:.1f} s"
        rows.append(
            f"| {d.planned.kind} | {at} | {d.acked_at:,} | {held} | {rec_s} | "
            f"{d.peak_lag:,} | {'; '.join(d.notes)} |"
        )
    return "\n".join(rows)
