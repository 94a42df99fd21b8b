"""``tailguard`` command line. The settings object is built here, once."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.cli_settings import emitter_settings, worker_settings
from pipeline.kafka_settings import EmitterSettings, KafkaSettings
from pipeline.shipped import DEFAULT_TRACE, EXAMPLE_CONTRACT

if TYPE_CHECKING:
    from pipeline.settings import Settings

__all__ = ["BACKTEST_START_UNIX_NS", "DEFAULT_CONTRACT", "DEFAULT_TRACE", "build_parser", "main"]
# The demo's and the backtest's overload episode (`--overload none` for none): arrivals
# x2 from minute 20 to 30 of the trace's hour.
DEFAULT_OVERLOAD = "1200:1800:2"
BACKTEST_START_UNIX_NS = 1_800_000_000_000_000_000  # fixed: same seed, same output


def _settings(args: argparse.Namespace) -> Settings:
    return worker_settings(args)


def _need_file(path: Path | None) -> None:
    """A missing input fails before anything is created (one line, via main)."""
    import errno
    import os

    if path is not None and str(path) != "-" and not path.is_file():
        code = errno.EISDIR if path.is_dir() else errno.ENOENT
        raise FileNotFoundError(code, os.strerror(code), str(path))


def _add_kafka(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (env TAILGUARD_BOOTSTRAP_SERVERS)")
    p.add_argument("--partitions", type=int, help="partitions for created topics")


def _add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store", type=Path, help="embedded ClickHouse directory (env TAILGUARD_STORE_DIR)"
    )


def _add_spec_and_policy(p: argparse.ArgumentParser) -> None:
    default = "(default: TAILGUARD_{} or the shipped one)"
    p.add_argument("--slo", type=Path, help=f"SLO spec {default.format('SLO_SPEC')}")
    p.add_argument("--policy", type=Path, help=f"control policy {default.format('POLICY_FILE')}")


def _add_sim(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Azure-format trace CSV")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the arrival rate")
    p.add_argument(
        "--overload",
        metavar="[SHAPE:]START_S:END_S:FACTOR",
        help="overload episode, e.g. 600:1200:3 (a step), ramp:600:1200:3 (x1 rising to x3), "
        "burst:600:1200:3 (replicas at the same instant), or none",
    )
    p.add_argument(
        "--scheduling",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="engine admission order: fcfs, or priority as vLLM's --scheduling-policy "
        "priority (lower priority number first, no preemption)",
    )
    p.add_argument("--limit", type=int, help="only the first N trace requests")
    p.add_argument(
        "--restart",
        action="append",
        metavar="ENGINE_HOST:OFFSET_S",
        help="restart an engine at this trace offset (a cold start; repeatable)",
    )


def cmd_schema(args: argparse.Namespace) -> int:
    from pipeline.contract.events import json_schema

    sys.stdout.write(orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    from pipeline.adapters.kafka_admin import ensure_topics

    for topic, n in ensure_topics(_settings(args)).items():
        print(f"{topic}\t{n} partitions")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from pipeline.adapters.store import migrate, open_store

    settings = _settings(args)
    store = open_store(settings)
    try:
        applied = migrate(store, settings.cluster)
    finally:
        store.close()
    print("applied: " + (", ".join(applied) if applied else "nothing (up to date)"))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from pipeline.adapters.faust_wiring import run_worker

    settings = _settings(args)
    run_worker(settings, loglevel=args.loglevel)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from pipeline.app.demo import sim_config_from_args, simulate_to

    _need_file(args.trace)
    config = sim_config_from_args(args)
    if args.out is not None:
        summary = simulate_to(
            args.trace, config, jsonl=args.out, speedup=args.speedup, limit=args.limit
        )
    else:
        summary = simulate_to(
            args.trace, config, settings=_settings(args), speedup=args.speedup, limit=args.limit
        )
    print(orjson.dumps(summary).decode())
    return 0


def _load_spec(path: Path | None) -> Any:
    from pipeline.spec.loader import SpecError
    from pipeline.spec.slo import load_spec_file

    if path is None:
        return None
    _need_file(path)
    try:
        return load_spec_file(path)
    except SpecError as exc:
        raise SystemExit(f"tailguard: invalid SLO spec:\n{exc}") from None


def _load_control(policy_path: Path | None, rules_path: Path) -> tuple[Any, Any]:
    from pipeline.spec.burn_rules import load_burn_rules_file
    from pipeline.spec.loader import SpecError
    from pipeline.spec.policy import load_policy_file

    if policy_path is None:
        return None, None
    _need_file(policy_path)
    _need_file(rules_path)
    try:
        return load_policy_file(policy_path), load_burn_rules_file(rules_path)
    except SpecError as exc:
        raise SystemExit(f"tailguard: invalid control configuration:\n{exc}") from None


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


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate a tailguard/v1 file of any kind (pipeline.spec.registry dispatches)."""
    from pipeline.spec.registry import validate_path

    _need_file(args.file)
    ok, message = validate_path(args.file)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _window_s(text: str) -> tuple[float, float]:
    """``START_S:END_S`` (trace offsets, seconds) for ``backtest --window``."""
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected START_S:END_S") from None
    if not (0 <= lo < hi):
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= START_S < END_S")
    return lo, hi


