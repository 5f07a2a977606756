"""Run `darkroom.derive.derive` in a persistent, resource-limited child process.

A decoder is the most exposed code darkroom runs: its input comes from anyone with an
account. A segfault, a runaway allocation or a hang in it must kill a child, never the
worker. One `DecoderProcess` owns one child (`python -m darkroom.sandbox`, started with
Popen rather than fork so a threaded asyncio parent is never forked) and reuses it across
jobs, because starting Python and libvips per image would cost more than many decodes.

The child is also a jail (`darkroom/jail.py`, `docs/SECURITY.md`): it starts with an
empty environment, an empty working directory and only its three pipes, and before its
first image it enters its own network and mount namespaces, drops root, sets its
resource limits, `no_new_privs` and a seccomp allow-list. A compromised decoder holds no
secret and can reach nothing; what it tries ends, like a crash, in an error code.

Wire protocol over the child's stdin/stdout, one request and one response at a time:

    request:  !II (json length, image length) + JSON limits + image bytes
    response: !II (json length, webp length)  + JSON meta   + webp bytes

The JSON meta is `{"width", "height", "sha256", "thumb", "thumbhash"}` or
`{"error_code", "detail"}`; `thumb` is `{"width", "height", "sha256", "bytes"}`, and the
payload is the preview's WebP followed by the thumb's (its last `thumb.bytes` bytes).

Failure mapping in the parent (`DecoderProcess.derive`):

* the child answered with a code          → that code (`DeriveError`)
* the time limit passed                   → child killed, `processing_timeout`
* `kill()` from another thread             → child killed, `Cancelled`
  (a `DeriveError` subclass with code `processing_failed`)
* the child died, by a signal or EOF,
  or broke the protocol                    → `processing_failed`
* memory exhaustion under RLIMIT_AS        → `processing_failed`: the header limits
  already bound what a valid image may need, so running out is the decoder's or the
  configuration's fault, not something the uploader can fix. When the allocation fails
  cleanly the child answers it; when glib aborts instead, the child dies — same code.

The child restarts transparently on the next `derive()` after any of these.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import math
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any, BinaryIO

from darkroom.derive import Derivative, Limits, check_size
from darkroom.errors import DeriveError, ErrorCode
from darkroom.jail import (
    BY_DESIGN,
    PROTECTIONS,
    Jail,
    enter_namespaces,
    lock_down,
    per_job_cpu,
    shield_parent,
)

log = logging.getLogger("darkroom.sandbox")
# What the child answers when an allocation failed (see derive.py and _child_main).
_OUT_OF_MEMORY = frozenset({"oom", "out of memory"})

_FRAME = struct.Struct("!II")
# Bounds on what either side accepts, so a confused peer cannot make us allocate wildly.
_MAX_META = 64 * 1024
_MAX_OUTPUT = 256 * 1024 * 1024
# Only tests set this: the child then hangs forever on each job, announced by one byte
# written to the named path. A FIFO (the test blocks reading it instead of sleeping) is
# opened by the child before it locks down and written when the job arrives; any other
# path is created by the parent once the job is on the child's pipe, because the jailed
# child may not create files.
TEST_HANG_ENV = "DARKROOM_SANDBOX_TEST_HANG"
# Only tests set this: instead of decoding, the child plays a compromised decoder and
# tries the named attack (see `_hostile`), answering what happened as the detail.
TEST_HOSTILE_ENV = "DARKROOM_SANDBOX_TEST_HOSTILE"
_TEST_ENVS = (
    TEST_HANG_ENV, TEST_HOSTILE_ENV, TEST_HOSTILE_ENV + "_PORT", TEST_HOSTILE_ENV + "_PATH"
)
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
# A child is replaced before it has used this much CPU in all (its hard RLIMIT_CPU), or
# ten jobs' worth when jobs may take longer.
CPU_LIFETIME_SECONDS = 3_600
# libvips threads in a child. The worker's parallelism is its number of children (one per
# slot), each decoding on one core; a single thread also keeps the jail's thread count and
# a job's CPU budget small.
VIPS_THREADS = 1
_EMPTY_DIR: str | None = None
_EMPTY_DIR_LOCK = threading.Lock()


def _empty_dir() -> str:
    """One empty directory per worker process, the children's working directory.

    Mode 0111: a child may stand in it but neither list nor create anything there.
    """
    global _EMPTY_DIR
    with _EMPTY_DIR_LOCK:
        if _EMPTY_DIR is None or not os.path.isdir(_EMPTY_DIR):
            _remove_stale_dirs()
            path = tempfile.mkdtemp(prefix=f"darkroom-decoder-{os.getpid()}-")
            os.chmod(path, 0o111)
            atexit.register(_remove_dir, path)
            _EMPTY_DIR = path
        return _EMPTY_DIR


def _remove_stale_dirs() -> None:
    """Remove the empty directories of workers that died without cleaning up (kill -9)."""
    for path in Path(tempfile.gettempdir()).glob("darkroom-decoder-*-*"):
        pid = path.name.split("-")[2]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        with contextlib.suppress(OSError):
            if path.lstat().st_uid == os.getuid():
                path.rmdir()  # only ever removes an empty directory


def _remove_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def child_environment() -> dict[str, str]:
    """The whole environment a decoder child gets: what Python and libvips read, no more.

    Never a copy of the worker's: that holds the database URL and the store's keys.
    """
    env = {
        # Set before the child starts: glibc reads MALLOC_ARENA_MAX at startup and
        # libvips reads VIPS_CONCURRENCY when it initialises. Few arenas and threads
        # keep the reserved address space small, so RLIMIT_AS bites only on real use.
        "VIPS_CONCURRENCY": str(VIPS_THREADS),
        "MALLOC_ARENA_MAX": "2",
        "VIPS_BLOCK_UNTRUSTED": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p
        ),
        # The child cannot write anywhere, and must not try.
        "PYTHONDONTWRITEBYTECODE": "1",
        "LC_ALL": "C.UTF-8",
    }
    for name in _TEST_ENVS:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def jail_log_fields(memory_mb: int = 1024) -> tuple[int, dict[str, Any]]:
    """The worker's one start-up line about the jail: log level and structured fields.
    Call it from the worker process itself: it may make that process non-dumpable.

    One boolean field per protection, plus `inactive` naming each missing one and why.
    WARNING when a protection is missing for any reason but a by-design one.
    """
    report = probe_jail(memory_mb)
    active: dict[str, bool] = report.get("active", {})
    reasons: dict[str, str] = report.get("inactive_reasons", {})
    fields: dict[str, Any] = {f"jail_{name}": bool(active.get(name)) for name in PROTECTIONS}
    missing = [name for name in PROTECTIONS if not active.get(name)]
    fields["inactive"] = "; ".join(f"{name}: {reasons.get(name, 'unknown')}" for name in missing)
    # A child with the worker's uid that can see the worker's /proc could read its
    # environment and memory: then the worker itself becomes non-dumpable.
    exposed = not active.get("mount_namespace_proc_hidden") and not active.get(
        "unprivileged_uid")
    fields["worker_not_dumpable"] = shield_parent() if exposed else False
    gaps = [name for name in missing if reasons.get(name) != BY_DESIGN.get(name)]
    return (logging.WARNING if gaps else logging.INFO), fields


def _is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _cpu_budget(timeout: float) -> int:
    """CPU seconds one job may use: its wall-clock limit on every libvips thread."""
    return math.ceil(timeout * VIPS_THREADS) + 1


def _cpu_lifetime(budget: int) -> int:
    return max(CPU_LIFETIME_SECONDS, 10 * budget)


def _child_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def probe_jail(memory_mb: int = 1024) -> dict[str, Any]:
    """Jail a throwaway child exactly as a decoder child and return what took effect.

    The worker logs this once at start. The probe skips libvips, so it costs a Python
    start-up, not a decoder's.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-m", "darkroom.sandbox", "--probe", str(memory_mb)],
            stdin=subprocess.DEVNULL, capture_output=True, env=child_environment(),
            cwd=_empty_dir(), close_fds=True, timeout=60, check=False,
        )
        report: dict[str, Any] = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return {"active": {}, "inactive_reasons": {"probe": type(exc).__name__}}
    return report


