"""The child-process sandbox: crashes, hangs and blow-ups end in a code, never in the parent.

Tests that need a job to be *in flight* run a test child program through the same jail
(`tests/derive/hostile_child.py`, action `hang`): given a FIFO, the child writes one byte
to it when a job arrives and then hangs. Reading the FIFO blocks until that moment, so no
test sleeps or polls to wait for the child.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PIL import Image

from darkroom.config import Settings, load_settings
from darkroom.derive import Derivative, Limits, _vips, derive
from darkroom.errors import DeriveError, ErrorCode
from darkroom.sandbox import DECODER, Cancelled, DecoderProcess, cli
from tests.derive import images as im
from tests.derive.hostile_child import hostile

DUNE = (im.CORPUS / "Dune.jpg").read_bytes()
LIMITS = Limits.from_settings(load_settings())


@pytest.fixture
def proc() -> Iterator[DecoderProcess]:
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as p:
        yield p


@pytest.fixture
def hang_fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "job-started"
    os.mkfifo(fifo)
    return fifo


class Background:
    """Run proc.derive in a thread and keep what it returned or raised."""

    def __init__(self, call: Callable[[], Derivative]) -> None:
        self.result: Derivative | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], Derivative]) -> None:
        try:
            self.result = call()
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "derive did not return"


def wait_until_in_flight(fifo: Path) -> None:
    with open(fifo, "rb") as marker:  # blocks until the child has the job
        assert marker.read(1) == b"1"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_same_result_as_in_process(proc: DecoderProcess) -> None:
    for path in im.CORPUS_IMAGES:
        data = path.read_bytes()
        assert proc.derive(data) == derive(data, LIMITS)


def test_new_formats_decode_in_the_child_with_thumb_and_thumbhash(proc: DecoderProcess) -> None:
    picture = im.quadrants(900, 600)
    for data in (im.heic(picture), im.save(picture, "AVIF"), im.save(picture, "TIFF")):
        result = proc.derive(data)
        assert result == derive(data, LIMITS)
        assert result.thumb is not None and result.thumbhash is not None
        assert (result.width, result.height) == (900, 600)
        assert (result.thumb.width, result.thumb.height) == (400, 267)
        with pytest.raises(DeriveError) as info:
            proc.derive(data[: len(data) // 2])
        assert info.value.code == ErrorCode.INVALID_IMAGE


def test_child_is_reused_across_jobs_and_errors(proc: DecoderProcess) -> None:
    first = proc.derive(DUNE)
    pid = proc.pid
    with pytest.raises(DeriveError) as info:
        proc.derive(b"not an image at all")
    assert info.value.code == ErrorCode.UNSUPPORTED_FORMAT
    assert proc.pid == pid
    # A used child's verdict against the file is asked again of a fresh child
    # (`test_rogue_child`), whose own verdict stands; that child serves on.
    with pytest.raises(DeriveError) as info:
        proc.derive(DUNE[: len(DUNE) // 2])
    assert info.value.code == ErrorCode.INVALID_IMAGE
    fresh = proc.pid
    assert fresh not in (None, pid)
    assert proc.derive(DUNE) == first
    assert proc.pid == fresh


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", ErrorCode.INVALID_IMAGE),
        (b"%PDF-1.4\n", ErrorCode.UNSUPPORTED_FORMAT),
        (im.png_header_only(100_000, 100_000), ErrorCode.IMAGE_TOO_LARGE),
        (b"\xff\xd8\xff\xe0" + b"\x00" * 100, ErrorCode.INVALID_IMAGE),
    ],
)
def test_codes_cross_the_pipe(proc: DecoderProcess, data: bytes, code: ErrorCode) -> None:
    with pytest.raises(DeriveError) as info:
        proc.derive(data)
    assert info.value.code == code


def test_bomb_rejected_fast_through_the_child(proc: DecoderProcess) -> None:
    bomb = im.png_zlib_bomb(30_000, 30_000)
    proc.start()
    proc.derive(DUNE)  # the child is up and libvips is warm
    with pytest.raises(DeriveError) as info:
        proc.derive(bomb)
    assert info.value.code == ErrorCode.IMAGE_TOO_LARGE


def test_kill_mid_job_cancels_and_next_job_works(proc: DecoderProcess, hang_fifo: Path) -> None:
    proc.program = hostile("hang", str(hang_fifo))
    job = Background(lambda: proc.derive(DUNE))
    wait_until_in_flight(hang_fifo)
    pid = proc.pid
    assert pid is not None and alive(pid)
    proc.kill()
    job.join()
    assert isinstance(job.error, Cancelled)
    assert job.error.code == ErrorCode.PROCESSING_FAILED
    assert not alive(pid)

    proc.program = DECODER
    result = proc.derive(DUNE)
    assert result.width == 1680
    assert proc.pid != pid


def test_child_crash_is_processing_failed(proc: DecoderProcess, hang_fifo: Path) -> None:
    proc.program = hostile("hang", str(hang_fifo))
    job = Background(lambda: proc.derive(DUNE))
    wait_until_in_flight(hang_fifo)
    pid = proc.pid
    assert pid is not None
    os.kill(pid, signal.SIGSEGV)  # what a decoder bug looks like from outside
    job.join()
    assert isinstance(job.error, DeriveError) and not isinstance(job.error, Cancelled)
    assert job.error.code == ErrorCode.PROCESSING_FAILED
    assert "SIGSEGV" in job.error.detail

    proc.program = DECODER
    assert proc.derive(DUNE).width == 1680


def test_hang_hits_the_time_limit(hang_fifo: Path) -> None:
    with DecoderProcess(LIMITS, timeout=0.5, memory_mb=1024,
                        program=hostile("hang", str(hang_fifo))) as proc:
        proc.start()
        with pytest.raises(DeriveError) as info:
            proc.derive(DUNE)
        assert info.value.code == ErrorCode.PROCESSING_TIMEOUT
        proc.program = DECODER
        proc.timeout = 30.0
        assert proc.derive(DUNE).width == 1680


@pytest.fixture(scope="module")
def big_progressive_jpeg() -> bytes:
    """~24 MP progressive JPEG: libjpeg must buffer every coefficient (~70 MB) to decode."""
    from darkroom.derive import _vips

    vips = _vips()
    x = vips.Image.xyz(6000, 4000)
    rgb = (x[0] % 256).bandjoin([x[1] % 256, (x[0] + x[1]) % 256]).cast("uchar")
    data: bytes = rgb.copy(interpretation="srgb").jpegsave_buffer(Q=85, interlace=True)
    return data


def test_memory_limit_gives_a_bounded_code(big_progressive_jpeg: bytes) -> None:
    # After an out-of-memory answer the child is replaced (its heap is left fragmented),
    # so the small job after it runs in a fresh one.
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=150) as proc:
        proc.derive(DUNE)  # small jobs fit
        with pytest.raises(DeriveError) as info:
            proc.derive(big_progressive_jpeg)
        assert info.value.code == ErrorCode.PROCESSING_FAILED
        assert proc.derive(DUNE).width == 1680  # the parent, and the pool, carry on
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        assert proc.derive(big_progressive_jpeg).width == 2048


def test_real_work_over_the_time_limit(big_progressive_jpeg: bytes) -> None:
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        proc.derive(DUNE)  # started and warm: the limit below measures decoding only
        proc.timeout = 0.05
        with pytest.raises(DeriveError) as info:
            proc.derive(big_progressive_jpeg)
        assert info.value.code == ErrorCode.PROCESSING_TIMEOUT
        proc.timeout = 30.0
        assert proc.derive(DUNE).width == 1680


def test_oversized_input_is_refused_in_the_parent(proc: DecoderProcess) -> None:
    proc.derive(DUNE)
    pid = proc.pid
    with pytest.raises(DeriveError) as info:
        proc.derive(b"\xff\xd8\xff" + bytes(LIMITS.max_bytes))
    assert info.value.code == ErrorCode.IMAGE_TOO_LARGE
    assert proc.pid == pid


def test_a_decoder_out_of_memory_while_reading_the_header_does_not_blame_the_file() -> None:
    # libvips' WebP loader allocates the whole frame as it reads the header: a valid
    # 2560×1600 WebP in a child too small for that frame is the child's failure.
    vips = _vips()
    x = vips.Image.xyz(2560, 1600)
    webp = (x[0] % 256).bandjoin([x[1] % 256, (x[0] + x[1]) % 256]).cast("uchar") \
        .copy(interpretation="srgb").webpsave_buffer(Q=80)
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=64) as proc:
        with pytest.raises(DeriveError) as info:
            proc.derive(webp)
        assert info.value.code == ErrorCode.PROCESSING_FAILED, info.value.detail
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        assert proc.derive(webp).width == 2048


@pytest.mark.parametrize("memory_mb", [144, 152])
def test_libjpeg_out_of_memory_on_large_markers_does_not_blame_the_file(memory_mb: int) -> None:
    # A valid photo carrying 19.5 MB of APP1 segments: libjpeg keeps them as it reads the
    # header, and a child too small for them runs out there. It may derive the photo or
    # fail by its own fault, never blame the file.
    segment = b"\xff\xe1" + (65_000 + 7).to_bytes(2, "big") + b"junk\0"
    padded = DUNE[:2] + b"".join(segment + bytes([i % 251]) * 65_000 for i in range(300)) \
        + DUNE[2:]
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=memory_mb) as proc:
        try:
            assert proc.derive(padded).width == 1680
        except DeriveError as failed:
            assert failed.code == ErrorCode.PROCESSING_FAILED, failed.detail


def test_a_heic_decoder_that_cannot_start_its_threads_does_not_blame_the_file() -> None:
    # libheif says "unexpected C++ exception" for a std::bad_alloc or a thread it could
    # not start: in a child this small, the child's failure.
    photo = Image.open(im.CORPUS / "Dune.jpg").convert("RGB").resize((2560, 1600))
    heic = im.heic(photo)
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=64) as proc:
        with pytest.raises(DeriveError) as info:
            proc.derive(heic)
        assert info.value.code == ErrorCode.PROCESSING_FAILED, info.value.detail


def test_memory_limit_too_small_to_start_is_still_a_code() -> None:
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=16) as proc:
        with pytest.raises(DeriveError) as info:
            proc.derive(DUNE)
        assert info.value.code == ErrorCode.PROCESSING_FAILED


def test_kill_while_idle_only_retires_the_child(proc: DecoderProcess) -> None:
    proc.derive(DUNE)
    pid = proc.pid
    proc.kill()
    assert proc.pid is None
    assert proc.derive(DUNE).width == 1680
    assert proc.pid not in (None, pid)


def test_close_stops_the_child() -> None:
    proc = DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024)
    proc.derive(DUNE)
    pid = proc.pid
    assert pid is not None
    proc.close()
    assert not alive(pid)
    with pytest.raises(DeriveError) as info:
        proc.derive(DUNE)
    assert info.value.code == ErrorCode.PROCESSING_FAILED


def test_derive_from_threads_is_serialised(proc: DecoderProcess) -> None:
    jobs = [Background(lambda: proc.derive(DUNE)) for _ in range(4)]
    for job in jobs:
        job.join()
    assert all(job.error is None for job in jobs)
    assert len({job.result.sha256 for job in jobs if job.result}) == 1


# -- darkroom derive IN [-o OUT] --------------------------------------------------------


def test_cli_success(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.webp"
    assert cli(str(im.CORPUS / "LadyBird.jpg"), str(out), Settings()) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["width"] == 2048 and printed["height"] == 1280
    assert printed["bytes"] == out.stat().st_size
    assert set(printed) == {"width", "height", "bytes", "sha256"}
    im.decode_webp(out.read_bytes())


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "photo.jpg"
    text.write_text("hello")
    assert cli(str(text), None, Settings()) == 1
    assert json.loads(capsys.readouterr().out) == {"error_code": "unsupported_format"}
    assert cli(str(tmp_path / "missing.jpg"), None, Settings()) == 1
    assert json.loads(capsys.readouterr().out) == {"error_code": "original_missing"}
    assert cli(str(im.CORPUS / "Dune.jpg"), None, Settings(max_upload_bytes=1000)) == 1
    assert json.loads(capsys.readouterr().out) == {"error_code": "image_too_large"}


def test_cli_in_a_fresh_interpreter(tmp_path: Path) -> None:
    code = "import sys; from darkroom.sandbox import cli; from darkroom.config import Settings; "
    code += "sys.exit(cli(sys.argv[1], None, Settings()))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(im.CORPUS / "Flow.png")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["width"] == 1920


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfd (Linux ≥ 5.3)")
def test_child_exits_when_the_worker_dies_mid_job(hang_fifo: Path) -> None:
    helper = (
        "import sys; from pathlib import Path; from darkroom.config import load_settings; "
        "from darkroom.derive import Limits; from darkroom.sandbox import DecoderProcess; "
        "from tests.derive.hostile_child import hostile; "
        "limits = Limits.from_settings(load_settings()); "
        "p = DecoderProcess(limits, timeout=300, memory_mb=1024, "
        "program=hostile('hang', sys.argv[2])); p.start(); "
        "print(p.pid, flush=True); p.derive(Path(sys.argv[1]).read_bytes())"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", helper, str(im.CORPUS / "Dune.jpg"), str(hang_fifo)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert worker.stdout is not None
        child = int(worker.stdout.readline())
        wait_until_in_flight(hang_fifo)
        pidfd = os.pidfd_open(child)
        worker.kill()  # kill -9 of the worker while its child hangs in a "decoder"
        worker.wait()
        readable, _, _ = select.select([pidfd], [], [], 10.0)
        os.close(pidfd)
        assert readable, "the orphaned decoder child kept running"
    finally:
        worker.kill()
        worker.wait()


def test_the_child_runs_at_the_niceness_it_was_given() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024, nice=5) as proc:
        proc.start()
        pid = proc.pid
        assert pid is not None
        # The child renices itself first thing; it cannot answer a job before that.
        proc.derive(DUNE)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, base + 5)
        autogroup = Path(f"/proc/{pid}/autogroup")
        if autogroup.exists():  # kernels with autogroup scheduling: the session's share
            assert autogroup.read_text().split()[-1] == str(min(19, base + 5))
