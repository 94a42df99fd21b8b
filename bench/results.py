"""Benchmark sections, the registry every bench module adds itself to, and the Markdown writer.

A bench module registers a function that measures and returns a
:class:`Section`::

    @register("detection", "Detection latency at 50k events/s", order=50)
    def run(ctx: Context) -> Section: ...

``bench/run.py`` imports :data:`BENCH_MODULES` in order, runs every
registered benchmark (or those named with ``--only``) and writes one Markdown
file. Each section in it says when, at which commit and under what load it was
measured; ``--only`` replaces those sections in the existing file and rebuilds
the summary from all of them. A module listed here that does not exist yet gets
a placeholder section saying so (nothing is invented).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.context import Context

# In run order. ``bench.detection`` is the reserved place for detection latency
# at 50k events/s (owned by the lead): create it and register a section.
BENCH_MODULES: tuple[str, ...] = (
    "bench.core_speed",
    "bench.throughput",
    "bench.accuracy",
    "bench.memory",
    "bench.detection",
    "bench.simulator_speed",
    "bench.loop_delay",
    "bench.gateway_latency",
    "bench.chaos",
    "bench.month",
    "bench.query_isolation",
)
PLACEHOLDERS: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured value, with its target when it has one.

    ``ok`` is None when there is no target (a figure reported for context).
    """

    name: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""

    def status(self) -> str:
        if self.ok is None:
            return ""
        return "PASS" if self.ok else "**MISS**"

    def formatted(self) -> str:
        v = self.value
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "n/a"
        if self.unit == "%":
            return f"{v:.3f} %"
        if isinstance(v, int):
            return f"{v:,} {self.unit}".strip()
        if abs(v) >= 100:
            return f"{v:,.0f} {self.unit}".strip()
        if abs(v) >= 1:
            return f"{v:,.2f} {self.unit}".strip()
        return f"{v:.4g} {self.unit}".strip()


def at_least(name: str, value: float, unit: str, target: float, note: str = "") -> Figure:
    return Figure(name, value, unit, f"≥ {target:,g} {unit}".strip(), value >= target, note)


def at_most(name: str, value: float, unit: str, target: float, note: str = "") -> Figure:
    return Figure(name, value, unit, f"≤ {target:,g} {unit}".strip(), value <= target, note)


@dataclass(frozen=True, slots=True)
class Measured:
    """When, at which commit and under what load one section was measured."""

    date_utc: str  # "2026-12-01 05:20 UTC"
    commit: str  # the full hash, "+ uncommitted changes" when the tree was dirty
    mode: str  # "full" or "quick"
    command: str  # how the run was started
    load_before: str  # load average 1/5/15 min, as /proc/loadavg says it
    load_after: str
    seconds: float

    def describe(self) -> str:
        return (
            f"_Measured {self.date_utc} at commit {self.commit} ({self.mode} mode, "
            f"`{self.command}`, {self.seconds:.0f} s); load average (1/5/15 min) before "
            f"{self.load_before}, after {self.load_after}._"
        )

    def short(self) -> str:
        """For the summary table: the date and the short commit."""
        return f"{self.date_utc.removesuffix(' UTC')} {self.commit[:7]}"


@dataclass(slots=True)
class Section:
    key: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # Markdown paragraphs, after the table
    profiles: list[tuple[str, str]] = field(default_factory=list)  # (title, preformatted)
    commands: list[str] = field(default_factory=list)  # what ran (worker command lines, ...)
    seconds: float = 0.0
    measured: Measured | None = None  # set by bench/run.py once the section ran

    def misses(self) -> list[Figure]:
        return [f for f in self.figures if f.ok is False]


@dataclass(frozen=True, slots=True)
class Bench:
    key: str
    title: str
    order: int
    run: Callable[[Context], Section]
    opt_in: bool = False  # runs only when named with --only (its section is kept otherwise)


REGISTRY: dict[str, Bench] = {}


def register(
    key: str, title: str, order: int, *, opt_in: bool = False
) -> Callable[[Callable[[Context], Section]], Callable[[Context], Section]]:
    def deco(fn: Callable[[Context], Section]) -> Callable[[Context], Section]:
        REGISTRY[key] = Bench(key, title, order, fn, opt_in)
        return fn

    return deco


# --- the results file ------------------------------------------------------------------
#
# Each section is stored under a marker line holding its key, title, when it was
# measured and its summary rows (JSON inside an HTML comment, invisible when rendered),
# so that `--only KEY` can replace that section alone and rebuild the summary from
# every section in the file.

_MARK = "<!-- bench-section: "
_MARK_END = " -->"

SummaryRow = tuple[str, str, str, str]  # (figure, value, target, status)


@dataclass(frozen=True, slots=True)
class StoredSection:
    """One section as it stands in the results file."""

    key: str
    title: str
    measured: Measured | None  # None: a section of a file older than these markers
    summary: tuple[SummaryRow, ...]  # the figures that have a target
    body: str  # the section's Markdown (heading included, marker line excluded)

    def markdown(self) -> str:
        doc = {
            "key": self.key,
            "title": self.title,
            "measured": None if self.measured is None else asdict(self.measured),
            "summary": [list(r) for r in self.summary],
        }
        return f"{_MARK}{json.dumps(doc, ensure_ascii=False)}{_MARK_END}\n{self.body.rstrip()}\n"


