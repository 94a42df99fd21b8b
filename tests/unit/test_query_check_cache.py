"""Issue 49: the query port keeps the texts its check accepted (``CheckCache``), so that
``report``'s and the dashboards' queries, sent again and again, are not parsed twice more
by the engine each time. The key is the text and its parameters; least recently used
first out; a long text is not kept."""

from __future__ import annotations

import pytest

from pipeline.adapters.query_server.session import CheckCache

Q = "SELECT count() FROM {t:Identifier}"


@pytest.mark.parametrize(
    ("put", "get", "found"),
    [
        ((Q, {"t": "requests"}), (Q, {"t": "requests"}), True),
        ((Q, {"t": "requests"}), (Q, {"t": "system.tables"}), False),  # parameters count
        ((Q, {"a": "1", "b": "2"}), (Q, {"b": "2", "a": "1"}), True),  # not their order
        ((Q, None), (Q, {}), True),
        ((Q, None), (Q + " ", None), False),  # the text exactly
        (("x" * 16_385, None), ("x" * 16_385, None), False),  # too long to keep
    ],
)
def test_an_accepted_text_is_found_by_its_text_and_parameters(
    put: tuple[str, dict[str, str] | None], get: tuple[str, dict[str, str] | None], found: bool
) -> None:
    c = CheckCache()
    c.put(*put, "normalized")
    assert (c.get(*get) == "normalized") is found
    assert c.hits == int(found)


def test_the_least_recently_used_text_goes_first() -> None:
    c = CheckCache(max_entries=2)
    c.put("a", None, "A")
    c.put("b", None, "B")
    assert c.get("a", None) == "A"  # a used: b is now the oldest
    c.put("c", None, "C")
    assert [c.get(k, None) for k in "abc"] == ["A", None, "C"]
