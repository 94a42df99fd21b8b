"""Burn-rate alerts as Alertmanager alerts: which fire, which resolved (pure).

Each evaluation's firing rules (:attr:`pipeline.core.budget.BudgetStatus.alerts`)
become alerts keyed by (SLO, scope, rule). :class:`AlertTracker` remembers what fired
last time, so that a rule that stops firing is sent once more as *resolved*, and a
firing alert is re-sent every evaluation (Alertmanager resolves an alert it has not heard
of for ``resolve_timeout``).

Times: ``startsAt`` / ``endsAt`` are **wall time** (``wall_ms`` passed to
:meth:`AlertTracker.step`): Alertmanager judges an alert active or resolved against its
own clock, so event-time instants (a replay, a worker catching up) would keep a resolved
alert active, or be refused when a firing alert's ``startsAt`` lies after the
``now + resolve_timeout`` Alertmanager gives it. The event time is in the annotations:
``event_time`` (when the rule first fired) and, on a resolved alert, ``resolved_event_time``.
``startsAt`` is the wall time of the first firing evaluation; a resolved alert's
``endsAt`` is the wall time of the evaluation that saw it stop, and always at least 1 ms
after ``startsAt`` (Alertmanager answers 400 "start time must be before end time"
otherwise; times are sent to the millisecond).

Labels (the Alertmanager v2 contract): ``alertname`` (``TailguardSLOBurn``, or
``TailguardSLOBudget`` / ``TailguardSLOCompliance`` for the other rule kinds), ``slo``,
``scope``, ``severity`` (``page`` | ``ticket``), ``burnrate_tier`` (the rule's name, e.g.
``page-fast-burn``), ``service`` = ``tailguard``. Annotations: ``summary``, the
rule's figures (``burn_1h`` ...) and ``event_time``. Times are RFC 3339 UTC, to the ms.

A burn that is not load-caused (:class:`pipeline.core.control.LoadNotice`: an SLO burning
fast on a model while its bad requests' time was mostly compute, so nothing is shed) is
alerted too: ``alertname`` ``TailguardBurnNotLoadCaused``, ``slo``, ``scope`` (the
model), ``severity`` ``ticket``, ``burnrate_tier`` ``not-load-caused``; annotations
``summary`` (why nothing is shed) and ``queue_share``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pipeline.core.budget import BudgetStatus

if TYPE_CHECKING:
    from pipeline.core.control import LoadNotice
from pipeline.core.timefmt import iso_time

SERVICE: Final = "tailguard"
ALERTNAMES: Final = {
    "burn": "TailguardSLOBurn",
    "spent": "TailguardSLOBudget",
    "below": "TailguardSLOCompliance",
    "not_load_caused": "TailguardBurnNotLoadCaused",
}
NOT_LOAD_CAUSED: Final = "not-load-caused"

AlertKey = tuple[str, str, str]  # slo, scope, rule


def rfc3339(ms: int) -> str:
    return iso_time(ms / 1000)


def _alertname(figures: Mapping[str, float]) -> str:
    if "factor" in figures:
        return ALERTNAMES["burn"]
    if "fraction" in figures:
        return ALERTNAMES["spent"]
    return ALERTNAMES["below"]


@dataclass(frozen=True, slots=True)
class AlertMessage:
    """One alert for Alertmanager's ``POST /api/v2/alerts`` (and the webhook)."""

    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    starts_at_ms: int  # wall time
    ends_at_ms: int | None  # set: resolved at that time (wall time, > starts_at_ms)

    def __post_init__(self) -> None:
        if self.ends_at_ms is not None and self.ends_at_ms <= self.starts_at_ms:
            raise ValueError(
                f"an alert must end after it starts: startsAt {self.starts_at_ms} ms, "
                f"endsAt {self.ends_at_ms} ms"
            )

    @property
    def resolved(self) -> bool:
        return self.ends_at_ms is not None

    def to_json(self, generator_url: str = "") -> dict[str, Any]:
        doc: dict[str, Any] = {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339(self.starts_at_ms),
        }
        if self.ends_at_ms is not None:
            doc["endsAt"] = rfc3339(self.ends_at_ms)
        if generator_url:
            doc["generatorURL"] = generator_url
        return doc


@dataclass
class AlertTracker:
    """What fired at the last evaluation; :meth:`step` returns what to send now."""

    firing: dict[AlertKey, AlertMessage] = field(default_factory=dict)

    def step(
        self,
        budgets: Iterable[BudgetStatus],
        now_ms: int,
        notices: Iterable[LoadNotice] = (),
        *,
        wall_ms: int | None = None,
    ) -> list[AlertMessage]:
        """What to send after the evaluation at event time ``now_ms``, made at wall time
        ``wall_ms`` (default ``now_ms``: live, event time is wall time)."""
        wall = now_ms if wall_ms is None else wall_ms
        now: dict[AlertKey, AlertMessage] = {}
        for n in notices:
            key = (n.slo, n.model, NOT_LOAD_CAUSED)
            before = self.firing.get(key)
            labels = (
                ("alertname", ALERTNAMES["not_load_caused"]),
                ("slo", n.slo),
                ("scope", n.model),
                ("severity", "ticket"),
                ("burnrate_tier", NOT_LOAD_CAUSED),
                ("service", SERVICE),
            )
            share = "" if n.queue_share is None else f"{n.queue_share:.4g}"
            annotations: tuple[tuple[str, str], ...] = (
                ("summary", n.text),
                ("queue_share", share),
            )
            now[key] = self._firing(before, labels, annotations, now_ms, wall)
        for st in budgets:
            for a in st.alerts:
                key = (st.slo, st.scope, a.rule)
                before = self.firing.get(key)
                labels = (
                    ("alertname", _alertname(a.figures)),
                    ("slo", st.slo),
                    ("scope", st.scope),
                    ("severity", a.severity),
                    ("burnrate_tier", a.rule),
                    ("service", SERVICE),
                )
                figures = " ".join(f"{k}={v:.4g}" for k, v in sorted(a.figures.items()))
                annotations = (
                    ("summary", f"SLO {st.slo} ({st.scope}): {a.rule} ({a.severity})"),
                    ("figures", figures),
                    ("objective", f"{st.objective:g}"),
                    (
                        "budget_remaining",
                        "" if st.remaining_fraction is None else f"{st.remaining_fraction:.4g}",
                    ),
                )
                now[key] = self._firing(before, labels, annotations, now_ms, wall)
        resolved = [
            AlertMessage(
                m.labels,
                (*m.annotations, ("resolved_event_time", rfc3339(now_ms))),
                m.starts_at_ms,
                max(wall, m.starts_at_ms + 1),
            )
            for key, m in sorted(self.firing.items())
            if key not in now
        ]
        self.firing = now
        return [*(now[k] for k in sorted(now)), *resolved]

    @staticmethod
    def _firing(
        before: AlertMessage | None,
        labels: tuple[tuple[str, str], ...],
        annotations: tuple[tuple[str, str], ...],
        now_ms: int,
        wall_ms: int,
    ) -> AlertMessage:
        """A firing alert: its first firing's wall time and event time are kept."""
        if before is None:
            started, event_time = wall_ms, rfc3339(now_ms)
        else:
            started, event_time = before.starts_at_ms, dict(before.annotations)["event_time"]
        return AlertMessage(labels, (*annotations, ("event_time", event_time)), started, None)
