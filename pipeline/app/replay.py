"""``tailguard replay``: the same core as the worker, over a JSON Lines file.

Each line is one message (an event object or an array of events), exactly as
it would sit on the lifecycle topic. Time is the events' own event time; at
the end of the input everything still pending is resolved as if its timeout
had passed, and every window is closed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from pipeline.contract.boundaries import BOUNDARIES
from pipeline.contract.codec import DeadLetter, SourceRef, dead_letter_record
from pipeline.contract.summary import StatsSample
from pipeline.core.budget import BudgetStatus
from pipeline.core.control import Controller, ControlLoop, ControlStep, build_control_loop
from pipeline.core.eventtime import ClockConfig
from pipeline.core.join import JoinConfig
from pipeline.core.policy import Evaluation
from pipeline.core.processor import Output, StreamProcessor
from pipeline.core.record import RequestRecord
from pipeline.core.sketch import QuantileSketch
from pipeline.core.skew import SkewEstimator
from pipeline.core.slo import SLOEvaluator
from pipeline.core.slo_windows import WindowSLOCounts
from pipeline.core.summary import summarize
from pipeline.core.windows import ClosedWindow, WindowConfig
from pipeline.spec.burn_rules import BurnRules, load_burn_rules_file
from pipeline.spec.policy import ControlPolicy
from pipeline.spec.slo import SLOSpec

if TYPE_CHECKING:
    from pipeline.adapters.store import WritableStore
    from pipeline.settings import Settings

REPLAY_QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}


@dataclass
class _ControlRun:
    """Drives the controller in event time through the core's one control path
    (:class:`pipeline.core.control.ControlLoop`): one evaluation per closed base window."""

    loop: ControlLoop
    relative_accuracy: float
    transitions: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    # What a worker would issue, in order: changes, and changes of what holds a level.
    decisions: list[Evaluation] = field(default_factory=list)
    last: ControlStep | None = None
    # Burns that were not load-caused (alerted, nothing shed): one entry per streak.
    notices: list[dict[str, Any]] = field(default_factory=list)
    _noticed: dict[str, str] = field(default_factory=dict)

    corrections: int = 0
    evaluations: int = 0
    _final_budgets: list[BudgetStatus] | None = None

    @classmethod
    def build(
        cls,
        policy: ControlPolicy,
        spec: SLOSpec | None,
        burn_rules: BurnRules | None,
        window_config: WindowConfig,
        *,
        queue_capacity: int,
        gateway_instances: int,
    ) -> _ControlRun:
        """The control loop of ``replay`` and the backtest: the core's one assembly
        (:func:`pipeline.core.control.build_control_loop`, the worker's), on windows of
        ``window_config``; ``burn_rules`` None: the shipped rules."""
        loop = build_control_loop(
            policy,
            spec,
            burn_rules or load_burn_rules_file(),
            size_ms=window_config.size_ms,
            grace_ms=window_config.grace_ms,
            queue_capacity=queue_capacity,
            gateway_instances=gateway_instances,
        )
        return cls(loop, window_config.relative_accuracy)

    @property
    def controller(self) -> Controller:
        return self.loop.controller

    def feed(self, out: Output) -> None:
        for st in out.stats:
            self.loop.add(StatsSample.of(st))
        for w in out.windows:
            if w.correction:
                # Budgets count it; no evaluation is due (the window was decided on).
                self.corrections += 1
                cid = f"replay-{self.corrections}"
                self.loop.add(summarize(w, self.relative_accuracy, correction_id=cid))
                continue
            self.loop.add(summarize(w, self.relative_accuracy))
            self.loop.clock.closed(w.start_ms + w.size_ms)
            for step in self.loop.step():
                self._take(step)

    def final_budgets(self) -> list[BudgetStatus]:
        """The budgets at the last evaluation with every window counted: the decisions
        read them ``budget_lag_ms`` behind, a report of the whole input reads them all."""
        if self._final_budgets is None:
            book, last = self.controller.book, self.last
            self._final_budgets = [] if book is None or last is None else book.evaluate(last.now_ms)
        return self._final_budgets

    def _take(self, step: ControlStep) -> None:
        self.evaluations += 1
        self.last = step
        for d in self.loop.announce(step):
            self.decisions.append(d)
            if d.changed:
                self.transitions.append(
                    {
                        "ts_unix_ns": step.now_ms * 1_000_000,
                        "scope": d.scope,
                        "level": d.level,
                        "phase": d.phase,
                        "reason": d.reason,
                    }
                )
        self.events.extend(e.to_json() for e in step.events)
        now = {n.model: n for n in step.notices}
        for model, n in now.items():
            if self._noticed.get(model) != n.slo:
                self.notices.append(n.to_json())
        self._noticed = {m: n.slo for m, n in now.items()}


@dataclass
class ReplayResult:
    spec: SLOSpec | None
    relative_accuracy: float
    control: _ControlRun | None = None
    queue_capacity: int = 64
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> serving figures
    # final version per request attempt (request id, attempt)
    records: dict[tuple[str, int], RequestRecord] = field(default_factory=dict)
    emitted: list[RequestRecord] = field(default_factory=list)  # every record, in emission order
    windows: list[ClosedWindow] = field(default_factory=list)
    dead_letters: int = 0
    counters: dict[str, Any] = field(default_factory=dict)

    def _take(self, out: Output) -> None:
        self.emitted.extend(out.records)
        for r in out.records:
            key = (r.request_id, r.attempt)
            prev = self.records.get(key)
            if prev is None or r.version >= prev.version:
                self.records[key] = r
        self.windows.extend(out.windows)
        self.dead_letters += len(out.dead)
        for st in out.stats:
            e = self.engines.setdefault(
                st.host,
                {"model": st.model, "samples": 0, "max_queue_saturation": 0.0,
                 "hit_sum": 0.0, "hit_n": 0, "max_gpu_memory_fraction": None},
            )  # fmt: skip
            e["samples"] += 1
            e["max_queue_saturation"] = max(
                e["max_queue_saturation"], st.num_waiting / self.queue_capacity
            )
            if st.prefix_cache_hit_rate is not None:
                e["hit_sum"] += st.prefix_cache_hit_rate
                e["hit_n"] += 1
            if st.gpu_memory_used_fraction is not None:
                g = e["max_gpu_memory_fraction"]
                e["max_gpu_memory_fraction"] = max(g or 0.0, st.gpu_memory_used_fraction)

    def summary(self) -> dict[str, Any]:
        sketches = {b: QuantileSketch(self.relative_accuracy) for b in BOUNDARIES}
        values: dict[str, list[float]] = {b: [] for b in BOUNDARIES}
        outcomes: dict[str, int] = {}
        skew = SkewEstimator()
        evaluator = SLOEvaluator(self.spec) if self.spec is not None else None
        for r in self.records.values():
            for b in BOUNDARIES:
                v = r.boundary(b)
                if v is not None:
                    values[b].append(v)
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
            skew.add(r)
            if evaluator is not None:
                evaluator.add(r)
        boundaries: dict[str, Any] = {}
        for b in BOUNDARIES:
            sk = sketches[b]
            sk.add_many(values[b])
            entry: dict[str, Any] = {"count": sk.count}
            for name, q in REPLAY_QUANTILES.items():
                entry[name] = sk.quantile(q)
            boundaries[b] = entry
        out: dict[str, Any] = {
            "requests": len(self.records),
            "dead_letters": self.dead_letters,
            "aborts": outcomes.get("client_abort", 0),
            "outcomes": dict(sorted(outcomes.items())),
            "boundaries": boundaries,
            "quantiles": {
                "method": "DDSketch",
                "relative_accuracy": self.relative_accuracy,
            },
        }
        if evaluator is not None:
            slo_json = evaluator.to_json()
            out["slos"] = {
                name: {"total": v["total"], "good": v["good"], "compliance": v["compliance"]}
                for name, v in slo_json["slos"].items()
            }
            blended = slo_json.get("blended")
            out["blended"] = {"compliance": blended["compliance"] if blended else None}
            out["slo_details"] = slo_json
        out["windows"] = {
            "closed": sum(1 for w in self.windows if not w.correction),
            "corrections": sum(1 for w in self.windows if w.correction),
            **self.counters.get("windows", {}),
        }
        out["clock_skew"] = skew.report()
        out["serving"] = self._serving()
        if self.control is not None:
            out["control"] = self.control.transitions
            # every directive a worker would issue and audit (changes, and changes of what
            # holds a level): what the control_signals table and its dashboard panel hold
            out["directives"] = [
                {"ts_unix_ns": d.now_ms * 1_000_000, "scope": d.scope, "level": d.level,
                 "phase": d.phase, "reason": d.reason}
                for d in self.control.decisions
            ]  # fmt: skip
            out["budget_events"] = self.control.events
            out["budgets"] = {
                st.slo: {
                    "remaining_fraction": st.remaining_fraction,
                    "consumed": st.consumed,
                    "allowed": st.allowed,
                    # how the allowance was obtained (pipeline/core/budget.py, "Allowance")
                    "observed_allowed": st.observed_allowed,
                    "observed_ms": st.observed_ms,
                    "period_ms": st.period_ms,
                    "allowance_basis": st.allowance_basis,
                    "burn_rates": dict(st.burn_rates),
                    "alerts": [a.rule for a in st.alerts],
                    "window": st.window,
                }
                for st in self.control.final_budgets()
            }
        out["join"] = self.counters.get("join", {})
        out["flags"] = self.counters.get("flags", {})  # contradictory records, per flag
        return out

    def _serving(self) -> dict[str, Any]:
        """Per model: queue/compute ratio (Σ inference / Σ gateway total; < 0.3 means
        queueing dominates); per engine: queue saturation, KV-cache hit rate, GPU memory."""
        sums: dict[str, list[float]] = {}
        for r in self.records.values():
            if r.inference_ms is not None and r.gateway_total_ms is not None:
                acc = sums.setdefault(r.model, [0.0, 0.0])
                acc[0] += r.inference_ms
                acc[1] += r.gateway_total_ms
        models = {
            m: {"queue_compute_ratio": inf / tot if tot else None}
            for m, (inf, tot) in sorted(sums.items())
        }
        engines = {
            host: {
                "model": e["model"],
                "samples": e["samples"],
                "max_queue_saturation": e["max_queue_saturation"],
                "mean_kv_cache_hit_rate": e["hit_sum"] / e["hit_n"] if e["hit_n"] else None,
                "max_gpu_memory_fraction": e["max_gpu_memory_fraction"],
            }
            for host, e in sorted(self.engines.items())
        }
        return {"queue_capacity": self.queue_capacity, "models": models, "engines": engines}


def _lines(fh: IO[bytes]) -> Iterator[tuple[int, int, bytes]]:
    for lineno, line in enumerate(fh, start=1):
        raw = line.rstrip(b"\r\n")
        if raw.strip():
            yield (0, lineno, raw)


def replay_file(
    path: Path,
    join_config: JoinConfig | None = None,
    *,
    spec: SLOSpec | None = None,
    window_config: WindowConfig | None = None,
    policy: ControlPolicy | None = None,
    burn_rules: BurnRules | None = None,
    queue_capacity: int = 64,
    gateway_instances: int = 1,
    dlq_out: IO[bytes] | None = None,
    chunk: int = 1000,
    clock_config: ClockConfig | None = None,
    ledger: dict[str, int] | None = None,
) -> ReplayResult:
    """Replay a file; ``chunk`` lines are processed at a time (the results do not depend
    on it). ``ledger``: requests already counted by the store (a file replayed before).
    ``queue_capacity``, ``gateway_instances``: the controller's, as the worker's."""
    wc = window_config or WindowConfig()
    proc = StreamProcessor(
        str(path),
        join_config,
        window_config=wc,
        clock_config=clock_config,
        slo_factory=(lambda: WindowSLOCounts(spec)) if spec is not None else None,
    )
    proc.init_partition(0, ledger, seed_join=False)
    result = ReplayResult(spec, wc.relative_accuracy, queue_capacity=queue_capacity)
    if policy is not None:
        result.control = _ControlRun.build(
            policy,
            spec,
            burn_rules,
            wc,
            queue_capacity=queue_capacity,
            gateway_instances=gateway_instances,
        )
    with path.open("rb") as fh:
        batch: list[tuple[int, int, bytes]] = []
        for msg in _lines(fh):
            batch.append(msg)
            if len(batch) >= chunk:
                _feed(proc, batch, result, dlq_out)
                batch = []
        _feed(proc, batch, result, dlq_out)
    # End of input: events still held ahead of the clock are quarantined here; they are
    # dead letters like any other (counted and written with their reason).
    _take(proc.drain(), result, dlq_out)
    j = proc.join_counters()
    w, c = proc.window_counters(), proc.counters
    result.counters = {
        "join": {name: getattr(j, name) for name in j.__slots__},
        "windows": {
            "corrected_records": w.corrected,
            "retracted_records": w.retracted,
            "quarantined_events": c.quarantined,
            "flagged_records": c.flagged,
            "replayed_records": c.replayed,
            # records of requests the join had forgotten that windows counted already
            "counted_before_records": c.beyond_memory,
        },
        "flags": dict(sorted(c.by_flag.items())),
    }
    return result


def _feed(
    proc: StreamProcessor,
    batch: list[tuple[int, int, bytes]],
    result: ReplayResult,
    dlq_out: IO[bytes] | None,
) -> None:
    _take(proc.process(batch, wall_ms=None), result, dlq_out)  # event time only in a replay


def _take(out: Output, result: ReplayResult, dlq_out: IO[bytes] | None) -> None:
    """One output of the processor: into the result, the control run and the DLQ file
    (every dead letter the result counts is a line of the file)."""
    result._take(out)
    if result.control is not None:
        result.control.feed(out)
    if dlq_out is not None:
        for d in out.dead:
            dlq_out.write(orjson.dumps(dead_letter_record(d)) + b"\n")


def replay_topic(path: Path) -> str:
    """The topic a replayed file's rows are stored under (its ledger's, its windows')."""
    return f"replay:{path.name}"


def run_replay(
    events: Path,
    settings: Settings,
    *,
    spec: SLOSpec | None,
    policy: ControlPolicy | None,
    burn_rules: BurnRules | None,
    dlq_path: Path,
    store: bool,
) -> dict[str, Any]:
    """``tailguard replay``: replay ``events``, dead letters to ``dlq_path``; with
    ``store``, write what it built into the settings' store as a worker writes a flush
    (:func:`store_replay`). Returns the summary."""
    topic = replay_topic(events)
    ledger: dict[str, int] = {}
    opened = None
    if store:
        from pipeline.adapters.queries.windows import read_ledger
        from pipeline.adapters.store import open_for_writing

        opened = open_for_writing(settings)
        # A second replay of the same file into this store counts nothing twice.
        ledger = read_ledger(opened.store, topic, 0, -1)
    with dlq_path.open("wb") as dlq:
        result = replay_file(
            events,
            settings.join_config(),
            spec=spec,
            window_config=settings.window_config(),
            clock_config=settings.clock_config(),
            policy=policy,
            burn_rules=burn_rules,
            queue_capacity=settings.queue_capacity,
            gateway_instances=settings.gateway_instances,
            dlq_out=dlq,
            ledger=ledger,
        )
    summary = result.summary()
    summary["dlq_file"] = str(dlq_path)
    if opened is not None:
        try:
            rejected = store_replay(opened, result, topic, settings.window_config())
        finally:
            opened.store.close()
        if rejected:
            with dlq_path.open("ab") as fh:  # each is a line of the DLQ file
                for d in rejected:
                    letter = dataclasses.replace(d, source=SourceRef(events.name, 0, -1))
                    fh.write(orjson.dumps(dead_letter_record(letter)) + b"\n")
            summary["store_rejected"] = len(rejected)
            summary["dead_letters"] += len(rejected)
        summary["windows"]["written"] = len(result.windows)
        summary["store"] = str(settings.store_dir)
    return summary


def store_replay(
    opened: WritableStore, result: ReplayResult, topic: str, window_config: WindowConfig
) -> list[DeadLetter]:
    """Write a replay's records, windows (with their ledger, covering its one partition)
    and control audit through the worker's writer, in the worker's order
    (:class:`pipeline.adapters.flush.FlushWriter`; a check of the rollups the opening
    put off runs after the first write of windows, as the worker's); the records the
    store rejected, as dead letters (the rest is written; the store is local: no
    retries)."""
    from pipeline.adapters.controller import replay_audit_rows
    from pipeline.adapters.flush import Flush, FlushWriter
    from pipeline.adapters.store import is_data_error, with_retry

    rejected: list[DeadLetter] = []
    writer = FlushWriter(
        opened.store,
        "replay",
        topic,
        window_config.relative_accuracy,
        retry=lambda fn, what: with_retry(fn, what, attempts=1, fatal=is_data_error),
        dead_rows=rejected.extend,
        rollups_unchecked=opened.rollups_unchecked,
    )
    writer.write(Flush(result.emitted, result.windows, through={0: 1}))
    if result.control is not None:  # the control audit, as a worker writes it
        writer.write_audit(*replay_audit_rows(result.control.decisions, result.control.events))
    return rejected
