"""The month store: built once through the flush's writers, reused while its recipe holds.

    nice -n 10 .venv/bin/python -m bench.month_store [--store DIR] [--days 30] [--hours N]

The store lives outside the repository (``TG_MONTH_STORE``, default
``~/.cache/tailguard/month-store``): ~50 M requests take gigabytes and an hour or more
of CPU to write. Its directory holds the embedded engine's data (``chdb/``) and
``recipe.json``: the :class:`~bench.month_data.MonthRecipe`, its digest (the recipe,
the migrations' text and the generator's version) and the hours written so far. A
recipe or migration change starts a new store; an interrupted build goes on where it
stopped (hours are written newest first, so a partial store holds the latest days; each
hour is one flush, recorded once written: stop a build between hours, never inside one,
whose windows would be written twice).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Final

from bench.month_data import HOUR_MS, MonthRecipe, generate_hour, hour_messages, hour_windows
from pipeline.adapters.flush import Flush, FlushWriter
from pipeline.adapters.store import ClickHouseStore, load_migrations, migrate, open_store
from pipeline.core.slo_windows import slo_factory
from pipeline.settings import Settings
from pipeline.spec.slo import load_spec_file

DATABASE: Final = "tailguard"
GROUP: Final = "tailguard-month"


def default_dir() -> Path:
    """``TG_MONTH_STORE``: where the month store lives (outside the repository)."""
    env = os.environ.get("TG_MONTH_STORE")
    return Path(env) if env else Path.home() / ".cache" / "tailguard" / "month-store"


def migration_digests() -> dict[str, str]:
    """Each migration's version and a digest of its text."""
    return {
        str(m.version): hashlib.sha256(m.sql.encode()).hexdigest()[:16] for m in load_migrations()
    }


def settings_for(store_dir: Path) -> Settings:
    return Settings().model_copy(update={"store_dir": store_dir / "chdb", "database": DATABASE})


