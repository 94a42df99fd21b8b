"""Signed degradation directives (L0-L3) on the compacted topic ``tailguard.control``.

Pure: the standard library (``hmac``, ``hashlib``, ``base64``), orjson and
pydantic; no files, environment, Kafka, Faust or ClickHouse (keys arrive as values:
:mod:`producers.control_keys` reads key files and the environment).

The stream worker decides a level per *scope* (a model name, or ``"*"`` for
all traffic) and publishes a :class:`ControlSignal`; the serving layer
(:mod:`producers.control_client`) verifies it and sheds load accordingly.

Wire format (contract v1)
-------------------------
Kafka message: key = ``utf8(scope)`` (the topic is compacted, so the log keeps
the latest signal per scope), value = one JSON object::

    {"actions":{"admit_fraction":null,"admit_gateways":null,"admit_rps":null,
                "cap_context_tokens":8192,"deadline_margin":null,
                "fair_share":false,"fallback_model":"llama-8b","hold_fraction":null,
                "queue_timeout_ms":null,"rate_limit_rps":null,
                "reject_new_sessions":true,"retry_after_s":30,
                "shed_priorities_at_or_above":2,"tenant_weights":null,
                "ttft_queue_ms":null,"ttft_service_ms":null},
     "as_of_unix_ms":1699999990000,
     "budget_exhausted":false,"expires_at_unix_ms":1700000030000,
     "figures":{"p99_ms":412.5,"violation_rate":0.31},
     "issued_at_unix_ms":1700000000000,"kid":"k1","level":1,
     "notify_customer":true,"phase":"degraded",
     "reason":"p99 > 300 ms for 5 min","scope":"llama-70b","seq":42,
     "sig":"<base64 of 32 bytes>","v":1}

(:func:`encode` writes exactly the canonical form below plus ``sig``, so the
value is itself sorted and compact; the line breaks above are for reading.)
Every field is always present (``null`` where unset). Readers ignore fields
they do not know, but such fields are covered by the signature.

Canonical bytes (what is signed)
--------------------------------
``sig = base64(HMAC-SHA256(secret[kid], canonical))`` (standard alphabet, with
``=`` padding, 44 characters), where ``canonical`` is the signal object
**without the ``sig`` member** (``kid`` is included, so a signature cannot be
moved to another key), serialised as orjson does with ``OPT_SORT_KEYS``:

* UTF-8, no whitespace anywhere (``{"a":1,"b":[1,2]}``);
* object members sorted by key, ascending by Unicode code point (= by UTF-8
  bytes), at every nesting level (``actions`` and ``figures`` too);
* strings: only ``"``, ``\\`` and control characters U+0000-U+001F escaped
  (``\\n``, ``\\t``, ``\\r``, ``\\b``, ``\\f``, others ``\\u00XX``); ``/`` and
  non-ASCII characters are written raw (UTF-8), never as ``\\uXXXX``;
* integers in plain decimal; ``true``/``false``/``null``;
* floats (finite only: NaN and infinities are rejected) as the shortest
  decimal that round-trips to the same IEEE-754 double (Python ``repr``),
  integral values keep ``.0`` (``1.0``), and magnitudes below 1e-4 or from
  1e16 up use exponent form with no exponent padding (``1e-7``,
  ``1.5e+20``, ``1e+16``).

A verifier in another language parses the value, deletes ``sig``, serialises
the rest by these rules and compares HMACs in constant time. The golden vector
in ``tests/unit/test_control_signal.py`` (fixed key and signal -> exact
canonical bytes and ``sig``) is the conformance test to port. This module
verifies over the bytes it re-serialises from the *parsed JSON* (not from the
validated model), so a field added later by a newer issuer still verifies.

Validity, expiry and the fail-open rule
---------------------------------------
``expires_at_unix_ms = issued_at_unix_ms + ttl_ms``; by default the issuer
re-sends the current directive of every scope every ``heartbeat_ms`` = 10 s
(:meth:`SignalIssuer.due_heartbeats`, with a fresh ``seq`` and expiry) and
``ttl_ms`` = 3 x heartbeat = 30 s, so two lost heartbeats are tolerated. A
signal is rejected as ``expired`` when ``now >= expires_at_unix_ms`` and as
``not_yet_valid`` when ``issued_at_unix_ms > now + max_skew_ms`` (default 5 s).
Both clocks are wall clocks of different hosts: they must be NTP-synchronised
to well under ``max_skew_ms``.

Maximum lifetime (``max_ttl_ms``)
---------------------------------
A verifier never enforces a signal for longer than ``max_ttl_ms`` after its
``issued_at_unix_ms`` (default :data:`DEFAULT_MAX_TTL_MS` = 5 minutes, ten times
the default ``ttl_ms``: an issuer may raise its heartbeat to ``max_ttl_ms`` / 3
= 100 s and still be obeyed in full). A signal that claims a longer expiry is
*clamped*, not refused: its effective expiry is ``issued_at_unix_ms +
max_ttl_ms`` (:attr:`VerifiedSignal.expires_at_unix_ms`), the serving side
counts and logs it, and it still verifies (the signature covers the claimed
expiry, which is kept as sent). So a correctly signed signal with a 365-day
expiry -- a misconfigured issuer, or one captured and re-published -- holds
for at most ``max_ttl_ms`` after it was issued, also for a verifier that starts
later and reads it from the compacted topic; and an issuer whose ``ttl_ms`` is
a little long still gets its directives enforced, renewed by its heartbeats.
The issuer refuses to sign beyond its own ``max_ttl_ms`` (:func:`sign`,
:class:`SignalIssuer`): configure both sides alike.

When the current directive of a scope expires without a newer valid signal,
the serving side **fails open to level 0** (normal service) and counts it.
Why: shedding turns paying traffic away; only a live controller that still
sees the overload may keep doing that. A dead, partitioned or misconfigured
controller (a key rotated away, a topic ACL broken) is not evidence of
overload, and fail-closed ("keep the last directive until told otherwise")
would let any such fault keep customers degraded forever, with nobody
noticing because shedding *looks* like protection. The serving engines keep
their own local protection (queue caps and queue timeouts -> 503), so failing
open degrades to "no global coordination", not to "no protection". The
alternative -- keeping the last level, or decaying one level per TTL -- suits
setups where an overload outlives its controller (e.g. the same fault kills
both); it could be added as a serving-side policy without changing this wire
format. Heartbeats are what let the serving side tell "still L1" from
"controller dead".

The loop's delay (``as_of_unix_ms``)
------------------------------------
``as_of_unix_ms`` is the *event time* of the evidence: the end of the latest base
window the decision read (the controller's evaluation time). ``issued_at`` and
``expires_at`` are the issuer's wall clock and say nothing about how old the evidence
is: a controller that trails its input by minutes issues fresh signals about old
windows. The serving side reports the loop's delay as *the gateway's time when it
applies the signal - as_of_unix_ms* (:class:`producers.loop_delay.LoopDelay`), both
read as event time: event time is the clock the gateways stamp their own
``gateway.*`` events with, so a gateway subtracts its own wall clock from a boundary
of the axis its clock (and its NTP-synchronised peers', the assumption
``max_skew_ms`` already makes) defines; the figure is good to that skew. Where event
time is simulated (the demo's sped-up simulator), the simulated gateways read the
simulator's clock instead of the wall clock: see :class:`producers.simulator.gate.GatewayGate`.
Heartbeats carry the ``as_of_unix_ms`` of the decision they repeat.

Sequence numbers and restarts
-----------------------------
``seq`` (>= 1) strictly increases per scope. The serving side's
:class:`SequenceGuard` rejects a ``seq`` at or below the last one accepted for
that scope (``replayed`` when equal, ``stale`` when lower), so a captured
signal cannot be re-played to re-impose or lift a directive. Consequently the
issuer's counters must survive a worker restart: at start-up the worker reads
the compacted topic from the beginning, feeds the values to
:func:`resume_seqs` (which verifies signatures, so a forged huge ``seq``
cannot poison the counters) and passes the result as ``initial_seqs`` to
:class:`SignalIssuer`. Should the counters be lost anyway, the serving side
recovers by itself once its last accepted signal for a scope has expired: a
signal with a lower ``seq`` but a *later* ``issued_at_unix_ms`` is then
accepted (see :class:`SequenceGuard`); until then the new signals are counted
as ``stale``.

Keys and rotation
-----------------
:class:`Keyring` maps key ids (``kid``) to secrets (>= 32 bytes) and names the
active kid used for signing. Rotation: (1) add the new kid to every verifier,
(2) make it active on the issuer, (3) keep the old kid on the verifiers until
every signal signed with it has expired (ttl; heartbeats re-sign with the new
key within one heartbeat), (4) retire it by removing it. Secrets never appear
in ``repr``/``str``, logs or error messages.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, Self

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

SIGNAL_VERSION: Final = 1
DEFAULT_HEARTBEAT_MS: Final = 10_000
DEFAULT_TTL_MS: Final = 3 * DEFAULT_HEARTBEAT_MS
DEFAULT_MAX_SKEW_MS: Final = 5_000
DEFAULT_MAX_TTL_MS: Final = 10 * DEFAULT_TTL_MS  # 5 minutes
MAX_SIGNAL_BYTES: Final = 65_536
REASON_MAX_CHARS: Final = 1024
MAX_FIGURES: Final = 64
MIN_SECRET_BYTES: Final = 32
ALL_SCOPES: Final = "*"

KID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_KID_RE: Final = re.compile(KID_PATTERN)
_SIG_LEN: Final = 44  # base64 of a 32-byte HMAC-SHA256, padded

Level = Annotated[int, Field(ge=0, le=3)]
Phase = Literal["normal", "degraded", "half_open"]
FigureKey = Annotated[str, Field(min_length=1, max_length=128)]
Figure = Annotated[float, Field(allow_inf_nan=False)] | bool | None


# --------------------------------------------------------------------------- model


class _Frozen(BaseModel):
    # extra="ignore": fields added by a newer issuer are skipped by older readers
    # (they are still covered by the signature, see the module docstring).
    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")


CutoffMs = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
TenantName = Annotated[str, Field(min_length=1, max_length=256)]
TenantWeight = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


class Actions(_Frozen):
    """What the serving layer does at this directive (all off by default)."""

    shed_priorities_at_or_above: Level | None = Field(
        json_schema_extra={"policy": True, "turns_away": True},
        default=None,
        description="Refuse (429) requests whose priority >= this (0 = highest ... 3).",
    )
    cap_context_tokens: int | None = Field(
        json_schema_extra={"policy": True},
        default=None,
        ge=1,
        description="Pass a max-context cap upstream.",
    )
    fallback_model: str | None = Field(
        json_schema_extra={"policy": True},
        default=None,
        min_length=1,
        max_length=256,
        description="Route to this (smaller) model.",
    )
    reject_new_sessions: bool = Field(
        json_schema_extra={"policy": True, "turns_away": True},
        default=False,
        description="Refuse (429) requests that open a new session, except priority 0 (real-time).",
    )
    retry_after_s: int = Field(
        json_schema_extra={"policy": True},
        default=5,
        ge=0,
        le=86_400,
        description="Retry-After of a refusal or queue cut-off caused by this directive.",
    )
    rate_limit_rps: float | None = Field(
        json_schema_extra={"policy": True, "turns_away": True},
        default=None,
        gt=0.0,
        allow_inf_nan=False,
        description=(
            "Requests/s each gateway instance admits (a token bucket, burst one second; "
            "priority 0 passes either way)."
        ),
    )
    admit_fraction: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Half-open only: fraction of otherwise rejected requests admitted.",
    )
    admit_rps: float | None = Field(
        default=None,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "Capacity-aware admission: requests/s this scope's gateways admit together, "
            "by strict priority (0 first, then 1, 2, 3 fill what is left); derived from "
            "what the engines served, corrected by feedback."
        ),
    )
    admit_gateways: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="admit_rps is split equally among this many gateway instances.",
    )
    queue_timeout_ms: list[CutoffMs | None] | None = Field(
        default=None,
        min_length=4,
        max_length=4,
        description=(
            "Queue cut-off per priority 0..3 (null: none; priority 0's is always null): a "
            "request still waiting for its first token this long after the gateway "
            "forwarded it is cancelled (503 + Retry-After). It is bad already on the "
            "tightest SLO that covers it, and the queue it leaves is what priority 0 "
            "would wait behind."
        ),
    )

    fair_share: bool = Field(
        json_schema_extra={"policy": True},
        default=False,
        description=(
            "With admit_rps: the admitted rate is shared max-min fairly among the tenants "
            "that want it (x-tenant-id), weighted by tenant_weights, each tenant's share "
            "by its own priorities in order; what a tenant sends above its share is "
            "turned away first. False: blind to tenants, strict by priority."
        ),
    )
    tenant_weights: dict[TenantName, TenantWeight] | None = Field(
        json_schema_extra={"policy": True},
        default=None,
        max_length=10_000,
        description=(
            "With fair_share: the tenants' weights in the fair shares (a tenant not named "
            "weighs 1; null: all equal)."
        ),
    )
    deadline_margin: float | None = Field(
        json_schema_extra={"policy": True, "turns_away": True},
        default=None,
        ge=0.0,
        le=100.0,
        allow_inf_nan=False,
        description=(
            "Deadline-aware admission (with admission): refuse (429, deadline) a request "
            "of priority >= 1 whose own first-token SLO (x-llm-d-slo-ttft-ms) its "
            "predicted first-token time exceeds by more than this share (0.25: by 25 %), "
            "or whose predicted queue wait exceeds its priority's queue cut-off by more; "
            "the wait is the queue the gateway sees (its forwarded requests with no first "
            "byte yet over their first-byte rate), else ttft_queue_ms, plus "
            "ttft_service_ms; null: never refused as late."
        ),
    )
    hold_fraction: float | None = Field(
        json_schema_extra={"policy": True},
        default=None,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description=(
            "Hold before refusal (with admission): a request admission has no token for "
            "now, whose deadline leaves slack (a non-streaming request: the SLO spec's "
            "threshold for its boundary; or its own first-token SLO), waits at the "
            "gateway up to this share of that slack (at most 3 s) for a token at its "
            "priority, in priority order, and is refused only when the wait runs out; "
            "null: refused at once."
        ),
    )
    ttft_queue_ms: float | None = Field(
        default=None,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "Deadline-aware admission: the time a request arriving now is predicted to "
            "wait queued for its first token (the engines' waiting requests over their "
            "measured service rate), for a gateway that has not seen enough first bytes "
            "of its own to tell. A request that carries its own first-token SLO and "
            "is predicted to miss it by a margin is refused at once (429, deadline); "
            "priority 0 never."
        ),
    )
    ttft_service_ms: float | None = Field(
        default=None,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "Deadline-aware admission: the first-token time without a queue (the "
            "measured median prefill and gateway overhead), added to ttft_queue_ms."
        ),
    )

    @field_validator("queue_timeout_ms")
    @classmethod
    def _priority_0_never_cut(cls, v: list[float | None] | None) -> object:
        if v is not None and v[0] is not None:
            raise ValueError("queue_timeout_ms[0] must be null: priority 0 is never cut off")
        return v

    def queue_timeout_for(self, priority: int) -> float | None:
        """The queue cut-off of a request of ``priority`` (None: not cut off)."""
        if self.queue_timeout_ms is None or not 0 < priority < len(self.queue_timeout_ms):
            return None
        return self.queue_timeout_ms[priority]

    def to_json(self) -> dict[str, Any]:
        """Every field (``null`` where unset), as signed on the wire."""
        return self.model_dump()


def marked_fields(actions: type[Actions], mark: str) -> tuple[str, ...]:
    """The fields of ``actions`` whose ``json_schema_extra`` sets ``mark``."""
    return tuple(
        name
        for name, f in actions.model_fields.items()
        if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get(mark)
    )


# The fields a control policy sets per level (``json_schema_extra={"policy": True}``):
# the policy's ActionsSpec is derived from them (pipeline/spec/policy.py), so a field
# added here with the mark is a policy field too, validated the same, and reaches the
# directive (one definition). The others the controller fills in (admit_fraction,
# admit_rps, admit_gateways, queue_timeout_ms, ttft_queue_ms, ttft_service_ms).
POLICY_FIELDS: Final = marked_fields(Actions, "policy")
# Policy fields that turn requests away when set (ActionsSpec.turns_away, the load gate).
TURNS_AWAY_FIELDS: Final = marked_fields(Actions, "turns_away")


class Decision(_Frozen):
    """What the controller decided for a scope: a signal minus its envelope.

    The one decision type: the policy engine makes it
    (:attr:`pipeline.core.policy.Evaluation.decision`), the issuer signs it, the
    serving side reads it back (:meth:`ControlSignal.decision`).

    Invariants: ``phase == "normal"`` exactly when ``level == 0``; ``admit_fraction``
    only in ``half_open``.
    """

    level: Level
    phase: Phase
    actions: Actions = Field(default_factory=Actions)
    reason: str = Field(default="", max_length=REASON_MAX_CHARS)
    figures: dict[FigureKey, Figure] = Field(default_factory=dict, max_length=MAX_FIGURES)
    notify_customer: bool = False
    budget_exhausted: bool = False

    @field_validator("figures", mode="before")
    @classmethod
    def _finite_figures(cls, v: object) -> object:
        # Figures are informational; JSON has no NaN/infinity: write them as null.
        if isinstance(v, Mapping):
            return {
                k: None if isinstance(x, float) and not math.isfinite(x) else x
                for k, x in v.items()
            }
        return v

    @classmethod
    def from_mapping(cls, fields: Mapping[str, Any], *, ignore_unknown: bool = False) -> Decision:
        """A decision from a mapping (e.g. a policy engine's JSON, whose extra keys
        such as ``scope`` or ``since_ms`` need ``ignore_unknown=True``); lax types."""
        unknown = set(fields) - set(Decision.model_fields)
        if unknown and not ignore_unknown:
            raise ValueError(f"unknown decision fields: {sorted(unknown)}")
        return Decision.model_validate(
            {k: v for k, v in fields.items() if k in Decision.model_fields}, strict=False
        )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.level == 0) != (self.phase == "normal"):
            raise ValueError("phase must be 'normal' exactly when level is 0")
        if self.actions.admit_fraction is not None and self.phase != "half_open":
            raise ValueError("actions.admit_fraction is only valid in phase 'half_open'")
        return self


class UnsignedSignal(Decision):
    """A decision with its envelope (scope, sequence, validity), not yet signed."""

    v: Literal[1] = SIGNAL_VERSION
    scope: str = Field(min_length=1, max_length=256)
    seq: int = Field(ge=1)
    issued_at_unix_ms: int = Field(ge=0)
    expires_at_unix_ms: int = Field(ge=0)
    # The evidence's event time: the end of the latest window the decision read (its
    # evaluation time, ``Evaluation.now_ms``); null when unknown (an older issuer, or a
    # hand-made signal). Event time, not the issuer's wall clock: the serving side
    # measures the loop's delay against it (see "The loop's delay" above).
    as_of_unix_ms: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _validity(self) -> Self:
        if self.expires_at_unix_ms <= self.issued_at_unix_ms:
            raise ValueError("expires_at_unix_ms must be after issued_at_unix_ms")
        return self


class ControlSignal(UnsignedSignal):
    """The value of one ``tailguard.control`` message (key = ``scope``)."""

    kid: str = Field(pattern=KID_PATTERN)
    sig: str = Field(min_length=_SIG_LEN, max_length=_SIG_LEN)

    def decision(self) -> Decision:
        return Decision.from_mapping(self.model_dump(), ignore_unknown=True)


# --------------------------------------------------------------------------- keys


class KeyConfigError(ValueError):
    """Unusable key configuration (a start-up error). Never contains a secret."""


class Keyring:
    """``kid -> secret`` plus the active kid used for signing. Immutable.

    ``repr``/``str`` show the key ids only. Rotation helpers return new keyrings:
    :meth:`with_key` (add, optionally activate), :meth:`activate`, :meth:`retire`.
    """

    __slots__ = ("_active", "_keys")

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if not keys:
            raise KeyConfigError("control keyring: no keys")
        checked: dict[str, bytes] = {}
        for kid, secret in keys.items():
            if not isinstance(kid, str) or not _KID_RE.match(kid):
                raise KeyConfigError(f"control keyring: key id {kid!r} must match {KID_PATTERN}")
            if not isinstance(secret, bytes | bytearray):
                raise KeyConfigError(f"control keyring: key {kid!r}: secret must be bytes")
            if len(secret) < MIN_SECRET_BYTES:
                raise KeyConfigError(
                    f"control keyring: key {kid!r}: secret has {len(secret)} bytes, "
                    f"needs >= {MIN_SECRET_BYTES}"
                )
            checked[kid] = bytes(secret)
        if active not in checked:
            raise KeyConfigError(
                f"control keyring: active key id {active!r} is not among {sorted(checked)}"
            )
        self._keys: Final[dict[str, bytes]] = checked
        self._active: Final[str] = active

    # -- reading
    @property
    def active_kid(self) -> str:
        return self._active

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys))

    def secret(self, kid: str) -> bytes | None:
        return self._keys.get(kid)

    def __contains__(self, kid: object) -> bool:
        return kid in self._keys

    def __repr__(self) -> str:
        return f"Keyring(active={self._active!r}, kids={list(self.kids)!r})"

    __str__ = __repr__

    # -- rotation
    def with_key(self, kid: str, secret: bytes, *, activate: bool = False) -> Keyring:
        if kid in self._keys:
            raise KeyConfigError(f"control keyring: key id {kid!r} already present")
        return Keyring({**self._keys, kid: secret}, kid if activate else self._active)

    def activate(self, kid: str) -> Keyring:
        return Keyring(self._keys, kid)

    def retire(self, kid: str) -> Keyring:
        if kid == self._active:
            raise KeyConfigError(f"control keyring: cannot retire the active key {kid!r}")
        if kid not in self._keys:
            raise KeyConfigError(f"control keyring: no key {kid!r} to retire")
        return Keyring({k: s for k, s in self._keys.items() if k != kid}, self._active)

    # -- loading
    @classmethod
    def from_base64(cls, keys: Mapping[str, str], active: str) -> Keyring:
        """``{kid: base64(secret)}`` (standard alphabet, padded) and the active kid."""
        return cls({kid: _b64_secret(kid, value) for kid, value in keys.items()}, active)

    @classmethod
    def from_env_string(cls, spec: str, active: str) -> Keyring:
        """``"k1:<base64>,k2:<base64>"`` (whitespace around items ignored)."""
        keys: dict[str, str] = {}
        for n, item in enumerate(x.strip() for x in spec.split(",")):
            if not item:
                continue
            kid, sep, value = item.partition(":")
            kid = kid.strip()
            if not sep:
                raise KeyConfigError(f"control keys: item {n} is not 'kid:base64'")
            if kid in keys:
                raise KeyConfigError(f"control keys: key id {kid!r} appears twice")
            keys[kid] = value.strip()
        return cls.from_base64(keys, active.strip())

    @classmethod
    def from_document(cls, doc: object, where: str) -> Keyring:
        """A parsed key document ``{active: k2, keys: {k1: <base64>, k2: <base64>}}``;
        ``where`` names its source in errors (a file path, never a secret)."""
        if not isinstance(doc, dict):
            raise KeyConfigError(f"{where}: expected a mapping with 'active', 'keys'")
        unknown = set(doc) - {"active", "keys"}
        if unknown:
            raise KeyConfigError(f"{where}: unknown fields {sorted(map(str, unknown))}")
        active, keys = doc.get("active"), doc.get("keys")
        if not isinstance(active, str):
            raise KeyConfigError(f"{where}: 'active' must be a key id string")
        if not isinstance(keys, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in keys.items()
        ):
            raise KeyConfigError(f"{where}: 'keys' must map key ids to base64 strings")
        return cls.from_base64(keys, active)


def _b64_secret(kid: str, value: str) -> bytes:
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyConfigError(f"control keyring: key {kid!r}: secret is not valid base64") from None


# --------------------------------------------------------------------------- codec


def _canonical_from_obj(obj: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in obj.items() if k != "sig"}
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def canonical_bytes(signal: UnsignedSignal) -> bytes:
    """The bytes the HMAC covers: the signal without ``sig``, sorted and compact."""
    return _canonical_from_obj(signal.model_dump(mode="json"))


def _mac(secret: bytes, canonical: bytes) -> bytes:
    return hmac.new(secret, canonical, hashlib.sha256).digest()


def sign(
    signal: UnsignedSignal, keyring: Keyring, *, max_ttl_ms: int = DEFAULT_MAX_TTL_MS
) -> ControlSignal:
    """Sign with the keyring's active key (sets ``kid`` and ``sig``).

    A :class:`ControlSignal` may be passed: its old ``kid``/``sig`` are replaced.
    Refuses (``ValueError``) a signal that would live longer than ``max_ttl_ms``
    (verifiers would clamp it anyway; see the module's docstring).
    """
    ttl = signal.expires_at_unix_ms - signal.issued_at_unix_ms
    if ttl > max_ttl_ms:
        raise ValueError(
            f"refusing to sign a signal that lives {ttl} ms: more than max_ttl_ms {max_ttl_ms}"
        )
    body = signal.model_dump(mode="json", exclude={"kid", "sig"})
    body["kid"] = keyring.active_kid
    secret = keyring.secret(keyring.active_kid)
    assert secret is not None  # the active kid is always in the keyring
    sig = base64.b64encode(_mac(secret, _canonical_from_obj(body))).decode("ascii")
    return ControlSignal.model_validate({**body, "sig": sig})


def encode(signal: ControlSignal) -> bytes:
    """Message value: the canonical bytes including ``sig`` (sorted, compact)."""
    return orjson.dumps(signal.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


def message_key(signal: UnsignedSignal) -> bytes:
    """Kafka key of a signal: its scope (the topic is compacted per scope)."""
    return signal.scope.encode("utf-8")


class RejectReason(enum.StrEnum):
    MALFORMED = "malformed"
    UNKNOWN_KID = "unknown_kid"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    REPLAYED = "replayed"  # SequenceGuard: same seq as the last accepted one
    STALE = "stale"  # SequenceGuard: lower seq than the last accepted one


@dataclass(frozen=True, slots=True)
class VerifiedSignal:
    """A signal that verified; ``max_ttl_ms``: the verifier's cap on its lifetime."""

    signal: ControlSignal
    max_ttl_ms: int = DEFAULT_MAX_TTL_MS

    @property
    def expires_at_unix_ms(self) -> int:
        """When the verifier stops enforcing it: the signal's own expiry, at most
        ``max_ttl_ms`` after it was issued."""
        return effective_expiry_ms(self.signal, self.max_ttl_ms)

    @property
    def clamped(self) -> bool:
        """It claimed a longer life than ``max_ttl_ms``."""
        return self.expires_at_unix_ms < self.signal.expires_at_unix_ms


def effective_expiry_ms(signal: UnsignedSignal, max_ttl_ms: int) -> int:
    """``expires_at_unix_ms``, at most ``max_ttl_ms`` after ``issued_at_unix_ms``."""
    return min(signal.expires_at_unix_ms, signal.issued_at_unix_ms + max_ttl_ms)


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: RejectReason
    detail: str = ""
    scope: str | None = None
    seq: int | None = None


def _verify(raw: bytes, keyring: Keyring) -> VerifiedSignal | Rejection:
    """Parse, check the signature, validate. No time checks."""
    if len(raw) > MAX_SIGNAL_BYTES:
        return Rejection(RejectReason.MALFORMED, f"{len(raw)} bytes > {MAX_SIGNAL_BYTES}")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return Rejection(RejectReason.MALFORMED, f"invalid JSON: {e}")
    if not isinstance(obj, dict):
        return Rejection(RejectReason.MALFORMED, "not a JSON object")
    if obj.get("v") != SIGNAL_VERSION or isinstance(obj.get("v"), bool):
        return Rejection(RejectReason.MALFORMED, f"unsupported version {obj.get('v')!r}")
    kid, sig = obj.get("kid"), obj.get("sig")
    scope = obj.get("scope") if isinstance(obj.get("scope"), str) else None
    seq = obj.get("seq") if type(obj.get("seq")) is int else None
    if not isinstance(kid, str) or not isinstance(sig, str):
        return Rejection(RejectReason.MALFORMED, "kid and sig must be strings", scope, seq)
    try:
        mac = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        mac = b""
    if len(mac) != hashlib.sha256().digest_size:
        return Rejection(RejectReason.MALFORMED, "sig is not base64 of 32 bytes", scope, seq)
    secret = keyring.secret(kid)
    if secret is None:
        return Rejection(RejectReason.UNKNOWN_KID, f"kid {kid[:64]!r}", scope, seq)
    if not hmac.compare_digest(mac, _mac(secret, _canonical_from_obj(obj))):
        return Rejection(RejectReason.BAD_SIGNATURE, f"kid {kid!r}", scope, seq)
    try:
        signal = ControlSignal.model_validate(obj)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in first["loc"]) or "<root>"
        return Rejection(RejectReason.MALFORMED, f"{loc}: {first['msg']}", scope, seq)
    return VerifiedSignal(signal)