def cmd_backtest(args: argparse.Namespace) -> int:
    from pipeline.app.backtest import render_text, run_backtest
    from pipeline.app.demo import sim_config_from_args
    from producers.simulator.trace import read_trace

    _need_file(args.trace)
    settings = _settings(args)
    spec = _load_spec(args.slo or settings.slo_spec)
    policy, rules = _load_control(args.policy or settings.policy_file, settings.burn_rules_file)
    if policy is None:
        raise SystemExit("tailguard backtest: no policy (pass --policy)")
    trace = read_trace(args.trace)
    if args.limit is not None:
        trace = trace[: args.limit]
    config = dataclasses.replace(sim_config_from_args(args), start_unix_ns=BACKTEST_START_UNIX_NS)
    loops = args.loops if "tailguard" in args.loops else [*args.loops, "tailguard"]
    from pipeline.app.backtest import DEFAULT_LOOP_DELAY_MS

    delay = DEFAULT_LOOP_DELAY_MS if args.loop_delay is None else args.loop_delay
    if delay < 0:
        raise SystemExit("tailguard backtest: --loop-delay must be >= 0")
    bt = run_backtest(
        trace, config, spec, policy, rules, loops=loops, window_s=args.window, loop_delay_ms=delay
    )
    if args.json:
        print(orjson.dumps(bt.to_json()).decode())
    else:
        print(render_text(bt))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from pipeline.app.replay import run_replay

    _need_file(args.events)
    settings = _settings(args)
    spec = _load_spec(args.slo or settings.slo_spec)
    policy, rules = _load_control(args.policy or settings.policy_file, settings.burn_rules_file)
    dlq_path: Path = args.dlq or args.events.with_suffix(".dlq.jsonl")
    summary = run_replay(
        args.events, settings, spec=spec, policy=policy, burn_rules=rules, dlq_path=dlq_path,
        store=not args.no_store,
    )  # fmt: skip
    if args.json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        from pipeline.app.replay_text import render_summary
        from pipeline.app.report import print_wide

        print_wide(render_summary(summary))
    return 0


def _report_time(text: str) -> float:
    """``--since/--until``: ISO 8601 (UTC unless it says otherwise) or unix seconds."""
    import datetime as dt

    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601, e.g. 2026-12-01T20:06:00, or unix seconds)"
        ) from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline.adapters.queries.filters import ReportFilter
    from pipeline.adapters.query_server import open_reader
    from pipeline.app.report import print_wide, read_report, render

    flt = ReportFilter(args.since, args.until, args.model, tuple(args.slo or ()))
    settings = _settings(args)
    spec = _load_spec(settings.slo_spec)
    store = open_reader(settings)  # through a live worker's port if one owns it
    try:
        report = read_report(store, flt, spec)
        html_data = None
        if args.html is not None or args.json:
            from pipeline.app.report_html import read_html_data

            html_data = read_html_data(store, flt, spec)
        if args.html is not None:
            from pipeline.app.report_html import render_html

            args.html.write_text(render_html(report, html_data), encoding="utf-8")
            print(f"HTML report: {args.html}", file=sys.stderr)
    finally:
        store.close()
    if args.json:
        from pipeline.app.report_html import series_json

        print(orjson.dumps(report.to_json() | {"series": series_json(html_data)}).decode())
    else:
        print_wide(render(report))
    return 0


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
    store = open_reader(_settings(args))
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
    st["generated_at"] = _now_iso()
    if args.html is not None:
        args.html.write_text(render_html(st), encoding="utf-8")
        print(f"HTML statement: {args.html}", file=sys.stderr)
    if args.json:
        print(orjson.dumps(st).decode())
    else:
        print(render_text(st))
    return 0


