"""The tailguard wheel's one build step that pyproject.toml cannot declare: the native hot
path (native/: the Rust extension ``tailguard_native``, PyO3, issue 39), compiled by
setuptools-rust (a build requirement) into the wheel when a Rust toolchain is there.

Everything else (metadata, packages, shipped files) is in pyproject.toml. A setup.py (not
``[tool.setuptools-rust]`` in pyproject.toml) because whether the extension is declared at
all depends on the environment:

* ``TG_NATIVE=0`` (as for ``tools/dev/build_native.sh``): not declared; a pure-Python
  wheel (``py3-none-any``), no Rust compiled (the wheel test sets it);
* no ``cargo`` on PATH (or ``$CARGO``): not declared either, one line says so, same wheel;
* an editable install (``pip install -e``, as ./tg does): not declared. setuptools-rust
  would compile it into the checkout's root, where the editable finder (which maps
  ``pipeline`` and ``producers`` only) does not look; ./tg builds it instead with
  ``tools/dev/build_native.sh``, once per version of native/;
* otherwise declared ``optional``: a failed Rust build (no network for crates.io, say)
  prints setuptools-rust's line and leaves the extension out of the wheel (which keeps
  the platform tag). A wheel with the extension is tagged ``cp311-abi3-<platform>``
  (PyO3's ``abi3-py311`` in native/Cargo.toml).

pip shows a build's output with ``-v`` only (``pip wheel -v``, ``python -m build`` always).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from setuptools import setup

EXTENSION = "tailguard_native"
MANIFEST = "native/Cargo.toml"
LIMITED_API = "cp311"  # the stable ABI of native/Cargo.toml's pyo3 feature abi3-py311


def native_build(environ: Mapping[str, str], commands: Sequence[str]) -> dict[str, Any]:
    """setup()'s keywords for the extension, given the environment and the setup commands
    the build backend runs (``sys.argv[1:]``): none when it is not built (module doc)."""
    if environ.get("TG_NATIVE", "1") == "0":
        return {}
    if "editable_wheel" in commands:
        print(
            f"tailguard: editable install without {EXTENSION}"
            " (tools/dev/build_native.sh builds it: ./tg does)",
            file=sys.stderr,
        )
        return {}
    cargo = environ.get("CARGO", "cargo")
    if shutil.which(cargo, path=environ.get("PATH")) is None:
        print(
            f"tailguard: no Rust toolchain ({cargo} not on PATH): the wheel is pure Python,"
            f" without {EXTENSION} (the pure-Python core runs)",
            file=sys.stderr,
        )
        return {}
    from setuptools_rust import Binding, RustExtension

    extension = RustExtension(EXTENSION, MANIFEST, binding=Binding.PyO3, optional=True)
    return {
        "rust_extensions": [extension],
        "options": {"bdist_wheel": {"py_limited_api": LIMITED_API}},
    }


def forget_earlier_builds(build_base: Path = Path("build")) -> None:
    """Remove an extension an earlier build left in build/: setuptools ships what is there,
    so a failed (optional) build would otherwise ship the last one that worked."""
    for stale in build_base.glob(f"lib*/{EXTENSION}*"):
        stale.unlink()


if __name__ == "__main__":
    forget_earlier_builds()
    setup(**native_build(os.environ, sys.argv[1:]))
