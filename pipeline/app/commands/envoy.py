"""``envoy``: Envoy JSON access logs into ``gateway.*`` events (a file, stdin, or
``--follow`` a growing log)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

import orjson

from pipeline.app.commands.common import Command, add_kafka, meter_provider, need_file
from pipeline.app.commands.settings import emitter_settings
from pipeline.kafka_settings import KafkaSettings


def cmd_envoy(args: argparse.Namespace) -> int:
    import signal
    import threading

    from producers.emit import JsonlSink, open_kafka_sink
    from producers.envoy import Follower, follow, ingest, load_position, save_position

    need_file(args.file)
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
            meter_provider=meter_provider(settings, "tailguard-envoy-ingest"),
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


def _arguments(s: argparse.ArgumentParser) -> None:
    add_kafka(s)
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


ENVOY = Command("envoy", "turn Envoy JSON access logs into gateway.* events", _arguments, cmd_envoy)
