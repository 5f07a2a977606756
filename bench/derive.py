"""Benchmark of the derivative pipeline (issue 3): throughput per core, limits, memory, bombs.

    .venv/bin/python -m bench.derive [--corpus DIR] [--rounds N] [--big PATH]
    .venv/bin/python -m bench.derive --claims [--rounds N]    # a tiny file claiming 50 MP

Writes bench/out/derive.json (bench/results.py `DeriveResult`) and prints it through its
renderer (bench/sections.py `derive_section`); the formats section
is bench/formats.py's (its measure, `formats_section`, lives here beside its helpers). Every
figure is measured in the same run: the pipeline against its own components
(decode+resize alone, encode alone), against Pillow doing the same job, two decoder
processes against one, the child's peak RSS on a 17.9 MP JPEG, and the time to reject a
decompression bomb. The decoder jail (issue 12) is measured against the child without it
("today's child", `jail=False`): start-up to the first answer and per-image CPU,
interleaved in the same run.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

# One libvips thread, set before pyvips loads: the figures are per core, and the
# production child runs with VIPS_CONCURRENCY=1 too.
os.environ["VIPS_CONCURRENCY"] = "1"

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image, ImageOps  # noqa: E402

from bench.cpu import machine, process_cpu_seconds  # noqa: E402
from bench.results import (  # noqa: E402
    DeriveFormatsResult,
    DeriveJail,
    DeriveOwnerSwitch,
    DeriveResult,
)
from bench.runs import BY_NAME, OUT, command  # noqa: E402
from bench.sections import publish  # noqa: E402
from darkroom.config import load_settings  # noqa: E402
from darkroom.derive import Limits, _vips, decode_resized, derive, encode  # noqa: E402
from darkroom.errors import DeriveError  # noqa: E402
from darkroom.sandbox import DecoderProcess  # noqa: E402
from darkroom.worker import pick_decoder  # noqa: E402
from tests.derive.images import png_header_only, png_zlib_bomb  # noqa: E402
from tests.support.services import CORPUS, corpus_photos  # noqa: E402

LIMITS = Limits.from_settings(load_settings())
BIG_NAME = "Elephants_5640x3172.jpg"


class Timing:
    """Best-of-rounds wall time and CPU time of one measure.

    Per-core throughput is images per CPU-second: it is what one core delivers, and
    unlike wall time it does not move when other work shares the machine. Wall time is
    kept alongside so a quiet machine can be checked against it.
    """

    def __init__(self, run: Callable[[], None], cpu: Callable[[], float]) -> None:
        self.run, self.cpu = run, cpu
        self.wall_s = float("inf")
        self.cpu_s = float("inf")

    def once(self) -> None:
        cpu0, wall0 = self.cpu(), time.perf_counter()
        self.run()
        self.wall_s = min(self.wall_s, time.perf_counter() - wall0)
        self.cpu_s = min(self.cpu_s, self.cpu() - cpu0)


def each(fn: Callable[[Any], object], items: list[Any]) -> Callable[[], None]:
    """One measure's run: `fn` over every item."""
    def run() -> None:
        for item in items:
            fn(item)
    return run


def best_of(rounds: int, run: Callable[[], None]) -> float:
    """Fastest wall time of `rounds` runs."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def pillow_job(data: bytes) -> bytes:
    image: Image.Image = Image.open(io.BytesIO(data))
    if image.format == "JPEG":
        image.draft("RGB", (LIMITS.max_edge, LIMITS.max_edge))
    image = ImageOps.exif_transpose(image)
    if image.mode not in ("RGB", "RGBA"):
        image = image.convert("RGBA" if "A" in image.mode else "RGB")
    image.thumbnail((LIMITS.max_edge, LIMITS.max_edge))
    out = io.BytesIO()
    image.save(out, "WEBP", quality=80, method=4)
    return out.getvalue()


def pillow_encode(image: Any) -> bytes:
    """The same pixels through Pillow's libwebp build: isolates encoder build speed."""
    mode = "RGBA" if image.bands == 4 else "RGB"
    pil = Image.frombytes(mode, (image.width, image.height), image.write_to_memory())
    out = io.BytesIO()
    pil.save(out, "WEBP", quality=80, method=4)
    return out.getvalue()


