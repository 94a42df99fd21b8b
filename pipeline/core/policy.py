"""Control policies (``apiVersion: tailguard/v1``, ``kind: ControlPolicy``): when to degrade.

Pure: plain values (no files, no Kafka, Faust or ClickHouse); the policy file
itself is :mod:`pipeline.spec.policy`. Time is passed in as integer milliseconds and nothing reads a
clock. The stream worker computes a flat mapping of *signals* per scope
(usually per model) every evaluation and asks :class:`PolicyEngine` for an
:class:`Evaluation`, whose :class:`~pipeline.contract.control_signal.Decision` (the
one decision type, signed as is onto the control topic) says the degradation
level (0 = normal, L1..L3), the actions the serving layer should apply, and
why. ``specs/policy-default.yaml`` adapts the source documents'
circuit-breaker table (``specs/policy-example.yaml``: L1 P99 > 300 ms for
5 min, L2 KV-cache hit rate < 80 %, L3 GPU memory > 95 %) to LLM serving.

Signals
-------
``Mapping[str, float | int | bool | None]``. Names a policy may use (anything
else is a spec error):

* ``p99.<boundary>`` for every boundary of
  :data:`pipeline.core.record.BOUNDARIES` (``p99.gateway_total_ms``,
  ``p99.queue_ms``, ...): the P99 over the last minute, in ms.
* ``compliance_5m.<slo-name>``: share of good requests of that SLO over the
  last 5 minutes (0..1).
* ``kv_cache_hit_rate`` (0..1), ``queue_saturation`` (waiting / capacity,
  0..1 and above), ``gpu_memory_fraction`` (0..1), ``queue_compute_ratio``
  (inference time / gateway total time; < 0.3 = queueing is the bottleneck).
* Booleans: ``burn.page`` / ``burn.ticket`` (a burn-rate alert of that
  severity fires for any SLO), ``budget_exhausted``.

``budget_exhausted`` may not appear in a condition: an exhausted error budget
is *not* a reason to degrade. It is passed through to every decision
(``Decision.budget_exhausted``, true only when the signal is ``True``),
without changing the level.

**Unknown signals.** A signal that is missing, ``None``, NaN/infinite, or of
the wrong type (a bool for a numeric signal, a number for a boolean one) is
*unknown*. Every signal may be missing: a gateway-only deployment has no engine
signals, engines without our stats plugin give no ``queue.depth_ratio`` or GPU
memory, a plugin may die mid-level. The rules:

* A condition on an unknown signal does not hold *now*, and it resets that
  condition's continuous-hold clock: ``for: 5m`` means five minutes of
  observations that all satisfied the comparison; a gap in the evidence is not
  evidence. So an unknown signal never triggers an ``enter`` condition and never
  a half-open relapse (no false alarm from a missing signal).
* An ``exit`` condition that has not been observed false for its whole window --
  at least its ``for`` and at least ``min_dwell``: every evaluation in it either
  held it or lacked its signal (a single false observation restarts that count) --
  holds when its signal is measured now, and is *waived* when it is unknown now:
  the level leaves on the exit conditions whose signals are measured, and the
  reason names what it lacked ("L1 exit holds (load.burning is false for 2m ...;
  queue.depth_ratio unknown since T) ...", "... unknown at times since T"). So a
  signal that is unknown for part of the window and then shows the cause gone
  counts as much as one unknown throughout, never less (before, the first known
  observation restarted the 2 minutes: a gateway-only level whose burn was of
  unknown cause for a minute after the overload, then not load-caused, waited 3).
  A short gap (a lost sample, an engine restart) waives nothing, and a condition
  measured only part of its window needs at least ``min_dwell``. The one exception is
  the pre-admission exit of a level that turns traffic away (below): it needs its
  ``for`` on measured observations.
* *Blind exits.* When no exit condition of the level is measured, or the level
  turns traffic away and its exit on a signal measured before admission
  (``PRE_ADMISSION_SIGNALS``: ``load.demand_ratio``, every arrival, refused ones
  included) is unknown, what remains cannot show that the cause has gone (the
  queue and the burn of admitted traffic are kept low by the level's own
  refusals). The level is then held, with the hold "exit not measured", until
  its ``max_duration``, and leaves from there as an exit would (L1 through
  half-open, whose probe relapses on the entry seen again). Past
  ``max_duration`` an exit condition unknown right now is waived too, so a
  signal that flickers between unknown and failing holds a level at most its
  ``max_duration``.
* Coherent exit and half-open: an opener whose signal is unknown is not "still
  measured", so it neither blocks the exit nor makes a half-open relapse; a
  half-open probe relapses only on an entry (or opener) observed true. The blind
  rule above is what keeps a level whose evidence has gone dark from leaving early.

Why this changed (issue 47). Before, an unknown signal never let an ``exit``
condition hold, on the grounds that a degraded scope should stay degraded
without evidence. Measured, that made a missing signal hold a level forever: a
replay of an overload with gateway and ``engine.finished`` events only (no
``engine.stats``) entered L1 and held it (then L2) to the end of the hour on
``queue.depth_ratio unknown``, turning traffic away for 30 minutes after the
queue had gone. Holding protection that costs users on no evidence is not the
safe side; leaving on the evidence that exists is, provided that evidence
includes the demand before admission (or max_duration has passed).

Conditions
----------
``{signal, op: > | >= | < | <=, value, for: 5m}`` (``for`` defaults to
``0s``) or, for a boolean signal, ``{signal, is: true|false, for}``. The
engine tracks per condition and scope since when the comparison has held on
every evaluation (the first evaluation that observed it true); the condition
*holds* at ``now`` when the comparison holds now and
``now - since >= for``. So with a 10 s cadence and ``for: 5m``, a comparison
first seen true at t = 0 holds from the evaluation at t = 300 s on, not before.
A false or unknown observation resets the clock.

Levels
------
Three levels, L1 < L2 < L3, each with:

* ``enter``: the level is entered when ANY of its conditions holds;
* ``exit``: it may be left only when ALL of its conditions hold. Hysteresis is
  validated: for every signal used in both lists, each exit condition must
  point the other way from each entry condition on that signal, with a
  threshold strictly on the safe side (entry ``> 300`` needs exit ``< T`` or
  ``<= T`` with ``T < 300``; entry ``is: true`` needs exit ``is: false``);
* ``max_duration``: held that long, the level escalates one level;
* ``notify_customer``; ``actions`` (see :class:`ActionsSpec`).

State machine (per scope)
-------------------------
A scope is in one of: level 0 / phase ``normal``; level 1..3 / phase
``degraded``; or level 1 / phase ``half_open`` (leaving L1: L1's actions stay
in force, except that ``admit_fraction`` of the traffic L1 would shed is
admitted). ``since_ms`` is when the current (level, phase) began. At every
evaluation, after updating the condition clocks, with ``entered`` = the highest
level whose ``enter`` holds (0 if none), exactly one rule applies:

1. **half_open**: if ``entered >= 1``, or any L1 ``enter`` comparison holds
   *right now* (ignoring its ``for``: a half-open phase is a probe, and a probe
   that sees the trouble again has failed) -> **relapse**: straight to
   ``max(1, entered)``, phase ``degraded`` (no dwell). Otherwise, once
   ``half_open.duration`` has passed since it began -> level 0, ``normal``.
   (L1's ``exit`` is not re-checked during half-open.)
2. **step up**: ``entered > level`` -> ``entered`` at once (higher levels win;
   stepping up is never delayed).
3. **step down** (degraded only): ``entered < level`` and every ``exit``
   condition of the current level holds and ``min_dwell`` has passed since
   ``since_ms`` -> one level down (``step_down: one``); from L1 that is
   ``half_open``, not 0.
4. **max duration** (degraded only): the level has been held (since
   ``since_ms``) for at least its ``max_duration`` -> one level up, with
   ``escalated_by_max_duration`` and ``notify_customer`` set for as long as
   the scope stays at the escalated level. At L3 there is no higher level:
   the scope stays at L3 with ``overdue`` and ``notify_customer`` set.
   Rule 3 is checked first: a level whose exit holds steps down rather than
   escalate. The max-duration clock restarts with every entry into a
   degraded level, a relapse included.
5. otherwise the state stays.

**Coherent exit.** The (non-alert) conditions whose holding raised a scope into its
current degraded level -- its entry, a relapse's probe, or the lower level's entry
that an escalation by ``max_duration`` could not cure -- are its *openers*. Rule 3
needs, besides the level's ``exit``, that no opener's comparison holds right now
(ignoring its ``for``): a level opened by one signal is not left on another's exit,
and an escalated level does not step back down to the level that failed while the
cause is still measured. In half-open an opener observed again is a relapse (rule 1).

**Load gate** (``dynamics.load_gate``). A level whose actions turn traffic away
(shed, reject new sessions, rate limit, admission) is entered, and kept as
justified by its entry, only while the signal ``load.caused`` is true (the burn is
load-caused: :mod:`pipeline.core.control`); an entry that holds without it is
reported in the reason ("... but the burn is not load-caused: nothing shed") and
the state stays. A half-open probe relapses only on a load-caused burn.

``notify_customer`` on a decision = the level's ``notify_customer`` (L1's in
half-open) or escalated or overdue. ``changed`` is true on the evaluation at
which (level, phase) changed.

Transitions per hour (flapping bound)
-------------------------------------
Order the states by severity: normal 0 < half_open 1 < L1 2 < L2 3 < L3 4.
Step-ups and relapses raise the severity and are immediate; every other
transition (a step down, the start or end of half-open, an escalation) needs
at least ``D = min(min_dwell, half_open.duration)`` since the previous
transition (``max_duration >= min_dwell`` is validated). Slow transitions are
therefore at least ``D`` apart: at most ``ceil(W / D)`` in any window of
length ``W``. Only the ``d`` step-downs lower the severity (by 1 each), it
ranges over 0..4, and each immediate transition raises it by at least 1, so
there are at most ``d + 4`` immediate ones::

    transitions in any window W  <=  2 * ceil(W / D) + 4

(:meth:`ControlPolicy.transition_bound`). The ``for`` durations of the
conditions only lengthen gaps (a relapse on a signal that also has an exit
condition resets that exit's clock), so the bound holds whatever they are;
a policy with D = 5 min gives at most 28 per hour (the shipped default, D = 90 s:
84). A policy may state ``dynamics.max_transitions_per_hour``; it is documentation
checked against
this bound (it must not promise fewer), never enforced at run time.

Scopes
------
Per scope the state is fixed-size (one clock per condition and the current
level). At most ``max_scopes`` scopes are kept; beyond that, the least
recently evaluated scope at level 0 is forgotten (if every scope is degraded,
the least recently evaluated one). A forgotten scope starts again at level 0.
Evaluations of one scope must come in non-decreasing ``now_ms`` order.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Generic, TypeVar, cast, overload

from pipeline.contract.control_signal import (
    MAX_FIGURES,
    REASON_MAX_CHARS,
    Actions,
    Decision,
    Phase,
)
from pipeline.spec.durations import format_ms
from pipeline.spec.policy import (
    ALERT_SIGNALS,
    BUDGET_SIGNAL,
    LEVELS,
    LOAD_SIGNAL,
    OPS,
    PRE_ADMISSION_SIGNALS,
    Condition,
    ControlPolicy,
    Level,
    num_text,
)

T = TypeVar("T")
SignalValue = float | int | bool | None
Signals = Mapping[str, SignalValue]


# --------------------------------------------------------------------------- #
# Decisions
# --------------------------------------------------------------------------- #


NO_ACTIONS: Final = Actions()


class _FromDecision(Generic[T]):
    """A read-only field of :class:`Evaluation` read through to its ``decision``."""

    __slots__ = ("name",)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _FromDecision[T]: ...
    @overload
    def __get__(self, obj: Evaluation, owner: type | None = None) -> T: ...
    def __get__(self, obj: Evaluation | None, owner: type | None = None) -> _FromDecision[T] | T:
        if obj is None:
            return self
        return cast("T", getattr(obj.decision, self.name))

    def __set__(self, obj: Evaluation, value: T) -> None:
        raise AttributeError(f"{self.name} is the decision's; it cannot be set")


@dataclass(frozen=True)  # not slotted: its read-through properties stay read-only
class Evaluation:
    """One evaluation of a scope: the :class:`~pipeline.contract.control_signal.Decision`
    (level, phase, actions, reason, figures, notify_customer, budget_exhausted: the
    one decision type, which a control signal carries as is) and the state
    machine's bookkeeping around it (see the module docstring for the rules).

    The decision's fields are readable here too (``e.level`` is ``e.decision.level``);
    they are defined once, on ``Decision``.
    """

    scope: str
    now_ms: int
    decision: Decision
    changed: bool  # (level, phase) changed at this evaluation
    since_ms: int  # when the current (level, phase) began
    escalated_by_max_duration: bool  # this level was reached by a max_duration escalation
    overdue: bool  # held past its max_duration without escalating (L3, or entry gone)
    previous_level: int
    previous_phase: Phase
    # On an evaluation that keeps a degraded or half-open state: what keeps it (texts such
    # as "p99.ttft_engine_ms 4120 >= 2500 (needs < 2500 for 3m)", "min_dwell (2m of 5m)").
    holds: tuple[Hold, ...] = ()

    level = _FromDecision[int]()
    phase = _FromDecision[Phase]()
    actions = _FromDecision[Actions]()
    reason = _FromDecision[str]()
    notify_customer = _FromDecision[bool]()
    budget_exhausted = _FromDecision[bool]()  # passed through; never changes the level

    @property
    def held_because(self) -> tuple[str, ...]:
        return tuple(h.text for h in self.holds)

    @property
    def figures(self) -> Mapping[str, float | bool | None]:
        return MappingProxyType(self.decision.figures)

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "now_ms": self.now_ms,
            "level": self.level,
            "phase": self.phase,
            "actions": self.actions.to_json(),
            "reason": self.reason,
            "figures": dict(self.figures),
            "changed": self.changed,
            "since_ms": self.since_ms,
            "notify_customer": self.notify_customer,
            "budget_exhausted": self.budget_exhausted,
            "escalated_by_max_duration": self.escalated_by_max_duration,
            "overdue": self.overdue,
            "previous_level": self.previous_level,
            "previous_phase": self.previous_phase,
            "held_because": list(self.held_because),
        }


@dataclass(frozen=True, slots=True)
class Hold:
    """One reason a level is kept, as data: ``key`` names it without its running value
    or time (a directive is re-issued when the set of keys changes, not every tick:
    ``pipeline.core.control.held_key``); ``text`` says it to a person."""

    key: str  # e.g. "entry p99.x > 300", "p99.x >= 250", "half-open", "min_dwell"
    text: str  # e.g. "entry p99.x 412 > 300 (3m of 5m)", "min_dwell (1m of 5m)"


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of (level, phase) of a scope, for replay and audit."""

    ts_ms: int
    scope: str
    level: int
    phase: Phase
    reason: str
    figures: Mapping[str, float | bool | None]
    previous_level: int
    previous_phase: Phase
    notify_customer: bool
    escalated_by_max_duration: bool

    @classmethod
    def of(cls, d: Evaluation) -> Transition:
        return cls(
            d.now_ms,
            d.scope,
            d.level,
            d.phase,
            d.reason,
            d.figures,
            d.previous_level,
            d.previous_phase,
            d.notify_customer,
            d.escalated_by_max_duration,
        )


