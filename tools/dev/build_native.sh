#!/usr/bin/env bash
# Build and install the native hot path (native/: tailguard_native, Rust + PyO3, issue 39)
# into a virtualenv; ./tg runs it after the Python packages. pip builds the wheel with
# maturin (from PyPI) and cargo fetches pyo3 (from crates.io); the Cargo build directory
# is native/target. The one build of it for a checkout: the editable install of tailguard
# leaves it out (setup.py); a tailguard wheel (`pip wheel .`) holds it, built there by
# setuptools-rust from the same native/Cargo.toml (docs/performance.md).
#
#   tools/dev/build_native.sh VENV
#
# Never fails: without a Rust toolchain (cargo), or when the build fails, it prints one
# line and leaves the pure-Python core to run (`tailguard` commands log which one runs).
# Once per version of native/ (a stamp in VENV); TG_NATIVE=0 skips it, and removing
# VENV/.tailguard-native tries again (after installing Rust, say).
set -uo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:?usage: build_native.sh VENV}
STAMP=$VENV/.tailguard-native
WANT=$(cat native/Cargo.toml native/Cargo.lock native/pyproject.toml native/src/*.rs | sha256sum | cut -c1-16)
[ "${TG_NATIVE:-1}" = 0 ] && exit 0
[ "$(cat "$STAMP" 2>/dev/null || true)" = "$WANT" ] && exit 0
export PATH="$PATH:${CARGO_HOME:-$HOME/.cargo}/bin"
if ! command -v cargo >/dev/null 2>&1; then
  echo "tg: no Rust toolchain (cargo): the pure-Python core runs (rm $STAMP to try again)" >&2
  "$VENV/bin/python" -m pip uninstall -q -y tailguard-native >/dev/null 2>&1
  echo "$WANT" > "$STAMP"
  exit 0
fi
echo "tg: building the native hot path (native/, Rust; once per version, ~1-2 min)" >&2
if log=$("$VENV/bin/python" -m pip install -q ./native 2>&1); then
  echo "$WANT" > "$STAMP"
else
  # a stale build of older sources must not run beside the new Python side
  "$VENV/bin/python" -m pip uninstall -q -y tailguard-native >/dev/null 2>&1
  why=$(printf '%s\n' "$log" | grep -iE 'error' | grep -v 'subprocess-exited-with-error' | head -1 | sed 's/^ *//')
  echo "tg: native hot path not built, the pure-Python core runs: ${why:-$(printf '%s\n' "$log" | tail -1)}" >&2
  echo "$WANT" > "$STAMP"
fi
exit 0