def pillow_peak_rss_mb(data: bytes) -> float:
    """Peak RSS of a fresh Python doing the Pillow job on `data`, for comparison."""
    code = (
        "import sys, resource; sys.path.insert(0, sys.argv[1]); "
        "from bench.derive import pillow_job; pillow_job(sys.stdin.buffer.read()); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT)], input=data, capture_output=True, check=True
    )
    return int(done.stdout.decode().split()[-1]) / 1024


def find_big(explicit: str | None) -> tuple[bytes, str]:
    """The 17.9 MP JPEG: given, already unpacked, downloaded, or else generated."""
    candidates = [Path(explicit)] if explicit else []
    candidates.append(Path("/tmp/mb/usr/share/backgrounds/mate/abstract") / BIG_NAME)
    for path in candidates:
        if path.is_file():
            return path.read_bytes(), f"file {path}"
    if shutil.which("apt-get") and shutil.which("dpkg"):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                subprocess.run(
                    ["apt-get", "download", "mate-backgrounds"],
                    cwd=tmp, check=True, capture_output=True, timeout=300,
                )
                deb = next(Path(tmp).glob("mate-backgrounds*.deb"))
                subprocess.run(
                    ["dpkg", "-x", str(deb), "x"], cwd=tmp, check=True, capture_output=True
                )
                found = next(Path(tmp, "x").rglob(BIG_NAME))
                return found.read_bytes(), "downloaded mate-backgrounds (Debian)"
            except (subprocess.SubprocessError, OSError, StopIteration):
                pass
    vips = _vips()
    x = vips.Image.xyz(5640, 3172)
    rgb = (x[0] % 256).bandjoin([x[1] % 256, (x[0] + x[1]) % 256]).cast("uchar")
    data: bytes = rgb.copy(interpretation="srgb").jpegsave_buffer(Q=90, interlace=True)
    return data, "generated 5640x3172 progressive JPEG (pyvips)"


def throughput(procs: list[DecoderProcess], corpus: list[bytes], repeats: int) -> float:
    """Images per second with one thread per decoder process, all sharing the work."""
    errors: list[BaseException] = []

    def run(proc: DecoderProcess) -> None:
        try:
            for _ in range(repeats):
                for data in corpus:
                    proc.derive(data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in procs]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return len(procs) * repeats * len(corpus) / elapsed