# --------------------------------------------------------------------------- #
# Engine
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class _Cond:
    """A condition compiled for evaluation: ``index`` is its clock's slot."""

    index: int
    signal: str
    boolean: bool
    compare: Callable[[float, float], bool] | None
    value: float
    is_value: bool
    for_ms: int
    text: str
    probe_text: str  # without `for`: what a half-open relapse checks
    alert: bool = False  # a burn-rate alert: opens a level, never holds one
    op: str = ""

    def observe(self, signals: Signals) -> bool | None:
        """Whether the comparison holds now; None when the signal is unknown."""
        v = signals.get(self.signal)
        if self.boolean:
            return (v is self.is_value) if isinstance(v, bool) else None
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        x = float(v)
        if not math.isfinite(x):
            return None
        assert self.compare is not None
        return self.compare(x, self.value)


class _Scope:
    __slots__ = (
        "calm", "clocks", "escalated", "last", "level", "openers", "phase", "recovered_ms",
        "since_ms", "unknown",
    )  # fmt: skip

    def __init__(self, n_conditions: int, now_ms: int) -> None:
        self.level = 0
        self.phase: Phase = "normal"
        self.since_ms = now_ms
        self.escalated = False
        self.recovered_ms: int | None = None  # last step down (or half-open, or back to 0)
        self.clocks: list[int | None] = [None] * n_conditions
        # Per condition: since when its signal has been unknown at every evaluation
        # (None: known at the last one). Lets an exit go without a signal that is absent.
        self.unknown: list[int | None] = [None] * n_conditions
        # Per condition: since when its comparison has not been observed false (every
        # evaluation since held it or lacked its signal; None: false at the last one).
        self.calm: list[int | None] = [None] * n_conditions
        self.last: Evaluation | None = None
        # The (non-alert) entry conditions that opened the current degraded level: it is
        # not left, nor half-opened, while any of them is still measured (coherent exit).
        self.openers: tuple[int, ...] = ()

    def observe(
        self, conds: Iterable[_Cond], signals: Signals, now_ms: int
    ) -> tuple[list[bool], list[bool]]:
        """Advance every condition's clocks to ``now_ms``: per condition, whether its
        comparison holds now (``observed``) and whether it has for its ``for`` (``holds``);
        an unknown signal resets the clock and starts (or keeps) its unknown-since; a
        false observation ends its calm."""
        observed = [False] * len(self.clocks)
        holds = [False] * len(self.clocks)
        clocks, unknown, calm = self.clocks, self.unknown, self.calm
        for c in conds:
            ok = c.observe(signals)
            if ok is None:
                if unknown[c.index] is None:
                    unknown[c.index] = now_ms
            else:
                unknown[c.index] = None
            if ok is False:
                calm[c.index] = None
            elif calm[c.index] is None:
                calm[c.index] = now_ms
            if ok:
                start = clocks[c.index]
                if start is None:
                    start = clocks[c.index] = now_ms
                observed[c.index] = True
                holds[c.index] = now_ms - start >= c.for_ms
            else:
                clocks[c.index] = None
        return observed, holds