def render_section(s: Section) -> str:
    out = [f"## {s.title}", ""]
    if s.measured is not None:
        out += [s.measured.describe(), ""]
    if s.figures:
        out += ["| figure | value | target | status | note |", "|---|---:|---|---|---|"]
        for f in s.figures:
            out.append(f"| {f.name} | {f.formatted()} | {f.target} | {f.status()} | {f.note} |")
        out.append("")
    for para in s.text:
        out += [para, ""]
    if s.commands:
        out += ["Commands:", "", "```", *s.commands, "```", ""]
    for title, body in s.profiles:
        out += [
            f"<details><summary>{title}</summary>",
            "",
            "```",
            body.rstrip(),
            "```",
            "",
            "</details>",
            "",
        ]
    return "\n".join(out)


def stored(s: Section) -> StoredSection:
    rows = tuple(
        (f.name, f.formatted(), f.target, f.status()) for f in s.figures if f.ok is not None
    )
    return StoredSection(s.key, s.title, s.measured, rows, render_section(s).rstrip() + "\n")


def parse_results(text: str, keys_by_title: dict[str, str]) -> list[StoredSection]:
    """The sections of a results file, in file order.

    A file written before the section markers (one run, one header) is read by its
    ``## `` headings: each section takes the header's date, commit and load, and its
    summary rows from the file's summary table (``keys_by_title`` names the keys).
    """
    if _MARK in text:
        out = []
        for chunk in text.split(_MARK)[1:]:
            head, _, body = chunk.partition("\n")
            doc = json.loads(head.removesuffix(_MARK_END))
            m = doc.get("measured")
            out.append(
                StoredSection(
                    doc["key"],
                    doc["title"],
                    None if m is None else Measured(**m),
                    tuple((a, b, c, d) for a, b, c, d in doc["summary"]),
                    body.rstrip() + "\n",
                )
            )
        return out
    return _parse_legacy(text, keys_by_title)


_LEGACY_HEADER = {
    "date": re.compile(r"^- date: (\d{4}-\d\d-\d\d \d\d:\d\d UTC) \((\w+) mode"),
    "command": re.compile(r"^- command: `(.*)`"),
    "load": re.compile(r"^- load average \(1/5/15 min\) before: ([^;]*); after: (.*?)(?: —|$)"),
    "commit": re.compile(r"^- git commit: (.*)$"),
}
_LEGACY_TOOK = re.compile(r"^_\(section took (\d+) s\)_$", re.MULTILINE)


def _parse_legacy(text: str, keys_by_title: dict[str, str]) -> list[StoredSection]:
    found: dict[str, re.Match[str]] = {}
    for line in text.splitlines():
        for name, rx in _LEGACY_HEADER.items():
            if name not in found and (m := rx.match(line)):
                found[name] = m
    rows: dict[str, list[SummaryRow]] = {}
    chunks = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    out = []
    for chunk in chunks:
        if not chunk.startswith("## "):
            continue
        title = chunk.splitlines()[0][3:].strip()
        if title == "Summary":
            for line in chunk.splitlines():
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) == 5 and cells[0] not in ("section", "---"):
                    rows.setdefault(cells[0], []).append((cells[1], cells[2], cells[3], cells[4]))
            continue
        took = _LEGACY_TOOK.search(chunk)
        measured = None
        if {"date", "command", "load", "commit"} <= found.keys():
            measured = Measured(
                found["date"].group(1),
                found["commit"].group(1).replace(" (working tree has uncommitted changes)",
                                                 " + uncommitted changes"),
                found["date"].group(2),
                found["command"].group(1),
                found["load"].group(1).strip(),
                found["load"].group(2).strip() + " (of the whole run)",
                float(took.group(1)) if took else 0.0,
            )  # fmt: skip
        body = _LEGACY_TOOK.sub("", chunk).rstrip() + "\n"
        if measured is not None:
            heading, _, rest = body.partition("\n")
            body = f"{heading}\n\n{measured.describe()}\n{rest.rstrip()}\n"
        key = keys_by_title.get(title) or re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")
        out.append(StoredSection(key, title, measured, (), body))
    return [
        StoredSection(s.key, s.title, s.measured, tuple(rows.get(s.title, ())), s.body) for s in out
    ]


def merge(
    old: list[StoredSection], new: list[StoredSection], order: dict[str, int]
) -> list[StoredSection]:
    """``old`` with the sections of ``new`` in place of theirs (same key), in ``order``
    (keys not in it last, as they were)."""
    by_key = {s.key: s for s in old}
    by_key.update({s.key: s for s in new})
    pos = {s.key: i for i, s in enumerate([*old, *new])}
    return sorted(by_key.values(), key=lambda s: (order.get(s.key, len(order)), pos[s.key]))


def render_summary(sections: list[StoredSection]) -> list[str]:
    """The summary table over every section (rows: the figures with a target), and a
    line naming the targets missed."""
    out = ["## Summary", ""]
    out += [
        "| section | figure | value | target | status | measured |",
        "|---|---|---:|---|---|---|",
    ]
    misses = []
    for s in sections:
        when = s.measured.short() if s.measured is not None else "?"
        for name, value, target, status in s.summary:
            out.append(f"| {s.title} | {name} | {value} | {target} | {status} | {when} |")
            if "MISS" in status:
                misses.append(f"{name} ({value}, target {target})")
    out.append("")
    if misses:
        out += [
            f"{len(misses)} target(s) missed: "
            + "; ".join(misses)
            + ". Where the time goes is in the profiles below.",
            "",
        ]
    return out
