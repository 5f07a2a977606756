"""Run the decoder in a persistent, resource-limited, jailed child process: the parent.

A decoder is the most exposed code darkroom runs: its input comes from anyone with an
account. A segfault, a runaway allocation or a hang in it must kill a child, never the
worker. One `DecoderProcess` owns one child and reuses it across jobs of one owner. A job
of another owner gets a fresh child, so a compromised decoder never sees a second owner's
images; that child is forked by the slot's zygote (`darkroom.zygote`, itself started with
Popen so a threaded asyncio parent is never forked), which has imported libvips once, so
a fresh child costs a fork, not a Python and libvips start-up.

The child is also a jail (`darkroom/jail.py`, `docs/SECURITY.md`), and the parent trusts
nothing it answers: the frame is bounded (`darkroom.wire`), and a derivative is accepted
only as a well-formed WebP of the claimed size within the configured edge, with a
thumbhash of the right length (`darkroom.webp`). Anything else kills the child.

Failure mapping in the parent (`DecoderProcess.derive`):

* the child answered with a code          → that code (`DeriveError`)
* the time limit passed                   → child killed, `processing_timeout`
* `kill()` from another thread             → child killed, `Cancelled`
  (a `DeriveError` subclass with code `processing_failed`)
* the child died, by a signal or EOF,
  broke the protocol, or answered a
  derivative that is not one              → child killed, `processing_failed`
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
import io
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

from darkroom.decoder_child import ENVIRONMENT_NAMES, VIPS_THREADS, cpu_budget, cpu_lifetime
from darkroom.derive import OUT_OF_MEMORY, Derivative, Limits, check_size
from darkroom.errors import DeriveError, ErrorCode
from darkroom.jail import BY_DESIGN, PROTECTIONS, shield_parent
from darkroom.webp import InvalidDerivative, check_derivative, check_thumbhash, max_payload
from darkroom.wire import FRAME, HELLO, MAX_OUTPUT, ProtocolError, read_frame
from darkroom.zygote import EXIT, FDS, SPAWN

if TYPE_CHECKING:
    from darkroom.config import Settings

log = logging.getLogger("darkroom.sandbox")
# What the child answers when an allocation failed (see derive.py and decoder_child.py).
# What a decoder may say about an image; the other codes are the worker's to give.
_DECODER_CODES = frozenset({ErrorCode.UNSUPPORTED_FORMAT, ErrorCode.INVALID_IMAGE,
                            ErrorCode.IMAGE_TOO_LARGE, ErrorCode.PROCESSING_FAILED})
_SIGNAL_NUMBERS = frozenset(int(number) for number in signal.Signals)
# A child between jobs computes next to nothing (its parent watch wakes twice a second):
# more than this much CPU since its last answer, checked this often, retires it.
_IDLE_CPU_SECONDS = 1.0
_IDLE_CHECK_SECONDS = 2.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
_cpu_budget = cpu_budget
_cpu_lifetime = cpu_lifetime
# A child says which process decodes (`darkroom.wire.HELLO`) once Python has started,
# before its slow imports.
_HELLO_SECONDS = 30.0
# How long a child whose decoder closed the pipe has to exit before it is killed.
_EXIT_SECONDS = 1.0


@dataclass(frozen=True)
class ChildProgram:
    """Which program a decoder child runs: `python -m MODULE` with the parent's arguments,
    then `-- ARGS`. The module must serve through `darkroom.decoder_child.main`, so it is
    jailed exactly as the decoder is. The product runs `DECODER`; the test suite gives
    `DecoderProcess` and `Worker` its own programs (hostile decoders, hangs)."""

    module: str
    args: tuple[str, ...] = ()


DECODER = ChildProgram("darkroom.decoder_child")

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


# How a child's malloc gets its memory. A fresh child per owner (`darkroom.zygote`) starts
# with nothing to reuse, and on a virtual machine each 4 KiB page a job first touches
# costs a fault of a few microseconds: about 40 MB per photo, more than the fork and the
# jail together. So a job's buffers come from the heap (`mmap_threshold` 32 MiB, glibc's
# own ceiling, rather than a fresh mapping each), the heap grows in steps of 16 MiB and is
# never given back while the child lives (`top_pad`, `trim_threshold`), and it is asked to
# be backed by transparent huge pages (`hugetlb=1`, madvise), one fault per 2 MiB where the
# kernel has them. A child's memory stays bounded by its RLIMIT_AS, and it ends with its
# owner's jobs.
MALLOC_TUNABLES = ":".join((
    "glibc.malloc.hugetlb=1",
    f"glibc.malloc.mmap_threshold={32 << 20}",
    f"glibc.malloc.top_pad={16 << 20}",
    f"glibc.malloc.trim_threshold={256 << 20}",
))


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
        "GLIBC_TUNABLES": MALLOC_TUNABLES,
        "VIPS_BLOCK_UNTRUSTED": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p
        ),
        # The child cannot write anywhere, and must not try.
        "PYTHONDONTWRITEBYTECODE": "1",
        "LC_ALL": "C.UTF-8",
    }
    assert set(env) == ENVIRONMENT_NAMES
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
    # A child with the worker's uid that can read the worker's /proc could read its
    # environment and memory: then the worker itself becomes non-dumpable.
    exposed = not any(active.get(name) for name in (
        "mount_namespace_proc_hidden", "unprivileged_uid", "filesystem_closed"))
    fields["worker_not_dumpable"] = shield_parent() if exposed else False
    gaps = [name for name in missing if reasons.get(name) != BY_DESIGN.get(name)]
    return (logging.WARNING if gaps else logging.INFO), fields


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
            [sys.executable, "-m", DECODER.module, "--probe", str(memory_mb)],
            stdin=subprocess.DEVNULL, capture_output=True, env=child_environment(),
            cwd=_empty_dir(), close_fds=True, timeout=60, check=False,
        )
        report: dict[str, Any] = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return {"active": {}, "inactive_reasons": {"probe": type(exc).__name__}}
    return report


class Child(Protocol):
    """A decoder child, as `subprocess.Popen` or `_Forked` (a zygote's) presents it."""

    pid: int
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


class _Forked:
    """A child forked by the zygote: not the worker's child, so it is killed through its
    pidfd and its exit code comes from the zygote, on a pipe (`darkroom.zygote`)."""

    def __init__(self, pid: int, fds: list[int]) -> None:
        stdin, stdout, stderr, self._pidfd, self._exit = fds
        self.pid = pid
        self.stdin: IO[bytes] | None = os.fdopen(stdin, "wb")
        self.stdout: IO[bytes] | None = os.fdopen(stdout, "rb")
        self.stderr: IO[bytes] | None = os.fdopen(stderr, "rb")
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def kill(self) -> None:
        with self._lock:
            if self.returncode is None and self._pidfd >= 0:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def poll(self) -> int | None:
        return self._collect(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"decoder child {self.pid}", timeout or 0.0)
        return code

    def _collect(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            exit_fd = self._exit
        if not select.select([exit_fd], [], [], timeout)[0]:
            return None
        with self._lock:
            if self.returncode is None:
                raw = os.read(self._exit, EXIT.size)
                # No code: the zygote died first; the child died with it (its init's
                # parent-death signal), as if killed.
                self.returncode = EXIT.unpack(raw)[0] if len(raw) == EXIT.size else -9
                os.close(self._exit)
                os.close(self._pidfd)
                self._pidfd = -1
            return self.returncode


class _Zygote:
    """The fork server of one `DecoderProcess` (`darkroom.zygote`)."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self._control, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                argv, stdin=theirs.fileno(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                env=child_environment(), cwd=_empty_dir(), close_fds=True,
                start_new_session=True,
            )
        finally:
            theirs.close()
        threading.Thread(target=_drain_stderr, args=(self._proc,),
                         name=f"decoder-zygote-{self._proc.pid}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def fork(self) -> _Forked:
        self._control.sendall(SPAWN)
        ready, _, _ = select.select([self._control], [], [], _HELLO_SECONDS)
        if not ready:
            raise OSError("zygote did not answer")
        message, fds, _, _ = socket.recv_fds(self._control, 32, FDS)
        if len(fds) != FDS or not message:
            for fd in fds:
                os.close(fd)
            raise OSError("zygote did not fork")
        # The zygote names it as its PID namespace does; the worker's logs want the host's.
        return _Forked(_pidfd_pid(fds[3]) or int(message), fds)

    def close(self) -> None:
        """EOF on its control socket: the zygote reaps its children and exits."""
        self._control.close()
        try:
            self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _pidfd_pid(pidfd: int) -> int | None:
    """The pid a pidfd stands for, as this process's PID namespace sees it."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines():
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                return pid if pid > 0 else None  # -1: it has ended
    return None


class _UsedChildBlamedTheFile(Exception):
    """A child that had run jobs before answered `invalid_image`: ask a fresh one."""


class Cancelled(DeriveError):
    """The in-flight derive was cancelled by `DecoderProcess.kill()`."""

    def __init__(self, detail: str = "cancelled") -> None:
        super().__init__(ErrorCode.PROCESSING_FAILED, detail)


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
        program: ChildProgram = DECODER,
        zygote: bool = True,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.limits = limits
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.nice = nice
        # Only the benchmark turns this off, to measure what the jail costs.
        self.jail = jail
        self.program = program
        # A fresh child per owner is a fork of a zygote that has done the imports
        # (`darkroom.zygote`); off, every child is a Python start-up of its own (the
        # benchmark compares both).
        self.use_zygote = zygote
        self._cpu_budget = _cpu_budget(timeout)
        self._limits_json = json.dumps(dataclasses.asdict(limits)).encode()
        # The largest answer a working child can give: `darkroom.webp`'s bound on each image.
        self._max_payload = min(MAX_OUTPUT, max_payload(limits.max_edge)
                                + max_payload(limits.thumb_edge))
        self._job_lock = threading.Lock()  # one request on the pipe at a time
        self._lock = threading.Lock()  # guards every field below
        self._proc: Child | None = None
        # The decoding process of `_proc`, as the host names it: `_proc` itself (a fork of
        # the slot's init), or the PID 2 of the PID namespace `_proc` made on its own.
        self._decoder_pid: int | None = None
        # A pidfd of the decoding process: what a kill signals (`_retire_locked`).
        self._decoder_fd: int | None = None
        self._retired: list[Child] = []
        self._zygote: _Zygote | None = None
        self._job = 0  # id of the in-flight job, 0 when idle
        self._next_job = 0
        self._kill_reason: str | None = None
        self._closed = False
        # Whose images the current child has seen (None: no owner named, one trust domain).
        self._owner: str | None = None
        # Whether the current child has been sent an image (then it belongs to `_owner`).
        self._fed = False
        # Wall seconds of the last job's steps, for the worker's stage histogram: `spawn`
        # (a fresh child, when one was needed), `send` (the image down the pipe), `decode`
        # (the child's work, until its answer starts), `receive` (the answer up the pipe)
        # and `check` (`darkroom.webp`'s reading of it).
        self.last_stages: dict[str, float] = {}

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
        """The pid (on the host) of the current child's decoding process, if one is running
        (for monitoring and tests). Killing it is a failed job, as any crash is."""
        with self._lock:
            return self._decoder_pid if self._proc is not None else None

    @property
    def zygote_pid(self) -> int | None:
        """The pid of the fork server this slot's children come from, if one runs."""
        with self._lock:
            return self._zygote.pid if self._zygote is not None else None

    @property
    def owner(self) -> str | None:
        """Whose images the current child has decoded (None: nobody's yet, or no owner
        named). `derive()` for another owner replaces the child first."""
        with self._lock:
            return self._owner if self._proc is not None else None

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
            if self._job:
                self._kill_reason = "cancelled"
                self._retire_locked()
            proc, self._proc = self._proc, None
            decoder, self._decoder_fd, self._decoder_pid = self._decoder_fd, None, None
            if decoder is not None:
                os.close(decoder)
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
            zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()

    def _argv(self, *flags: str) -> list[str]:
        argv = [sys.executable, "-m", self.program.module, str(self.memory_mb), str(self.nice),
                str(self._cpu_budget), *flags]
        if not self.jail:
            argv.append("--no-jail")
        if self.program.args:
            argv += ["--", *self.program.args]
        return argv

    def _spawn(self) -> Child:
        proc: Child
        if self.use_zygote:
            argv = self._argv("--zygote")
            if self._zygote is not None and self._zygote.argv != argv:
                # Its program or limits were changed: its forks would be the old ones.
                self._zygote.close()
                self._zygote = None
            for attempt in range(2):  # a zygote that died is replaced once
                if self._zygote is None:
                    self._zygote = _Zygote(argv)
                try:
                    proc = self._zygote.fork()
                    break
                except OSError:
                    self._zygote.close()
                    self._zygote = None
                    if attempt:
                        raise
        else:
            proc = self._popen()
        threading.Thread(
            target=_drain_stderr, args=(proc,), name=f"decoder-stderr-{proc.pid}", daemon=True
        ).start()
        return proc

    def _popen(self) -> Child:
        argv = self._argv()
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
        return proc

    def _hello(self, proc: Child) -> int:
        """The decoding process's pid, as the child says first (`darkroom.wire.HELLO`)."""
        stdout = proc.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], _HELLO_SECONDS)
        raw = stdout.read(HELLO.size) if ready else b""
        if len(raw) != HELLO.size:
            self._retired.append(proc)
            with contextlib.suppress(OSError):
                proc.kill()
            raise OSError("no hello from the decoder child")
        (pid,) = HELLO.unpack(raw)
        return int(pid)

    def _ensure_child_locked(self) -> Child:
        if self._closed:
            raise DeriveError(ErrorCode.PROCESSING_FAILED, "decoder process closed")
        self._reap_locked(block=False)
        if self._proc is not None and (
            self._proc.poll() is not None
            # Replaced before its hard RLIMIT_CPU could end it in the middle of a job.
            or _child_cpu_seconds(self._decoder_pid or self._proc.pid)
            > _cpu_lifetime(self._cpu_budget) - self._cpu_budget
        ):
            self._retire_locked()
        if self._proc is None:
            try:
                proc = self._spawn()
                self._decoder_pid = self._hello(proc)
                with contextlib.suppress(OSError):
                    self._decoder_fd = os.pidfd_open(self._decoder_pid)
                self._proc = proc
            except OSError as exc:
                log.error("cannot start decoder child: %s", exc)
                raise DeriveError(ErrorCode.PROCESSING_FAILED, "spawn failed") from None
        return self._proc

    def _retire_locked(self) -> None:
        """Kill the current child and forget it; it is reaped later, never reused."""
        proc, self._proc = self._proc, None
        self._fed = False
        decoder, self._decoder_fd, self._decoder_pid = self._decoder_fd, None, None
        if decoder is not None:
            # The decoder itself, not a child's first process: its init reaps it (and a
            # first process ends as it did), so everything exits in order and its CPU
            # time is accounted to the worker's children.
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(decoder, signal.SIGKILL)
            os.close(decoder)
        elif proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
        if proc is not None:
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
    def _close_pipes(proc: Child) -> None:
        # stderr belongs to its drain thread, which closes it at EOF.
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _watch_idle_locked(self, proc: Child, job: int,
                           cpu_at_end: float) -> None:
        """Check now and then, until its next job, that a child between jobs stays idle.

        The job's time limit and CPU budget end with its answer; a compromised child can
        go on computing in a thread of its own (ignoring SIGXCPU, its soft CPU limit raised
        to the hard one) while its slot looks idle. Such a child is retired.
        """
        watch = threading.Timer(_IDLE_CHECK_SECONDS, self._check_idle,
                                args=(proc, job, cpu_at_end))
        watch.daemon = True
        watch.start()

    def _check_idle(self, proc: Child, job: int, cpu_at_end: float) -> None:
        with self._lock:
            if (self._proc is not proc or self._job or self._next_job != job
                    or proc.poll() is not None):
                return  # retired, ended, or a later job started: its own watch follows it
            used = _child_cpu_seconds(self._decoder_pid or proc.pid) - cpu_at_end
            if used <= _IDLE_CPU_SECONDS:
                self._watch_idle_locked(proc, job, cpu_at_end)
                return
            self._retire_locked()
        log.warning("decoder child used %.1fs of CPU between jobs; killed", used,
                    extra={"child_pid": proc.pid})

    def _on_timeout(self, job: int) -> None:
        with self._lock:
            if self._job == job:
                self._kill_reason = "timeout"
                self._retire_locked()

    # -- the job -----------------------------------------------------------------------

    def derive(self, data: bytes, *, owner: str | None = None) -> Derivative:
        """Derive in the child. Blocking; raises `DeriveError` (or `Cancelled`).

        `owner` names whose image this is: a child that has decoded another owner's image
        is replaced first, so a compromised decoder never sees two owners' files.
        """
        # The byte limit and the sniff need no decoder, so they are safe here, and an
        # oversized upload must not be copied into the child (nor count against its
        # address-space limit, which would turn image_too_large into a crash).
        check_size(data, self.limits)
        with self._job_lock:
            try:
                return self._derive_locked(data, owner)
            except _UsedChildBlamedTheFile:
                # A child that had run jobs before blamed the file: its heap, kept from
                # those jobs, may be what failed (a decoder out of address space does not
                # always say so). Only a fresh child's verdict on the file stands.
                return self._derive_locked(data, owner)

    def _derive_locked(self, data: bytes, owner: str | None) -> Derivative:
        started = time.perf_counter()
        self.last_stages = stages = {}
        with self._lock:
            if owner != self._owner:
                if self._fed:
                    # It has decoded another owner's image. A child that has decoded
                    # nothing yet (started ahead: `start()`, or after a retirement)
                    # holds nobody's bytes and takes the owner without a fork.
                    self._retire_locked()
                self._owner = owner
            proc = self._ensure_child_locked()
            used = self._fed
            self._fed = True
            self._next_job += 1
            job = self._job = self._next_job
            self._kill_reason = None
        stages["spawn"] = time.perf_counter() - started
        timer = threading.Timer(self.timeout, self._on_timeout, args=(job,))
        timer.daemon = True
        timer.start()
        try:
            meta, payload = self._exchange(proc, data, stages)
        except ProtocolError as exc:
            with self._lock:
                reason = self._kill_reason
            if reason is None:
                # The decoder died by itself: its exit code (the slot's init reports
                # it, or its first process ends by the same signal) comes a moment
                # after the pipe's EOF. Killed first, it would say SIGKILL instead.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=_EXIT_SECONDS)
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
                if self._proc is proc:
                    self._watch_idle_locked(
                        proc, job, _child_cpu_seconds(self._decoder_pid or proc.pid))
        try:
            checked = time.perf_counter()
            result = self._result(meta, payload)
            stages["check"] = time.perf_counter() - checked
            return result
        except DeriveError as exc:
            blamed = used and exc.code == ErrorCode.INVALID_IMAGE
            if blamed or exc.detail == OUT_OF_MEMORY:
                # A heap that ran out is left fragmented: the next job, however small,
                # could run out too. And a used child that blamed the file is asked again
                # fresh (`derive`). Either way the next job gets a fresh child.
                with self._lock:
                    if self._proc is proc:
                        self._retire_locked()
            if blamed:
                raise _UsedChildBlamedTheFile from None
            raise
        except InvalidDerivative as exc:
            # Not what a working decoder answers: the child is compromised or broken,
            # and is never asked again.
            with self._lock:
                if self._proc is proc:
                    self._retire_locked()
            log.warning("decoder child answered an invalid derivative: %s", exc)
            raise DeriveError(ErrorCode.PROCESSING_FAILED, "invalid child output") from None

    def _exchange(
        self, proc: Child, data: bytes, stages: dict[str, float]
    ) -> tuple[dict[str, Any], bytes]:
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None
        try:
            started = time.perf_counter()
            stdin.write(FRAME.pack(len(self._limits_json), len(data)))
            stdin.write(self._limits_json)
            stdin.write(data)
            stdin.flush()
            sent = time.perf_counter()
            stages["send"] = sent - started
            # The answer's first bytes end the child's work; the rest is the copy up.
            cast(io.BufferedReader, stdout).peek(1)
            answered = time.perf_counter()
            stages["decode"] = answered - sent
            frame = read_frame(stdout, self._max_payload)
            stages["receive"] = time.perf_counter() - answered
            return frame
        except (OSError, ValueError) as exc:
            # EPIPE, EBADF after a concurrent kill.
            raise ProtocolError(f"{type(exc).__name__}: {exc}") from None

    def _failure(
        self, proc: Child, reason: str | None, detail: str
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
            # A real-time signal (the child may send itself any) has no name.
            name = signal.Signals(-code).name if -code in _SIGNAL_NUMBERS else str(-code)
            detail = f"child killed by {name}"
        elif code is not None:
            detail = f"child exited {code} ({detail})"
        log.warning("decoder child failed: %s", detail)
        return DeriveError(ErrorCode.PROCESSING_FAILED, detail)

    def _result(self, meta: dict[str, Any], payload: bytes) -> Derivative:
        if "error_code" in meta:
            name, detail = meta["error_code"], meta.get("detail", "")
            if not isinstance(name, str) or not isinstance(detail, str):
                raise InvalidDerivative("error answer types")
            if name not in _DECODER_CODES:
                # Storage, the clock, the queue: a decoder that blames them is lying.
                raise InvalidDerivative("an error code no decoder answers")
            raise DeriveError(ErrorCode(name), detail[:500])
        # Every field checked before anything is kept: a child that answers anything but a
        # derivative this parent could have asked for is treated as compromised.
        try:
            thumb_meta = meta["thumb"]
            size = int(thumb_meta["bytes"])
            if not 0 < size < len(payload):
                raise InvalidDerivative("thumb size")
            preview_data, thumb_data = payload[:-size], payload[-size:]
            preview = check_derivative(preview_data, meta, self.limits.max_edge)
            thumb = check_derivative(thumb_data, thumb_meta, self.limits.thumb_edge)
            thumbhash = check_thumbhash(meta["thumbhash"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidDerivative(f"meta: {type(exc).__name__}") from None
        return Derivative(data=preview_data, width=preview.width, height=preview.height,
                          sha256=preview.sha256, thumbhash=thumbhash,
                          thumb=Derivative(data=thumb_data, width=thumb.width,
                                           height=thumb.height, sha256=thumb.sha256))


# A child's stderr lines reach the worker's log, a compromised child's as fast as the pipe
# goes: the log keeps a burst of them, then one a second, and counts the rest unread.
_STDERR_BURST = 100
_STDERR_LINES_PER_SECOND = 1.0


def _drain_stderr(proc: Child) -> None:
    """Forward the child's stderr lines to the worker's log until the child is gone, within
    `_STDERR_BURST` lines and `_STDERR_LINES_PER_SECOND` after; say how many were dropped."""
    stream = proc.stderr
    assert stream is not None
    child_log = logging.getLogger("darkroom.sandbox.child")
    tokens, last, dropped = float(_STDERR_BURST), time.monotonic(), 0
    with contextlib.suppress(OSError, ValueError), stream:
        while True:
            now = time.monotonic()
            tokens = min(_STDERR_BURST, tokens + (now - last) * _STDERR_LINES_PER_SECOND)
            last = now
            if tokens < 1:
                # Over budget: read in bulk and only count, so a flood costs the worker
                # one read per pipe-full rather than a log record per line.
                chunk = cast(io.BufferedReader, stream).read1(65536)
                if not chunk:
                    break
                dropped += chunk.count(b"\n")
                continue
            raw = stream.readline(4096)
            if not raw:
                break
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                tokens -= 1
                child_log.warning("%s", line, extra={"child_pid": proc.pid})
    if dropped:
        child_log.warning("decoder child wrote too much to stderr: %d lines dropped", dropped,
                          extra={"child_pid": proc.pid, "dropped": dropped})


def cli(path: str, out: str | None, settings: Settings) -> int:
    """`darkroom derive IN [-o OUT]`: the production child-process path on one file."""
    limits = Limits.from_settings(settings)

    def fail(code: ErrorCode) -> int:
        print(json.dumps({"error_code": str(code)}))
        return 1

    source = Path(path)
    try:
        # Refuse by size before reading, so a huge file is never pulled into memory.
        if source.stat().st_size > limits.max_bytes:
            return fail(ErrorCode.IMAGE_TOO_LARGE)
        data = source.read_bytes()
    except OSError as exc:
        print(f"darkroom derive: cannot read input: {exc.strerror}", file=sys.stderr)
        return fail(ErrorCode.ORIGINAL_MISSING)
    try:
        with DecoderProcess(
            limits,
            timeout=settings.derive_timeout_seconds,
            memory_mb=settings.derive_memory_mb,
        ) as proc:
            result = proc.derive(data)
    except DeriveError as exc:
        log.info("derive %s failed: %s", path, exc)
        return fail(exc.code)
    if out is not None:
        try:
            Path(out).write_bytes(result.data)
        except OSError as exc:
            print(f"darkroom derive: cannot write output: {exc.strerror}", file=sys.stderr)
            return fail(ErrorCode.PROCESSING_FAILED)
    print(
        json.dumps(
            {
                "width": result.width,
                "height": result.height,
                "bytes": result.size,
                "sha256": result.sha256,
            }
        )
    )
    return 0