@dataclass(slots=True)
class _Step:
    """One evaluation of a scope: its state, the signals, and what the entry
    conditions say (``_observe``); ``held``: ms at the current (level, phase)."""

    s: _Scope
    now_ms: int
    signals: Signals
    observed: list[bool]  # per condition: its comparison holds now
    holds: list[bool]  # per condition: it has held for its ``for``
    opens: list[bool]  # per condition: it holds and may open a level
    entered: int  # highest level whose entry holds: may step up
    justified: int  # highest level whose entry holds on evidence other than alerts
    gated_entry: int  # highest level whose entry holds but the load gate keeps shut
    load_caused: bool
    opener_seen: list[int]  # the openers of the level, still measured now
    held: int

    def move(
        self, level: int, phase: Phase, *, escalated: bool = False, by: Iterable[_Cond] = ()
    ) -> None:
        """The scope to (level, phase) now; ``by``: the conditions that open the level."""
        s, now_ms = self.s, self.now_ms
        if level < s.level or phase == "half_open" or level == 0:
            s.recovered_ms = now_ms  # a step down
        if level > s.level or (phase == "degraded" and s.phase == "half_open"):
            s.openers = tuple(c.index for c in by if not c.alert)
        elif level == 0:
            s.openers = ()
        s.level, s.phase, s.since_ms, s.escalated = level, phase, now_ms, escalated


