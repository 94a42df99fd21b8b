"""One definition per concept (issue 38): the policy's actions are the directive's.

``ActionsSpec`` (what a control policy sets per level) is derived from the wire type
``Actions`` (what the controller signs and the gateways read): the fields marked
``policy`` with their types, bounds and defaults. A field added to ``Actions`` with the
mark is settable in a policy and reaches the directive with no second type to touch.
"""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from pipeline.contract.control_signal import POLICY_FIELDS, TURNS_AWAY_FIELDS, Actions
from pipeline.spec.policy import ActionsSpec, derive_actions_spec

SPEC_ONLY = {"admission", "queue_cutoff"}


def test_the_policy_fields_are_the_directives() -> None:
    spec_fields = ActionsSpec.model_fields
    assert set(spec_fields) - SPEC_ONLY == set(POLICY_FIELDS)
    for name in POLICY_FIELDS:
        wire = Actions.model_fields[name]
        assert spec_fields[name].annotation == wire.annotation, name
        assert spec_fields[name].default == wire.default, name
        assert spec_fields[name].metadata == wire.metadata, name  # the same bounds
    assert set(TURNS_AWAY_FIELDS) <= set(POLICY_FIELDS)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("shed_priorities_at_or_above", 2),
        ("cap_context_tokens", 8192),
        ("fallback_model", "llama-3-8b"),
        ("reject_new_sessions", True),
        ("retry_after_s", 45),
        ("rate_limit_rps", 12.5),
    ],
)
def test_every_policy_field_reaches_the_directive(field: str, value: object) -> None:
    assert field in POLICY_FIELDS
    actions = ActionsSpec.model_validate({field: value}).to_actions()
    assert getattr(actions, field) == value
    assert actions.to_json()[field] == value  # signed as set


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"shed_priorities_at_or_above": 4}, "less than or equal to 3"),
        ({"cap_context_tokens": 0}, "greater than or equal to 1"),
        ({"retry_after_s": 100_000}, "less than or equal to 86400"),
        ({"rate_limit_rps": 0}, "greater than 0"),
        ({"admit_rps": 5}, "admit_rps"),  # the controller's, not the policy's
    ],
)
def test_the_wire_bounds_hold_in_the_policy(doc: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        ActionsSpec.model_validate(doc)


class _ActionsPlus(Actions):
    """The directive with a field added (what a maintainer would write)."""

    hold_new_streams: bool = Field(
        default=False,
        json_schema_extra={"policy": True, "turns_away": True},
        description="Hold new streams at the gateway.",
    )


def test_a_new_field_reaches_the_gateway_without_a_second_type() -> None:
    spec_type = derive_actions_spec(_ActionsPlus)
    spec = spec_type.model_validate({"hold_new_streams": True, "retry_after_s": 9})
    assert spec.turns_away()  # marked turns_away: the load gate sees it
    actions = spec.to_actions()
    assert isinstance(actions, _ActionsPlus)
    assert actions.hold_new_streams is True
    assert actions.to_json()["hold_new_streams"] is True  # what is signed
    # the gateway side decodes the signed JSON with the same type
    assert _ActionsPlus.model_validate(actions.to_json()).hold_new_streams is True
    with pytest.raises(ValidationError):
        spec_type.model_validate({"hold_new_stream": True})  # a misspelling is refused
