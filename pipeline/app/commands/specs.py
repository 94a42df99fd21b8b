"""``schema``, ``validate``, ``openslo``: the event contract and the tailguard/v1 files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from pipeline.app.commands.common import Command, need_file, no_arguments


def cmd_schema(args: argparse.Namespace) -> int:
    from pipeline.contract.events import json_schema

    sys.stdout.write(orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate a tailguard/v1 file of any kind (pipeline.spec.registry dispatches)."""
    from pipeline.spec.registry import validate_path

    need_file(args.file)
    ok, message = validate_path(args.file)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _validate_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("file", type=Path)


def cmd_openslo(args: argparse.Namespace) -> int:
    """OpenSLO v1 <-> tailguard/v1 (pipeline.spec.openslo says what maps and how)."""
    import yaml

    from pipeline.spec.burn_rules import load_burn_rules_file
    from pipeline.spec.loader import SpecError
    from pipeline.spec.openslo import (
        OpenSLOError,
        export_openslo,
        import_openslo,
        rules_document,
        spec_document,
    )
    from pipeline.spec.slo import load_spec_file

    def write(path: Path | None, docs: list[Any]) -> None:
        text = yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True)
        if path is None:
            sys.stdout.write(text)
        else:
            path.write_text(text, encoding="utf-8")

    try:
        if args.direction == "export":
            spec = load_spec_file(args.file)
            rules = load_burn_rules_file(args.rules) if args.rules else None
            write(args.out, export_openslo(spec, rules, service=args.service))
            return 0
        try:
            docs = [d for d in yaml.safe_load_all(args.file.read_text(encoding="utf-8")) if d]
        except (OSError, yaml.YAMLError) as exc:
            print(f"{args.file}: {exc}", file=sys.stderr)
            return 1
        spec, rules = import_openslo(docs, str(args.file))
    except (OpenSLOError, SpecError) as exc:
        print(exc, file=sys.stderr)
        return 1
    write(args.out, [spec_document(spec)])
    if rules is not None:
        if args.rules_out is None:
            print("note: alert policies found; --rules-out FILE writes them", file=sys.stderr)
        else:
            write(args.rules_out, [rules_document(rules)])
    return 0


def _openslo_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("direction", choices=["import", "export"])
    s.add_argument(
        "file", type=Path, help="import: OpenSLO YAML (multi-document); export: a tailguard spec"
    )
    s.add_argument("-o", "--out", type=Path, help="write here (default stdout)")
    s.add_argument("--rules", type=Path, help="export: burn rules to add as alert policies")
    s.add_argument("--rules-out", type=Path, help="import: write the alert policies' rules here")
    s.add_argument(
        "--service",
        default="tailguard",
        help="export: the OpenSLO service of SLOs whose spec names none (default tailguard)",
    )


SCHEMA = Command("schema", "print the v1 event contract as JSON Schema", no_arguments, cmd_schema)
VALIDATE = Command(
    "validate",
    "validate an SLO spec, control policy, burn rules or contract file (by its kind)",
    _validate_arguments,
    cmd_validate,
)
OPENSLO = Command(
    "openslo", "convert OpenSLO v1 <-> tailguard/v1 specs", _openslo_arguments, cmd_openslo
)
