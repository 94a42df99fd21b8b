"""The wheel works on its own: built from a copy of the tree, installed in a fresh
virtualenv (not editable: nothing of the checkout on its path), it validates its shipped
spec, simulates from its shipped trace and replays into a store from its shipped SQL.

Offline and quick (~15 s): the wheel is built without build isolation (setuptools and
wheel are dev dependencies), installed with ``--no-deps --no-index``, and the runtime
dependencies are those already installed here, put on the fresh environment's path by a
``.pth`` line (which adds the directory only: the editable install's finder there is not
loaded); the test checks the installed wheel's own requirements (base and ``worker``
extra) are met by them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import orjson
import pytest

from tests.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv*", ".cache", "var", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
)  # fmt: skip

_CHECK_REQUIREMENTS = """
import sys
from importlib.metadata import PackageNotFoundError, distribution, version
from packaging.requirements import Requirement

dist = distribution("tailguard")
print(dist.locate_file(""))
missing = []
for text in dist.requires or []:
    req = Requirement(text)
    if req.marker is not None and not any(
        req.marker.evaluate({"extra": e}) for e in ("", "worker")
    ):
        continue  # another extra (dev, vllm, all)
    try:
        ok = req.specifier.contains(version(req.name), prereleases=True)
    except PackageNotFoundError:
        ok = False
    if not ok:
        missing.append(text)
print(missing)
"""


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=_NOT_COPIED)  # no build/ left in the tree
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(work / "dist"), str(src)],
        cwd=work, env=dict(os.environ),
    )  # fmt: skip
    (built,) = (work / "dist").glob("tailguard-*.whl")
    assert built.name == "tailguard-0.1.0-py3-none-any.whl"  # pure Python
    return built


def test_the_wheel_holds_the_package_and_its_shipped_files_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"pipeline", "producers", "tailguard-0.1.0.dist-info"}
    assert not [n for n in names if "devtools" in n or n.startswith(("tools/", "tests/"))]
    shipped = {n.removeprefix("pipeline/shipped/") for n in names if "/shipped/" in n}
    sql = {f"sql/{p.name}" for p in (REPO / "sql").glob("*.sql")}
    specs = {f"specs/{p.name}" for p in (REPO / "specs").iterdir()}
    assert sql <= shipped
    assert specs <= shipped
    assert "data/azure-llm-2023/conv.csv" in shipped
    assert "producers/envoy-access-log.yaml" in names
    entry_points = zipfile.ZipFile(wheel).read("tailguard-0.1.0.dist-info/entry_points.txt")
    assert "tailguard = pipeline.cli:main" in entry_points.decode()


def test_a_fresh_install_validates_simulates_and_replays_from_its_shipped_files(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path,
         env=dict(os.environ))  # fmt: skip
    python = venv / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        cwd=tmp_path, env=dict(os.environ),
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env = {k: v for k, v in env.items() if not k.startswith("TAILGUARD_")}
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=tmp_path, env=env).stdout.strip()  # fmt: skip
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "zz-tailguard-test-deps.pth").write_text("\n".join(sorted(deps)) + "\n")

    located, missing = _run([str(python), "-c", _CHECK_REQUIREMENTS], cwd=tmp_path,
                            env=env).stdout.splitlines()  # fmt: skip
    assert Path(located).is_relative_to(venv)
    assert missing == "[]"
    probe = _run(
        [str(python), "-c", "import pipeline, producers\n"
         "from pipeline.shipped import DEFAULT_SLO_SPEC, DEFAULT_POLICY, DEFAULT_BURN_RULES\n"
         "print(pipeline.__file__, producers.__file__)\n"
         "print(DEFAULT_SLO_SPEC, DEFAULT_POLICY, DEFAULT_BURN_RULES)\n"
         "import importlib.util; print(importlib.util.find_spec('tools'))"],
        cwd=tmp_path, env=env,
    ).stdout.splitlines()  # fmt: skip
    paths = [Path(p) for line in probe[:2] for p in line.split()]
    assert all(p.is_relative_to(venv) for p in paths), probe
    assert probe[2] == "None"  # no dev tools installed

    tailguard = str(venv / "bin" / "tailguard")
    for spec in paths[2:]:  # the shipped SLO spec, policy and burn rules
        assert _run([tailguard, "validate", str(spec)], cwd=tmp_path, env=env).stdout.startswith(
            "ok:"
        )
    _run([tailguard, "simulate", "--out", "ev.jsonl", "--limit", "200"], cwd=tmp_path, env=env)
    replay = _run([tailguard, "replay", "ev.jsonl", "--store", "store", "--json"], cwd=tmp_path,
                  env=env)  # fmt: skip
    summary = orjson.loads(replay.stdout)
    assert summary["requests"] == 200
    assert summary["dead_letters"] == 0
    assert summary["slos"]  # the shipped default spec was evaluated
    for migration in sorted((REPO / "sql").glob("*.sql")):
        assert f"applied migration {migration.stem}" in replay.stderr
    # The demo's local broker ships (pipeline.adapters.local_kafka): installed, its jars
    # go to the user's cache, not beside the package ...
    home = env | {"HOME": str(tmp_path), "XDG_CACHE_HOME": ""}
    cache = _run([str(python), "-c", "from pipeline.adapters.local_kafka import "
                  "default_cache_dir; print(default_cache_dir())"], cwd=tmp_path,
                 env=home).stdout.strip()  # fmt: skip
    assert Path(cache) == tmp_path / ".cache" / "tailguard" / "kafka"
    # ... and without Java (nor jars) the demo says so in one message, before fetching
    no_java = env | {"TAILGUARD_KAFKA_CACHE": str(tmp_path / "kafka-cache"),
                     "JAVA_HOME": str(tmp_path / "no-java")}  # fmt: skip
    demo = subprocess.run([tailguard, "demo", "--limit", "1"], cwd=tmp_path, env=no_java,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert demo.returncode == 1
    assert "tailguard demo:" in demo.stderr
    assert "--bootstrap HOST:PORT" in demo.stderr
    assert "Traceback" not in demo.stderr
