"""``gateway``: the OpenAI-compatible pass-through proxy that emits ``gateway.*`` events
(and, with ``--control``, applies the control topic's directives)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from pipeline.app.commands.common import Command, add_kafka, meter_provider
from pipeline.app.commands.settings import emitter_settings


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
        meter_provider=meter_provider(settings, "tailguard-gateway"),
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
        modes = Modes.of_settings(settings)
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


def _arguments(s: argparse.ArgumentParser) -> None:
    add_kafka(s)
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


GATEWAY = Command(
    "gateway",
    "OpenAI-compatible pass-through proxy that emits gateway.* events",
    _arguments,
    cmd_gateway,
)
