"""The one enforcement (producers/enforcement.py): rules, statuses, modes, as tables."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipeline.contract.control_signal import Actions
from producers.control_client import Directive
from producers.enforcement import (
    ADMIT,
    LOGICAL_ID_MEMORY_MS,
    REASONS,
    STATUS,
    Enforcement,
    Modes,
    RequestFacts,
    Verdict,
    spread_retry_after_s,
    stricter,
    unit_of,
)


def _d(level: int = 1, phase: str = "degraded", scope: str = "m", **actions: Any) -> Directive:
    return Directive(level=level, phase=phase, actions=Actions(**actions), scope=scope)  # type: ignore[arg-type]


def _r(priority: int = 2, *, new: bool = False, key: str | None = "k", prompt: int | None = None,
       model: str | None = "m") -> RequestFacts:  # fmt: skip
    return RequestFacts(model=model, priority=priority, new_session=new, request_key=key,
                        prompt_tokens=prompt)  # fmt: skip


RULES = [
    # (id, directive, request, reason, status)
    ("level-0-admits", _d(0, "normal", shed_priorities_at_or_above=0), _r(3), None, 0),
    ("shed-at-or-above", _d(shed_priorities_at_or_above=2), _r(2), "shed_priority", 429),
    ("shed-below-passes", _d(shed_priorities_at_or_above=2), _r(1), None, 0),
    ("shed-0-explicit", _d(shed_priorities_at_or_above=0), _r(0), "shed_priority", 429),
    ("priority-clamped", _d(shed_priorities_at_or_above=3), _r(9), "shed_priority", 429),
    ("new-session", _d(reject_new_sessions=True), _r(1, new=True), "new_session", 429),
    ("new-session-p0-exempt", _d(reject_new_sessions=True), _r(0, new=True), None, 0),
    ("old-session-passes", _d(reject_new_sessions=True), _r(3), None, 0),
    ("nothing-named", _d(), _r(3, new=True), None, 0),
]


@pytest.mark.parametrize(("directive", "request_", "reason", "status"),
                         [c[1:] for c in RULES], ids=[c[0] for c in RULES])  # fmt: skip
def test_rules(
    directive: Directive, request_: RequestFacts, reason: str | None, status: int
) -> None:
    d = Enforcement().decide(directive, request_, 0.0)
    assert (d.verdict.reason, d.verdict.status) == (reason, status)
    assert d.refused == (reason is not None)
    if reason is not None:  # the directive's Retry-After, spread per request key
        want = spread_retry_after_s(directive.actions.retry_after_s, unit_of("retry-after:k"))
        assert d.verdict.retry_after_s == want


def test_one_status_per_reason() -> None:
    """Every deliberate refusal is 429 (retry later); only the queue cut-off is 503."""
    assert set(STATUS) == set(REASONS)
    assert {r: s for r, s in STATUS.items() if s != 429} == {"queue_timeout": 503}


@pytest.mark.parametrize(
    ("prompt", "cap", "want"),
    [(5000, 4096, 4096), (100, 4096, None), (None, 4096, 4096), (5000, None, None)],
)
def test_context_cap_only_when_it_cuts(
    prompt: int | None, cap: int | None, want: int | None
) -> None:
    v = Enforcement().decide(_d(cap_context_tokens=cap), _r(2, prompt=prompt), 0.0).act
    assert v.cap_context_tokens == want


def test_fallback_and_cutoff_of_an_admitted_request() -> None:
    d = _d(fallback_model="small", queue_timeout_ms=[None, 800.0, 500.0, 300.0], retry_after_s=9)
    e = Enforcement()
    assert e.decide(d, _r(0), 0.0).act.queue_timeout_ms is None  # priority 0: never cut off
    v = e.decide(d, _r(3), 0.0).act
    assert (v.reason, v.fallback_model, v.queue_timeout_ms, v.retry_after_s) == (
        None, "small", 300.0, spread_retry_after_s(9, unit_of("retry-after:k")))  # fmt: skip
    assert e.applied["fallback"] == 2


def test_half_open_hashes_the_request_key_and_spreads_without_one() -> None:
    d = _d(phase="half_open", shed_priorities_at_or_above=3, admit_fraction=0.25)
    e = Enforcement()
    first = [e.decide(d, _r(3, key=f"q{i}"), 0.0).act.reason is None for i in range(2000)]
    again = [Enforcement().decide(d, _r(3, key=f"q{i}"), 0.0).act.reason is None
             for i in range(2000)]  # fmt: skip
    assert first == again  # the same key gets the same answer
    assert 400 < sum(first) < 600
    spread = [e.decide(d, _r(3, key=None), 0.0).act.reason is None for i in range(100)]
    assert sum(spread) == 25


def test_rate_limit_is_enforced_per_scope_priority_0_never_waits() -> None:
    d = _d(rate_limit_rps=5.0)
    e = Enforcement()
    got = [e.decide(d, _r(2, key=f"r{i}"), 0.0).act.reason for i in range(7)]
    assert got == [None] * 5 + ["rate_limit"] * 2
    assert e.decide(d, _r(0), 0.0).act.reason is None  # no token, passes all the same
    assert e.decide(d, _r(2), 200.0).act.reason is None  # one token back after 200 ms
    other = _d(rate_limit_rps=5.0, scope="other")
    assert e.decide(other, _r(2, model="other"), 200.0).act.reason is None  # its own bucket


def test_rate_limit_below_one_per_second_still_admits() -> None:
    e = Enforcement()
    assert e.decide(_d(rate_limit_rps=0.5), _r(2), 0.0).act.reason is None


def test_admission_refusal_carries_its_own_retry_after() -> None:
    d = _d(admit_rps=4.0, retry_after_s=20)
    e = Enforcement()
    verdicts = [e.decide(d, _r(2, key=f"r{i}"), 0.0).act for i in range(30)]
    refused = [v for v in verdicts if v.reason is not None]
    assert refused
    assert {(v.reason, v.status) for v in refused} == {("admission", 429)}
    assert all(1 <= v.retry_after_s <= 20 for v in refused)
    assert e.decide(d, _r(0), 0.0).act.reason is None  # priority 0 never evicted


def test_admission_splits_the_rate_among_gateways() -> None:
    """admit_gateways instances each admit admit_rps / admit_gateways."""

    def admitted(gateways: int) -> int:
        e, d, n = Enforcement(), _d(admit_rps=40.0, admit_gateways=gateways), 0
        for i in range(4000):  # 40 s at 100/s of priority 2
            n += e.decide(d, _r(2, key=f"r{i}"), i * 10.0).act.reason is None
        return n

    one, four = admitted(1), admitted(4)
    assert 1400 < one < 1800
    assert 300 < four < 500


MODES = [
    # (modes, priority, mode in force)
    (Modes("off"), 3, "off"),
    (Modes("shadow"), 3, "shadow"),
    (Modes("enforce"), 0, "enforce"),
    (Modes("enforce", enforce_from_priority=3), 3, "enforce"),
    (Modes("enforce", enforce_from_priority=3), 2, "shadow"),
    (Modes("shadow", enforce_from_priority=3), 3, "shadow"),
    (Modes("enforce", scopes=(("m", "off"),)), 3, "off"),
    (Modes("off", scopes=(("m", "enforce"),)), 3, "enforce"),
    (Modes("off", scopes=(("other", "enforce"),)), 3, "off"),
]


@pytest.mark.parametrize(("modes", "priority", "mode"), MODES)
def test_mode_of_a_request(modes: Modes, priority: int, mode: str) -> None:
    assert modes.of("m", priority) == mode
    d = Enforcement(modes).decide(_d(shed_priorities_at_or_above=0), _r(priority), 0.0)
    assert d.mode == mode
    assert d.refused == (mode == "enforce")
    assert (d.would_refuse is not None) == (mode == "shadow")
    if mode != "enforce":
        assert d.act == ADMIT  # shadow and off never act


@pytest.mark.parametrize(
    ("text", "kwargs", "want"),
    [
        ("enforce", {}, Modes("enforce")),
        (" shadow ", {"enforce_from_priority": 0}, Modes("shadow")),
        ("enforce", {"enforce_from_priority": 3}, Modes("enforce", 3)),
        ("off", {"scopes": "llama=enforce, qwen = shadow"},
         Modes("off", 0, (("llama", "enforce"), ("qwen", "shadow")))),
        ("enforce", {"retry_budget_ratio": 0.5, "retry_budget_min_retries": 0},
         Modes("enforce", retry_budget_ratio=0.5, retry_budget_min_retries=0)),
    ],
)  # fmt: skip
def test_modes_parse(text: str, kwargs: dict[str, Any], want: Modes) -> None:
    assert Modes.parse(text, **kwargs) == want


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, Modes("off")),
        ({"control_mode": "enforce", "control_enforce_from_priority": 2},
         Modes("enforce", 2)),
        ({"control_mode": "shadow", "control_mode_scopes": "llama=enforce"},
         Modes("shadow", 0, (("llama", "enforce"),))),
        ({"control_retry_budget_ratio": 0.5, "control_retry_budget_min_retries": 0},
         Modes("off", retry_budget_ratio=0.5, retry_budget_min_retries=0)),
    ],
)  # fmt: skip
def test_modes_of_settings(env: dict[str, Any], want: Modes) -> None:
    """The gateway command and the LiteLLM hook build their modes from the same settings."""
    from pipeline.kafka_settings import EmitterSettings

    assert Modes.of_settings(EmitterSettings(**env)) == want


@pytest.mark.parametrize(
    ("text", "kwargs"),
    [("on", {}), ("enforce", {"enforce_from_priority": 4}), ("enforce", {"scopes": "llama"}),
     ("enforce", {"scopes": "llama=loud"}), ("enforce", {"scopes": "=shadow"}),
     ("enforce", {"retry_budget_ratio": -0.1}), ("enforce", {"retry_budget_ratio": float("nan")}),
     ("enforce", {"retry_budget_ratio": 101.0}), ("enforce", {"retry_budget_min_retries": -1}),
     ("enforce", {"retry_budget_min_retries": 1.5})],
)  # fmt: skip
def test_bad_modes_fail_at_start(text: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"control mode|enforce_from_priority|MODEL=MODE|retry_"):
        Modes.parse(text, **kwargs)


def test_shadow_counts_exactly_what_enforce_refuses_on_the_same_arrivals() -> None:
    """Shadow runs the same rules on the same state: its would-have counters equal
    enforce's refusals, per model, priority and reason, for every directive field."""
    rng = random.Random(7)
    directives = [
        _d(shed_priorities_at_or_above=3, reject_new_sessions=True, retry_after_s=3),
        _d(phase="half_open", shed_priorities_at_or_above=2, admit_fraction=0.3),
        _d(level=2, rate_limit_rps=20.0, cap_context_tokens=2048, fallback_model="small"),
        _d(level=2, admit_rps=30.0, admit_gateways=2, queue_timeout_ms=[None, 900.0, 600.0, 300.0]),
    ]
    arrivals = [
        (i * 7.0, rng.choice(directives),
         _r(rng.randrange(4), new=rng.random() < 0.3, key=f"r{i}", prompt=rng.randrange(8000),
            model=rng.choice(["m", "m", "other"])))
        for i in range(5000)
    ]  # fmt: skip
    enforce, shadow = Enforcement(Modes("enforce")), Enforcement(Modes("shadow"))
    for t, d, r in arrivals:
        a, b = enforce.decide(d, r, t), shadow.decide(d, r, t)
        assert a.verdict == b.verdict
        assert b.act == ADMIT
    refused = {(m, p, w): n for (_mode, m, p, w), n in enforce.refusals.items()}
    would = {(m, p, w): n for (_mode, m, p, w), n in shadow.refusals.items()}
    assert refused == would
    assert {w for (_m, _p, w) in refused} >= {"shed_priority", "new_session", "admission"}
    assert {mode for (mode, *_rest) in shadow.refusals} == {"shadow"}