def _now_iso() -> str:
    from datetime import UTC, datetime

    return datetime.now(tz=UTC).isoformat(timespec="seconds")


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.app.demo import run_demo, sim_config_from_args

    _need_file(args.trace)
    return run_demo(
        trace=args.trace,
        sim_config=sim_config_from_args(args),
        speedup=args.speedup,
        partitions=args.partitions or 8,
        workdir=args.workdir,
        bootstrap=args.bootstrap,
        limit=args.limit,
        tee_jsonl=args.tee,
        json_out=args.json,
        closed_loop=not args.open_loop,
    )


def _meter_provider(settings: EmitterSettings, service: str) -> Any:
    from pipeline.adapters.telemetry import meter_provider

    provider, _reader = meter_provider(
        service, settings.metrics_exporter, settings.metrics_interval_ms, settings.metrics_file
    )
    return provider


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise SystemExit(f"--listen must look like HOST:PORT, got {value!r}") from None


def cmd_gateway(args: argparse.Namespace) -> int:
    from producers.emit import open_kafka_sink
    from producers.gateway_proxy import build_gateway, serve_gateway

    settings = emitter_settings(args)
    host, port = _listen(args.listen)
    if not args.upstream.startswith(("http://", "https://")):
        raise SystemExit(f"--upstream must be an http(s):// URL, got {args.upstream!r}")
    log = logging.getLogger("tailguard.gateway")
    sink = open_kafka_sink(
        settings,
        service="gateway",
        buffer_max_events=args.buffer_events,
        meter_provider=_meter_provider(settings, "tailguard-gateway"),
    )
    closed: list[bool] = []

    def close_sink() -> None:  # at lifespan shutdown: uvicorn re-raises SIGTERM afterwards
        if closed:
            return
        closed.append(True)
        sink.close(timeout_s=5.0)
        c = sink.counters
        log.info(
            "producer closed: sent=%d dropped=%d failed=%d",
            c.events_sent,
            c.events_dropped,
            c.events_failed,
        )

    from producers.gateway import INFERENCE_ROUTES, PriorityRules

    try:
        rules = PriorityRules(
            default=args.default_priority,
            llmd_header=args.llmd_priority_header.lower().encode(),
        )
    except ValueError as exc:
        raise SystemExit(f"--default-priority: {exc}") from None
    paths = args.record_path or sorted(INFERENCE_ROUTES)
    client, modes, shutdown = _gateway_control(args, settings, log)
    app, _proxy, _mw = build_gateway(
        args.upstream,
        sink,
        host=args.name,
        control=client.directive if client is not None else None,
        control_modes=modes,
        control_in_force=client.in_force if client is not None else None,
        control_loop_delay=client.loop_delay if client is not None else None,
        on_shutdown=[*shutdown, close_sink],
        default_model=args.default_model,
        tenant_header=args.tenant_header.lower().encode(),
        priority=rules,
        record_paths=None if "*" in paths else frozenset(p.rstrip("/") for p in paths),
    )
    log.info(
        "gateway on http://%s:%d -> %s (events to %s)",
        host,
        port,
        args.upstream,
        settings.bootstrap_servers,
    )
    try:
        serve_gateway(app, host, port, verbose=args.verbose)  # -v: a log line per request
    finally:
        close_sink()
    return 0


def _gateway_control(
    args: argparse.Namespace, settings: Any, log: logging.Logger
) -> tuple[Any, Any, list[Any]]:
    """The gateway's control client, modes and what to stop at shutdown: with a mode other
    than off, a ControlClient on the control topic with the control keys (bad keys or
    modes fail here, at start). Fails open: a directive that expires is level 0."""
    from producers.enforcement import Modes

    try:
        modes = Modes.parse(
            settings.control_mode,
            enforce_from_priority=settings.control_enforce_from_priority,
            scopes=settings.control_mode_scopes,
            retry_budget_ratio=settings.control_retry_budget_ratio,
            retry_budget_min_retries=settings.control_retry_budget_min_retries,
        )
    except ValueError as exc:
        raise SystemExit(f"tailguard gateway: {exc}") from None
    if modes.mode == "off" and all(m == "off" for _, m in modes.scopes):
        return None, None, []
    from pipeline.contract.control_signal import KeyConfigError
    from producers.control_client import ControlClient
    from producers.control_keys import load_keyring

    try:
        keyring = load_keyring(args.control_keys_file)
    except KeyConfigError as exc:
        raise SystemExit(f"tailguard gateway --control {modes.mode}: {exc}") from None
    client = ControlClient.from_settings(settings, keyring)
    client.start()
    log.info(
        "control %s (enforced from priority %d%s), directives from %s",
        modes.mode,
        modes.enforce_from_priority,
        "".join(f", {m} for {scope}" for scope, m in modes.scopes),
        settings.control_topic,
    )
    return client, modes, [client.stop]


