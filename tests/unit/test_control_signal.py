"""Signed control signals: wire format, verification, keys, replay guard, issuer."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contract.control_signal import (
    DEFAULT_MAX_TTL_MS,
    Actions,
    ControlSignal,
    Decision,
    KeyConfigError,
    Keyring,
    Rejection,
    RejectReason,
    SequenceGuard,
    SignalIssuer,
    UnsignedSignal,
    VerifiedSignal,
    canonical_bytes,
    decode_and_verify,
    encode,
    message_key,
    resume_seqs,
    sign,
)
from producers.control_keys import keyring_from_environ, keyring_from_file

T0 = 1_700_000_000_000
KEY1 = b"k" * 32
KEY2 = bytes(range(40))
KR = Keyring({"k1": KEY1}, "k1")

L1 = Decision(
    level=1,
    phase="degraded",
    actions=Actions(shed_priorities_at_or_above=2, retry_after_s=30),
    reason="p99 > 300 ms for 5 min",
    figures={"p99_ms": 412.5, "breach": True},
    notify_customer=True,
)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unsigned(
    *, scope: str = "m", seq: int = 1, issued: int = T0, ttl: int = 30_000, level: int = 1
) -> UnsignedSignal:
    return UnsignedSignal(
        scope=scope,
        seq=seq,
        level=level,
        phase="normal" if level == 0 else "degraded",
        issued_at_unix_ms=issued,
        expires_at_unix_ms=issued + ttl,
    )


def _raw(**kw: Any) -> bytes:
    return encode(sign(_unsigned(**kw), KR))


def _resign(obj: dict[str, Any], key: bytes) -> bytes:
    """Sign an arbitrary object the way the issuer does (to forge 'valid' bad content)."""
    body = {k: v for k, v in obj.items() if k != "sig"}
    mac = hmac.new(key, orjson.dumps(body, option=orjson.OPT_SORT_KEYS), hashlib.sha256)
    return orjson.dumps({**body, "sig": _b64(mac.digest())})


# --------------------------------------------------------------------------- golden vector

# Conformance vector for other languages: this key and this signal must give exactly
# these canonical bytes and this sig. Cross-checked with
#   printf '%s' "$CANONICAL" | openssl dgst -sha256 -hmac "$KEY" -binary | base64
GOLDEN_KEY = b"tailguard-golden-vector-key-0001"
GOLDEN_KEY_B64 = "dGFpbGd1YXJkLWdvbGRlbi12ZWN0b3Ita2V5LTAwMDE="
GOLDEN_CANONICAL = (
    '{"actions":{"admit_fraction":null,"admit_gateways":null,"admit_rps":null,'
    '"cap_context_tokens":8192,"deadline_margin":null,'
    '"fair_share":false,"fallback_model":"llama-3-8b","hold_fraction":null,'
    '"queue_timeout_ms":null,'
    '"rate_limit_rps":150.0,'
    '"reject_new_sessions":true,'
    '"retry_after_s":30,"shed_priorities_at_or_above":2,"tenant_weights":null,'
    '"ttft_queue_ms":null,"ttft_service_ms":null},"as_of_unix_ms":1699999990000,'
    '"budget_exhausted":false,'
    '"expires_at_unix_ms":1700000030000,"figures":{"big":1.5e+20,"gpu_oom":false,'
    '"kv_hit_rate":0.78,"n":3.0,"p99_ms":412.5,"queue_depth":null,"violation_rate":1e-7},'
    '"issued_at_unix_ms":1700000000000,"kid":"golden-1","level":2,"notify_customer":true,'
    '"phase":"degraded","reason":"P99 > 300 ms for 5 min; KV hit < 80% \u2014 \u00e9",'
    '"scope":"llama-3-70b","seq":42,"v":1}'
).encode()
GOLDEN_SIG = "ehEDR7bJ0AqQ+e8AErCxmW0wLKTxOS97ZzU3seuvkP8="


def _golden_unsigned() -> UnsignedSignal:
    return UnsignedSignal(
        scope="llama-3-70b",
        seq=42,
        level=2,
        phase="degraded",
        actions=Actions(
            shed_priorities_at_or_above=2,
            cap_context_tokens=8192,
            fallback_model="llama-3-8b",
            reject_new_sessions=True,
            retry_after_s=30,
            rate_limit_rps=150.0,
        ),
        reason="P99 > 300 ms for 5 min; KV hit < 80% \u2014 \u00e9",
        figures={
            "p99_ms": 412.5,
            "kv_hit_rate": 0.78,
            "violation_rate": 1e-7,
            "big": 1.5e20,
            "gpu_oom": False,
            "queue_depth": None,
            "n": 3.0,
        },
        issued_at_unix_ms=1_700_000_000_000,
        expires_at_unix_ms=1_700_000_030_000,
        as_of_unix_ms=1_699_999_990_000,
        notify_customer=True,
    )


def test_golden_vector() -> None:
    kr = Keyring.from_base64({"golden-1": GOLDEN_KEY_B64}, "golden-1")
    assert kr.secret("golden-1") == GOLDEN_KEY
    signed = sign(_golden_unsigned(), kr)
    assert canonical_bytes(signed) == GOLDEN_CANONICAL
    assert signed.sig == GOLDEN_SIG
    # independent of this module: HMAC-SHA256 over the literal bytes
    assert _b64(hmac.new(GOLDEN_KEY, GOLDEN_CANONICAL, hashlib.sha256).digest()) == GOLDEN_SIG
    wire = encode(signed)
    assert GOLDEN_CANONICAL.endswith(b',"v":1}')
    assert wire == GOLDEN_CANONICAL[:-7] + f',"sig":"{GOLDEN_SIG}","v":1}}'.encode()
    res = decode_and_verify(wire, kr, 1_700_000_000_001)
    assert isinstance(res, VerifiedSignal)
    assert res.signal == signed


def test_canonical_bytes_do_not_depend_on_construction_order() -> None:
    a = _golden_unsigned()
    b = UnsignedSignal.model_validate(dict(reversed(list(a.model_dump().items()))))
    assert canonical_bytes(a) == canonical_bytes(b)
    signed = canonical_bytes(sign(a, KR))
    assert b'"sig"' not in signed
    assert b'"kid":"k1"' in signed  # the kid is signed: a sig cannot move to another key


def test_message_key_is_scope() -> None:
    assert message_key(_unsigned(scope="llama")) == b"llama"


# --------------------------------------------------------------------------- verification


def test_round_trip_accepts() -> None:
    s = sign(_unsigned(), KR)
    res = decode_and_verify(encode(s), KR, T0 + 1)
    assert res == VerifiedSignal(s)


def _tamper(path: tuple[str, ...], value: Any) -> Callable[[], bytes]:
    def make() -> bytes:
        obj = orjson.loads(_raw())
        target = obj
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
        return orjson.dumps(obj)

    return make


def _drop(field: str) -> Callable[[], bytes]:
    def make() -> bytes:
        obj = orjson.loads(_raw())
        del obj[field]
        return orjson.dumps(obj)

    return make


OTHER_KID_KR = Keyring({"k1": KEY1, "k2": KEY2}, "k1")

REJECTIONS: list[tuple[str, Callable[[], bytes], RejectReason]] = [
    # forged
    ("wrong key, same kid", lambda: encode(sign(_unsigned(), Keyring({"k1": KEY2}, "k1"))),
     RejectReason.BAD_SIGNATURE),
    ("unknown kid", lambda: encode(sign(_unsigned(), Keyring({"kx": KEY1}, "kx"))),
     RejectReason.UNKNOWN_KID),
    ("tampered level", _tamper(("level",), 3), RejectReason.BAD_SIGNATURE),
    ("tampered scope", _tamper(("scope",), "other"), RejectReason.BAD_SIGNATURE),
    ("tampered seq", _tamper(("seq",), 99), RejectReason.BAD_SIGNATURE),
    ("tampered expiry", _tamper(("expires_at_unix_ms",), T0 + 10**9), RejectReason.BAD_SIGNATURE),
    ("tampered action", _tamper(("actions", "shed_priorities_at_or_above"), 0),
     RejectReason.BAD_SIGNATURE),
    ("tampered figure", _tamper(("figures", "x"), 1.0), RejectReason.BAD_SIGNATURE),
    ("kid swapped to another known kid", _tamper(("kid",), "k2"), RejectReason.BAD_SIGNATURE),
    ("field added after signing", _tamper(("extra",), 1), RejectReason.BAD_SIGNATURE),
    ("field removed after signing", _drop("reason"), RejectReason.BAD_SIGNATURE),
    ("sig of another signal", lambda: orjson.dumps(
        {**orjson.loads(_raw(seq=1)), "sig": orjson.loads(_raw(seq=2))["sig"]}),
     RejectReason.BAD_SIGNATURE),
    # malformed
    ("empty", lambda: b"", RejectReason.MALFORMED),
    ("not json", lambda: b"\xff{garbage", RejectReason.MALFORMED),
    ("json array", lambda: b"[]", RejectReason.MALFORMED),
    ("json string", lambda: b'"x"', RejectReason.MALFORMED),
    ("empty object", lambda: b"{}", RejectReason.MALFORMED),
    ("version 2", _tamper(("v",), 2), RejectReason.MALFORMED),
    ("version true", _tamper(("v",), True), RejectReason.MALFORMED),
    ("no sig", _drop("sig"), RejectReason.MALFORMED),
    ("sig not base64", _tamper(("sig",), "!" * 44), RejectReason.MALFORMED),
    ("sig too short", _tamper(("sig",), _b64(b"x" * 16)), RejectReason.MALFORMED),
    ("kid not a string", _tamper(("kid",), 1), RejectReason.MALFORMED),
    ("oversize", lambda: b" " * 70_000 + _raw(), RejectReason.MALFORMED),
    ("truncated", lambda: _raw()[:-5], RejectReason.MALFORMED),
    # correctly signed, but not a valid signal
    ("signed, level 7", lambda: _resign({**orjson.loads(_raw()), "level": 7}, KEY1),
     RejectReason.MALFORMED),
    ("signed, phase normal at L1",
     lambda: _resign({**orjson.loads(_raw()), "phase": "normal"}, KEY1), RejectReason.MALFORMED),
    ("signed, seq 0", lambda: _resign({**orjson.loads(_raw()), "seq": 0}, KEY1),
     RejectReason.MALFORMED),
    ("signed, seq as float", lambda: _resign({**orjson.loads(_raw()), "seq": 1.0}, KEY1),
     RejectReason.MALFORMED),
    ("signed, expires before issued",
     lambda: _resign({**orjson.loads(_raw()), "expires_at_unix_ms": T0 - 1}, KEY1),
     RejectReason.MALFORMED),
    ("signed, missing actions",
     lambda: _resign({k: v for k, v in orjson.loads(_raw()).items() if k != "scope"}, KEY1),
     RejectReason.MALFORMED),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "reason"), [(m, r) for _, m, r in REJECTIONS], ids=[n for n, _, _ in REJECTIONS]
)
def test_rejections(make: Callable[[], bytes], reason: RejectReason) -> None:
    res = decode_and_verify(make(), OTHER_KID_KR, T0 + 1)
    assert isinstance(res, Rejection), res
    assert res.reason is reason, res


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (T0 - 5_000, None),  # issued 5 s in the future: within the default skew
        (T0 - 5_001, RejectReason.NOT_YET_VALID),
        (T0, None),
        (T0 + 29_999, None),
        (T0 + 30_000, RejectReason.EXPIRED),  # now >= expires_at
        (T0 + 10**6, RejectReason.EXPIRED),
    ],
)
def test_validity_window(now: int, expected: RejectReason | None) -> None:
    res = decode_and_verify(_raw(ttl=30_000), KR, now)
    got = res.reason if isinstance(res, Rejection) else None
    assert got is expected


def test_skew_is_configurable() -> None:
    raw = _raw()
    assert isinstance(decode_and_verify(raw, KR, T0 - 1_000, max_skew_ms=0), Rejection)
    assert isinstance(decode_and_verify(raw, KR, T0 - 60_000, max_skew_ms=60_000), VerifiedSignal)


def test_unknown_fields_signed_by_a_newer_issuer_still_verify() -> None:
    raw = _resign({**orjson.loads(_raw()), "new_field": {"z": 1, "a": [1, 2]}}, KEY1)
    res = decode_and_verify(raw, KR, T0 + 1)
    assert isinstance(res, VerifiedSignal)


decisions = st.builds(
    Decision,
    level=st.just(2),
    phase=st.sampled_from(["degraded", "half_open"]),
    actions=st.builds(
        Actions,
        shed_priorities_at_or_above=st.none() | st.integers(0, 3),
        cap_context_tokens=st.none() | st.integers(1, 1 << 20),
        fallback_model=st.none() | st.text(min_size=1, max_size=20),
        reject_new_sessions=st.booleans(),
        retry_after_s=st.integers(0, 3600),
        rate_limit_rps=st.none() | st.floats(1e-6, 1e9),
    ),
    reason=st.text(max_size=50),
    figures=st.dictionaries(
        st.text(min_size=1, max_size=10),
        st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False),
        max_size=5,
    ),
)


@settings(max_examples=60, deadline=None)
@given(decision=decisions, pos=st.integers(0, 10_000), flip=st.integers(1, 255))
def test_any_byte_flip_is_rejected_or_means_the_same(
    decision: Decision, pos: int, flip: int
) -> None:
    signal = SignalIssuer(KR).issue("m", decision, T0)
    wire = encode(signal)
    ok = decode_and_verify(wire, KR, T0 + 1)
    assert ok == VerifiedSignal(signal)
    i = pos % len(wire)
    bad = wire[:i] + bytes([wire[i] ^ flip]) + wire[i + 1 :]
    res = decode_and_verify(bad, KR, T0 + 1)
    # The signature covers the meaning (re-serialised JSON), not the bytes: a flip that
    # leaves the parsed value identical (e.g. "1e+16" -> "1e016") may pass; nothing else.
    assert isinstance(res, Rejection) or res.signal == signal


# --------------------------------------------------------------------------- keys


def test_rotation_old_kid_verifies_new_kid_signs_retired_kid_rejected() -> None:
    old = Keyring({"k1": KEY1}, "k1")
    before = encode(sign(_unsigned(seq=1), old))
    rotated = old.with_key("k2", KEY2, activate=True)
    after = sign(_unsigned(seq=2), rotated)
    assert after.kid == "k2"
    assert isinstance(decode_and_verify(before, rotated, T0 + 1), VerifiedSignal)
    assert isinstance(decode_and_verify(encode(after), rotated, T0 + 1), VerifiedSignal)
    # a verifier that has not learnt k2 yet cannot verify: add keys to verifiers first
    res_old_verifier = decode_and_verify(encode(after), old, T0 + 1)
    assert isinstance(res_old_verifier, Rejection)
    assert res_old_verifier.reason is RejectReason.UNKNOWN_KID
    retired = rotated.retire("k1")
    res = decode_and_verify(before, retired, T0 + 1)
    assert isinstance(res, Rejection)
    assert res.reason is RejectReason.UNKNOWN_KID
    assert isinstance(decode_and_verify(encode(after), retired, T0 + 1), VerifiedSignal)


def test_keyring_rotation_guards() -> None:
    kr = Keyring({"k1": KEY1, "k2": KEY2}, "k1")
    with pytest.raises(KeyConfigError, match="active"):
        kr.retire("k1")
    with pytest.raises(KeyConfigError, match="no key"):
        kr.retire("k9")
    with pytest.raises(KeyConfigError, match="already"):
        kr.with_key("k2", KEY2)
    assert kr.activate("k2").active_kid == "k2"
    assert kr.kids == ("k1", "k2")
    assert "k1" in kr
    assert "k9" not in kr


SECRET_B64 = _b64(KEY2)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Keyring({}, "k1"), "no keys"),
        (lambda: Keyring({"k1": b"short"}, "k1"), "needs >= 32"),
        (lambda: Keyring({"k1": KEY1}, "k2"), "active key id 'k2'"),
        (lambda: Keyring({"bad kid!": KEY1}, "bad kid!"), "must match"),
        (lambda: Keyring({"": KEY1}, ""), "must match"),
        (lambda: Keyring.from_base64({"k1": "not base64!!"}, "k1"), "not valid base64"),
        (lambda: Keyring.from_base64({"k1": _b64(b"x" * 31)}, "k1"), "31 bytes"),
        (lambda: Keyring.from_env_string(f"k1{SECRET_B64}", "k1"), "not 'kid:base64'"),
        (lambda: Keyring.from_env_string(f"k1:{SECRET_B64},k1:{SECRET_B64}", "k1"), "twice"),
        (lambda: Keyring.from_env_string("", "k1"), "no keys"),
    ],
)
def test_bad_key_config_raises_clearly(build: Callable[[], Keyring], match: str) -> None:
    with pytest.raises(KeyConfigError, match=match) as exc:
        build()
    assert SECRET_B64 not in str(exc.value)
    assert "not base64!!" not in str(exc.value)


def test_secrets_never_in_repr_or_str() -> None:
    kr = Keyring.from_env_string(f" k1:{SECRET_B64} , k2:{_b64(KEY1)} ", "k2")
    assert kr.secret("k1") == KEY2
    for text in (repr(kr), str(kr), repr(SignalIssuer(kr)), f"{kr}"):
        assert SECRET_B64 not in text
        assert _b64(KEY1) not in text
        assert "kkkk" not in text
        assert "k1" in text


def test_key_files_json_and_yaml(tmp_path: Path) -> None:
    doc = {"active": "k2", "keys": {"k1": _b64(KEY1), "k2": SECRET_B64}}
    j = tmp_path / "keys.json"
    j.write_text(json.dumps(doc))
    y = tmp_path / "keys.yaml"
    y.write_text(f"active: k2\nkeys:\n  k1: {_b64(KEY1)}\n  k2: {SECRET_B64}\n")
    other = tmp_path / "keys.conf"  # unknown suffix: JSON, then YAML
    other.write_text(y.read_text())
    for p in (j, y, other):
        kr = keyring_from_file(p)
        assert kr.active_kid == "k2"
        assert kr.secret("k1") == KEY1
        assert kr.secret("k2") == KEY2


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("a.json", "{not json", "not valid JSON"),
        ("a.yaml", "active: [", "not valid YAML"),
        ("a.json", "[1, 2]", "expected a mapping"),
        ("a.json", json.dumps({"active": "k1", "keys": {"k1": SECRET_B64}, "x": 1}), "unknown"),
        ("a.json", json.dumps({"keys": {"k1": SECRET_B64}}), "'active'"),
        ("a.json", json.dumps({"active": "k1", "keys": [SECRET_B64]}), "'keys'"),
        ("a.json", '{"active": "k1", "keys": {"k1": 5}}', "'keys'"),
        ("a.json", json.dumps({"active": "k1", "keys": {"k1": _b64(b"x" * 8)}}), "needs >= 32"),
    ],
)
def test_bad_key_files(tmp_path: Path, name: str, text: str, match: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(KeyConfigError, match=match) as exc:
        keyring_from_file(p)
    assert SECRET_B64 not in str(exc.value)


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(KeyConfigError, match="control key file"):
        keyring_from_file(tmp_path / "absent.json")


def test_keyring_from_environ(tmp_path: Path) -> None:
    spec = f"k1:{_b64(KEY1)},k2:{SECRET_B64}"
    kr = keyring_from_environ(
        {"TAILGUARD_CONTROL_KEYS": spec, "TAILGUARD_CONTROL_ACTIVE_KID": "k1"}
    )
    assert kr.active_kid == "k1"
    assert kr.kids == ("k1", "k2")
    f = tmp_path / "k.json"
    f.write_text(json.dumps({"active": "k2", "keys": {"k2": SECRET_B64}}))
    assert keyring_from_environ({"TAILGUARD_CONTROL_KEYS_FILE": str(f)}).active_kid == "k2"
    with pytest.raises(KeyConfigError, match="ACTIVE_KID"):
        keyring_from_environ({"TAILGUARD_CONTROL_KEYS": spec})
    with pytest.raises(KeyConfigError, match="not both"):
        keyring_from_environ(
            {"TAILGUARD_CONTROL_KEYS": spec, "TAILGUARD_CONTROL_KEYS_FILE": str(f)}
        )
    with pytest.raises(KeyConfigError, match="no control keys"):
        keyring_from_environ({})


# --------------------------------------------------------------------------- sequence guard


def _sig(seq: int, *, scope: str = "m", issued: int = T0, ttl: int = 30_000) -> ControlSignal:
    return sign(_unsigned(scope=scope, seq=seq, issued=issued, ttl=ttl), KR)


def test_guard_replayed_and_stale() -> None:
    g = SequenceGuard()
    assert g.admit(_sig(5), T0) is None
    assert g.admit(_sig(5), T0) is RejectReason.REPLAYED
    assert g.admit(_sig(4), T0) is RejectReason.STALE
    assert g.admit(_sig(1, scope="other"), T0) is None  # per scope
    assert g.admit(_sig(6), T0) is None
    assert g.admit(_sig(5), T0) is RejectReason.STALE
    assert g.last_seq("m") == 6
    assert g.last_seq("nope") is None


def test_guard_check_does_not_record() -> None:
    g = SequenceGuard()
    assert g.check(_sig(3), T0) is None
    assert g.last_seq("m") is None


def test_guard_is_bounded() -> None:
    g = SequenceGuard(max_scopes=3)
    for i in range(10):
        assert g.admit(_sig(1, scope=f"s{i}"), T0) is None
    assert g.evicted == 7
    assert [g.last_seq(f"s{i}") for i in range(10)] == [None] * 7 + [1, 1, 1]


def test_guard_resets_after_expiry_only_for_later_signals() -> None:
    g = SequenceGuard()
    assert g.admit(_sig(100, issued=T0), T0) is None  # expires at T0 + 30 s
    # issuer lost its counters and restarts at 1: stale while the last one is live
    assert g.admit(_sig(1, issued=T0 + 10_000), T0 + 10_000) is RejectReason.STALE
    # after the last accepted signal expired, a later-issued lower seq resets the scope
    assert g.admit(_sig(2, issued=T0 + 31_000), T0 + 31_000) is None
    assert g.resets == 1
    assert g.last_seq("m") == 2
    # a replay of something issued before the last accepted one never resets
    g2 = SequenceGuard()
    assert g2.admit(_sig(10, issued=T0, ttl=1_000), T0) is None
    assert g2.admit(_sig(9, issued=T0 - 1, ttl=100_000), T0 + 5_000) is RejectReason.STALE
    assert g2.admit(_sig(10, issued=T0, ttl=1_000), T0 + 5_000) is RejectReason.REPLAYED
    strict = SequenceGuard(allow_reset_after_expiry=False)
    assert strict.admit(_sig(100, issued=T0), T0) is None
    assert strict.admit(_sig(2, issued=T0 + 31_000), T0 + 31_000) is RejectReason.STALE


# --------------------------------------------------------------------------- issuer


def test_issue_increments_per_scope_and_sets_expiry() -> None:
    iss = SignalIssuer(KR, heartbeat_ms=10_000)
    assert iss.ttl_ms == 30_000
    seqs = [(s.scope, s.seq) for s in (
        iss.issue("a", L1, T0), iss.issue("a", L1, T0), iss.issue("b", L1, T0),
        iss.issue("a", L1, T0 + 1),
    )]  # fmt: skip
    assert seqs == [("a", 1), ("a", 2), ("b", 1), ("a", 3)]
    s = iss.issue("a", L1, T0 + 7)
    assert (s.issued_at_unix_ms, s.expires_at_unix_ms) == (T0 + 7, T0 + 30_007)
    assert s.kid == "k1"
    assert s.decision() == L1
    assert isinstance(decode_and_verify(encode(s), KR, T0 + 8), VerifiedSignal)


def test_issuer_resumes_from_initial_seqs() -> None:
    iss = SignalIssuer(KR, initial_seqs={"a": 41, "b": 0})
    assert iss.issue("a", L1, T0).seq == 42
    assert iss.issue("b", L1, T0).seq == 1
    assert iss.issue("c", L1, T0).seq == 1
    iss.observe_seq("c", 10)
    iss.observe_seq("c", 3)  # never lowers
    assert iss.issue("c", L1, T0).seq == 11


def test_resume_seqs_from_the_compacted_topic() -> None:
    old = SignalIssuer(KR)
    values: list[bytes | None] = [encode(old.issue("a", L1, T0)) for _ in range(5)]
    values.append(encode(old.issue("b", L1, T0)))
    values.append(None)  # tombstone
    values.append(b"garbage")
    forged = _resign({**orjson.loads(values[0] or b""), "seq": 10**12}, KEY2)
    values.append(forged)
    values.append(encode(sign(_unsigned(scope="a", seq=999), Keyring({"kx": KEY1}, "kx"))))
    seqs = resume_seqs(values, KR)
    assert seqs == {"a": 5, "b": 1}  # the forged 10**12 and the unknown kid's 999 are ignored
    new = SignalIssuer(KR, initial_seqs=seqs)
    s = new.issue("a", L1, T0 + 60_000)
    assert s.seq == 6
    g = SequenceGuard()
    for v in values:
        res = decode_and_verify(v or b"", KR, T0 + 1)
        if isinstance(res, VerifiedSignal):
            g.admit(res.signal, T0 + 1)
    assert g.admit(s, T0 + 60_000) is None  # the serving side accepts the resumed issuer


def test_heartbeats_reissue_with_new_seq_and_expiry() -> None:
    iss = SignalIssuer(KR, heartbeat_ms=10_000)
    a = iss.issue("a", L1, T0)
    b = iss.issue("b", Decision(level=0, phase="normal"), T0 + 5_000)
    assert iss.due_heartbeats(T0 + 9_999) == []
    (hb_a,) = iss.due_heartbeats(T0 + 10_000)
    assert hb_a.scope == "a"
    assert hb_a.seq == a.seq + 1
    assert hb_a.issued_at_unix_ms == T0 + 10_000
    assert hb_a.expires_at_unix_ms == T0 + 40_000 > a.expires_at_unix_ms
    assert hb_a.decision() == a.decision()
    assert hb_a.sig != a.sig
    assert iss.due_heartbeats(T0 + 14_999) == []
    hbs = iss.due_heartbeats(T0 + 20_000)
    assert sorted((s.scope, s.seq) for s in hbs) == [("a", 3), ("b", 2)]
    assert b.level == 0
    assert iss.current("a") == L1
    assert iss.current("zzz") is None
    assert set(iss.scopes) == {"a", "b"}


def test_heartbeats_keep_a_directive_alive_and_their_absence_lets_it_expire() -> None:
    iss = SignalIssuer(KR, heartbeat_ms=10_000)
    latest = iss.issue("a", L1, T0)
    now = T0
    for _ in range(10):  # 100 s of heartbeats: always a valid signal
        now += 10_000
        (latest,) = iss.due_heartbeats(now)
        assert isinstance(decode_and_verify(encode(latest), KR, now + 1), VerifiedSignal)
    dead = now + iss.ttl_ms  # controller died right after the last heartbeat
    assert decode_and_verify(encode(latest), KR, dead).reason is RejectReason.EXPIRED  # type: ignore[union-attr]


def test_issuer_validation() -> None:
    with pytest.raises(ValueError, match="must exceed"):
        SignalIssuer(KR, ttl_ms=10_000, heartbeat_ms=10_000)
    with pytest.raises(ValueError, match="heartbeat_ms"):
        SignalIssuer(KR, heartbeat_ms=0)
    iss = SignalIssuer(KR, ttl_ms=5_000, heartbeat_ms=1_000)
    assert iss.ttl_ms == 5_000
    with pytest.raises(ValueError, match="unknown decision fields"):
        iss.issue("a", {"level": 1, "phase": "degraded", "levle": 2}, T0)
    s = iss.issue("a", {"level": 1, "phase": "degraded", "actions": {"retry_after_s": 9}}, T0)
    assert s.actions.retry_after_s == 9


@pytest.mark.parametrize(
    "fields",
    [
        {"level": 0, "phase": "degraded"},
        {"level": 2, "phase": "normal"},
        {"level": 4, "phase": "degraded"},
        {"level": 1, "phase": "sideways"},
        {"level": 1, "phase": "degraded", "actions": {"admit_fraction": 0.5}},
        {"level": 1, "phase": "half_open", "actions": {"admit_fraction": 1.5}},
        {"level": 1, "phase": "degraded", "actions": {"retry_after_s": -1}},
        {"level": 1, "phase": "degraded", "actions": {"cap_context_tokens": 0}},
        {"level": 1, "phase": "degraded", "figures": {"x": "text"}},
    ],
)
def test_invalid_decisions_rejected(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - pydantic's ValidationError is a ValueError
        Decision.model_validate(fields, strict=False)


def test_decision_from_a_policy_mapping() -> None:
    policy_json = {
        "scope": "m",
        "now_ms": T0,
        "since_ms": T0,
        "changed": True,
        "level": 1,
        "phase": "half_open",
        "actions": {"shed_priorities_at_or_above": 2, "admit_fraction": 0.25, "retry_after_s": 0},
        "reason": "leaving L1",
        "figures": {"p99_ms": float("nan"), "burn": float("inf"), "ok": True, "n": 3},
        "notify_customer": True,
        "budget_exhausted": False,
    }
    with pytest.raises(ValueError, match="unknown decision fields"):
        Decision.from_mapping(policy_json)
    d = Decision.from_mapping(policy_json, ignore_unknown=True)
    assert d.figures == {"p99_ms": None, "burn": None, "ok": True, "n": 3.0}  # JSON-safe
    assert d.actions.admit_fraction == 0.25
    s = SignalIssuer(KR).issue("m", d, T0)
    assert isinstance(decode_and_verify(encode(s), KR, T0), VerifiedSignal)


def test_models_are_frozen() -> None:
    s = _sig(1)
    with pytest.raises(ValueError):  # noqa: PT011
        s.level = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- max_ttl

DAY_MS = 86_400_000


@pytest.mark.parametrize(
    ("ttl", "max_ttl", "now", "verdict"),
    [
        # (claimed ttl, verifier's max_ttl, now - issued) -> accepted (effective expiry) or why not
        (30_000, DEFAULT_MAX_TTL_MS, 29_999, T0 + 30_000),
        (30_000, DEFAULT_MAX_TTL_MS, 30_000, RejectReason.EXPIRED),
        (DEFAULT_MAX_TTL_MS, DEFAULT_MAX_TTL_MS, 1, T0 + DEFAULT_MAX_TTL_MS),  # the cap itself
        (365 * DAY_MS, DEFAULT_MAX_TTL_MS, 1, T0 + DEFAULT_MAX_TTL_MS),  # clamped
        (365 * DAY_MS, DEFAULT_MAX_TTL_MS, DEFAULT_MAX_TTL_MS, RejectReason.EXPIRED),
        (365 * DAY_MS, DEFAULT_MAX_TTL_MS, 364 * DAY_MS, RejectReason.EXPIRED),
        (365 * DAY_MS, 60_000, 59_999, T0 + 60_000),
        (365 * DAY_MS, 400 * DAY_MS, 364 * DAY_MS, T0 + 365 * DAY_MS),  # within a wide cap
    ],
)
def test_verifiers_clamp_the_lifetime_to_max_ttl(
    ttl: int, max_ttl: int, now: int, verdict: int | RejectReason
) -> None:
    raw = encode(sign(_unsigned(ttl=ttl), KR, max_ttl_ms=ttl))
    res = decode_and_verify(raw, KR, T0 + now, max_ttl_ms=max_ttl)
    if isinstance(verdict, RejectReason):
        assert isinstance(res, Rejection)
        assert res.reason is verdict
    else:
        assert isinstance(res, VerifiedSignal)
        assert res.expires_at_unix_ms == verdict
        assert res.clamped == (ttl > max_ttl)
        assert res.signal.expires_at_unix_ms == T0 + ttl  # what was signed, unchanged


def test_the_issuer_refuses_to_sign_beyond_max_ttl() -> None:
    year = _unsigned(ttl=365 * DAY_MS)
    with pytest.raises(ValueError, match="more than max_ttl_ms 300000"):
        sign(year, KR)
    with pytest.raises(ValueError, match="more than max_ttl_ms 60000"):
        sign(_unsigned(ttl=60_001), KR, max_ttl_ms=60_000)
    assert sign(_unsigned(ttl=DEFAULT_MAX_TTL_MS), KR).expires_at_unix_ms == T0 + DEFAULT_MAX_TTL_MS
    with pytest.raises(ValueError, match="must not exceed max_ttl_ms"):
        SignalIssuer(KR, ttl_ms=DEFAULT_MAX_TTL_MS + 1, heartbeat_ms=10_000)
    with pytest.raises(ValueError, match="must not exceed max_ttl_ms"):
        SignalIssuer(KR, heartbeat_ms=101_000)  # ttl 3 x heartbeat = 303 s
    with pytest.raises(ValueError, match="must not exceed max_ttl_ms"):
        SignalIssuer(KR, ttl_ms=90_000, max_ttl_ms=60_000)
    iss = SignalIssuer(KR, heartbeat_ms=100_000)  # the longest heartbeat the default allows
    assert iss.issue("a", L1, T0).expires_at_unix_ms == T0 + 300_000
