"""Topic generations in commit metadata (pipeline/core/generation.py): a commit made for
a topic generation that is gone is never resumed from."""

from __future__ import annotations

import pytest

from pipeline.core.generation import (
    CommitMeta,
    commit_applies,
    commit_metadata,
    parse_commit_metadata,
)


@pytest.mark.parametrize(
    "meta",
    [
        CommitMeta("AAAAAAAAAAAAAAAAAAAAAA"),
        CommitMeta("x-y_z", dlq_since_ms=0),
        CommitMeta("q", 1234),
    ],
)
def test_metadata_round_trips(meta: CommitMeta) -> None:
    text = commit_metadata(meta)
    assert len(text.encode()) < 4096  # the broker's default offset.metadata.max.bytes
    assert parse_commit_metadata(text) == meta


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (None, None),
        ("", None),  # Faust's and aiokafka's own commits
        ("something else", None),
        ("tailguard/1;", None),  # no topic id
        ("tailguard/1;topic_id=", None),
        ("tailguard/1;topic_id=abc", CommitMeta("abc")),
        ("tailguard/1;topic_id=abc;dlq_since_ms=x", CommitMeta("abc")),
        ("tailguard/1;topic_id=abc;future=1;dlq_since_ms=7", CommitMeta("abc", 7)),
        ("tailguard/2;topic_id=abc", None),
    ],
)
def test_parse(text: str | None, parsed: CommitMeta | None) -> None:
    assert parse_commit_metadata(text) == parsed


@pytest.mark.parametrize(
    ("text", "current", "applies"),
    [
        ("tailguard/1;topic_id=old", "old", True),  # the current generation's commit
        ("tailguard/1;topic_id=old", "new", False),  # the topic was created again since
        ("tailguard/1;topic_id=old", None, False),  # the topic is gone
        ("", "new", True),  # not ours (made before this version): nothing to check
        (None, None, True),
    ],
)
def test_a_commit_applies_only_to_its_generation(
    text: str | None, current: str | None, applies: bool
) -> None:
    assert commit_applies(text, current) is applies
