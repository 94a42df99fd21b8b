"""The ledger's fast paths against the loops they shortcut: ``merge_versions`` (one
``dict.update`` when no request is in both) and ``encode_ledger`` (the versions sliced
from the values, not looked up id by id)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from unittest import mock

import orjson
from hypothesis import given
from hypothesis import strategies as st

from pipeline.contract import ledger
from pipeline.contract.ledger import LEDGER_VERSION, LedgerEntry, decode_ledger, encode_ledger
from pipeline.core.ledger import CODE_MASK, code_order, merge_versions

_IDS = st.text("abcdef", min_size=1, max_size=3)
# ledger codes with an end of window packed above them, as the worker's dicts hold them
_CODES = st.integers(0, 31) | st.builds(
    lambda c, e: c | (e << 5), st.integers(0, 31), st.integers(1, 99)
)
_VERSIONS = st.dictionaries(_IDS, _CODES, max_size=30)


def _merge_reference(into: dict[str, int], more: Mapping[str, int]) -> None:
    for rid, code in more.items():
        have = into.get(rid)
        if have is None or code_order(code & CODE_MASK) > code_order(have & CODE_MASK):
            into[rid] = code


@given(_VERSIONS, st.lists(_VERSIONS, max_size=5))
def test_merge_is_the_loop(start: dict[str, int], batches: list[dict[str, int]]) -> None:
    got, want = dict(start), dict(start)
    for more in batches:
        merge_versions(got, more)
        _merge_reference(want, more)
        assert list(got.items()) == list(want.items())  # the same values, in the same order


def _encode_reference(entry: LedgerEntry) -> Iterator[bytes]:
    ids = list(entry.versions)
    for i in range(0, max(len(ids), 1), ledger.MAX_IDS_PER_MESSAGE):
        chunk = ids[i : i + ledger.MAX_IDS_PER_MESSAGE]
        yield orjson.dumps(
            {
                "v": LEDGER_VERSION, "topic": entry.topic, "partition": entry.partition,
                "through": entry.through, "end_ms": entry.end_ms, "ids": chunk,
                "versions": [entry.versions[k] for k in chunk],
            }
        )  # fmt: skip


@given(_VERSIONS, st.integers(1, 7), st.integers(0, 9), st.integers(0, 10**6))
def test_encode_is_the_lookup_per_id(
    versions: dict[str, int], per_message: int, partition: int, through: int
) -> None:
    entry = LedgerEntry("lc", partition, through, versions, 1234)
    with mock.patch.object(ledger, "MAX_IDS_PER_MESSAGE", per_message):
        got = list(encode_ledger(entry))
        assert got == list(_encode_reference(entry))
    decoded: dict[str, int] = {}
    for msg in got:
        decoded.update(decode_ledger(msg).versions)
    assert decoded == versions
