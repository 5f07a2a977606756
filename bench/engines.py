"""darkroom end to end beside the bare engines, on the same photos and the same work.

    .venv/bin/python -m bench.engines [--rounds 3] [--copies 4] [--parallel 2]

The work per photo is the same everywhere: decode once (shrink-on-load where the format
has it), EXIF rotation, sRGB, a preview of at most 2048 px on the long edge in WebP q80
effort 4, and a thumb of at most 400 px from the same decode. Three runners, in
interleaved rounds so that a noisy neighbour hurts each alike:

- **pyvips**: bare libvips through pyvips, `--parallel` processes, no queue, no store;
- **sharp**: sharp (libvips under Node.js; the engine Immich uses), `--parallel` node
  processes, installed by `make bench-install` into bench/engines/ (skipped with its
  reason where node or sharp is missing);
- **darkroom**: the whole service: an API process and a worker with `--parallel` slots on
  a private PostgreSQL and the local store; each photo is created, uploaded and confirmed
  over HTTP, claimed under a lease, decoded in the jail, stored and published. Timed from
  the first create to the last `ready`.

Besides images/s (best round of each) it reports machine CPU per image, the derivatives'
bytes and their SSIM against each other (same settings must give the same pictures), and
darkroom's time per image by stage, from the worker's and the API's own histograms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from string import Template
from typing import Any

import httpx
import psycopg

from bench.api import _tree_ticks
from bench.cpu import TICK
from bench.runs import OUT
from darkroom.db import embedded
from darkroom.db.migrations import migrate
from darkroom.keys import create_key_at
from tests.support.services import CORPUS, free_port

ROOT = Path(__file__).resolve().parents[1]
SHARP_DIR = ROOT / "bench" / "engines"
RESULT = OUT / "engines.json"
EDGE, THUMB, QUALITY, EFFORT = 2048, 400, 80, 4

# One process's share of the photos through bare pyvips: the same steps as the pipeline,
# without the jail, the limits or the thumbhash.
PYVIPS_CHILD = Template(r"""
import json, sys, time, pyvips
pyvips.cache_set_max(0)
datas = [open(p, "rb").read() for p in sys.argv[1:]]
sys.stdin.readline()  # go: loaded and ready, as a running service would be
cpu = time.process_time()
total = 0
for data in datas:
    # Shrink-on-load, EXIF rotation; the ICC profile to sRGB only where there is one.
    image = pyvips.Image.thumbnail_buffer(data, ${edge}, height=${edge}, size="down")
    if image.get_typeof("icc-profile-data"):
        image = image.icc_transform("srgb", embedded=True, intent="perceptual")
    if image.interpretation != "srgb":
        image = image.colourspace("srgb")
    image = image.copy_memory()
    preview = image.webpsave_buffer(Q=${q}, effort=${effort}, keep="none")
    small = image.thumbnail_image(${thumb}, height=${thumb}, size="down").copy_memory()
    thumb = small.webpsave_buffer(Q=${q}, effort=${effort}, keep="none")
    total += len(preview) + len(thumb)
