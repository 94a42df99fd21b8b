"""The control-key adapter: which source wins, and the contract's Keyring takes values only."""

from __future__ import annotations

import base64
import inspect
import json
from pathlib import Path

import pytest

from pipeline.contract import control_signal
from pipeline.contract.control_signal import KeyConfigError, Keyring
from producers.control_keys import load_keyring

SECRET = base64.b64encode(b"s" * 32).decode()
ENV = {"TAILGUARD_CONTROL_KEYS": f"e:{SECRET}", "TAILGUARD_CONTROL_ACTIVE_KID": "e"}


@pytest.mark.parametrize(
    ("use_file", "environ", "active"),
    [
        (True, {}, "f"),
        # the settings' file wins over the environment
        (True, ENV, "f"),
        (False, ENV, "e"),
    ],
)
def test_load_keyring_sources(
    tmp_path: Path, use_file: bool, environ: dict[str, str], active: str
) -> None:
    f = tmp_path / "keys.json"
    f.write_text(json.dumps({"active": "f", "keys": {"f": SECRET}}))
    assert load_keyring(f if use_file else None, environ).active_kid == active


def test_load_keyring_without_keys_fails_clearly() -> None:
    with pytest.raises(KeyConfigError, match="no control keys"):
        load_keyring(None, {})


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"active": "k", "keys": {"k": SECRET}}, None),
        ([1], "expected a mapping"),
        ({"active": "k", "keys": {"k": SECRET}, "x": 1}, "unknown fields"),
        ({"keys": {"k": SECRET}}, "'active'"),
        ({"active": "k", "keys": {"k": 1}}, "'keys'"),
    ],
)
def test_keyring_from_document(doc: object, match: str | None) -> None:
    if match is None:
        assert Keyring.from_document(doc, "here").kids == ("k",)
        return
    with pytest.raises(KeyConfigError, match=f"^here: .*{match}"):
        Keyring.from_document(doc, "here")


def test_contract_reads_no_files_or_environment() -> None:
    src = inspect.getsource(control_signal)
    for needle in ("import os", "os.environ", ".read_bytes(", "open(", "pathlib"):
        assert needle not in src, needle