@dataclasses.dataclass(slots=True)
class Progress:
    """``recipe.json``: what the store was built from and how far."""

    recipe: MonthRecipe
    digest: str
    migrations: dict[str, str]  # version -> digest of its text, as applied to this store
    hours_done: set[int]  # hours whose requests are written
    windows_done: set[int] = dataclasses.field(default_factory=set)  # ... and windows
    raw_done: set[int] = dataclasses.field(default_factory=set)  # ... and raw events
    build_cpu_s: float = 0.0
    build_wall_s: float = 0.0
    requests: int = 0

    def save(self, path: Path) -> None:
        data = {
            "recipe": dataclasses.asdict(self.recipe),
            "digest": self.digest,
            "migrations": self.migrations,
            "hours_done": sorted(self.hours_done),
            "windows_done": sorted(self.windows_done),
            "raw_done": sorted(self.raw_done),
            "build_cpu_s": self.build_cpu_s,
            "build_wall_s": self.build_wall_s,
            "requests": self.requests,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Progress | None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        r = data["recipe"]
        r["episodes"] = tuple(tuple(e) for e in r["episodes"])
        return cls(
            MonthRecipe(**r), data["digest"], data["migrations"], set(data["hours_done"]),
            set(data.get("windows_done", ())), set(data.get("raw_done", ())),
            data["build_cpu_s"], data["build_wall_s"], data["requests"],
        )  # fmt: skip

    @property
    def raw_hours(self) -> list[int]:
        """The hours whose raw events the table keeps (its retention), newest first."""
        r = self.recipe
        return list(reversed(range(max(0, r.hours - 24 * r.raw_days), r.hours)))

    @property
    def complete(self) -> bool:
        return len(self.windows_done) == len(
            self.hours_done
        ) == self.recipe.hours and self.raw_done >= set(self.raw_hours)


def last_full_hour_ms() -> int:
    now = int(time.time() * 1000)
    return now - now % HOUR_MS


def open_month(store_dir: Path, recipe: MonthRecipe) -> tuple[ClickHouseStore, Progress]:
    """The store of ``recipe`` in ``store_dir`` (its end is kept from the first build: the
    recipe's ``end_ms`` 0 means "the last full hour", fixed then), migrated; a store of
    another recipe, or one a migration it had applied has changed since, is removed
    first. Migrations added since are applied to it, as to a live store."""
    path = store_dir / "recipe.json"
    old = Progress.load(path)
    if old is not None and recipe.end_ms == 0:
        recipe = dataclasses.replace(recipe, end_ms=old.recipe.end_ms)
    if recipe.end_ms == 0:
        recipe = dataclasses.replace(recipe, end_ms=last_full_hour_ms())
    digest = recipe.digest()
    now = migration_digests()
    if (
        old is None
        or old.digest != digest
        or any(now.get(v) != d for v, d in old.migrations.items())
    ):
        if store_dir.exists():
            shutil.rmtree(store_dir)
        store_dir.mkdir(parents=True)
        old = Progress(recipe, digest, {}, set())
    s = settings_for(store_dir)
    store = open_store(s)
    migrate(store, raw_ttl_days=s.raw_events_ttl_days)
    old.migrations = now
    old.save(path)
    return store, old


def _no_retry(write: Any, _what: str) -> int:
    write()
    return 0


def _no_dead(letters: list[Any]) -> None:
    if letters:
        raise RuntimeError(f"the store refused {len(letters)} generated rows")


def build(store_dir: Path, recipe: MonthRecipe, *, max_hours: int | None = None,
          stop_file: Path | None = None, passes: set[str] | None = None,
          log: Any = sys.stderr) -> Progress:  # fmt: skip
    """Write the hours of ``recipe`` not yet in the store, newest first, in passes: every
    hour's requests (the cheap part: ~6 µs a request), the last day's raw events, every
    hour's windows (~50 µs a request: the engine's inserts into ``window_sketches`` and
    its views), the other retained days' raw events; so that a build cut short holds the
    whole month of requests, the last day's events and the latest windows. Stops between
    hours once ``stop_file`` exists, or after ``max_hours`` flushes; ``passes``: only
    those ("requests", "raw events", "windows")."""
    store, prog = open_month(store_dir, recipe)
    recipe = prog.recipe
    s = settings_for(store_dir)
    config = s.window_config()
    factory = slo_factory(load_spec_file(s.slo_spec))
    writer = FlushWriter(
        store, GROUP, s.lifecycle_topic, config.relative_accuracy,
        retry=_no_retry, dead_rows=_no_dead,
    )  # fmt: skip
    newest_first = list(reversed(range(recipe.hours)))
    raw = prog.raw_hours
    todo = [(h, "requests") for h in newest_first if h not in prog.hours_done]
    todo += [(h, "raw events") for h in raw[:24] if h not in prog.raw_done]
    todo += [(h, "windows") for h in newest_first if h not in prog.windows_done]
    todo += [(h, "raw events") for h in raw[24:] if h not in prog.raw_done]
    if passes is not None:
        todo = [t for t in todo if t[1] in passes]
    if max_hours is not None:
        todo = todo[:max_hours]
    try:
        for n, (index, what) in enumerate(todo):
            if stop_file is not None and stop_file.exists():
                print("[month] stop file found: stopped between hours", file=log, flush=True)
                break
            t, c = time.monotonic(), time.process_time()
            hour = generate_hour(recipe, index)
            # (its requests are in: written by the first pass)
            if what == "windows":
                windows = hour_windows(hour, recipe.partitions, config, factory)
                writer.write(Flush((), windows))
                prog.windows_done.add(index)
            elif what == "raw events":
                writer.write(Flush((), (), hour_messages(hour, recipe.partitions)))
                prog.raw_done.add(index)
            else:
                writer.write(Flush(hour.records, ()))
                prog.hours_done.add(index)
                prog.requests += len(hour.records)
            prog.build_cpu_s += time.process_time() - c
            prog.build_wall_s += time.monotonic() - t
            prog.save(store_dir / "recipe.json")
            print(
                f"[month] {what} of hour {index} "
                f"({n + 1}/{len(todo)}): {len(hour.records)} requests, "
                f"{time.monotonic() - t:.1f} s; {len(prog.hours_done)} hours of requests "
                f"({prog.requests:,}), {len(prog.raw_done)} of raw events, "
                f"{len(prog.windows_done)} of windows",
                file=log,
                flush=True,
            )
    finally:
        store.close()
    return prog


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=default_dir())
    ap.add_argument("--days", type=int, default=MonthRecipe().days)
    ap.add_argument(
        "--partitions", type=int, default=None,
        help="default: the existing store's (a store of another recipe is built anew)",
    )  # fmt: skip
    ap.add_argument(
        "--rate", type=float, default=MonthRecipe().rate_per_s,
        help="requests per second on average (a smaller store of the same month's shape)",
    )  # fmt: skip
    ap.add_argument("--hours", type=int, default=None, help="write at most this many hours")
    ap.add_argument("--stop-file", type=Path, help="stop between hours once it exists")
    ap.add_argument(
        "--pass",
        dest="passes",
        action="append",
        choices=("requests", "raw events", "windows"),
        help="only this pass (repeatable; default: all, in order)",
    )
    args = ap.parse_args(argv)
    existing = Progress.load(args.store / "recipe.json")
    partitions = args.partitions
    if partitions is None:
        partitions = existing.recipe.partitions if existing else MonthRecipe().partitions
    recipe = MonthRecipe(days=args.days, partitions=partitions, rate_per_s=args.rate)
    prog = build(
        args.store, recipe, max_hours=args.hours, stop_file=args.stop_file,
        passes=set(args.passes) if args.passes else None,
    )  # fmt: skip
    print(
        f"[month] {len(prog.hours_done)}/{prog.recipe.hours} hours of requests "
        f"({prog.requests:,}), {len(prog.windows_done)} of windows;"
        f" build {prog.build_cpu_s:.0f} CPU-s, {prog.build_wall_s:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
