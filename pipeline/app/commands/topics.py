"""``topics``: create tailguard's Kafka topics."""

from __future__ import annotations

import argparse

from pipeline.app.commands.common import Command, add_kafka
from pipeline.app.commands.settings import worker_settings


def cmd_topics(args: argparse.Namespace) -> int:
    from pipeline.adapters.kafka_admin import ensure_topics

    for topic, n in ensure_topics(worker_settings(args)).items():
        print(f"{topic}\t{n} partitions")
    return 0


TOPICS = Command("topics", "create tailguard's Kafka topics (idempotent)", add_kafka, cmd_topics)