class Cancelled(DeriveError):
    """The in-flight derive was cancelled by `DecoderProcess.kill()`."""

    def __init__(self, detail: str = "cancelled") -> None:
        super().__init__(ErrorCode.PROCESSING_FAILED, detail)


class _ChildGone(Exception):
    """The pipe to the child broke or closed mid-frame."""


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size) if size else b""
    if len(data) != size:
        raise _ChildGone(f"short read: {len(data)} of {size}")
    return data


class DecoderProcess:
    """One persistent decoder child. `derive()` is blocking; run it in a thread.

    `derive()` calls are serialised; `kill()` and `close()` may be called from any
    thread at any time. A `kill()` while no derive is running just retires the current
    child; the next derive starts a fresh one and is not affected.
    """

    def __init__(
        self,
        limits: Limits,
        *,
        timeout: float,
        memory_mb: int,
        nice: int = 0,
        jail: bool = True,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.limits = limits
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.nice = nice
        # Only the benchmark turns this off, to measure what the jail costs.
        self.jail = jail
        self._cpu_budget = _cpu_budget(timeout)
        self._hang_path: str | None = None
        self._limits_json = json.dumps(dataclasses.asdict(limits)).encode()
        self._job_lock = threading.Lock()  # one request on the pipe at a time
        self._lock = threading.Lock()  # guards every field below
        self._proc: subprocess.Popen[bytes] | None = None
        self._retired: list[subprocess.Popen[bytes]] = []
        self._job = 0  # id of the in-flight job, 0 when idle
        self._next_job = 0
        self._kill_reason: str | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> DecoderProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The current child's pid, if one is running (for monitoring and tests)."""
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the child now rather than on the first derive (pays the spawn early)."""
        with self._lock:
            self._ensure_child_locked()

    def kill(self) -> None:
        """SIGKILL the child; an in-flight `derive()` raises `Cancelled`. Thread-safe."""
        with self._lock:
            if self._job:
                self._kill_reason = "cancelled"
            self._retire_locked()

    def close(self) -> None:
        """Stop the child for good: EOF lets an idle child exit by itself."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
            if proc is not None and self._job:
                self._kill_reason = "cancelled"
                proc.kill()
        if proc is not None:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._close_pipes(proc)
        with self._lock:
            self._reap_locked(block=True)

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._hang_path = os.environ.get(TEST_HANG_ENV)
        argv = [sys.executable, "-m", "darkroom.sandbox", str(self.memory_mb), str(self.nice),
                str(self._cpu_budget)]
        if not self.jail:
            argv.append("--no-jail")
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # A pipe of our own, drained into the worker's log: the child may not write
            # files (RLIMIT_FSIZE 0), and the worker's stderr may be one.
            stderr=subprocess.PIPE,
            env=child_environment(),
            cwd=_empty_dir(),
            close_fds=True,
            # Its own session: a terminal's Ctrl-C goes to the worker, which decides.
            start_new_session=True,
        )
        threading.Thread(
            target=_drain_stderr, args=(proc,), name=f"decoder-stderr-{proc.pid}", daemon=True
        ).start()
        return proc

    def _ensure_child_locked(self) -> subprocess.Popen[bytes]:
        if self._closed:
            raise DeriveError(ErrorCode.PROCESSING_FAILED, "decoder process closed")
        self._reap_locked(block=False)
        if self._proc is not None and (
            self._proc.poll() is not None
            # Replaced before its hard RLIMIT_CPU could end it in the middle of a job.
            or _child_cpu_seconds(self._proc.pid)
            > _cpu_lifetime(self._cpu_budget) - self._cpu_budget
        ):
            self._retire_locked()
        if self._proc is None:
            try:
                self._proc = self._spawn()
            except OSError as exc:
                log.error("cannot start decoder child: %s", exc)
                raise DeriveError(ErrorCode.PROCESSING_FAILED, "spawn failed") from None
        return self._proc

    def _retire_locked(self) -> None:
        """Kill the current child and forget it; it is reaped later, never reused."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
            self._retired.append(proc)

    def _reap_locked(self, *, block: bool) -> None:
        alive = []
        for proc in self._retired:
            if block:
                proc.wait()
            if proc.poll() is None:
                alive.append(proc)
            else:
                self._close_pipes(proc)
        self._retired = alive

    @staticmethod
    def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
        # stderr belongs to its drain thread, which closes it at EOF.
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _on_timeout(self, job: int) -> None:
        with self._lock:
            if self._job == job:
                self._kill_reason = "timeout"
                self._retire_locked()

    # -- the job -----------------------------------------------------------------------

    def derive(self, data: bytes) -> Derivative:
        """Derive in the child. Blocking; raises `DeriveError` (or `Cancelled`)."""
        # The byte limit and the sniff need no decoder, so they are safe here, and an
        # oversized upload must not be copied into the child (nor count against its
        # address-space limit, which would turn image_too_large into a crash).
        check_size(data, self.limits)
        with self._job_lock:
            with self._lock:
                proc = self._ensure_child_locked()
                self._next_job += 1
                job = self._job = self._next_job
                self._kill_reason = None
            timer = threading.Timer(self.timeout, self._on_timeout, args=(job,))
            timer.daemon = True
            timer.start()
            try:
                meta, payload = self._exchange(proc, data)
            except _ChildGone as exc:
                with self._lock:
                    self._job = 0
                    reason = self._kill_reason
                    if self._proc is proc:
                        self._retire_locked()
                raise self._failure(proc, reason, str(exc)) from None
            finally:
                timer.cancel()
                with self._lock:
                    self._job = 0
            if meta.get("detail") in _OUT_OF_MEMORY:
                # A heap that ran out is left fragmented: the next job, however small,
                # could run out too. It gets a fresh child.
                with self._lock:
                    if self._proc is proc:
                        self._retire_locked()
        return self._result(meta, payload)

    def _exchange(
        self, proc: subprocess.Popen[bytes], data: bytes
    ) -> tuple[dict[str, Any], bytes]:
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(_FRAME.pack(len(self._limits_json), len(data)))
            stdin.write(self._limits_json)
            stdin.write(data)
            stdin.flush()
            if self._hang_path and not _is_fifo(self._hang_path):
                with open(self._hang_path, "wb") as marker:
                    marker.write(b"1")
            meta_len, payload_len = _FRAME.unpack(_read_exact(stdout, _FRAME.size))
            if meta_len > _MAX_META or payload_len > _MAX_OUTPUT:
                raise _ChildGone(f"bad frame {meta_len}/{payload_len}")
            meta = json.loads(_read_exact(stdout, meta_len))
            payload = _read_exact(stdout, payload_len)
        except (OSError, ValueError) as exc:
            # EPIPE, EBADF after a concurrent kill, or undecodable JSON.
            raise _ChildGone(f"{type(exc).__name__}: {exc}") from None
        if not isinstance(meta, dict):
            raise _ChildGone("meta is not an object")
        return meta, payload

    def _failure(
        self, proc: subprocess.Popen[bytes], reason: str | None, detail: str
    ) -> DeriveError:
        try:
            # Reap now: the child was killed or has exited, so this returns at once,
            # and a dead child must not linger as a zombie until the next job.
            code = proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            code = None
        if reason == "cancelled":
            return Cancelled()
        if reason == "timeout":
            log.warning("decoder child exceeded %.1fs; killed", self.timeout)
            return DeriveError(ErrorCode.PROCESSING_TIMEOUT, f"over {self.timeout}s")
        if code is not None and code < 0:
            detail = f"child killed by {signal.Signals(-code).name}"
        elif code is not None:
            detail = f"child exited {code} ({detail})"
        log.warning("decoder child failed: %s", detail)
        return DeriveError(ErrorCode.PROCESSING_FAILED, detail)

    def _result(self, meta: dict[str, Any], payload: bytes) -> Derivative:
        if "error_code" in meta:
            try:
                code = ErrorCode(meta["error_code"])
            except ValueError:
                code = ErrorCode.PROCESSING_FAILED
            raise DeriveError(code, str(meta.get("detail", ""))[:500])
        thumb: Derivative | None = None
        thumbhash: str | None = None
        try:
            if "thumb" in meta:
                size = int(meta["thumb"]["bytes"])
                if not 0 < size < len(payload):
                    raise ValueError("thumb size")
                payload, thumb_data = payload[:-size], payload[-size:]
                thumb = self._checked(meta["thumb"], thumb_data)
                thumbhash = str(meta["thumbhash"])[:64]
            preview = self._checked(meta, payload)
        except (KeyError, TypeError, ValueError):
            raise DeriveError(ErrorCode.PROCESSING_FAILED, "bad child meta") from None
        return dataclasses.replace(preview, thumb=thumb, thumbhash=thumbhash)

    @staticmethod
    def _checked(meta: dict[str, Any], payload: bytes) -> Derivative:
        width, height = int(meta["width"]), int(meta["height"])
        digest = hashlib.sha256(payload).hexdigest()
        if digest != meta.get("sha256") or not payload:
            raise DeriveError(ErrorCode.PROCESSING_FAILED, "child output corrupt")
        return Derivative(data=payload, width=width, height=height, sha256=digest)


def _drain_stderr(proc: subprocess.Popen[bytes]) -> None:
    """Forward the child's stderr lines to the worker's log until the child is gone."""
    stream = proc.stderr
    assert stream is not None
    child_log = logging.getLogger("darkroom.sandbox.child")
    with contextlib.suppress(OSError, ValueError), stream:
        for raw in iter(lambda: stream.readline(4096), b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                child_log.warning("%s", line, extra={"child_pid": proc.pid})


# -- the child -------------------------------------------------------------------------


def _harden(memory_mb: int, nice: int) -> None:
    import resource

    # Decoding is throughput work: on a shared host the API's requests and the worker's
    # own heartbeats (in the parent, at normal priority) get the CPU first.
    if nice > 0:
        level = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        os.setpriority(os.PRIO_PROCESS, 0, level)
        # This child leads its own session, and with the kernel's autogroup scheduling a
        # session shares the CPU with the others as a whole, whatever its processes'
        # niceness: the group's own nice is what counts against the API's.
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(level), encoding="ascii")
    limit = memory_mb * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)  # an unprivileged process cannot raise its hard limit
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # The worker's own Ctrl-C handling decides when we stop; stdin EOF ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _watch_parent() -> None:
    """Exit if the worker dies, even while the main thread hangs inside a decoder.

    Not PR_SET_PDEATHSIG: Linux fires that when the *thread* that spawned us exits,
    and the worker spawns from short-lived `asyncio.to_thread` pool threads.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def _respond(out: BinaryIO, meta: dict[str, Any], payload: bytes = b"") -> None:
    encoded = json.dumps(meta).encode()
    out.write(_FRAME.pack(len(encoded), len(payload)))
    out.write(encoded)
    out.write(payload)
    out.flush()