def test_stricter_directive_wins_the_models_own_on_a_tie() -> None:
    own, star = _d(1, scope="m"), _d(2, scope="*")
    assert stricter(own, star) is star
    assert stricter(_d(2, scope="m"), star).scope == "m"
    assert stricter(None, star) is star
    assert stricter(own, None) is own
    assert stricter(None, None) is None


# --- the retry budget (issue 47) ---------------------------------------------------------


def _retry(priority: int = 2, attempt: int = 1, *, key: str | None = None,
           logical: str | None = None) -> RequestFacts:  # fmt: skip
    return RequestFacts(model="m", priority=priority, request_key=key, attempt=attempt,
                        logical_id=logical)  # fmt: skip


BUDGET = [
    # (id, modes, first attempts in the window, then retries [(priority, attempt)],
    #  want: reason of each retry)
    ("floor-admits-a-trickle", Modes(), 0, [(2, 1)] * 4, [None, None, None, "retry_budget"]),
    ("20-percent-of-firsts", Modes(), 50, [(3, 1)] * 11, [None] * 10 + ["retry_budget"]),
    ("ratio-and-floor-configurable", Modes(retry_budget_ratio=0.5, retry_budget_min_retries=0),
     4, [(1, 2)] * 3, [None, None, "retry_budget"]),
    ("no-floor-no-firsts-refuses", Modes(retry_budget_min_retries=0), 0, [(2, 1)],
     ["retry_budget"]),
    ("priority-0-never-refused", Modes(retry_budget_min_retries=0), 0, [(0, 1)] * 3,
     [None] * 3),
    ("first-attempts-are-never-counted-as-retries", Modes(retry_budget_min_retries=0), 0,
     [(2, 0)] * 5, [None] * 5),
]  # fmt: skip


