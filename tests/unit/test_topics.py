"""The topic table (pipeline/contract/topics.py) against the settings, the contract and
ARCHITECTURE.md: every topic has its format module in pipeline/contract/, and the page a
new maintainer reads names each topic with that module."""

from __future__ import annotations

import importlib

import pytest

from pipeline.contract.topics import TOPICS, Topic
from pipeline.kafka_settings import KafkaSettings
from tests.paths import REPO

ARCHITECTURE = (REPO / "ARCHITECTURE.md").read_text()


def test_every_topic_setting_is_in_the_table() -> None:
    settings = {n for n in KafkaSettings.model_fields if n.endswith("_topic")}
    assert settings == {t.setting for t in TOPICS}
    for t in TOPICS:
        assert KafkaSettings.model_fields[t.setting].default == t.name


@pytest.mark.parametrize("topic", TOPICS, ids=lambda t: t.name)
def test_each_format_lives_in_the_contract(topic: Topic) -> None:
    assert topic.format.startswith("pipeline.contract.")
    importlib.import_module(topic.format)


@pytest.mark.parametrize("topic", TOPICS, ids=lambda t: t.name)
def test_architecture_names_each_topic_with_its_format(topic: Topic) -> None:
    assert f"`{topic.name}`" in ARCHITECTURE
    assert "contract/" + topic.format.rsplit(".", 1)[1] + ".py" in ARCHITECTURE
