"""darkroom end to end beside the bare engines, on the same photos and the same work.

    .venv/bin/python -m bench.engines [--rounds 3] [--copies 4] [--parallel 2]

The work per photo is the same everywhere: decode once (shrink-on-load where the format
has it), EXIF rotation, sRGB, a preview of at most 2048 px on the long edge in WebP q80
effort 4, and a thumb of at most 400 px from the same decode. Three runners, one libvips
thread per process, each process in a session of its own (the kernel's autogroups share
the CPU by session; darkroom's decoder children have theirs), at the same priority
(darkroom's decoders run at DARKROOM_DERIVE_NICE=0 here: the peers are not niced):

- **pyvips**: bare libvips through pyvips, `--parallel` processes, no queue, no store;
- **sharp**: sharp (libvips under Node.js; the engine Immich uses), `--parallel` node
  processes, installed by `make bench-install` into bench/engines/ (skipped with its
  reason where node or sharp is missing);
- **darkroom**: the whole service: an API process and a worker with `--parallel` slots on
  a private PostgreSQL and the local store; each photo is created, uploaded and confirmed
  over HTTP, claimed under a lease, decoded in the jail, stored and published. Timed from
  the first create to the last `ready`.

Rounds are interleaved (the order rotates each round), so a noisy neighbour hurts each
runner alike; the ratios are taken within a round and the report gives their median. Beside
images/s: CPU per image (of the runner's own processes; darkroom's split by process), the
derivatives' bytes and SSIM against the same reference (the original resized by libvips,
never compressed), and darkroom's wall time per image by stage from the worker's and the
API's own histograms, with the pipeline's steps (thumbhash among them) timed in this
process on the same photos.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from string import Template
from typing import Any

import httpx
import psycopg

from bench.api import _tree_ticks
from bench.cpu import TICK, machine, process_ticks
from bench.results import EnginesQuality, EnginesResult, EnginesRound
from bench.runs import command
from bench.sections import publish
from bench.sql import SQL
from darkroom.db import embedded
from darkroom.db.migrations import migrate
from darkroom.keys import create_key_at
from tests.support.services import corpus_photos, free_port

ROOT = Path(__file__).resolve().parents[1]
SHARP_DIR = ROOT / "bench" / "engines"
EDGE, THUMB, QUALITY, EFFORT = 2048, 400, 80, 4
RUNNERS = ("pyvips", "sharp", "darkroom")

# One process's share of the photos through bare pyvips: the same steps as the pipeline,
# without the jail, the limits or the thumbhash.
PYVIPS_CHILD = Template(r"""
import json, os, sys, time, pyvips
pyvips.cache_set_max(0)
paths = sys.argv[1:]
datas = [open(p, "rb").read() for p in paths]
keep = os.environ.get("ENGINES_KEEP")
sys.stdin.readline()  # go: loaded and ready, as a running service would be
cpu = time.process_time()
total = 0
for path, data in zip(paths, datas):
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
    if keep:
        name = os.path.basename(path)
        open(f"{keep}/{name}.webp", "wb").write(preview)
        open(f"{keep}/{name}.thumb.webp", "wb").write(thumb)
