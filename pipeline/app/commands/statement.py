"""``statement``: a tenant's contract statement for a billing period, or ``--verify`` one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from pipeline.app.commands.common import Command, add_store
from pipeline.app.commands.settings import worker_settings
from pipeline.shipped import EXAMPLE_CONTRACT

DEFAULT_CONTRACT = EXAMPLE_CONTRACT


def cmd_statement(args: argparse.Namespace) -> int:
    """A tenant's contract statement for a billing period, or --verify one."""
    from pipeline.adapters.query_server import open_reader
    from pipeline.app.statement import build_statement, render_html, render_text, verify
    from pipeline.spec.contract import load_contract_file
    from pipeline.spec.loader import SpecError

    doc: dict[str, Any] | None = None
    loaded = None
    given: list[tuple[str, str, str]] = []
    try:
        if args.verify is None or args.contract is not None or args.slo is not None:
            loaded = load_contract_file(args.contract or DEFAULT_CONTRACT, args.slo)
            if args.contract is not None:
                given.append(("contract", str(loaded.path), loaded.contract_digest))
            if args.contract is not None or args.slo is not None:
                given.append(("slo_spec", str(loaded.spec_path), loaded.spec_digest))
    except SpecError as exc:
        raise SystemExit(f"tailguard: invalid contract:\n{exc}") from None
    if args.verify is not None:
        try:
            doc = orjson.loads(args.verify.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise SystemExit(
                f"tailguard statement --verify: cannot read {args.verify}: {exc}"
            ) from None
        if not isinstance(doc, dict):
            raise SystemExit(f"tailguard statement --verify: {args.verify} is not a statement")
    elif args.tenant is None or args.period is None:
        raise SystemExit("tailguard statement: give --tenant and --period (or --verify FILE)")
    store = open_reader(worker_settings(args))
    try:
        if doc is not None:
            try:
                found = verify(store, doc, given=given)
            except (ValueError, KeyError, TypeError) as exc:
                raise SystemExit(
                    f"tailguard statement --verify: {args.verify} is not a statement: {exc}"
                ) from None
            if found.problems:
                print(
                    f"MISMATCH: {args.verify} does not match the store (recomputed with the "
                    "contract and SLO spec it records):",
                    file=sys.stderr,
                )
                for p in found.problems:
                    print(f"  {p}", file=sys.stderr)
            else:
                print(
                    f"ok: {args.verify} matches the store under the contract and SLO spec it "
                    f"records (tenant {doc['tenant']}, period {doc['period']}, "
                    f"{doc['inputs']['requests_rows']} request rows)"
                )
            if found.files_differ:
                print(
                    "DIFFERS: a file given is not the one the statement records:", file=sys.stderr
                )
                for p in found.files_differ:
                    print(f"  {p}", file=sys.stderr)
            return 0 if found.ok else 1
        assert loaded is not None
        try:
            st = build_statement(store, loaded, args.tenant, args.period)
        except ValueError as exc:
            raise SystemExit(f"tailguard statement: {exc}") from None
    finally:
        store.close()
    if args.html is not None:
        args.html.write_text(render_html(st), encoding="utf-8")
        print(f"HTML statement: {args.html}", file=sys.stderr)
    if args.json:
        print(orjson.dumps(st.to_json() | {"generated_at": _now_iso()}).decode())
    else:
        print(render_text(st))
    return 0


def _now_iso() -> str:
    from datetime import UTC, datetime

    return datetime.now(tz=UTC).isoformat(timespec="seconds")


def _arguments(s: argparse.ArgumentParser) -> None:
    add_store(s)
    s.add_argument("--tenant", help="the tenant (one of the contract's)")
    s.add_argument("--period", help="billing period, YYYY-MM (calendar month, contract's zone)")
    s.add_argument(
        "--contract",
        type=Path,
        help="contract (kind: Contract; default: the shipped example). With --verify: "
        "also check that this file is the contract the statement records",
    )
    s.add_argument(
        "--slo", type=Path, help="SLO spec (default: the contract's slo_spec; with --verify: "
        "compared with the recorded one)",
    )  # fmt: skip
    s.add_argument("--json", action="store_true", help="the statement as one JSON object")
    s.add_argument("--html", type=Path, help="also write a self-contained HTML statement")
    s.add_argument(
        "--verify", type=Path, metavar="FILE.json", help="recompute a --json statement and compare"
    )


STATEMENT = Command(
    "statement",
    "a tenant's contract statement for a billing period (or --verify one)",
    _arguments,
    cmd_statement,
)
