"""In-process CPU cost of the join alone (``pipeline.core.join.Joiner``) per event.

Runs ``StreamProcessor.process`` once over the ``core_speed`` workload with every call it
makes to its joiners recorded (events, offsets, clocks, in order), then replays those
calls against fresh joiners and reports CPU µs per event (``time.process_time``, the
median of ``--repeat`` replays) with a digest of everything the join returned (records,
counters, safe offsets): the same digest before and after a change means the same
records, counters and offsets.

    PYTHONPATH=$PWD python -m bench.join_speed [--instances 4] [--repeat 5] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import importlib.util
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from bench.core_speed import load
from pipeline.core import processor
from pipeline.core.join import JoinConfig, Joiner
from pipeline.settings import Settings

Call = tuple[Any, ...]


def record_trace(msgs: list[tuple[int, int, bytes]]) -> tuple[list[Call], JoinConfig, int]:
    """The processor's joiner calls over the messages, in order, and the event count."""
    calls: list[Call] = []

    class Recording(Joiner):
        def add_emitted(self, event: Any, offset: int, wall_ms: Any = None, now_ms: int = 0):  # type: ignore[no-untyped-def]
            calls.append(("add", id(self), event, offset, wall_ms, now_ms))
            return super().add_emitted(event, offset, wall_ms, now_ms)

        def advance_emitted(self, now_ms: int, wall_ms: Any = None):  # type: ignore[no-untyped-def]
            calls.append(("adv", id(self), now_ms, wall_ms))
            return super().advance_emitted(now_ms, wall_ms)

        def oldest_terminal_ms(self):  # type: ignore[no-untyped-def]
            calls.append(("old", id(self)))
            return super().oldest_terminal_ms()

        def oldest_terminal_before(self, bound_ms: int):  # type: ignore[no-untyped-def]
            calls.append(("before", id(self), bound_ms))
            return super().oldest_terminal_before(bound_ms)

        def evict(self, n: int) -> None:
            calls.append(("evict", id(self), n))
            super().evict(n)

        def drain_emitted(self):  # type: ignore[no-untyped-def]
            calls.append(("drain", id(self)))
            return super().drain_emitted()

    s = Settings()
    processor.Joiner = Recording  # type: ignore[misc]  # what the processor builds
    try:
        proc = processor.StreamProcessor(
            s.lifecycle_topic, s.join_config(), max_message_bytes=s.max_message_bytes,
            window_config=s.window_config(), keep_events=False,
        )  # fmt: skip
        for i in range(0, len(msgs), 1000):
            proc.process(msgs[i : i + 1000], None)
        proc.drain()
    finally:
        processor.Joiner = Joiner  # type: ignore[misc]
    # Joiner ids -> small ints (the recording joiners are gone after this)
    ids: dict[int, int] = {}
    out = [(c[0], ids.setdefault(c[1], len(ids)), *c[2:]) for c in calls]
    return out, s.join_config(), proc.counters.events


def replay(
    calls: list[Call], config: JoinConfig, digest: bool = False, joiner: Any = Joiner
) -> tuple[float, str]:
    """CPU seconds the joiner calls take (and, with ``digest``, a hash of their results)."""
    joiners: dict[int, Any] = {}
    results: list[Any] = []
    keep = results.append if digest else None
    t = time.process_time()
    for c in calls:
        j = joiners.get(c[1])
        if j is None:
            j = joiners[c[1]] = joiner(config)
        op = c[0]
        if op == "add":
            r: Any = j.add_emitted(c[2], c[3], c[4], c[5])
        elif op == "adv":
            r = j.advance_emitted(c[2], c[3])
        elif op == "old":
            r = j.oldest_terminal_ms()
        elif op == "before":
            r = j.oldest_terminal_before(c[2])
        elif op == "evict":
            r = j.evict(c[2])
        else:
            r = j.drain_emitted()
        if keep is not None:
            keep(r)
            if op == "add":
                keep(j.safe_offset(c[3] + 1))
    elapsed = time.process_time() - t
    if not digest:
        return elapsed, ""
    h = hashlib.sha256()
    enc = msgspec.json.Encoder()
    for r in results:
        items = r if isinstance(r, list) else [r]
        for e in items:
            if e is None or isinstance(e, int):
                h.update(repr(e).encode())
            else:
                prev = None if e.previous is None else enc.encode(e.previous)
                h.update(enc.encode(e.record))
                h.update(repr((e.first_offset, e.upgrade, prev)).encode())
        h.update(b"|")
    for k in sorted(joiners):
        h.update(repr(joiners[k].counters).encode())
    return elapsed, h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--instances", type=int, default=4, help="x ~58k events")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile one replay")
    ap.add_argument(
        "--against", type=Path, metavar="JOIN_PY",
        help="also replay another version of join.py (e.g. main's, from git show), "
        "interleaved with this one (the same load on both)",
    )  # fmt: skip
    args = ap.parse_args()
    msgs, _ = load(args.instances)
    calls, config, n = record_trace(msgs)
    adds = sum(1 for c in calls if c[0] == "add")
    print(f"events={n} join_calls={len(calls)} adds={adds}")
    versions: dict[str, Any] = {"this": Joiner}
    if args.against is not None:
        spec = importlib.util.spec_from_file_location("_join_against", args.against)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        versions["against"] = module.Joiner
    times: dict[str, list[float]] = {name: [] for name in versions}
    for _ in range(args.repeat):
        for name, cls in versions.items():
            times[name].append(replay(calls, config, joiner=cls)[0])
    for name, cls in versions.items():
        _, digest = replay(calls, config, digest=True, joiner=cls)
        ts = times[name]
        print(
            f"{name}: digest={digest} join_us_per_event="
            f"{statistics.median(ts) / n * 1e6:.2f} (min {min(ts) / n * 1e6:.2f})"
        )
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        replay(calls, config)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