def cmd_envoy(args: argparse.Namespace) -> int:
    import signal
    import threading

    from producers.emit import JsonlSink, open_kafka_sink
    from producers.envoy import Follower, follow, ingest, load_position, save_position

    _need_file(args.file)
    settings = emitter_settings(args)
    stdin = str(args.file) == "-"
    if args.follow and stdin:
        raise SystemExit("--follow needs a file (it is re-opened when rotated), not -")
    sink: Any
    out_fh = None
    if args.out is not None:
        # following: append (a restart resumes where the position file says)
        out_fh = args.out.open("ab" if args.follow else "wb")
        sink = JsonlSink(out_fh)
    else:
        sink = open_kafka_sink(
            settings,
            service="envoy-ingest",
            on_full="block",
            meter_provider=_meter_provider(settings, "tailguard-envoy-ingest"),
        )
    dlq = None if args.out is not None else _dlq_sender(settings)
    dlq_path = args.dlq or (
        args.out.with_name(args.out.name + ".dlq.jsonl") if args.out is not None else None
    )
    dlq_fh = dlq_path.open("ab" if args.follow else "wb") if dlq_path is not None else None
    source = "stdin" if stdin else str(args.file)

    def dead(raw: bytes, reason: str, line_no: int) -> None:
        where = f"envoy:{source}:{line_no}"
        if dlq_fh is not None:  # with --out: a dead-letter file, one JSON object a line
            dlq_fh.write(
                orjson.dumps(
                    {"reason": reason, "source": where, "raw": raw.decode("utf-8", "replace")}
                )
                + b"\n"
            )
            return
        if dlq is None:
            logging.getLogger("tailguard.envoy").warning("line %d: %s", line_no, reason)
            return
        dlq.send(raw, [("tailguard.reason", reason.encode()), ("tailguard.source", where.encode())])

    def flush_dlq() -> None:
        if dlq_fh is not None:
            dlq_fh.flush()
        if dlq is not None:
            dlq.flush()

    try:
        if args.follow:
            stop = threading.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            pos_path = args.position or args.file.with_name(args.file.name + ".tailguard-pos")
            follower = Follower(args.file, load_position(pos_path))
            logging.getLogger("tailguard.envoy").info(
                "following %s (position in %s)", args.file, pos_path
            )
            try:
                stats = follow(
                    follower, sink, stop, host=args.name, default_model=args.default_model,
                    dead=dead, flush=flush_dlq, on_delivered=lambda p: save_position(pos_path, p),
                    default_priority=args.default_priority,
                )  # fmt: skip
            finally:
                follower.close()
        else:
            src = sys.stdin.buffer if stdin else args.file.open("rb")
            try:
                stats = ingest(
                    src, sink, host=args.name, default_model=args.default_model, dead=dead,
                    default_priority=args.default_priority,
                )  # fmt: skip
            finally:
                if src is not sys.stdin.buffer:
                    src.close()
    finally:
        sink.close()  # flush and go
        flush_dlq()
        for fh in (out_fh, dlq_fh):
            if fh is not None:
                fh.close()
    print(orjson.dumps(stats.to_json()).decode())
    return 0 if stats.lines or args.follow else 1


