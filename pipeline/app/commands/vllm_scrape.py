"""``tailguard vllm-scrape``: unmodified vLLM engines' ``/metrics`` -> ``engine.stats``.

For engines without our stat-logger plugin (:mod:`producers.vllm_scrape` does the work;
what is read and how: :mod:`producers.vllm_metrics`). Events go to the lifecycle topic
(``TAILGUARD_BOOTSTRAP_SERVERS`` / ``--bootstrap``), or with ``--out`` to a JSON Lines
file (the ``replay`` format). Runs until SIGTERM / SIGINT, or ``--rounds`` scrapes.
(Registered by :func:`register`; ``pipeline.cli`` calls it.)
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from pipeline.app.commands.common import Command, add_kafka
from pipeline.app.commands.settings import emitter_settings


def cmd_vllm_scrape(args: argparse.Namespace) -> int:
    from producers.emit import JsonlSink, open_kafka_sink
    from producers.vllm_scrape import VllmScraper

    sink: Any
    if args.out is not None:
        sink = JsonlSink(args.out)
    else:
        sink = open_kafka_sink(emitter_settings(args), service="vllm-scrape", on_full="drop")
    scraper = VllmScraper(
        args.url, sink, hosts=args.host or None, model=args.model, timeout_s=args.timeout_s
    )
    stop = threading.Event()
    try:
        if args.rounds is not None:
            for i in range(args.rounds):
                if i:
                    stop.wait(args.interval_s)
                scraper.scrape_once()
            sink.flush()
        else:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            scraper.run(stop, args.interval_s)
    finally:
        scraper.close()
        sink.close()
    failed = sum(ep.failures for ep in scraper.endpoints)
    print(f"vllm-scrape: {scraper.emitted} engine.stats events, {failed} failed scrapes")
    return 0


def _arguments(s: argparse.ArgumentParser) -> None:
    add_kafka(s)
    s.add_argument(
        "--url", action="append", required=True,
        help="an engine's metrics URL, e.g. http://engine-1:8000/metrics (repeatable)",
    )  # fmt: skip
    s.add_argument(
        "--host", action="append",
        help="the host name in the events, one per --url (default: the URL's host:port)",
    )  # fmt: skip
    s.add_argument("--model", help="the model name in the events (default: vLLM's model_name)")
    s.add_argument("--interval-s", type=float, default=1.0, help="seconds between scrapes")
    s.add_argument("--timeout-s", type=float, default=2.0, help="per scrape")
    s.add_argument("--rounds", type=int, help="scrape this many times, then exit")
    s.add_argument("-o", "--out", type=Path, help="write JSON Lines here instead of Kafka")


VLLM_SCRAPE = Command(
    "vllm-scrape",
    "scrape unmodified vLLM engines' /metrics into engine.stats events (no plugin)",
    _arguments,
    cmd_vllm_scrape,
)