@dataclass(slots=True)
class _Exits:
    """A level's exit as measured now (``PolicyEngine._exits``)."""

    known: list[_Cond]  # the exit conditions not waived
    failing: list[_Cond]  # of those, the ones that do not hold
    lacking: str  # the waived ones, said
    blind_all: bool
    exit_ok: bool
    held_because: list[Hold]


@dataclass(slots=True)
class _Outcome:
    """What a phase of the evaluation decided: the conditions it rests on, the reason,
    what holds the level, and whether it is past ``max_duration``."""

    figs: list[_Cond]
    reason: str
    held_because: list[Hold] = field(default_factory=list)
    overdue: bool = False


class PolicyEngine:
    """The degradation state machine, one state per scope (e.g. per model). Deterministic."""

    def __init__(self, policy: ControlPolicy, *, max_scopes: int = 10_000) -> None:
        if max_scopes < 1:
            raise ValueError("max_scopes must be >= 1")
        self.policy = policy
        self.max_scopes = max_scopes
        self._conds: list[_Cond] = []
        self._enter: dict[int, list[_Cond]] = {}
        self._exit: dict[int, list[_Cond]] = {}
        self._levels: dict[int, Level] = {}
        for lv in sorted(policy.levels, key=lambda x: x.level):
            self._levels[lv.level] = lv
            self._enter[lv.level] = [self._compile(c) for c in lv.enter]
            self._exit[lv.level] = [self._compile(c) for c in lv.exit]
        d = policy.dynamics
        self._dwell_ms = d.min_dwell_ms
        self._ho_ms = d.half_open.duration_ms
        self._admit = d.half_open.admit_fraction
        self._max_ms = {n: lv.max_duration_ms for n, lv in self._levels.items()}
        self._actions = {n: lv.actions.to_actions() for n, lv in self._levels.items()}
        self._ho_actions = self._levels[1].actions.to_actions(self._admit)
        self._admission = {n for n, lv in self._levels.items() if lv.actions.admission}
        self._cutoff = {n for n, lv in self._levels.items() if lv.actions.queue_cutoff}
        self._load_gate = d.load_gate
        self._turns_away = {n for n, lv in self._levels.items() if lv.actions.turns_away()}
        self._gated = {
            n for n, lv in self._levels.items() if d.load_gate and lv.actions.turns_away()
        }
        self._scopes: OrderedDict[str, _Scope] = OrderedDict()

    def admits(self, level: int, phase: str) -> bool:
        """Whether (level, phase) applies capacity-aware admission (half-open: L1's)."""
        return level > 0 and (1 if phase == "half_open" else level) in self._admission

    def cuts_queue(self, level: int, phase: str) -> bool:
        """Whether (level, phase) applies the queue cut-off (half-open: L1's)."""
        return level > 0 and (1 if phase == "half_open" else level) in self._cutoff

    def _compile(self, c: Condition) -> _Cond:
        compiled = _compiled(c, len(self._conds))
        self._conds.append(compiled)
        return compiled

    # -- scopes ------------------------------------------------------------- #

    @property
    def scopes(self) -> list[str]:
        return list(self._scopes)

    def last_decision(self, scope: str) -> Evaluation | None:
        s = self._scopes.get(scope)
        return None if s is None else s.last

    def forget(self, scope: str) -> None:
        self._scopes.pop(scope, None)

    def _scope(self, scope: str, now_ms: int) -> _Scope:
        s = self._scopes.get(scope)
        if s is not None:
            self._scopes.move_to_end(scope)
            return s
        if len(self._scopes) >= self.max_scopes:
            victim = next((k for k, v in self._scopes.items() if v.level == 0), None)
            if victim is None:
                victim = next(iter(self._scopes))
            del self._scopes[victim]
        s = _Scope(len(self._conds), now_ms)
        self._scopes[scope] = s
        return s

    # -- evaluation ----------------------------------------------------------- #

    def evaluate(self, scope: str, now_ms: int, signals: Signals) -> Evaluation:
        """Advance ``scope`` to ``now_ms`` with these signals and say what to do."""
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise TypeError(f"now_ms must be an integer (ms), got {now_ms!r}")
        s = self._scope(scope, now_ms)
        if s.last is not None and now_ms < s.last.now_ms:
            raise ValueError(
                f"scope {scope!r}: now_ms {now_ms} is before the previous evaluation "
                f"({s.last.now_ms}); evaluations of a scope must be in time order"
            )
        st = self._observe(s, now_ms, signals)
        prev_level, prev_phase = s.level, s.phase
        if s.phase == "half_open":
            out = self._half_open(st)
        elif st.entered > s.level:
            figs = self._holding(st.entered, st.opens)
            st.move(st.entered, "degraded", by=figs)
            out = _Outcome(figs, f"L{st.entered} entry holds: {_texts(figs, signals)}")
        elif s.level > 0:
            out = self._degraded(st)
        elif st.gated_entry:
            figs = self._holding(st.gated_entry, st.opens)
            out = _Outcome(
                figs,
                f"L{st.gated_entry} entry holds ({_texts(figs, signals)}) but the burn is not "
                f"load-caused ({LOAD_SIGNAL} false): nothing shed",
            )
        else:
            out = _Outcome([], "normal: no entry condition holds")
        figs, reason, held_because, overdue = out.figs, out.reason, out.held_because, out.overdue

        level, phase = s.level, s.phase
        if phase == "half_open":
            actions = self._ho_actions
        elif level == 0:
            actions = NO_ACTIONS
        else:
            actions = self._actions[level]
        notify = level > 0 and (self._levels[level].notify_customer or s.escalated or overdue)
        changed = (level, phase) != (prev_level, prev_phase)
        figures = {c.signal: v for c in figs if (v := _value(c, signals)) is not None}
        evaluation = Evaluation(
            scope=scope,
            now_ms=now_ms,
            decision=Decision(
                level=level,
                phase=phase,
                actions=actions,
                reason=bounded_reason(reason),
                figures=dict(list(figures.items())[:MAX_FIGURES]),
                notify_customer=notify,
                budget_exhausted=signals.get(BUDGET_SIGNAL) is True,
            ),
            changed=changed,
            since_ms=s.since_ms,
            escalated_by_max_duration=s.escalated,
            overdue=overdue,
            previous_level=prev_level,
            previous_phase=prev_phase,
            holds=() if changed or level == 0 else tuple(held_because),
        )
        s.last = evaluation
        return evaluation

    # -- the phases of an evaluation ------------------------------------------ #

    def _observe(self, s: _Scope, now_ms: int, signals: Signals) -> _Step:
        """The condition clocks advanced to ``now_ms``, and which levels' entries hold."""
        observed, holds = s.observe(self._conds, signals, now_ms)
        clocks = s.clocks
        # An alert opens a level only if it rose after the scope last stepped down: an
        # alert still firing from before a recovery does not re-open what it opened.
        opens = [
            holds[c.index]
            and (not c.alert or s.recovered_ms is None or (clocks[c.index] or 0) > s.recovered_ms)
            for c in self._conds
        ]
        entered = 0  # highest level whose entry holds: may step up
        justified = 0  # highest level whose entry holds on evidence other than alerts: keeps it
        load_caused = signals.get(LOAD_SIGNAL) is True
        gated_entry = 0  # highest level whose entry holds but the load gate keeps shut
        for n in LEVELS:
            if any(opens[c.index] for c in self._enter[n]):
                if n in self._gated and not load_caused:
                    gated_entry = n
                else:
                    entered = n
            if any(holds[c.index] and not c.alert for c in self._enter[n]) and (
                n not in self._gated or load_caused
            ):
                justified = n
        # Coherent exit: the conditions that opened the level, still measured right now.
        opener_seen = [i for i in s.openers if observed[i]]
        return _Step(
            s, now_ms, signals, observed, holds, opens, entered, justified, gated_entry,
            load_caused, opener_seen, now_ms - s.since_ms,
        )  # fmt: skip

    def _half_open(self, st: _Step) -> _Outcome:
        """Half-open: a relapse re-opens a level, a quiet ``duration`` closes to normal."""
        s, signals, observed, entered, held = st.s, st.signals, st.observed, st.entered, st.held
        probe = [c for c in self._enter[1] if observed[c.index] and not c.alert]
        probe += [self._conds[i] for i in st.opener_seen if self._conds[i] not in probe]
        if 1 in self._gated and not st.load_caused:
            probe = []  # a probe sheds again only for a load-caused burn
        if entered >= 1 or probe:
            target = max(1, entered)
            figs = self._holding(target, st.opens) if entered >= 1 else probe
            st.move(target, "degraded", by=figs)
            texts = _texts(figs, signals, probe=entered == 0)
            return _Outcome(figs, f"relapse during half-open -> L{target}: {texts}")
        if held >= self._ho_ms:
            st.move(0, "normal")
            return _Outcome(
                [], f"half-open {format_ms(self._ho_ms)} passed without relapse -> normal"
            )
        return _Outcome(
            [],
            f"half-open since {s.since_ms}: admitting {self._admit:.0%} of shed "
            f"traffic until {s.since_ms + self._ho_ms}; relapse if "
            + " or ".join(c.probe_text for c in self._enter[1] if not c.alert),
            [Hold("half-open", f"half-open ({format_ms(held)} of {format_ms(self._ho_ms)})")],
        )

    def _degraded(self, st: _Step) -> _Outcome:
        """At a level, not half-open: step down on its exit, escalate past its
        ``max_duration`` while its entry holds, or hold it (and say why)."""
        lv = st.s.level
        ex = self._exits(st)
        if st.justified < lv and ex.exit_ok and st.held >= self._dwell_ms:
            return self._step_down(st, ex)
        if st.held >= self._max_ms[lv] and st.justified >= lv and lv < LEVELS[-1]:
            # Its own entry still holds after max_duration: its actions are not enough.
            figs = self._justifying(lv, st.holds)
            limit = format_ms(self._max_ms[lv])
            st.move(lv + 1, "degraded", escalated=True, by=figs)
            return _Outcome(
                figs,
                f"L{lv} held {format_ms(st.held)} >= max_duration {limit} and its entry "
                f"still holds ({_texts(figs, st.signals)}) -> escalated to L{lv + 1}, "
                "notify customer",
            )
        return self._keep(st, ex)

    def _exits(self, st: _Step) -> _Exits:
        """The level's exit as measured now, and what holds the level (so far)."""
        s, signals, now_ms, holds, held = st.s, st.signals, st.now_ms, st.holds, st.held
        justified, clocks = st.justified, s.clocks
        lv = s.level
        exits = self._exit[lv]
        openers = [self._conds[i] for i in st.opener_seen]
        over_max = held >= self._max_ms[lv]
        # Unknown signals: an exit condition whose signal has been unknown for its
        # whole window is waived; the level leaves on the exits that are measured.
        waived = [c for c in exits if _waived(c, st, over_max, self._dwell_ms)]
        known = [c for c in exits if c not in waived]
        # Blind: no exit is measured, or a level that turns traffic away lacks its
        # pre-admission exit (the rest reads admitted traffic only): max_duration.
        blind = [c for c in waived if c.signal in PRE_ADMISSION_SIGNALS]
        blind = blind if lv in self._turns_away else []
        blind_all = not known or bool(blind)
        exit_holds = {c.index: _exit_holds(c, st, self._dwell_ms, self._turns_away) for c in known}
        exit_ok = all(exit_holds.values()) and not openers and (over_max or not blind_all)
        failing = [c for c in known if not exit_holds[c.index]]
        # measured now, held over a window in which its signal was unknown at times
        partly = [c for c in known if not holds[c.index] and exit_holds[c.index]]
        lacking = "; ".join(
            [f"{c.signal} unknown since {s.unknown[c.index]}" for c in waived]
            + [f"{c.signal} unknown at times since {s.calm[c.index]}" for c in partly]
        )
        held_because: list[Hold] = []
        if justified >= lv:
            held_because.extend(
                _hold(c, signals, now_ms, clocks[c.index], prefix="entry ")
                for c in self._enter[lv]
                if holds[c.index] and not c.alert
            )
        held_because.extend(_hold(c, signals, now_ms, clocks[c.index]) for c in failing)
        if blind_all and not over_max:
            what = ", ".join(c.signal for c in (blind or waived)) or "none"
            held_because.append(
                Hold(
                    "blind " + what,
                    f"exit not measured ({what} unknown): held up to max_duration "
                    f"{format_ms(self._max_ms[lv])}",
                )
            )
        held_because.extend(
            _hold(
                c, signals, now_ms, clocks[c.index], prefix="opened by ", suffix=", still measured"
            )
            for c in openers
            if not (justified >= lv and holds[c.index] and c in self._enter[lv])
        )
        return _Exits(known, failing, lacking, blind_all, exit_ok, held_because)

    def _step_down(self, st: _Step, ex: _Exits) -> _Outcome:
        """The level's exit holds past ``min_dwell``: L1 half-opens, a higher level steps
        one down."""
        lv, held = st.s.level, st.held
        figs = ex.known
        on = _texts(figs, st.signals) if figs else "no exit measured"
        if ex.lacking:
            on = f"{on}; {ex.lacking}"
        if ex.blind_all:
            on = f"{on}; held past max_duration {format_ms(self._max_ms[lv])}"
        if lv == 1:
            st.move(1, "half_open")
            reason = (
                f"L1 exit holds ({on}) after "
                f"{format_ms(held)} >= min_dwell {format_ms(self._dwell_ms)} -> "
                f"half-open for {format_ms(self._ho_ms)}, admitting "
                f"{self._admit:.0%} of shed traffic"
            )
        else:
            st.move(lv - 1, "degraded")
            reason = (
                f"L{lv} exit holds ({on}) after "
                f"{format_ms(held)} >= min_dwell {format_ms(self._dwell_ms)} "
                f"-> L{lv - 1}"
            )
        return _Outcome(figs, reason)

    def _keep(self, st: _Step, ex: _Exits) -> _Outcome:
        """The level is held: on its entry, waiting for its exit, or for ``min_dwell``;
        past ``max_duration``, overdue (the customer is notified)."""
        s, signals, held, justified = st.s, st.signals, st.held, st.justified
        lv = s.level
        held_because = ex.held_because
        overdue = False
        if held < self._dwell_ms and not ex.failing and justified < lv:
            text = f"min_dwell ({format_ms(held)} of {format_ms(self._dwell_ms)})"
            held_because.append(Hold("min_dwell", text))
        if held >= self._max_ms[lv]:
            # Past max_duration: notified; it escalates only while its entry holds
            # (L3 has nowhere to go) and otherwise steps down as usual.
            overdue = True
            limit = format_ms(self._max_ms[lv])
            tail = (
                "no higher level: notify customer"
                if justified >= lv
                else "entry no longer holds: not escalated, notify customer"
            )
            prefix = f"L{lv} held {format_ms(held)} past max_duration {limit}; {tail}"
        else:
            prefix = ""
        if justified >= lv:
            figs = self._justifying(lv, st.holds)
            body = f"L{lv} entry holds: {_texts(figs, signals)}"
        elif not ex.exit_ok:
            figs = ex.failing
            body = f"L{lv} held, waiting for exit: {'; '.join(h.text for h in held_because)}"
            if ex.lacking:
                body += f" (not waited for: {ex.lacking})"
        else:
            figs = ex.known
            body = (
                f"L{lv}: exit holds, min_dwell {format_ms(self._dwell_ms)} "
                f"until {s.since_ms + self._dwell_ms}"
            )
        reason = f"{prefix}: {body}" if prefix else body
        return _Outcome(figs, reason, held_because, overdue)

    def _holding(self, level: int, holds: list[bool]) -> list[_Cond]:
        return [c for c in self._enter[level] if holds[c.index]]

    def _justifying(self, level: int, holds: list[bool]) -> list[_Cond]:
        return [c for c in self._enter[level] if holds[c.index] and not c.alert]