print(json.dumps({"cpu": time.process_time() - cpu, "bytes": total}), flush=True)
""").substitute(edge=EDGE, thumb=THUMB, q=QUALITY, effort=EFFORT)

SHARP_CHILD = Template(r"""
const sharp = require("sharp");
const fs = require("fs");
sharp.concurrency(1);
sharp.cache(false);
const paths = process.argv.slice(1);  // node -e SCRIPT: argv[0] is node itself
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
      fs.writeFileSync(process.env.ENGINES_KEEP + "/" + name + ".thumb.webp", thumb);
    }
  }
  const used = process.cpuUsage(cpu);
  console.log(JSON.stringify({ cpu: (used.user + used.system) / 1e6, bytes: total }));
  process.exit(0);
});
""").substitute(edge=EDGE, thumb=THUMB, q=QUALITY, effort=EFFORT)


def split(paths: list[Path], parts: int) -> list[list[Path]]:
    return [paths[i::parts] for i in range(parts)]


def sharp_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (SHARP_DIR / "node_modules" / "sharp").is_dir():
        return "sharp is not installed (make bench-install)"
    return None


def engine_commands(runner: str, paths: list[Path], parallel: int) -> list[list[str]]:
    if runner == "pyvips":
        return [[sys.executable, "-c", PYVIPS_CHILD, *map(str, part)]
                for part in split(paths, parallel)]
    return [["node", "-e", SHARP_CHILD, *map(str, part)] for part in split(paths, parallel)]


def engine_env(keep: Path | None = None) -> dict[str, str]:
    # One libvips thread per process, as darkroom's decoders and `sharp.concurrency(1)`.
    env = {**os.environ, "VIPS_CONCURRENCY": "1",
           "NODE_PATH": str(SHARP_DIR / "node_modules")}
    if keep is not None:
        env["ENGINES_KEEP"] = str(keep)
    return env


def run_engine(runner: str, paths: list[Path], parallel: int, keep: Path | None = None
               ) -> EnginesRound:
    """Start the processes, let them load, then time them from one go to the last answer.
    CPU is what the processes report for the work itself."""
    procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=engine_env(keep), start_new_session=True)
             for c in engine_commands(runner, paths, parallel)]
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
            raise RuntimeError(f"{runner} failed ({proc.returncode})")
    return EnginesRound(runner=runner, round=0, images=len(paths), seconds=seconds,
                        cpu_seconds=sum(float(a["cpu"]) for a in answers))


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
               "DARKROOM_DATA_DIR": str(tmp), "DARKROOM_CREATE_RATE_PER_MINUTE": "0",
               # The peers run at the default priority; so do darkroom's decoders here.
               "DARKROOM_DERIVE_NICE": "0"}
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
        deadline = time.monotonic() + 120
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
        self.postmaster = int(Path(self.pgdata / "postmaster.pid").read_text().split()[0])

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the API, the worker itself, its decoders (zygotes and
        children), PostgreSQL, and the client that uploads (this process)."""
        worker_self = process_ticks(self.worker.pid)
        return {"api": _tree_ticks(self.api.pid) / TICK,
                "worker": worker_self / TICK,
                "decoders": (_tree_ticks(self.worker.pid) - worker_self) / TICK,
                "postgres": _tree_ticks(self.postmaster) / TICK,
                "client": process_ticks(os.getpid()) / TICK}

    def upload(self, path: Path) -> str:
        data = path.read_bytes()
        kind = "image/png" if path.suffix == ".png" else "image/jpeg"
        card = self.client.post("/v1/files", json={"filename": path.name,
                                                   "content_type": kind, "size": len(data),
                                                   "allow_duplicate": True})
        card.raise_for_status()
        body = card.json()
        up = body["upload"]
        # On the client's kept-alive connection: a client uploading many photos does so.
        put = self.client.request(up["method"], httpx.URL(self.base).join(up["url"]),
                                  headers=up.get("headers", {}), content=data)
        put.raise_for_status()
        self.client.post(f"/v1/files/{body['id']}/confirm",
                         json={"version": put.json()["version"]}).raise_for_status()
        return str(body["id"])

    def run(self, paths: list[Path]) -> EnginesRound:
        before = self.cpu()
        start = time.perf_counter()
        ids = [self.upload(p) for p in paths]
        deadline = time.monotonic() + 1200
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while True:
                row = conn.execute(SQL["ready_and_rejected_among"], {"ids": ids}).fetchone()
                assert row is not None
                if row[1]:
                    raise RuntimeError(f"{row[1]} card(s) rejected")
                if row[0] == len(ids):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("cards not ready")
                # Often enough to end the round within 1 % of its time, seldom enough that
                # the watching costs next to nothing (it shares the cores).
                time.sleep(0.1)
        seconds = time.perf_counter() - start
        after = self.cpu()
        by = {k: after[k] - before[k] for k in after}
        self.last_ids = dict(zip((p.name for p in paths), ids, strict=True))
        return EnginesRound(runner="darkroom", round=0, images=len(paths), seconds=seconds,
                            cpu_seconds=sum(v for k, v in by.items() if k != "client"),
                            cpu_by_process=by)

    def keep(self, names: list[str], out: Path) -> None:
        """The derivatives of the last round, one per photo, as the API serves them."""
        for name in names:
            file_id = self.last_ids[name]
            for variant, suffix in (("preview", ".webp"), ("thumb", ".thumb.webp")):
                got = self.client.get(f"/v1/files/{file_id}/derivative",
                                      params={"size": variant}, follow_redirects=True)
                got.raise_for_status()
                (out / f"{name}{suffix}").write_bytes(got.content)

    def stages(self) -> dict[str, tuple[float, int]]:
        """Seconds and count of each worker stage, and of the API's requests by route."""
        found: dict[str, tuple[float, int]] = {}
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text
        text += self.client.get("/metrics").text
        pattern = re.compile(r'^(darkroom_stage_duration_seconds|[a-z_]*request_duration_seconds)'
                             r'_(sum|count)\{((?:[^}"]|"[^"]*")*)\} ([0-9.e+-]+)$', re.M)
        for name, kind, labels, value in pattern.findall(text):
            label = " ".join(v for k, v in re.findall(r'(\w+)="([^"]*)"', labels)
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


# --- quality ---------------------------------------------------------------------------


def _flat_luma(vips: Any, image: Any) -> Any:
    """Luminance, alpha flattened onto white: what a viewer of the picture sees."""
    if image.hasalpha():
        image = image.flatten(background=[255, 255, 255])
    return image.colourspace("b-w")[0].cast("float")


def ssim(vips: Any, a: Any, b: Any) -> float:
    """Mean SSIM (Wang et al. 2004) of two same-size luminance images, Gaussian window of
    sigma 1.5, the usual constants for 8-bit values."""
    def blur(x: Any) -> Any:
        return x.gaussblur(1.5, precision="float")

    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a * mu_a
    var_b = blur(b * b) - mu_b * mu_b
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    num = (mu_a * mu_b * 2 + c1) * (cov * 2 + c2)
    den = (mu_a * mu_a + mu_b * mu_b + c1) * (var_a + var_b + c2)
    return float((num / den).avg())


def quality(runner: str, base: list[Path], kept: Path) -> EnginesQuality:
    """Bytes of one engine's derivatives of each photo, and the mean SSIM of its previews
    against the original resized by libvips (never compressed)."""
    import pyvips

    scores, preview_bytes, thumb_bytes = [], 0, 0
    for path in base:
        preview = (kept / f"{path.name}.webp").read_bytes()
        preview_bytes += len(preview)
        thumb_bytes += len((kept / f"{path.name}.thumb.webp").read_bytes())
        ref = pyvips.Image.thumbnail_buffer(path.read_bytes(), EDGE, height=EDGE, size="down")
        if ref.get_typeof("icc-profile-data"):
            ref = ref.icc_transform("srgb", embedded=True, intent="perceptual")
        got = pyvips.Image.new_from_buffer(preview, "")
        if (got.width, got.height) != (ref.width, ref.height):
            # A rounding apart (sharp and libvips may round the short edge differently).
            got = got.resize(ref.width / got.width, vscale=ref.height / got.height)
        scores.append(ssim(pyvips, _flat_luma(pyvips, ref), _flat_luma(pyvips, got)))
    return EnginesQuality(runner=runner, preview_bytes=preview_bytes, thumb_bytes=thumb_bytes,
                          ssim=statistics.fmean(scores),
                          ssim_by_photo={p.name: round(s, 5) for p, s in zip(base, scores,
                                                                            strict=True)})


def pipeline_steps(base: list[Path]) -> dict[str, float]:
    """CPU ms per image of the pipeline's steps, in this process on the same photos (best
    of three): what the decoder child spends, thumbhash among it."""
    from darkroom.derive import Limits, _webp, decode_resized, thumbhash

    limits = Limits(max_bytes=200 << 20, max_pixels=100_000_000, max_dimension=30_000,
                    max_edge=EDGE, thumb_edge=THUMB)
    best: dict[str, float] = {}
    datas = [p.read_bytes() for p in base]
    for _ in range(3):
        spent = dict.fromkeys(("decode_resize", "preview_encode", "thumb", "thumbhash"), 0.0)
        for data in datas:
            t0 = time.process_time()
            image = decode_resized(data, limits)
            t1 = time.process_time()
            _webp(image)
            t2 = time.process_time()
            small = image.thumbnail_image(THUMB, height=THUMB, size="down",
                                          no_rotate=True).copy_memory()
            _webp(small)
            t3 = time.process_time()
            thumbhash(small)
            t4 = time.process_time()
            for key, value in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                spent[key] += value
        for key, value in spent.items():
            best[key] = min(best.get(key, float("inf")), 1000 * value / len(datas))
    return best


def versions() -> dict[str, str]:
    import pyvips

    found = {"libvips": f"{pyvips.version(0)}.{pyvips.version(1)}.{pyvips.version(2)}"}
    package = SHARP_DIR / "node_modules" / "sharp" / "package.json"
    if package.exists():
        found["sharp"] = json.loads(package.read_text())["version"]
        done = subprocess.run(["node", "-e", "console.log(JSON.stringify("
                               "require('sharp').versions))"], env=engine_env(),
                              capture_output=True, text=True, check=False)
        if done.returncode == 0:
            found["sharp_libvips"] = json.loads(done.stdout).get("vips", "?")
    if shutil.which("node"):
        found["node"] = subprocess.run(["node", "--version"], capture_output=True,
                                       text=True, check=False).stdout.strip()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=4, help="each corpus photo this often")
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    started_machine = machine()
    base = corpus_photos()
    paths = base * args.copies
    missing = sharp_missing()
    runners = [r for r in RUNNERS if r != "sharp" or missing is None]
    tmp = Path(tempfile.mkdtemp(prefix="darkroom-engines-"))
    kept = {r: tmp / f"kept-{r}" for r in runners}
    for folder in kept.values():
        folder.mkdir()
    rounds: list[EnginesRound] = []
    system = Darkroom(tmp, args.parallel)
    try:
        # The peers' derivatives, for the comparison of bytes and SSIM (not timed).
        for runner in runners:
            if runner != "darkroom":
                run_engine(runner, base, 1, keep=kept[runner])
        for r in range(args.rounds):
            order = runners[r % len(runners):] + runners[:r % len(runners)]
            for runner in order:
                done = (system.run(paths) if runner == "darkroom"
                        else run_engine(runner, paths, args.parallel))
                rounds.append(EnginesRound(**{**done.__dict__, "round": r + 1}))
            print(f"round {r + 1}: " + ", ".join(
                f"{x.runner} {x.images / x.seconds:.2f}/s" for x in rounds[-len(runners):]),
                flush=True)
        system.keep([p.name for p in base], kept["darkroom"])
        stages = system.stages()
    finally:
        system.stop()
    qualities = [quality(r, base, kept[r]) for r in runners]
    shutil.rmtree(tmp, ignore_errors=True)
    done_images = args.rounds * len(paths)
    result = EnginesResult(
        photos=[p.name for p in base], images_per_round=len(paths), rounds=args.rounds,
        parallel=args.parallel, sharp_missing=missing, runs=rounds, quality=qualities,
        stage_ms_per_image={k: 1000 * s / done_images for k, (s, n) in stages.items() if n},
        stage_calls={k: n for k, (s, n) in stages.items() if n},
        pipeline_cpu_ms=pipeline_steps(base), versions=versions(), machine=started_machine,
        command=command("engines"), loadavg_at_end=list(os.getloadavg()))
    publish("engines", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