@pytest.mark.parametrize(("modes", "firsts", "retries", "want"), [c[1:] for c in BUDGET],
                         ids=[c[0] for c in BUDGET])  # fmt: skip
def test_retry_budget(
    modes: Modes, firsts: int, retries: list[tuple[int, int]], want: list[str | None]
) -> None:
    """Retries admitted per (gateway, scope) in the window: at most max(floor, ratio x
    first attempts); over it -> 429 retry_budget with x-should-retry: false."""
    e, d = Enforcement(modes), _d(retry_after_s=20)
    for i in range(firsts):
        assert e.decide(d, _r(3, key=f"f{i}"), 0.0).act.reason is None
    got = [e.decide(d, _retry(p, a, key=f"r{i}"), 100.0).act for i, (p, a) in enumerate(retries)]
    assert [v.reason for v in got] == want
    for v in got:
        if v.reason is not None:
            assert (v.status, v.should_retry) == (429, False)
            assert 10 <= v.retry_after_s <= 20
            assert ("x-should-retry", "false") in v.refusal_headers(1)


def test_retry_budget_window_slides_and_is_per_scope() -> None:
    e, d = Enforcement(Modes(retry_budget_min_retries=1)), _d()
    assert e.decide(d, _retry(), 0.0).act.reason is None
    assert e.decide(d, _retry(), 9_999.0).act.reason == "retry_budget"  # same window
    assert e.decide(d, _retry(), 10_000.0).act.reason is None  # the first one's second left
    other = _d(scope="other")
    assert e.decide(other, _retry(), 10_000.0).act.reason is None  # its own budget
    assert e.decide(d, _retry(), 10_500.0).act.reason == "retry_budget"