def decode_and_verify(
    raw: bytes,
    keyring: Keyring,
    now_ms: int,
    *,
    max_skew_ms: int = DEFAULT_MAX_SKEW_MS,
    max_ttl_ms: int = DEFAULT_MAX_TTL_MS,
) -> VerifiedSignal | Rejection:
    """Bytes -> verified signal, or the first reason to reject it. Never raises.

    Checks, in order: size, JSON object, ``v == 1``, ``kid``/``sig`` present
    (``malformed``); ``kid`` known (``unknown_kid``); HMAC (``bad_signature``);
    schema (``malformed``); ``now >=`` the effective expiry (``expired``:
    ``expires_at``, at most ``issued_at + max_ttl_ms``);
    ``issued_at > now + max_skew_ms`` (``not_yet_valid``). Sequence rules are
    :class:`SequenceGuard`'s.
    """
    if max_ttl_ms < 1:
        raise ValueError(f"max_ttl_ms must be >= 1, got {max_ttl_ms}")
    try:
        out = _verify(bytes(raw), keyring)
    except Exception as e:  # defensive: bad input must never raise
        return Rejection(RejectReason.MALFORMED, f"{type(e).__name__}")
    if isinstance(out, Rejection):
        return out
    out = VerifiedSignal(out.signal, max_ttl_ms)
    s = out.signal
    if now_ms >= out.expires_at_unix_ms:
        clamp = (
            f" (issued at {s.issued_at_unix_ms} + max_ttl_ms {max_ttl_ms}; "
            f"the signal claims {s.expires_at_unix_ms})"
            if out.clamped
            else ""
        )
        return Rejection(
            RejectReason.EXPIRED,
            f"expired at {out.expires_at_unix_ms}{clamp}, now {now_ms}",
            s.scope,
            s.seq,
        )
    if s.issued_at_unix_ms > now_ms + max_skew_ms:
        return Rejection(
            RejectReason.NOT_YET_VALID,
            f"issued at {s.issued_at_unix_ms} > now {now_ms} + skew {max_skew_ms}",
            s.scope,
            s.seq,
        )
    return out