print(json.dumps({"cpu": time.process_time() - cpu, "bytes": total}), flush=True)
""").substitute(edge=EDGE, thumb=THUMB, q=QUALITY, effort=EFFORT)

SHARP_CHILD = Template(r"""
const sharp = require("sharp");
const fs = require("fs");
sharp.concurrency(1);
sharp.cache(false);
const paths = process.argv.slice(2);
const inputs = paths.map((p) => fs.readFileSync(p));
process.stdin.once("data", async () => {
  const cpu = process.cpuUsage();
  let total = 0;
  for (let i = 0; i < inputs.length; i++) {
    const input = inputs[i], path = paths[i];
    const { data, info } = await sharp(input).rotate()
      .resize(${edge}, ${edge}, { fit: "inside", withoutEnlargement: true })
      .toColourspace("srgb").raw().toBuffer({ resolveWithObject: true });
    const raw = { raw: { width: info.width, height: info.height, channels: info.channels } };
    const preview = await sharp(data, raw).webp({ quality: ${q}, effort: ${effort} }).toBuffer();
    const thumb = await sharp(data, raw)
      .resize(${thumb}, ${thumb}, { fit: "inside", withoutEnlargement: true })
      .webp({ quality: ${q}, effort: ${effort} }).toBuffer();
    total += preview.length + thumb.length;
    if (process.env.ENGINES_KEEP) {
      const name = require("path").basename(path);
      fs.writeFileSync(process.env.ENGINES_KEEP + "/" + name + ".webp", preview);
    }
  }
  const used = process.cpuUsage(cpu);
  console.log(JSON.stringify({ cpu: (used.user + used.system) / 1e6, bytes: total }));
  process.exit(0);
});
""").substitute(edge=EDGE, thumb=THUMB, q=QUALITY, effort=EFFORT)


@dataclass(frozen=True)
class Round:
    runner: str
    images: int
    seconds: float
    cpu_seconds: float

    @property
    def per_second(self) -> float:
        return self.images / self.seconds


def photos() -> list[Path]:
    return sorted(p for p in CORPUS.iterdir() if p.suffix in {".jpg", ".png"})


def split(paths: list[Path], parts: int) -> list[list[Path]]:
    return [paths[i::parts] for i in range(parts)]


def run_children(commands: list[list[str]], env: dict[str, str] | None = None
                 ) -> tuple[float, float]:
    """Start the processes, let them load, then time them from one go to the last answer:
    (seconds, CPU seconds of the work itself)."""
    procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
             for c in commands]
    time.sleep(2.0)  # loaded: pyvips or sharp imported, the photos read
    start = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    answers = [json.loads(proc.communicate()[0]) for proc in procs]
    seconds = time.perf_counter() - start
    for proc in procs:
        if proc.returncode != 0:
            raise RuntimeError(f"{commands[0][0]} failed ({proc.returncode})")
    return seconds, sum(float(a["cpu"]) for a in answers)


def timed(runner: str, n: int, body: Any, cpu: Any) -> Round:
    """One round of the service; CPU is its own processes' (the machine is shared)."""
    before = cpu()
    start = time.perf_counter()
    body()
    seconds = time.perf_counter() - start
    return Round(runner, n, seconds, cpu() - before)


def engine(runner: str, n: int, commands: list[list[str]], env: dict[str, str] | None = None
           ) -> Round:
    seconds, cpu = run_children(commands, env)
    return Round(runner, n, seconds, cpu)


def sharp_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (SHARP_DIR / "node_modules" / "sharp").is_dir():
        return "sharp is not installed (make bench-install)"
    return None


