"""The README stays short and the docs hold together (issue 38 item 8).

README.md and docs/control.md are at most 400 lines each; every relative link in
README.md and docs/*.md names a file that exists and, into a Markdown file, a heading
that exists (GitHub's anchors); every page under docs/ is linked from docs/README.md;
docs/configuration.md names every setting (``python -m tools.dev.settings_doc``
regenerates its reference).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from pipeline.settings import Settings
from tests.paths import REPO
from tools.dev import settings_doc

DOCS = REPO / "docs"
README_MAX_LINES = 400
# A manual page, not a measurement log (issue 50): logs live in bench/ or generated pages.
MANUAL_MAX_LINES = {"control.md": 400}

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced code blocks (a `# comment` there is no heading)."""
    return _FENCE.sub("", text)


def links(text: str) -> list[str]:
    return _LINK.findall(_CODE_SPAN.sub(lambda m: m.group(0).strip("`"), _prose(text)))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_prose(path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def test_slug_is_githubs() -> None:
    assert slug('How the worker keeps "nothing lost, nothing counted twice"') == (
        "how-the-worker-keeps-nothing-lost-nothing-counted-twice"
    )
    assert slug("5. Policy, controller, control topic, serving side") == (
        "5-policy-controller-control-topic-serving-side"
    )
    assert slug("`tailguard report`: filters") == "tailguard-report-filters"
    assert slug("Prometheus, Alertmanager, OpenSLO, OpenTelemetry") == (
        "prometheus-alertmanager-openslo-opentelemetry"
    )


def test_readme_is_short() -> None:
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail into docs/"


@pytest.mark.parametrize(("page", "most"), sorted(MANUAL_MAX_LINES.items()))
def test_manual_pages_stay_manuals(page: str, most: int) -> None:
    n = len((DOCS / page).read_text().splitlines())
    assert n <= most, f"docs/{page} has {n} lines; move measurements to bench/ or a generated page"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_every_docs_page_is_in_the_index() -> None:
    index = DOCS / "README.md"
    linked = {
        (DOCS / t.partition("#")[0]).resolve() for t in links(index.read_text()) if ":" not in t
    }
    pages = [p for p in sorted(DOCS.glob("*.md")) if p != index]
    missing = [p.name for p in pages if p.resolve() not in linked]
    assert not missing, f"docs/README.md does not link {missing}"


def test_readme_links_the_docs_index_and_every_page() -> None:
    readme_links = {t.partition("#")[0] for t in links((REPO / "README.md").read_text())}
    assert "docs/README.md" in readme_links
    assert "docs/operations.md" in readme_links


def test_configuration_names_every_setting() -> None:
    page = (DOCS / "configuration.md").read_text()
    names = [settings_doc.env_name(f) for f in Settings.model_fields]
    missing = [name for name in names if name not in page]
    assert not missing, f"docs/configuration.md lacks {missing}: python -m tools.dev.settings_doc"


def test_settings_reference_is_generated_from_every_field() -> None:
    table = settings_doc.render()
    for field in Settings.model_fields:
        assert f"| `{settings_doc.env_name(field)}` |" in table
    assert settings_doc.rewrite(f"a\n{settings_doc.BEGIN}\nold\n{settings_doc.END}\nb") == (
        f"a\n{table}\nb"
    )
