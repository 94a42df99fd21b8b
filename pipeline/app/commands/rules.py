"""``rules``: Prometheus rules and an Alertmanager example from the SLO spec.

* ``rules export [--slo SPEC] [--burn-rules FILE] [--format prometheus|prometheusrule]``:
  recording and alerting rules (one page and one ticket per SLO, each holding every rule
  kind's conditions and those of the SLO's blended tiers; dead-man alerts), written by
  :mod:`pipeline.app.rules`;
* ``rules alertmanager [--receiver-url URL]``: an Alertmanager configuration whose
  ``inhibit_rules`` let a page silence the ticket of the same SLO (docs/alerting.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipeline.app.commands.common import Command
from pipeline.shipped import DEFAULT_BURN_RULES, DEFAULT_SLO_SPEC


def cmd_rules(args: argparse.Namespace) -> int:
    # the core is imported here: the base install (emitters) builds the parser without it
    from pipeline.app.rules import export_text, to_yaml
    from pipeline.core.prom_rules import RulesOptions, alertmanager_example
    from pipeline.spec.loader import SpecError

    if args.action == "alertmanager":
        text = to_yaml(alertmanager_example(args.receiver_url))
    else:
        spec = args.slo or Path(os.environ.get("TAILGUARD_SLO_SPEC") or DEFAULT_SLO_SPEC)
        rules = args.burn_rules or Path(
            os.environ.get("TAILGUARD_BURN_RULES_FILE") or DEFAULT_BURN_RULES
        )
        opts = RulesOptions(service=args.service)
        if args.runbook_url:
            opts = RulesOptions(service=args.service, runbook_url=args.runbook_url)
        try:
            text = export_text(spec, rules, args.format, opts)
        except SpecError as exc:
            print(exc, file=sys.stderr)
            return 1
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


def _arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=["export", "alertmanager"])
    s.add_argument("--slo", type=Path, help="SLO spec (default: TAILGUARD_SLO_SPEC, or shipped)")
    s.add_argument(
        "--burn-rules",
        type=Path,
        help="burn rules (default: TAILGUARD_BURN_RULES_FILE, or the shipped rules)",
    )
    s.add_argument(
        "--format",
        choices=["prometheus", "prometheusrule"],
        default="prometheus",
        help="a rule file (promtool check rules), or a Prometheus Operator PrometheusRule",
    )
    s.add_argument("--service", default="tailguard", help="the sloth_service label")
    s.add_argument(
        "--runbook-url", help="the alerts' runbook_url (default: docs/alerting.md#runbook)"
    )
    s.add_argument(
        "--receiver-url",
        default="http://127.0.0.1:5001/",
        help="alertmanager: the example's webhook receiver",
    )
    s.add_argument("-o", "--out", type=Path, help="write here (default stdout)")


RULES = Command(
    "rules",
    "Prometheus recording + alerting rules (and an Alertmanager example) from the spec: "
    "one page and one ticket per SLO (burn_rate, budget_fraction, compliance_below rules; "
    "blended tiers in their primary's)",
    _arguments,
    cmd_rules,
)