def _start_jail(memory_mb: int, nice: int, jailed: bool) -> Jail:
    """Everything the child does before importing libvips (see `darkroom.jail`)."""
    jail = Jail()
    # Given by the parent (`DecoderProcess._spawn`): checked here so the report is true.
    if not set(os.environ) - {*child_environment(), *_TEST_ENVS}:
        jail.on("empty_environment")
    else:
        jail.off("empty_environment", "started with extra variables")
    # One more than the three pipes: the listing's own descriptor.
    if len(set(os.listdir("/proc/self/fd")) - {"0", "1", "2"}) <= 1:
        jail.on("pipes_only")
    else:
        jail.off("pipes_only", "inherited descriptors")
    # Mode 0111 from `_empty_dir`: nobody (and, once seccomp forbids chmod, not even its
    # owner) may list or create anything there. Root could, but root drops to nobody.
    try:
        listed = os.listdir(".")
    except PermissionError:
        listed = []  # its owner, not root: 0111 hides even the (empty) listing
    if not listed and not os.stat(".").st_mode & 0o222:
        jail.on("empty_working_directory")
    else:
        jail.off("empty_working_directory", "working directory not empty or writable")
    _harden(memory_mb, nice)
    if jailed:
        enter_namespaces(jail)
    else:
        for name in PROTECTIONS:
            jail.off(name, "jail disabled")
    return jail