def child_peak_rss_mb(data: bytes) -> float:
    with DecoderProcess(LIMITS, timeout=120.0, memory_mb=1024) as proc:
        proc.derive(data)
        status = Path(f"/proc/{proc.pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert match, "no VmHWM in /proc"
    return int(match.group(1)) / 1024


def bomb_ms(proc: DecoderProcess, bomb: bytes, rounds: int) -> float:
    def reject() -> None:
        try:
            proc.derive(bomb)
        except DeriveError as exc:
            assert exc.code == "image_too_large", exc.code
        else:
            raise AssertionError("bomb accepted")

    return best_of(rounds, reject) * 1000


FORMAT_LIMITS = replace(LIMITS, max_bytes=100_000_000)
# An iPhone's 12 MP frame.
PHONE_SIZE = (4032, 3024)


def phone_photo(corpus: list[Path]) -> Image.Image:
    """A corpus photo at a phone camera's size, to encode in every accepted format."""
    source = next(p for p in corpus if p.suffix == ".jpg")
    with Image.open(source) as image:
        return ImageOps.fit(image.convert("RGB"), PHONE_SIZE)


def encoded_formats(photo: Image.Image) -> dict[str, bytes]:
    """The same pixels in each format, each made by Pillow or pillow-heif (not libvips)."""
    import pillow_heif

    def save(fmt: str, **options: Any) -> bytes:
        buf = io.BytesIO()
        photo.save(buf, fmt, **options)
        return buf.getvalue()

    heic = io.BytesIO()
    pillow_heif.from_pillow(photo).save(heic, quality=85)
    return {
        "jpeg": save("JPEG", quality=90),
        "heic": heic.getvalue(),
        "avif": save("AVIF", quality=85),
        "webp": save("WEBP", quality=90),
        "png": save("PNG"),
        "tiff": save("TIFF", compression="tiff_lzw"),
    }


def formats_section(paths: list[Path], rounds: int, out: Path) -> int:
    """Decode cost per format, and what the thumb and thumbhash add to today's pipeline.

    "Today's pipeline" is the preview alone (decode, resize, sRGB, WebP encode), the same
    code as `derive` up to its preview; "with thumbs" is `derive` as it runs now (plus a
    ≤ 400 px resize, a small WebP and a thumbhash). Both in this process, interleaved
    round by round, CPU time of the process, best of rounds: the ratio is a same-run one.
    """
    # A 12 MP PNG or TIFF is over the default 25 MB upload limit: lifted here only.
    photo = phone_photo(paths)
    files = encoded_formats(photo)
    cpu = time.process_time

    def preview_only(data: bytes) -> None:
        encode(decode_resized(data, FORMAT_LIMITS))

    def derive_one(data: bytes) -> None:
        derive(data, FORMAT_LIMITS)

    for data in files.values():  # warm every decoder
        derive(data, FORMAT_LIMITS)
    per_format = {kind: Timing(each(derive_one, [data]), cpu) for kind, data in files.items()}
    corpus = [p.read_bytes() for p in paths] + [files["heic"], files["avif"]]
    today = Timing(each(preview_only, corpus), cpu)
    now = Timing(each(derive_one, corpus), cpu)
    for _ in range(rounds):
        for timing in (*per_format.values(), today, now):
            timing.once()
    sample = derive(files["jpeg"], FORMAT_LIMITS)
    assert sample.thumb is not None and sample.thumbhash is not None
    source = next(p for p in paths if p.suffix == ".jpg").name
    result = DeriveFormatsResult(
        photo=f"{PHONE_SIZE[0]}×{PHONE_SIZE[1]} crop of {source}", rounds=rounds,
        bytes={kind: len(data) for kind, data in files.items()},
        derive_cpu_ms={kind: t.cpu_s * 1000 for kind, t in per_format.items()},
        corpus_today_cpu_s=today.cpu_s, corpus_with_thumbs_cpu_s=now.cpu_s,
        corpus_images=len(corpus), thumb_extra_cpu_share=now.cpu_s / today.cpu_s - 1.0,
        sample_bytes={"preview": sample.size, "thumb": sample.thumb.size,
                      "thumbhash_chars": len(sample.thumbhash)},
        command=command("formats"))
    publish("formats", result, out)
    return 0


def start_up_ms(rounds: int, tiny: bytes) -> dict[str, float]:
    """Spawning a child until its first answer (a 64 px JPEG), jailed and not: wall time,
    and the child's own CPU time, which unlike wall time does not move with outside load.

    Alternated, so load from outside hits both alike; best and median of `rounds`.
    """
    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, jail in (("jailed", True), ("unjailed", False)):
            started = time.perf_counter()
            # Started on its own: a zygote's fork would leave the imports' CPU in the zygote.
            with DecoderProcess(LIMITS, timeout=120.0, memory_mb=1024, jail=jail,
                                zygote=False) as proc:
                proc.derive(tiny)
                wall = (time.perf_counter() - started) * 1000
                cpu = process_cpu_seconds(proc.pid or 0) * 1000
            samples.setdefault(f"{name}", []).append(wall)
            samples.setdefault(f"{name}_cpu", []).append(cpu)
    result: dict[str, float] = {}
    for name, values in samples.items():
        values.sort()
        result[f"{name}_best"] = values[0]
        result[f"{name}_median"] = values[len(values) // 2]
    return result


def claims_section(rounds: int, out: Path) -> int:
    """CPU of the 2 KB lossless WebP that claims 16383 x 3050 (50 MP): as the pipeline
    used to decode it (in full, then resized), with shrink-on-load alone (libwebp scaling
    while it decodes), and as derive() treats it now (refused from its header).

    Writes `out` (JSON) and prints the figures; best of `rounds`, one libvips thread.
    """
    import json

    from tests.derive.images import flat

    vips = _vips()
    data = flat(16_383, 3_050, ".webp", lossless=True)
    edge = LIMITS.max_edge

    def full_decode() -> None:
        image = vips.Image.webpload_buffer(data, n=1, access="sequential", fail_on="error")
        image = image.thumbnail_image(edge, height=edge, size="down", no_rotate=True)
        encode(image.copy_memory())

    def shrunk_decode() -> None:
        image = vips.Image.webpload_buffer(data, n=1, access="sequential", fail_on="error",
                                           scale=edge / 16_383)
        image = image.thumbnail_image(edge, height=edge, size="down", no_rotate=True)
        encode(image.copy_memory())

    def now() -> None:
        try:
            derive(data, LIMITS)
        except DeriveError as exc:
            assert exc.code.value == "image_too_large"
        else:
            raise AssertionError("the 50 MP claim was not refused")

    measures = {"before_full_decode": full_decode, "shrink_on_load_only": shrunk_decode,
                "now_refused": now}
    best = {name: float("inf") for name in measures}
    for _ in range(rounds):  # interleaved: outside load hits every measure alike
        for name, run in measures.items():
            started = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - started)
    result = {"input_bytes": len(data), "claimed": "16383x3050", "rounds": rounds,
              "cpu_s": {name: round(v, 4) for name, v in best.items()},
              "machine": machine(), "command": command("derive")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"lossless WebP of {len(data):,} bytes claiming 16383x3050, CPU s (best of {rounds}):")
    for name, value in best.items():
        print(f"  {name:22s} {value:8.4f}")
    return 0
def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def owner_switch(corpus: list[bytes], rounds: int) -> DeriveOwnerSwitch:
    """The same jobs of one owner, then with the owner changing at every job (a fresh
    child each time), alternated; CPU of every child including its start-up."""
    jobs = [data for _ in range(2) for data in corpus]
    best = {"same_owner": float("inf"), "owner_every_job": float("inf"),
            "two_owners_two_slots": float("inf"),
            # Every child a Python start-up of its own, as before the zygote.
            "owner_every_job_no_zygote": float("inf")}
    # The two modes the target compares run back to back in every round, and the ratio is
    # the median of the rounds' own ratios: each pair sees the same machine, whereas the
    # best of each mode alone may pair a quiet round of one with a busy round of the other.
    paired: list[tuple[float, float]] = []
    for _ in range(rounds):
        spent: dict[str, float] = {}
        for mode in best:
            before = _children_cpu()
            if mode == "two_owners_two_slots":
                # Two owners alternating on a worker of two slots, as the worker picks
                # (`pick_decoder`): each owner keeps a warm child.
                slots = [DecoderProcess(LIMITS, timeout=120.0, memory_mb=1024)
                         for _ in range(2)]
                for i, data in enumerate(jobs):
                    owner = str(i % 2)
                    slots[pick_decoder(slots, owner)].derive(data, owner=owner)
                for slot in slots:
                    slot.close()
            else:
                _run_jobs(jobs, new_owner_each=mode != "same_owner",
                          zygote=mode != "owner_every_job_no_zygote")
            spent[mode] = (_children_cpu() - before) / len(jobs)
            best[mode] = min(best[mode], spent[mode])
        paired.append((spent["same_owner"], spent["owner_every_job"]))
    return DeriveOwnerSwitch(
        jobs=len(jobs), cpu_per_job_ms={k: v * 1000 for k, v in best.items()},
        switch_cpu_ms=statistics.median(every - same for same, every in paired) * 1000,
        throughput_ratio=statistics.median(same / every for same, every in paired),
        tiny_switch_cpu_ms=tiny_switch_ms(max(rounds, 4)))


def _run_jobs(jobs: list[bytes], *, new_owner_each: bool, zygote: bool = True) -> None:
    """The jobs through one slot: all of one owner, or each of a new owner."""
    with DecoderProcess(LIMITS, timeout=120.0, memory_mb=1024, zygote=zygote) as proc:
        for i, data in enumerate(jobs):
            proc.derive(data, owner=str(i) if new_owner_each else "1")


def tiny_jpeg() -> bytes:
    """A 64×64 JPEG: a job that costs next to nothing."""
    data: bytes = _vips().Image.black(64, 64, bands=3).jpegsave_buffer()
    return data


def tiny_switch_ms(rounds: int, jobs: int = 30) -> float:
    """CPU of an owner change where the job costs next to nothing: what the fresh child
    itself costs (fork, jail, first job), with far less noise than the photos' figure."""
    tiny = [tiny_jpeg()] * jobs
    differences = []
    for _ in range(rounds):
        spent = {}
        for new_owner_each in (False, True):
            before = _children_cpu()
            _run_jobs(tiny, new_owner_each=new_owner_each)
            spent[new_owner_each] = (_children_cpu() - before) / jobs
        differences.append(spent[True] - spent[False])
    return statistics.median(differences) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(CORPUS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--big", default=None, help=f"path to {BIG_NAME}")
    parser.add_argument("--out", type=Path, default=BY_NAME["derive"].json_path)
    parser.add_argument("--claims", action="store_true",
                        help="only the tiny file claiming 50 MP, before and after")
    parser.add_argument("--owners", action="store_true",
                        help="only the owner-change measure, printed")
    args = parser.parse_args()
    if args.claims:
        return claims_section(args.rounds, OUT / "derive_claims.json")

    paths = corpus_photos(Path(args.corpus))
    corpus = [p.read_bytes() for p in paths]
    if args.owners:
        print(owner_switch(corpus, args.rounds))
        return 0
    n = len(corpus)
    rounds = args.rounds
    started_on = machine()

    for data in corpus:  # warm libvips and the page cache
        derive(data, LIMITS)
    decoded = [decode_resized(data, LIMITS) for data in corpus]

    one = DecoderProcess(LIMITS, timeout=120.0, memory_mb=1024)
    one.derive(corpus[0])
    assert one.pid is not None
    child_pid = one.pid
    # Today's child before issue 12: same process, same protocol, no jail.
    bare = DecoderProcess(LIMITS, timeout=120.0, memory_mb=1024, jail=False)
    bare.derive(corpus[0])
    assert bare.pid is not None
    bare_pid = bare.pid

    cpu = time.process_time
    timings = {
        "decode_resize": Timing(each(lambda d: decode_resized(d, LIMITS), corpus), cpu),
        "encode": Timing(each(encode, decoded), cpu),
        "pipeline_in_process": Timing(each(lambda d: derive(d, LIMITS), corpus), cpu),
        "pipeline_child": Timing(each(one.derive, corpus), lambda: process_cpu_seconds(child_pid)),
        "pipeline_child_unjailed": Timing(
            each(bare.derive, corpus), lambda: process_cpu_seconds(bare_pid)
        ),
        "pillow": Timing(each(pillow_job, corpus), cpu),
        "pillow_encode": Timing(each(pillow_encode, decoded), cpu),
    }
    # Interleaved, so a burst of outside load hits every measure alike.
    for _ in range(rounds):
        for timing in timings.values():
            timing.once()
    t_decode = timings["decode_resize"].cpu_s
    t_encode = timings["encode"].cpu_s
    bomb = png_zlib_bomb(30_000, 30_000)
    bomb_rejection_ms = bomb_ms(one, bomb, 5)
    header_rejection_ms = bomb_ms(one, png_header_only(100_000, 100_000), 5)
    one.close()
    bare.close()
    start_up = start_up_ms(max(rounds * 3, 9), tiny_jpeg())

    with DecoderProcess(LIMITS, timeout=120.0, memory_mb=1024) as a, DecoderProcess(
        LIMITS, timeout=120.0, memory_mb=1024
    ) as b:
        a.derive(corpus[0])
        b.derive(corpus[0])
        # Alternated, best of each: the machine may be shared, and this measure, unlike
        # the per-core ones, can only be taken in wall time.
        ips_one = ips_two = 0.0
        cpu_per_image = {"one": float("inf"), "two": float("inf")}
        for _ in range(max(rounds, 3)):
            cpu0 = process_cpu_seconds(a.pid or 0)
            ips_one = max(ips_one, throughput([a], corpus, 2))
            cpu_per_image["one"] = min(
                cpu_per_image["one"], (process_cpu_seconds(a.pid or 0) - cpu0) / (2 * n)
            )
            cpu0 = process_cpu_seconds(a.pid or 0) + process_cpu_seconds(b.pid or 0)
            ips_two = max(ips_two, throughput([a, b], corpus, 2))
            spent = process_cpu_seconds(a.pid or 0) + process_cpu_seconds(b.pid or 0) - cpu0
            cpu_per_image["two"] = min(cpu_per_image["two"], spent / (4 * n))

    owners = owner_switch(corpus, rounds)
    big, big_source = find_big(args.big)
    rss_mb = child_peak_rss_mb(big)
    pillow_rss_mb = pillow_peak_rss_mb(big)

    ips = {name: n / timing.cpu_s for name, timing in timings.items()}
    ips_wall = {name: n / timing.wall_s for name, timing in timings.items()}
    component_limit = n / (t_decode + t_encode)
    result = DeriveResult(
        corpus=[p.name for p in paths], rounds=rounds,
        machine=started_on | {"libvips": ".".join(str(_vips().version(i)) for i in range(3))},
        images_per_second_per_core=ips, images_per_second_wall=ips_wall,
        component_limit=component_limit,
        pipeline_to_limit_ratio=ips["pipeline_child"] / component_limit,
        pipeline_to_limit_ratio_wall=ips_wall["pipeline_child"]
        / (n / (timings["decode_resize"].wall_s + timings["encode"].wall_s)),
        pipeline_in_process_to_limit_ratio=ips["pipeline_in_process"] / component_limit,
        pipeline_unjailed_to_limit_ratio=ips["pipeline_child_unjailed"] / component_limit,
        jail=DeriveJail(
            start_up_ms=start_up,
            cpu_per_image_ms={"jailed": timings["pipeline_child"].cpu_s / n * 1000,
                              "unjailed": timings["pipeline_child_unjailed"].cpu_s / n * 1000},
            jailed_vs_unjailed=ips["pipeline_child"] / ips["pipeline_child_unjailed"]),
        pyvips_vs_pillow=ips["pipeline_child"] / ips["pillow"],
        one_process_ips=ips_one, two_processes_ips=ips_two, two_vs_one=ips_two / ips_one,
        child_cpu_seconds_per_image=cpu_per_image,
        child_peak_rss_mb=rss_mb, pillow_peak_rss_mb=pillow_rss_mb, big_image=big_source,
        bomb_rejection_ms=bomb_rejection_ms, header_100k_rejection_ms=header_rejection_ms,
        owner_switch=owners,
        command=command("derive"), loadavg_at_end=list(os.getloadavg()))
    publish("derive", result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
