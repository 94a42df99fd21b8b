"""Control-signal keys from files and the environment (the I/O the contract leaves out):
the one reader, for the controller and every gateway (the reference proxy, the LiteLLM
hook) alike.

:class:`~pipeline.contract.control_signal.Keyring` validates keys it is given as
values; this adapter reads them: a key file (JSON or YAML ``{active: k2, keys: {k1:
<base64>, k2: <base64>}}``), or ``TAILGUARD_CONTROL_KEYS`` (``k1:<b64>,k2:<b64>``) with
``TAILGUARD_CONTROL_ACTIVE_KID``. Errors name the file or the variable, never a secret.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import orjson

from pipeline.contract.control_signal import MIN_SECRET_BYTES, KeyConfigError, Keyring

ENV_KEYS: Final = "TAILGUARD_CONTROL_KEYS"
ENV_ACTIVE_KID: Final = "TAILGUARD_CONTROL_ACTIVE_KID"
ENV_KEYS_FILE: Final = "TAILGUARD_CONTROL_KEYS_FILE"


def load_keyring(keys_file: Path | None, environ: Mapping[str, str] | None = None) -> Keyring:
    """The controller's keyring: ``keys_file`` (``Settings.control_keys_file``) when set,
    else the environment (:func:`keyring_from_environ`). The one call the settings need."""
    if keys_file is not None:
        return keyring_from_file(keys_file)
    return keyring_from_environ(environ)


def keyring_from_file(path: str | os.PathLike[str]) -> Keyring:
    """A key file: ``.json`` read as JSON, ``.yaml``/``.yml`` as YAML, anything else as
    JSON and then YAML."""
    p = Path(path)
    where = f"control key file {p}"
    try:
        text = p.read_bytes()
    except OSError as e:
        raise KeyConfigError(f"{where}: {e.strerror or e}") from None
    return Keyring.from_document(_parse_key_doc(p.suffix.lower(), text, where), where)


def _parse_key_doc(suffix: str, text: bytes, where: str) -> object:
    if suffix not in {".yaml", ".yml"}:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            if suffix == ".json":
                raise KeyConfigError(f"{where}: not valid JSON") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise KeyConfigError(f"{where}: not valid YAML") from None


def keyring_from_environ(environ: Mapping[str, str] | None = None) -> Keyring:
    """The keyring from ``TAILGUARD_CONTROL_KEYS_FILE``, or from
    ``TAILGUARD_CONTROL_KEYS`` (``k1:<b64>,k2:<b64>``) + ``TAILGUARD_CONTROL_ACTIVE_KID``.
    """
    env = os.environ if environ is None else environ
    path, spec = env.get(ENV_KEYS_FILE), env.get(ENV_KEYS)
    if path and spec:
        raise KeyConfigError(f"set either {ENV_KEYS_FILE} or {ENV_KEYS}, not both")
    if path:
        return keyring_from_file(path)
    if spec:
        active = env.get(ENV_ACTIVE_KID)
        if not active:
            raise KeyConfigError(f"{ENV_KEYS} is set but {ENV_ACTIVE_KID} is not")
        return Keyring.from_env_string(spec, active)
    raise KeyConfigError(f"no control keys: set {ENV_KEYS_FILE} or {ENV_KEYS}")


def generate_secret_b64(n_bytes: int = 32) -> str:
    """A fresh random secret, base64 (for key files and ``TAILGUARD_CONTROL_KEYS``)."""
    return base64.b64encode(os.urandom(max(n_bytes, MIN_SECRET_BYTES))).decode("ascii")
