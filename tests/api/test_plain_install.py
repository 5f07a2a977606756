"""Every runtime command works on a plain install, without the dev extras.

A clean virtual environment built here would be the most literal proof, but it downloads
and installs every runtime wheel (pyvips-binary, pgserver, boto3: minutes, and a network)
on every run. Instead each command runs in a subprocess of this environment that cannot
import any distribution only the dev extras bring: the set is computed from
pyproject.toml (the dev extras' dependency closure minus the runtime dependencies'
closure), so a runtime module that starts needing, say, httpx or Pillow while they are
dev-only fails here exactly as `pip install darkroom` would fail for a user.
"""

from __future__ import annotations

import importlib.metadata as md
import io
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from PIL import Image

from tests.api.conftest import Api

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# Installed before any darkroom code runs: an import of a dev-only distribution's module
# fails as it would where that distribution is not installed.
_BLOCKER = """
import importlib.abc, json, runpy, sys
BLOCKED = frozenset(json.loads(sys.argv.pop(1)))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (dev-only)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
for name in [m for m in sys.modules if m.partition(".")[0] in BLOCKED]:
    del sys.modules[name]
target = sys.argv.pop(1)
if target == "--modules":
    import pkgutil, darkroom
    for info in pkgutil.walk_packages(darkroom.__path__, "darkroom."):
        __import__(info.name)
    print("imported")
else:
    sys.argv[0] = "darkroom"
    runpy.run_module(target, run_name="__main__", alter_sys=True)
"""


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions `requirements` pull in, extras and markers honoured."""
    seen: set[str] = set()
    todo = [(Requirement(r), ) for r in requirements]
    while todo:
        (req,) = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # not installed here (a marker for another platform, say)
        for raw in dist.requires or []:
            sub = Requirement(raw)
            extras = ["", *sorted(req.extras)]
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                sub.marker = None
                todo.append((sub,))
    return {k.partition("[")[0] for k in seen}


def dev_only_modules() -> set[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    runtime = _closure(project["dependencies"])
    dev = _closure(project["optional-dependencies"]["dev"])
    dev_only = dev - runtime
    by_module = md.packages_distributions()
    return {module for module, dists in by_module.items()
            if dists and all(canonicalize_name(d) in dev_only for d in dists)
            and not module.startswith("_")}


@pytest.fixture(scope="module")
def blocked() -> list[str]:
    modules = sorted(dev_only_modules())
    # The set is the dev tools, not the runtime: a sanity check of the computation.
    assert {"pytest", "hypothesis", "playwright", "mypy"} <= set(modules)
    # Pillow is runtime since HEIC support (pillow-heif, which the decoder child imports).
    assert not {"fastapi", "boto3", "psycopg", "pyvips", "PIL", "pillow_heif"} & set(modules)
    return modules


def run_plain(blocked: list[str], *args: str, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER, json.dumps(blocked), *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
        cwd=PYPROJECT.parent,
    )


def test_the_blocker_blocks(blocked: list[str]) -> None:
    r = run_plain(blocked, "pytest", "--version")
    assert r.returncode != 0 and "dev-only" in r.stderr


def test_every_darkroom_module_imports_without_the_dev_extras(blocked: list[str]) -> None:
    r = run_plain(blocked, "--modules")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "imported"


@pytest.mark.parametrize("command", [
    ["up"], ["migrate"], ["api"], ["worker"], ["sweep"], ["stats"], ["keys", "create"],
    ["import"], ["derive"],
])
def test_each_command_answers_help(blocked: list[str], command: list[str]) -> None:
    r = run_plain(blocked, "darkroom.cli", *command, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage: darkroom" in r.stdout


def test_derive_and_import_run_without_the_dev_extras(
    blocked: list[str], local_api: Api, tmp_path: Path
) -> None:
    photo = tmp_path / "photos" / "one.png"
    photo.parent.mkdir()
    out = io.BytesIO()
    Image.new("RGB", (30, 20), (10, 200, 90)).save(out, format="PNG")
    photo.write_bytes(out.getvalue())

    r = run_plain(blocked, "darkroom.cli", "derive", str(photo), "-o", str(tmp_path / "o.webp"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["width"] == 30

    key = local_api.make_key("plain")
    r = run_plain(blocked, "darkroom.cli", "import", str(photo.parent), "--api", local_api.url,
                  env={"DARKROOM_API_KEY": key})
    assert r.returncode == 0, r.stderr
    assert "1 uploaded" in r.stderr
    with local_api.client(key) as c:
        assert [i["filename"] for i in c.get("/v1/files").json()["items"]] == ["one.png"]