class Darkroom:
    """An API process and a worker on a private PostgreSQL and the local store."""

    def __init__(self, tmp: Path, slots: int) -> None:
        self.pgdata = tmp / "pg"
        self.db_url = embedded.url(self.pgdata, stop_on_exit=True)
        migrate(self.db_url)
        self.key = asyncio.run(create_key_at(self.db_url, "bench", admin=True))
        self.api_port, self.metrics_port = free_port(), free_port()
        env = {**os.environ, "DARKROOM_DATABASE_URL": self.db_url,
               "DARKROOM_STORAGE_URL": (tmp / "objects").as_uri(),
               "DARKROOM_DATA_DIR": str(tmp), "DARKROOM_CREATE_RATE_PER_MINUTE": "0"}
        (tmp / "objects").mkdir()
        self.logs = (tmp / "api.log").open("wb"), (tmp / "worker.log").open("wb")
        cli = [sys.executable, "-m", "darkroom.cli"]
        self.api = subprocess.Popen([*cli, "api", "--port", str(self.api_port)], env=env,
                                    stdout=self.logs[0], stderr=subprocess.STDOUT)
        self.worker = subprocess.Popen(
            [*cli, "worker", "--concurrency", str(slots), "--name", "bench",
             "--metrics-port", str(self.metrics_port)],
            env=env, stdout=self.logs[1], stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.api_port}"
        self.client = httpx.Client(base_url=self.base, timeout=30,
                                   headers={"Authorization": f"Bearer {self.key}"})
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.client.get("/readyz").status_code == 200 and b"worker started" in \
                        Path(self.logs[1].name).read_bytes():
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("darkroom did not start")
            time.sleep(0.1)
        time.sleep(1.0)  # the decoder children finish importing libvips

    def cpu(self) -> float:
        """CPU seconds of the API, the worker with its decoders, and PostgreSQL."""
        postmaster = int(Path(self.pgdata / "postmaster.pid").read_text().split()[0])
        pids = (self.api.pid, self.worker.pid, postmaster)
        return sum(_tree_ticks(pid) for pid in pids) / TICK

    def upload(self, path: Path) -> str:
        data = path.read_bytes()
        kind = "image/png" if path.suffix == ".png" else "image/jpeg"
        card = self.client.post("/v1/files", json={"filename": path.name,
                                                   "content_type": kind, "size": len(data)})
        card.raise_for_status()
        body = card.json()
        up = body["upload"]
        put = httpx.request(up["method"], httpx.URL(self.base).join(up["url"]),
                            headers={**up.get("headers", {}),
                                     "Authorization": f"Bearer {self.key}"}, content=data)
        put.raise_for_status()
        self.client.post(f"/v1/files/{body['id']}/confirm",
                         json={"version": put.json()["version"]}).raise_for_status()
        return str(body["id"])

    def run(self, paths: list[Path]) -> None:
        ids = {self.upload(p) for p in paths}
        deadline = time.monotonic() + 600
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'ready'),"
                    " count(*) FILTER (WHERE status = 'rejected')"
                    " FROM archive_files WHERE id = ANY(%s)", [list(ids)]).fetchone()
                assert row is not None
                if row[1]:
                    raise RuntimeError(f"{row[1]} card(s) rejected")
                if row[0] == len(ids):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError("cards not ready")
                time.sleep(0.02)

    def stages(self) -> dict[str, tuple[float, int]]:
        """Seconds and count of each worker stage, and of the API's requests by route."""
        found: dict[str, tuple[float, int]] = {}
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text
        text += self.client.get("/metrics").text
        pattern = re.compile(r'^(darkroom_stage_duration_seconds|[a-z_]*request_duration_seconds)'
                             r'_(sum|count)\{((?:[^}"]|"[^"]*")*)\} ([0-9.e+-]+)$', re.M)
        for name, kind, labels, value in pattern.findall(text):
            label = ",".join(v for k, v in re.findall(r'(\w+)="([^"]*)"', labels)
                             if k in ("stage", "route", "method", "handler"))
            key = f"{'worker' if name.startswith('darkroom_stage') else 'api'} {label}"
            seconds, count = found.get(key, (0.0, 0))
            found[key] = (seconds + float(value), count) if kind == "sum" else (
                seconds, count + int(float(value)))
        return found

    def stop(self) -> None:
        self.client.close()
        for proc in (self.api, self.worker):
            proc.terminate()
        for proc in (self.api, self.worker):
            proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=4, help="each corpus photo this often")
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    base = photos()
    paths = base * args.copies
    n = len(paths)
    missing = sharp_missing()
    tmp = Path(tempfile.mkdtemp(prefix="darkroom-engines-"))
    rounds: list[Round] = []
    system = Darkroom(tmp, args.parallel)
    try:
        for r in range(args.rounds):
            rounds.append(engine("pyvips", n, [[sys.executable, "-c", PYVIPS_CHILD, *map(str, part)]
                                               for part in split(paths, args.parallel)]))
            if missing is None:
                rounds.append(engine("sharp", n, [["node", "-e", SHARP_CHILD, *map(str, part)]
                                                  for part in split(paths, args.parallel)],
                                     {**os.environ, "NODE_PATH": str(SHARP_DIR / "node_modules")}))
            rounds.append(timed("darkroom", n, lambda: system.run(paths), system.cpu))
            last = rounds[-(3 if missing is None else 2):]
            print(f"round {r + 1}: " + ", ".join(f"{x.runner} {x.per_second:.2f}/s" for x in last),
                  flush=True)
        stages = system.stages()
    finally:
        system.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    best = {name: max((x for x in rounds if x.runner == name), key=lambda x: x.per_second)
            for name in {x.runner for x in rounds}}
    done = args.rounds * n
    print(f"\n{n} images per round, {args.rounds} rounds, {args.parallel} processes/slots")
    print("| runner | images/s (best) | CPU ms per image |")
    print("|---|---:|---:|")
    for name in ("pyvips", "sharp", "darkroom"):
        if name in best:
            b = best[name]
            print(f"| {name} | {b.per_second:.2f} | {1000 * b.cpu_seconds / b.images:.0f} |")
    if missing:
        print(f"sharp skipped: {missing}")
    d = best["darkroom"].per_second
    print(f"darkroom / pyvips = {d / best['pyvips'].per_second:.3f}")
    if "sharp" in best:
        print(f"darkroom / sharp = {d / best['sharp'].per_second:.3f}")
    print("\ndarkroom, wall ms per image by stage (all rounds):")
    for key, (seconds, count) in sorted(stages.items()):
        if count:
            print(f"  {key:<40} {1000 * seconds / done:8.1f} ms/image  ({count} calls)")
    OUT.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"rounds": [asdict(x) for x in rounds], "images": n,
                                  "parallel": args.parallel, "sharp_missing": missing,
                                  "stages": stages}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