def _dlq_sender(settings: KafkaSettings) -> Any:
    from pipeline.adapters.reliable import ReliableProducer

    return ReliableProducer(settings, settings.dlq_topic, "envoy dead letters")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tailguard", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("schema", help="print the v1 event contract as JSON Schema")
    s.set_defaults(func=cmd_schema)

    s = sub.add_parser("topics", help="create tailguard's Kafka topics (idempotent)")
    _add_kafka(s)
    s.set_defaults(func=cmd_topics)

    s = sub.add_parser("migrate", help="apply sql/ migrations to ClickHouse (idempotent)")
    _add_store(s)
    s.set_defaults(func=cmd_migrate)

    s = sub.add_parser("worker", help="run a pipeline worker (Faust)")
    _add_kafka(s)
    _add_store(s)
    s.add_argument("--group", help="consumer group id")
    s.add_argument("--loglevel", default="info")
    s.set_defaults(func=cmd_worker)

    s = sub.add_parser("simulate", help="replay a trace through the serving simulator")
    _add_kafka(s)
    _add_sim(s)
    s.add_argument("--speedup", type=float, default=None, help="event time / wall time; omit = max")
    s.add_argument("--out", type=Path, help="write JSON Lines here instead of Kafka")
    s.set_defaults(func=cmd_simulate)

    s = sub.add_parser("replay", help="run the core over a JSON Lines file of messages")
    s.add_argument("events", type=Path)
    _add_store(s)
    s.add_argument("--no-store", action="store_true", help="do not write to the store")
    _add_spec_and_policy(s)
    s.add_argument("--dlq", type=Path, help="dead letters out (default EVENTS.dlq.jsonl)")
    s.add_argument("--json", action="store_true", help="the whole summary as one-line JSON")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser(
        "validate",
        help="validate an SLO spec, control policy, burn rules or contract file (by its kind)",
    )
    s.add_argument("file", type=Path)
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("report", help="print the SLO report from the store")
    _add_store(s)
    s.add_argument("--json", action="store_true", help="everything, as one JSON object")
    s.add_argument("--html", type=Path, help="also write a self-contained HTML report with charts")
    s.add_argument("--since", type=_report_time, help="from this time (ISO 8601 or unix s)")
    s.add_argument("--until", type=_report_time, help="before this time (ISO 8601 or unix s)")
    s.add_argument(
        "--model",
        help="only this model: its requests, latency, SLOs (recounted over its requests), "
        "budget events of the SLOs that select it, its control scope",
    )
    s.add_argument("--slo", action="append", help="only this SLO (repeatable)")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser(
        "statement", help="a tenant's contract statement for a billing period (or --verify one)"
    )
    _add_store(s)
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
    s.set_defaults(func=cmd_statement)

    from pipeline.app.tool_commands import register as register_tools

    register_tools(sub, _add_store)  # explain, capacity, sql

    s = sub.add_parser(
        "gateway", help="OpenAI-compatible pass-through proxy that emits gateway.* events"
    )
    _add_kafka(s)
    s.add_argument(
        "--upstream", required=True, help="upstream base URL, e.g. http://127.0.0.1:8000"
    )
    s.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on")
    s.add_argument("--name", help="host name in events (default gateway/<hostname>)")
    s.add_argument("--default-model", default="unknown", help="model when the body names none")
    s.add_argument(
        "--tenant-header", default="x-tenant-id", help="request header naming the tenant"
    )
    s.add_argument("--buffer-events", type=int, default=100_000, help="local buffer bound")
    s.add_argument(
        "--default-priority",
        type=int,
        default=2,
        help="priority (0 highest .. 3) of a request that names none (default 2, a middle tier)",
    )
    s.add_argument(
        "--llmd-priority-header",
        default="x-llm-d-priority",
        help="header with llm-d's signed priority (< 0 = sheddable -> 3)",
    )
    s.add_argument(
        "--record-path",
        action="append",
        metavar="PATH",
        help="record requests to PATH (repeatable; '*' = every path); default: "
        "/v1/chat/completions /v1/completions /v1/embeddings /v1/responses",
    )
    s.add_argument(
        "--control",
        dest="control_mode",
        choices=["off", "shadow", "enforce"],
        help="apply the control topic's directives: off (default), shadow (count what would be "
        "refused, serve everything) or enforce (env TAILGUARD_CONTROL_MODE)",
    )
    s.add_argument(
        "--enforce-from-priority",
        dest="control_enforce_from_priority",
        type=int,
        metavar="P",
        help="enforce only priorities >= P, shadow the others (3: the rollout's first step; "
        "env TAILGUARD_CONTROL_ENFORCE_FROM_PRIORITY)",
    )
    s.add_argument(
        "--control-scopes",
        dest="control_mode_scopes",
        metavar="MODEL=MODE,...",
        help="per-model modes over --control (env TAILGUARD_CONTROL_MODE_SCOPES)",
    )
    s.add_argument(
        "--control-keys-file",
        type=Path,
        help="the control keys (default: TAILGUARD_CONTROL_KEYS_FILE, or TAILGUARD_CONTROL_KEYS "
        "+ TAILGUARD_CONTROL_ACTIVE_KID)",
    )
    s.set_defaults(func=cmd_gateway)

    s = sub.add_parser("openslo", help="convert OpenSLO v1 <-> tailguard/v1 specs")
    s.add_argument("direction", choices=["import", "export"])
    s.add_argument(
        "file", type=Path, help="import: OpenSLO YAML (multi-document); export: a tailguard spec"
    )
    s.add_argument("-o", "--out", type=Path, help="write here (default stdout)")
    s.add_argument("--rules", type=Path, help="export: burn rules to add as alert policies")
    s.add_argument("--rules-out", type=Path, help="import: write the alert policies' rules here")
    s.add_argument("--service", default="tailguard", help="export: OpenSLO service name")
    s.set_defaults(func=cmd_openslo)

    s = sub.add_parser("envoy", help="turn Envoy JSON access logs into gateway.* events")
    _add_kafka(s)
    s.add_argument("file", type=Path, help="access log file (JSON lines), or - for stdin")
    s.add_argument("--name", default="envoy", help="host name in events")
    s.add_argument("--default-model", default="unknown", help="model when the log line has none")
    s.add_argument("--out", type=Path, help="write JSON Lines here instead of Kafka")
    s.add_argument(
        "--dlq",
        type=Path,
        help="dead letters as JSON Lines here (default with --out: OUT.dlq.jsonl)",
    )
    s.add_argument(
        "--follow",
        action="store_true",
        help="keep reading as the file grows (tail -F: rotation and truncation handled) "
        "until SIGTERM/SIGINT; the position is kept across restarts",
    )
    s.add_argument(
        "--position", type=Path, help="--follow: position file (default FILE.tailguard-pos)"
    )
    s.add_argument(
        "--default-priority",
        type=int,
        choices=range(4),
        default=2,
        help="priority of a line without X-Vllm-Priority (default 2, a middle tier)",
    )
    s.set_defaults(func=cmd_envoy)

    s = sub.add_parser(
        "backtest",
        help="one trace through the simulator twice (open vs closed loop): would the policy help?",
    )
    _add_sim(s)
    s.set_defaults(overload=DEFAULT_OVERLOAD)
    _add_spec_and_policy(s)
    s.add_argument(
        "--json",
        action="store_true",
        help='one object {"scheduling", "loops", "runs": {loop: run}, "open_loop", "closed_loop"}',
    )
    s.add_argument(
        "--loops",
        nargs="+",
        choices=("open", "static", "aimd", "tailguard"),
        default=["open", "static", "aimd", "tailguard"],
        help="which loops to run side by side (default: all four)",
    )
    s.add_argument(
        "--loop-delay",
        type=int,
        default=None,
        metavar="MS",
        help="directives reach the simulated gateways MS after their evidence (the end of "
        "the window the decision read), event time; default: the live loop's P99 from "
        "./tg bench (pipeline.app.backtest.DEFAULT_LOOP_DELAY_MS); 0: as soon as decided",
    )
    s.add_argument(
        "--window",
        type=_window_s,
        default=None,
        metavar="START_S:END_S",
        help="with --overload none: measure this span as the episode (one the trace "
        "already has, e.g. make_trace --shape burst's 1500:1560)",
    )
    s.set_defaults(func=cmd_backtest)

    s = sub.add_parser("demo", help="local Kafka + simulator + worker + report, end to end")
    _add_sim(s)
    s.add_argument(
        "--speedup",
        type=float,
        default=20.0,
        help="event time / wall time (0 = max); closed loop: the worker must keep up",
    )
    s.add_argument("--partitions", type=int)
    s.add_argument("--bootstrap", help="use this Kafka instead of starting a local one")
    s.add_argument("--workdir", type=Path, default=Path("var/demo"))
    s.add_argument("--tee", type=Path, help="also write the simulated events to this JSONL file")
    s.add_argument("--json", type=Path, help="also write the report as JSON to this file")
    s.add_argument(
        "--open-loop", action="store_true", help="gateways ignore the directives (default: apply)"
    )
    s.set_defaults(func=cmd_demo, overload=DEFAULT_OVERLOAD)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    """Run the command; a missing input (file, store) is one line on stderr and exit 1,
    a closed stdout (``| head``) ends the command quietly (exit 141, as SIGPIPE would).
    ``-v`` shows the traceback instead."""
    import os

    from pipeline.adapters.store import StoreError

    name = f"tailguard {args.command}"
    try:
        result: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away: nothing more to say, and nothing to flush at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (StoreError, OSError) as exc:
        if args.verbose or (isinstance(exc, OSError) and exc.filename is None):
            raise
        if isinstance(exc, OSError):
            print(f"{name}: {exc.strerror}: {exc.filename}", file=sys.stderr)
        else:
            print(f"{name}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