def _child_main(memory_mb: int, nice: int = 0, cpu_seconds: int = 61,
                *, jailed: bool = True, probe: bool = False) -> int:
    jail = _start_jail(memory_mb, nice, jailed)
    # The protocol owns fd 1. Anything else that writes to stdout (a stray print, a
    # library message) is sent to stderr instead of corrupting a frame.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    logging.basicConfig(
        level=logging.WARNING, format="darkroom.sandbox[%(process)d] %(name)s: %(message)s"
    )

    if not probe:
        from darkroom.derive import derive, warm_up

        # Pay for libvips and thumbhash before the first job, not inside its time limit.
        warm_up()
    hang = bool(os.environ.get(TEST_HANG_ENV))
    hang_fd = None
    if hang and _is_fifo(os.environ[TEST_HANG_ENV]):
        # O_RDWR never blocks on a FIFO, and keeps the byte for a reader that comes later.
        hang_fd = os.open(os.environ[TEST_HANG_ENV], os.O_RDWR | os.O_NONBLOCK)
    hostile = os.environ.get(TEST_HOSTILE_ENV)
    _watch_parent()
    if jailed:
        lock_down(jail, cpu_seconds=cpu_seconds, cpu_lifetime_seconds=_cpu_lifetime(cpu_seconds),
                  threads=VIPS_THREADS,
                  extra_fds=(out.fileno(),) if hang_fd is None else (out.fileno(), hang_fd))
    if probe:
        _respond_raw(out, json.dumps(jail.report).encode())
        return 0

    while True:
        head = requests.read(_FRAME.size)
        if not head:
            return 0  # the parent closed our stdin: a clean stop
        try:
            if len(head) != _FRAME.size:
                raise _ChildGone("short header")
            meta_len, data_len = _FRAME.unpack(head)
            if meta_len > _MAX_META:
                raise _ChildGone("oversized limits")
            limits = Limits(**json.loads(_read_exact(requests, meta_len)))
            data = _read_exact(requests, data_len)
        except (_ChildGone, ValueError, TypeError) as exc:
            # Out of step with the parent: no way to resynchronise the stream.
            print(f"darkroom.sandbox: protocol error: {exc}", file=sys.stderr)
            return 2
        if hang:
            if hang_fd is not None:
                os.write(hang_fd, b"1")
            while True:
                signal.pause()
        if jailed:
            per_job_cpu(cpu_seconds)
        try:
            if hostile:
                raise DeriveError(ErrorCode.PROCESSING_FAILED, _hostile(hostile))
            result = derive(data, limits)
        except DeriveError as exc:
            reply: dict[str, Any] = {"error_code": str(exc.code), "detail": exc.detail}
            payload = b""
        except MemoryError:
            reply = {"error_code": str(ErrorCode.PROCESSING_FAILED), "detail": "oom"}
            payload = b""
        else:
            reply = {"width": result.width, "height": result.height, "sha256": result.sha256}
            payload = result.data
            if result.thumb is not None:
                reply["thumb"] = {"width": result.thumb.width, "height": result.thumb.height,
                                  "sha256": result.thumb.sha256, "bytes": result.thumb.size}
                reply["thumbhash"] = result.thumbhash
                payload += result.thumb.data
        del data
        try:
            _respond(out, reply, payload)
        except BrokenPipeError:
            return 0  # the parent went away (or killed this job's reader): nothing to do


