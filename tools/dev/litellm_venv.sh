#!/usr/bin/env bash
# Build .venv-litellm: the LiteLLM proxy (litellm[proxy], pinned below) with tailguard's
# base install, for producers/litellm_hook.py and tests/integration/test_litellm_proxy.py.
#
#   tools/dev/litellm_venv.sh        (./tg litellm-venv runs it)
#
# Its own virtualenv because litellm[proxy] 1.100.5 cannot share .venv's pins
# (constraints.txt): it needs rich<14 (we pin rich 15.0.0) and, through boto3/botocore,
# python-dateutil<3 (we pin 4.0.0); installed into .venv, pip also moved click past
# faust-streaming's click<8.4. Packages LiteLLM brings keep LiteLLM's versions; tailguard's
# others follow constraints.txt (as ./tg vllm-test does for vLLM). ~700 MB; once per
# version of pyproject.toml, constraints.txt and this script (a stamp).
set -euo pipefail
cd "$(dirname "$0")/../.."
LITELLM_REQ='litellm[proxy]==1.100.5'  # the pin of pyproject.toml's `litellm` extra
PY=${TAILGUARD_PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VV=.venv-litellm
STAMP=$VV/.tailguard-installed
WANT=$(cat pyproject.toml constraints.txt "$0" | sha256sum | cut -c1-16)
[ -x "$VV/bin/python" ] || "$PY" -m venv "$VV"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  echo "tg: installing $LITELLM_REQ into $VV (~700 MB, a minute or two)" >&2
  "$VV/bin/python" -m pip install -q --upgrade pip
  "$VV/bin/python" -m pip install -q "$LITELLM_REQ"
  "$VV/bin/python" - constraints.txt "$VV/constraints-tailguard.txt" <<'PYEOF'
import sys
from importlib.metadata import distributions
norm = lambda n: n.lower().replace("_", "-").replace(".", "-")
have = {norm(d.metadata["Name"]) for d in distributions()}
src, dst = sys.argv[1:3]
keep = [l for l in open(src) if norm(l.split("==")[0].strip()) not in have]
open(dst, "w").writelines(keep)
PYEOF
  PYTHONWARNINGS="ignore:Editable installation" \
    "$VV/bin/python" -m pip install -q -c "$VV/constraints-tailguard.txt" -e .
  "$VV/bin/python" -m pip check
  echo "$WANT" > "$STAMP"
fi