def _calm_window(c: _Cond, st: _Step, dwell_ms: int) -> bool:
    """The exit condition has not been observed false for its whole window: its
    ``for`` and at least ``min_dwell`` (each evaluation held it or lacked its signal)."""
    since = st.s.calm[c.index]
    return since is not None and st.now_ms - since >= max(c.for_ms, dwell_ms)


def _waived(c: _Cond, st: _Step, over_max: bool, dwell_ms: int) -> bool:
    """An exit condition whose signal is unknown now and that has not been observed
    false for its whole window (:func:`_calm_window`; or, past the level's
    ``max_duration``, unknown now: a flickering signal holds no longer)."""
    if st.s.unknown[c.index] is None:
        return False
    return over_max or _calm_window(c, st, dwell_ms)


def _exit_holds(c: _Cond, st: _Step, dwell_ms: int, turns_away: Container[int]) -> bool:
    """A measured exit condition holds: for its ``for`` on known observations, or now
    and never observed false for its whole window (:func:`_calm_window`: its signal
    was unknown for part of it; more evidence than a waived condition, never less).
    The pre-admission exit of a level that turns traffic away, whose absence holds
    the level (blind), needs its ``for`` on known observations: one sample of demand
    after a long gap does not end what its absence held."""
    if st.holds[c.index]:
        return True
    strict = c.signal in PRE_ADMISSION_SIGNALS and st.s.level in turns_away
    return not strict and st.observed[c.index] and _calm_window(c, st, dwell_ms)