def _respond_raw(out: BinaryIO, data: bytes) -> None:
    out.write(data)
    out.flush()


def _hostile(action: str) -> str:
    """Test only: what a compromised decoder would try. Returns what happened."""
    def attempt(what: str, call: Any) -> str:
        try:
            got = call()
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return f"{what}: refused ({name})"
        return f"{what}: done {got!r}"[:300]

    if action == "environ":
        own = ",".join(sorted(os.environ))
        parent = attempt(
            "parent environ", lambda: Path(f"/proc/{os.getppid()}/environ").read_bytes()
        )
        init = attempt("init environ", lambda: Path("/proc/1/environ").read_bytes())
        return f"own environ: {own}; {parent}; {init}"
    if action == "socket":
        port = int(os.environ.get(TEST_HOSTILE_ENV + "_PORT", "0"))

        def connect() -> str:
            with socket.socket() as sock:
                sock.connect(("127.0.0.1", port))
                return "connected"

        return attempt("socket", lambda: socket.socket().close()) + "; " + attempt(
            "connect", connect)
    if action == "write":
        target = os.environ.get(TEST_HOSTILE_ENV + "_PATH", "/tmp/darkroom-hostile")
        return attempt("write", lambda: Path(target).write_bytes(b"pwned")) + "; " + attempt(
            "write cwd", lambda: Path("pwned").write_bytes(b"pwned"))
    if action == "exec":
        target = os.environ.get(TEST_HOSTILE_ENV + "_PATH", "/tmp/darkroom-hostile")
        return attempt("exec", lambda: os.execv("/bin/sh", ["sh", "-c", f"echo > {target}"]))
    if action == "fork":
        def fork() -> int:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            return pid

        return attempt("fork", fork)
    if action == "ptrace":
        import ctypes  # already loaded by the jail, so importable after lock-down

        libc = ctypes.CDLL(None, use_errno=True)
        attached = libc.ptrace(16, os.getppid(), None, None)  # PTRACE_ATTACH the worker
        return f"ptrace: {'attached' if attached == 0 else 'refused'}"
    return f"unknown action {action}"


def _main(argv: list[str]) -> int:
    """`python -m darkroom.sandbox MEMORY_MB [NICE CPU_SECONDS] [--no-jail]`, or
    `--probe MEMORY_MB` for the jail report alone."""
    flags = {arg for arg in argv if arg.startswith("--")}
    numbers = [int(arg) for arg in argv if not arg.startswith("--")]
    if "--probe" in flags:
        memory_mb = [*numbers, 1024][0]
        return _child_main(memory_mb, 0, _cpu_budget(60), probe=True)
    memory_mb, nice, cpu_seconds = [*numbers, *[1024, 0, 61][len(numbers):]][:3]
    return _child_main(memory_mb, nice, cpu_seconds, jailed="--no-jail" not in flags)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