# --------------------------------------------------------------------------- replay guard


@dataclass(frozen=True, slots=True)
class _Last:
    seq: int
    issued_at_unix_ms: int
    expires_at_unix_ms: int


class SequenceGuard:
    """Per scope, the last accepted ``seq``: only strictly newer signals pass.

    :meth:`admit` rejects ``seq == last`` as ``replayed`` and ``seq < last`` as
    ``stale``, except (``allow_reset_after_expiry``, default on) when the last
    accepted signal of the scope has expired *and* the candidate was issued
    later than it: an issuer that lost its counters then recovers after one TTL
    instead of being locked out until every serving process restarts. A replay
    cannot use this door: a replayed signal was issued no later than the last
    accepted one.

    Bounded: at most ``max_scopes`` scopes, least recently updated evicted
    first (only signed signals reach the guard, so scopes are the issuer's;
    the bound is a safety net).
    """

    def __init__(self, max_scopes: int = 10_000, *, allow_reset_after_expiry: bool = True) -> None:
        if max_scopes < 1:
            raise ValueError("max_scopes must be >= 1")
        self.max_scopes = max_scopes
        self.allow_reset_after_expiry = allow_reset_after_expiry
        self._last: OrderedDict[str, _Last] = OrderedDict()
        self.resets = 0
        self.evicted = 0

    def last_seq(self, scope: str) -> int | None:
        last = self._last.get(scope)
        return None if last is None else last.seq

    def check(self, signal: UnsignedSignal, now_ms: int) -> RejectReason | None:
        last = self._last.get(signal.scope)
        if last is None or signal.seq > last.seq:
            return None
        if (
            self.allow_reset_after_expiry
            and now_ms >= last.expires_at_unix_ms
            and signal.issued_at_unix_ms > last.issued_at_unix_ms
        ):
            return None
        return RejectReason.REPLAYED if signal.seq == last.seq else RejectReason.STALE

    def admit(
        self, signal: UnsignedSignal, now_ms: int, *, expires_at_unix_ms: int | None = None
    ) -> RejectReason | None:
        """Check and, when it passes, record the signal as the scope's last;
        ``expires_at_unix_ms``: its effective expiry, if clamped
        (:attr:`VerifiedSignal.expires_at_unix_ms`)."""
        verdict = self.check(signal, now_ms)
        if verdict is not None:
            return verdict
        last = self._last.get(signal.scope)
        if last is not None and signal.seq <= last.seq:
            self.resets += 1
        expires = signal.expires_at_unix_ms if expires_at_unix_ms is None else expires_at_unix_ms
        self._last[signal.scope] = _Last(signal.seq, signal.issued_at_unix_ms, expires)
        self._last.move_to_end(signal.scope)
        while len(self._last) > self.max_scopes:
            self._last.popitem(last=False)
            self.evicted += 1
        return None


