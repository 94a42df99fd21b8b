"""Benchmark sections, the registry every bench module adds itself to, and the Markdown writer.

A bench module registers a function that measures and returns a
:class:`Section`::

    @register("detection", "Detection latency at 50k events/s", order=50)
    def run(ctx: Context) -> Section: ...

``bench/run.py`` imports :data:`BENCH_MODULES` in order, runs every
registered benchmark and writes one Markdown file. A module listed there that
does not exist yet gets a placeholder section saying so (nothing is invented).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.run import Context

# In run order. ``bench.detection`` is the reserved place for detection latency
# at 50k events/s (owned by the lead): create it and register a section.
BENCH_MODULES: tuple[str, ...] = (
    "bench.core_speed",
    "bench.throughput",
    "bench.accuracy",
    "bench.memory",
    "bench.detection",
    "bench.gateway_latency",
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
        if abs(v) >= 100:
            return f"{v:,.0f} {self.unit}".strip()
        if abs(v) >= 1:
            return f"{v:,.2f} {self.unit}".strip()
        return f"{v:.4g} {self.unit}".strip()


def at_least(name: str, value: float, unit: str, target: float, note: str = "") -> Figure:
    return Figure(name, value, unit, f"≥ {target:,g} {unit}".strip(), value >= target, note)


def at_most(name: str, value: float, unit: str, target: float, note: str = "") -> Figure:
    return Figure(name, value, unit, f"≤ {target:,g} {unit}".strip(), value <= target, note)


@dataclass(slots=True)
class Section:
    key: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # Markdown paragraphs, after the table
    profiles: list[tuple[str, str]] = field(default_factory=list)  # (title, preformatted)
    commands: list[str] = field(default_factory=list)  # what ran (worker command lines, ...)
    seconds: float = 0.0

    def misses(self) -> list[Figure]:
        return [f for f in self.figures if f.ok is False]


@dataclass(frozen=True, slots=True)
class Bench:
    key: str
    title: str
    order: int
    run: Callable[[Context], Section]


REGISTRY: dict[str, Bench] = {}


def register(
    key: str, title: str, order: int
) -> Callable[[Callable[[Context], Section]], Callable[[Context], Section]]:
    def deco(fn: Callable[[Context], Section]) -> Callable[[Context], Section]:
        REGISTRY[key] = Bench(key, title, order, fn)
        return fn

    return deco


def render_section(s: Section) -> str:
    out = [f"## {s.title}", ""]
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
    if s.seconds:
        out += [f"_(section took {s.seconds:.0f} s)_", ""]
    return "\n".join(out)