def test_a_repeated_logical_id_is_a_retry() -> None:
    """Without a retry count, the same idempotency key / client request id again within
    LOGICAL_ID_MEMORY_MS is a retry; once forgotten, a first attempt."""
    e, d = Enforcement(Modes(retry_budget_min_retries=0)), _d()
    assert e.decide(d, _retry(attempt=0, logical="L1"), 0.0).act.reason is None
    assert e.decide(d, _retry(attempt=0, logical="L1"), 1_000.0).act.reason is None  # 1 first
    # the window now holds 1 first attempt and 0 retries: 0.2 x 1 < 1 -> over budget
    assert e.decide(d, _retry(attempt=0, logical="L1"), 2_000.0).act.reason == "retry_budget"
    later = 2_000.0 + LOGICAL_ID_MEMORY_MS + 1.0
    assert e.decide(d, _retry(attempt=0, logical="L1"), later).act.reason is None


def test_retry_budget_only_while_a_directive_is_in_force() -> None:
    e = Enforcement(Modes(retry_budget_min_retries=0))
    assert e.decide(_d(0, "normal"), _retry(), 0.0).act.reason is None
    assert e.decide(None, _retry(), 0.0).act.reason is None


def test_shadow_counts_a_retry_over_budget_and_serves_it() -> None:
    e = Enforcement(Modes("shadow", retry_budget_min_retries=0))
    d = e.decide(_d(), _retry(), 0.0)
    assert (d.would_refuse, d.act) == ("retry_budget", ADMIT)
    assert e.refusals == {("shadow", "m", 2, "retry_budget"): 1}