# --------------------------------------------------------------------------- issuer


@dataclass(frozen=True, slots=True)
class _Current:
    decision: Decision
    issued_at_ms: int
    as_of_ms: int | None = None


class SignalIssuer:
    """Pure publisher core: per-scope ``seq`` counters, signing, heartbeats.

    ``issue`` signs a new directive for a scope (``seq + 1``, expiry
    ``now + ttl_ms``; ``ttl_ms`` at most ``max_ttl_ms``, checked here);
    ``due_heartbeats`` re-signs the current directive of every scope whose last
    signal is ``heartbeat_ms`` old or older (fresh ``seq`` and expiry, same
    decision), so the serving side can tell "still L1" from "controller dead".
    ``initial_seqs`` (from :func:`resume_seqs` over the compacted topic) make the
    counters survive a restart; :meth:`observe_seq` raises a counter later. The
    caller publishes with key :func:`message_key` and value :func:`encode`. Not
    thread-safe (one owner).
    """

    def __init__(
        self,
        keyring: Keyring,
        ttl_ms: int | None = None,
        heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
        initial_seqs: Mapping[str, int] | None = None,
        *,
        max_ttl_ms: int = DEFAULT_MAX_TTL_MS,
    ) -> None:
        if heartbeat_ms < 1:
            raise ValueError("heartbeat_ms must be >= 1")
        ttl = 3 * heartbeat_ms if ttl_ms is None else ttl_ms
        if ttl <= heartbeat_ms:
            raise ValueError(
                f"ttl_ms ({ttl}) must exceed heartbeat_ms ({heartbeat_ms}), "
                "or directives expire between heartbeats"
            )
        if ttl > max_ttl_ms:
            raise ValueError(
                f"ttl_ms ({ttl}) must not exceed max_ttl_ms ({max_ttl_ms}): verifiers "
                "clamp longer signals, the issuer refuses to sign them"
            )
        self.keyring = keyring
        self.ttl_ms = ttl
        self.max_ttl_ms = max_ttl_ms
        self.heartbeat_ms = heartbeat_ms
        self._seq: dict[str, int] = {}
        self._current: dict[str, _Current] = {}
        for scope, seq in (initial_seqs or {}).items():
            self.observe_seq(scope, seq)

    def observe_seq(self, scope: str, seq: int) -> None:
        """Never issue ``seq`` or lower for ``scope`` again."""
        if seq < 0:
            raise ValueError(f"initial seq for {scope!r} must be >= 0")
        self._seq[scope] = max(self._seq.get(scope, 0), seq)

    def last_seq(self, scope: str) -> int:
        return self._seq.get(scope, 0)

    def current(self, scope: str) -> Decision | None:
        cur = self._current.get(scope)
        return None if cur is None else cur.decision

    @property
    def scopes(self) -> tuple[str, ...]:
        return tuple(self._current)

    def issue(
        self,
        scope: str,
        decision: Decision | Mapping[str, Any],
        now_ms: int,
        as_of_ms: int | None = None,
    ) -> ControlSignal:
        """``now_ms``: the issuer's wall clock (validity); ``as_of_ms``: the event time of
        the evidence the decision read (kept by its heartbeats: the same decision)."""
        d = decision if isinstance(decision, Decision) else Decision.from_mapping(decision)
        seq = self._seq.get(scope, 0) + 1
        signal = sign(
            UnsignedSignal.model_validate(
                {
                    **d.model_dump(),
                    "scope": scope,
                    "seq": seq,
                    "issued_at_unix_ms": now_ms,
                    "expires_at_unix_ms": now_ms + self.ttl_ms,
                    "as_of_unix_ms": as_of_ms,
                }
            ),
            self.keyring,
            max_ttl_ms=self.max_ttl_ms,
        )
        self._seq[scope] = seq
        self._current[scope] = _Current(d, now_ms, as_of_ms)
        return signal

    def due_heartbeats(self, now_ms: int) -> list[ControlSignal]:
        return [
            self.issue(scope, cur.decision, now_ms, cur.as_of_ms)
            for scope, cur in list(self._current.items())
            if now_ms - cur.issued_at_ms >= self.heartbeat_ms
        ]

    def __repr__(self) -> str:
        return (
            f"SignalIssuer(keyring={self.keyring!r}, ttl_ms={self.ttl_ms}, "
            f"heartbeat_ms={self.heartbeat_ms}, scopes={len(self._seq)})"
        )


def resume_seqs(raws: Iterable[bytes | None], keyring: Keyring) -> dict[str, int]:
    """Highest verified ``seq`` per scope among message values (tombstones skipped).

    Feed it the compacted control topic read from the beginning; expiry is not
    checked (an expired signal's ``seq`` still counts). Signals that do not
    verify (forged, unknown kid) are ignored, so pass a keyring with every kid
    the serving side may still accept.
    """
    out: dict[str, int] = {}
    for raw in raws:
        if raw is None:
            continue
        try:
            res = _verify(bytes(raw), keyring)
        except Exception:  # noqa: S112 - bad input is skipped, never raised
            continue
        if isinstance(res, VerifiedSignal):
            s = res.signal
            out[s.scope] = max(out.get(s.scope, 0), s.seq)
    return out