def _compiled(c: Condition, index: int) -> _Cond:
    """A condition compiled for evaluation; ``index``: its clock's slot."""
    boolean = c.is_ is not None
    return _Cond(
        index=index,
        signal=c.signal,
        boolean=boolean,
        compare=None if boolean else OPS[c.op or ">"],
        value=0.0 if c.value is None else c.value,
        is_value=bool(c.is_),
        for_ms=c.for_ms,
        text=c.describe(),
        probe_text=c.describe(with_for=False),
        alert=c.signal in ALERT_SIGNALS,
        op=c.op or "",
    )


def bounded_reason(reason: str) -> str:
    """A reason fits a signal (``REASON_MAX_CHARS``): cut, and marked as cut."""
    if len(reason) <= REASON_MAX_CHARS:
        return reason
    return reason[: REASON_MAX_CHARS - 1] + "\u2026"


def _value(c: _Cond, signals: Signals) -> float | bool | None:
    """The signal's value as the condition reads it; None when unknown to it."""
    v = signals.get(c.signal)
    if c.observe(signals) is None:
        return None
    if isinstance(v, bool):
        return v
    assert isinstance(v, int | float)
    return float(v)


_NEGATED: Final = {">": "<=", ">=": "<", "<": ">=", "<=": ">"}


def _hold(
    c: _Cond, signals: Signals, now_ms: int, since: int | None, *, prefix: str = "",
    suffix: str = "",
) -> Hold:  # fmt: skip
    """Why a condition is where it is. Texts: ``"p99.x 412 >= 250 (needs < 250 for
    5m)"``, ``"p99.x 200 < 250 (3m of 5m)"``, ``"burn.page unknown (needs is false)"``;
    keys: the same without the value and the time (``"p99.x >= 250"``, ``"p99.x < 250"``,
    ``"burn.page unknown"``; a boolean keeps its value: ``"load.burning is true"``)."""
    v = _value(c, signals)
    needs = c.text.removeprefix(c.signal + " ")
    if v is None:
        key, text = f"{c.signal} unknown", f"{c.signal} unknown (needs {needs})"
    else:
        shown = str(v).lower() if isinstance(v, bool) else num_text(v)
        if c.boolean:
            key = head = f"{c.signal} is {shown}"
        else:
            op = c.op if since is not None else _NEGATED[c.op]
            key = f"{c.signal} {op} {num_text(c.value)}"
            head = f"{c.signal} {shown} {op} {num_text(c.value)}"
        if since is None:  # the comparison does not hold now
            text = f"{head} (needs {needs})"
        else:
            text = f"{head} ({format_ms(now_ms - since)} of {format_ms(c.for_ms)})"
    return Hold(prefix + key, prefix + text + suffix)


def _texts(conds: Iterable[_Cond], signals: Signals, *, probe: bool = False) -> str:
    parts = []
    for c in conds:
        v = _value(c, signals)
        shown = "unknown" if v is None else str(v).lower() if isinstance(v, bool) else num_text(v)
        parts.append(f"{c.probe_text if probe else c.text} (now {shown})")
    return "; ".join(parts)


# --------------------------------------------------------------------------- #
# Replay
# --------------------------------------------------------------------------- #


def transitions(
    policy: ControlPolicy | PolicyEngine,
    samples: Iterable[tuple[int, Signals]],
    *,
    scope: str = "default",
) -> list[Transition]:
    """Feed ``(now_ms, signals)`` samples of one scope in order; the changes of level/phase.

    Pass a :class:`PolicyEngine` to continue from (and update) its state.
    """
    engine = policy if isinstance(policy, PolicyEngine) else PolicyEngine(policy)
    out: list[Transition] = []
    for now_ms, signals in samples:
        d = engine.evaluate(scope, now_ms, signals)
        if d.changed:
            out.append(Transition.of(d))
    return out