@pytest.mark.parametrize(
    ("reason", "should_retry", "headers"),
    [
        ("admission", None, [("retry-after", "7"), ("x-tailguard-level", "2")]),
        ("queue_timeout", None, [("retry-after", "7"), ("x-tailguard-level", "2")]),
        ("retry_budget", False, [("retry-after", "7"), ("x-tailguard-level", "2"),
                                 ("x-should-retry", "false")]),
        ("admission", False, [("retry-after", "7"), ("x-tailguard-level", "2"),
                              ("x-should-retry", "false")]),
    ],
)  # fmt: skip
def test_refusal_headers(
    reason: Any, should_retry: bool | None, headers: list[tuple[str, str]]
) -> None:
    v = Verdict(reason=reason, retry_after_s=7, should_retry=should_retry)
    assert v.refusal_headers(2) == headers


INVITES = [
    # (id, modes, first attempts admitted, refusals (priority), want x-should-retry of each)
    ("floor-invites-a-trickle", Modes(), 0, [2] * 4, [None, None, None, False]),
    # the refused are first attempts too: the k-th (0-based) sees 41 + k of them
    ("20-percent-of-firsts", Modes(), 40, [3] * 12, [None] * 11 + [False]),
    ("no-budget-no-invitation", Modes(retry_budget_ratio=0.0, retry_budget_min_retries=0), 50,
     [1, 3], [False, False]),
    ("priority-0-never-told", Modes(retry_budget_min_retries=0), 0, [0, 0], [None, None]),
]  # fmt: skip


@pytest.mark.parametrize(("modes", "firsts", "refused", "want"), [c[1:] for c in INVITES],
                         ids=[c[0] for c in INVITES])  # fmt: skip
def test_a_refusal_invites_a_retry_only_within_the_budget(
    modes: Modes, firsts: int, refused: list[int], want: list[bool | None]
) -> None:
    """A refusal leaves the retry to the client (no header) while the window's
    invitations are under the budget's allowance; past it, x-should-retry: false (its
    retry would come back over budget), so refused clients do not all come back."""
    e = Enforcement(modes)
    admit_all = _d(retry_after_s=20)
    for i in range(firsts):
        assert e.decide(admit_all, _r(3, key=f"f{i}"), 0.0).act.reason is None
    shed_all = _d(shed_priorities_at_or_above=0, retry_after_s=20)
    got = [e.decide(shed_all, _r(p, key=f"x{i}"), 100.0).act for i, p in enumerate(refused)]
    assert [v.reason for v in got] == ["shed_priority"] * len(refused)
    assert [v.should_retry for v in got] == want


SPREAD = [
    # (id, Retry-After, u, want): ceil(R·(1 - u/2)), at least 1; 0 stays 0
    ("u-0-is-R", 30, 0.0, 30),
    ("u-half", 30, 0.5, 23),
    ("u-near-1-is-half", 30, 0.999, 16),
    ("one-stays-one", 1, 0.99, 1),
    ("zero-stays-zero", 0, 0.5, 0),
]


@pytest.mark.parametrize(("base", "u", "want"), [c[1:] for c in SPREAD],
                         ids=[c[0] for c in SPREAD])  # fmt: skip
def test_retry_after_spread(base: int, u: float, want: int) -> None:
    assert spread_retry_after_s(base, u) == want


def test_retry_after_spread_without_a_key_is_even() -> None:
    e, d = Enforcement(), _d(shed_priorities_at_or_above=1, retry_after_s=20)
    got = [e.decide(d, _r(2, key=None), 0.0).act.retry_after_s for _ in range(1000)]
    assert set(got) == set(range(11, 21))
    assert max(got.count(s) for s in set(got)) < 1.5 * min(got.count(s) for s in set(got))


def test_gateway_settings_default_to_the_enforcements_budget_and_bad_values_fail() -> None:
    """Every gateway (tailguard gateway, the LiteLLM hook) builds its Modes from these
    settings and the simulator's gates from Modes(): the same budget by default."""
    from pydantic import ValidationError

    from pipeline.kafka_settings import EmitterSettings

    fields = EmitterSettings.model_fields
    assert fields["control_retry_budget_ratio"].default == Modes().retry_budget_ratio
    assert fields["control_retry_budget_min_retries"].default == Modes().retry_budget_min_retries
    for bad in ({"control_retry_budget_ratio": -0.5}, {"control_retry_budget_ratio": "nan"},
                {"control_retry_budget_min_retries": -1}):  # fmt: skip
        with pytest.raises(ValidationError):
            EmitterSettings(**bad)  # type: ignore[arg-type]
