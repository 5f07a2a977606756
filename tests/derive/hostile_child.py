"""Test-only decoder children: compromised or hanging decoders, run through the product's jail.

`python -m tests.derive.hostile_child MEMORY_MB NICE CPU -- ACTION [ARG...]`, started by
`DecoderProcess(program=hostile("ACTION", ...))`. It serves exactly as the production child
(`darkroom.decoder_child.main`: same namespaces, same lock-down, same protocol), but each
job runs ACTION instead of a decode: it plays a decoder that an image has taken over, and
answers what happened as the error detail, or answers a forged derivative.

Nothing in the product can start this module: only a test passes it as the child program.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import os
import signal
import socket
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from darkroom.decoder_child import decode_job, main
from darkroom.derive import Limits
from darkroom.errors import DeriveError, ErrorCode
from darkroom.jail import per_job_cpu
from darkroom.sandbox import ChildProgram

MODULE = "tests.derive.hostile_child"
_F_SETSIG = 10
_F_SETOWN = 8


def _is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def hostile(action: str, *args: str) -> ChildProgram:
    """The child program that runs `action` on every job."""
    return ChildProgram(MODULE, (action, *args))


def attempt(what: str, call: Callable[[], Any]) -> str:
    try:
        got = call()
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return f"{what}: refused ({name})"
    return f"{what}: done {got!r}"[:200]


def _connect(port: int) -> str:
    with socket.socket() as sock:
        sock.connect(("127.0.0.1", port))
        return "connected"


def _signal_0(pid: int) -> None:
    os.kill(pid, 0)


def _fork() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return pid


def _set_owner(victim: int) -> str:
    """Ask the kernel to send SIGKILL to `victim` when the worker reads our stderr."""
    steps = [
        attempt("F_SETOWN", lambda: fcntl.fcntl(2, _F_SETOWN, victim)),
        attempt("F_SETSIG", lambda: fcntl.fcntl(2, _F_SETSIG, signal.SIGKILL)),
        attempt("O_ASYNC", lambda: fcntl.fcntl(
            2, fcntl.F_SETFL, fcntl.fcntl(2, fcntl.F_GETFL) | os.O_ASYNC)),
    ]
    print("hostile: the worker reads this line", file=sys.stderr, flush=True)
    return "; ".join(steps)


def _mmap_exec() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    prot_rwx, map_private_anonymous = 7, 0x22
    address = libc.mmap(None, 4096, prot_rwx, map_private_anonymous, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    return "mapped"


def _mprotect_exec() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(8192)
    page = (ctypes.addressof(buffer) + 4095) & ~4095
    if libc.mprotect(ctypes.c_void_p(page), ctypes.c_size_t(4096), 7) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
    return "executable"


def _read(path: str) -> str:
    if os.path.isdir(path):
        return ",".join(sorted(os.listdir(path)))[:80]
    return Path(path).read_bytes()[:80].decode("latin-1")


def report(action: str, args: list[str]) -> str:
    """Try one attack; say what happened."""
    if action == "environ":
        own = ",".join(sorted(os.environ))
        return "; ".join([
            f"own environ: {own}",
            attempt("parent environ", lambda: Path(f"/proc/{os.getppid()}/environ").read_bytes()),
            attempt("init environ", lambda: Path("/proc/1/environ").read_bytes()),
        ])
    if action == "socket":
        return attempt("socket", lambda: socket.socket().close()) + "; " + attempt(
            "connect", lambda: _connect(int(args[0])))
    if action == "write":
        return attempt("write", lambda: Path(args[0]).write_bytes(b"pwned")) + "; " + attempt(
            "write cwd", lambda: Path("pwned").write_bytes(b"pwned"))
    if action == "exec":
        return attempt("exec", lambda: os.execv("/bin/sh", ["sh", "-c", f"echo > {args[0]}"]))
    if action == "fork":
        return attempt("fork", _fork)
    if action == "ptrace":
        libc = ctypes.CDLL(None, use_errno=True)
        attached = libc.ptrace(16, os.getppid(), None, None)  # PTRACE_ATTACH the worker
        return f"ptrace: {'attached' if attached == 0 else 'refused'}"
    if action == "kill":
        return "; ".join(attempt(f"kill {pid}", lambda p=int(pid): os.kill(p, signal.SIGKILL))  # type: ignore[misc]
                         for pid in args)
    if action == "setown":
        return _set_owner(int(args[0]))
    if action == "exec-memory":
        return attempt("mmap rwx", _mmap_exec) + "; " + attempt("mprotect rwx", _mprotect_exec)
    if action == "read":
        # By position: the parent bounds the detail, and paths are long.
        return "; ".join(attempt(f"read #{i}", lambda p=path: _read(p))  # type: ignore[misc]
                         for i, path in enumerate(args))
    if action == "o_path":  # a handle without read rights: still a path's metadata
        return "; ".join(attempt(f"O_PATH #{i}", lambda p=path: os.open(p, os.O_PATH))  # type: ignore[misc]
                         for i, path in enumerate(args))
    if action == "proc":
        return attempt("list /proc", lambda: len(os.listdir("/proc"))) + "; " + attempt(
            "parent status", lambda: Path(f"/proc/{os.getppid()}/status").read_text()[:40])
    return f"unknown action {action}"


def forged(kind: str, data: bytes, limits: Limits) -> tuple[dict[str, Any], bytes]:
    """A derivative that is not one, with a frame and sha256 the parent would accept."""
    meta, payload = decode_job(data, limits)
    thumb_size = meta["thumb"]["bytes"]
    preview, thumb = payload[:-thumb_size], payload[-thumb_size:]
    if kind == "file":  # another file passed off as the preview (here: the test's bytes)
        preview = b"-----BEGIN PRIVATE KEY-----\n" + bytes(4000)
    elif kind == "png":  # a real image, but not a WebP
        from darkroom.derive import _vips

        preview = _vips().Image.black(meta["width"], meta["height"]).pngsave_buffer()
    elif kind == "dimensions":  # a real WebP, claimed larger than it is
        meta["width"] += 1
    elif kind == "edge":  # a real WebP over the edge, honestly described
        from darkroom.derive import _vips

        big = _vips().Image.black(limits.max_edge + 1, 8).copy(interpretation="srgb")
        preview = big.webpsave_buffer(Q=80)
        meta["width"], meta["height"] = limits.max_edge + 1, 8
    elif kind == "padded":  # a real WebP carrying a payload far beyond its pixels
        extra = b"EXIF" + (len(preview) * 0 + 5_000_000).to_bytes(4, "little") + bytes(5_000_000)
        preview = preview[:4] + (len(preview) - 8 + len(extra)).to_bytes(4, "little") + \
            preview[8:] + extra
    elif kind == "oversized":  # more than any derivative within the edge could be
        preview = bytes(4 * (limits.max_edge ** 2 + limits.thumb_edge ** 2) + 10_000)
    elif kind == "thumbhash":
        meta["thumbhash"] = meta["thumbhash"] + "AAAA"
    else:
        raise DeriveError(ErrorCode.PROCESSING_FAILED, f"unknown forgery {kind}")
    meta["sha256"] = hashlib.sha256(preview).hexdigest()
    return meta, preview + thumb


def _parent_on_host(pid: int | None = None) -> int:
    # The host's /proc (not yet covered) names parents as the host does. None: our own.
    lines = Path(f"/proc/{'self' if pid is None else pid}/status").read_text()
    return int(next(line.split()[1] for line in lines.splitlines() if line.startswith("PPid:")))


def _open_mem(pid: int) -> str:
    with open(f"/proc/{pid}/mem", "rb"):
        return "opened"


def _leave_a_lurker() -> None:
    first = os.fork()
    if first:
        os.waitpid(first, 0)
        return
    if os.fork():
        os._exit(0)
    for fd in range(3):  # holding the worker's pipes would keep them open
        os.close(fd)
    while True:
        signal.pause()


def run(argv: list[str]) -> int:
    action, args = argv[argv.index("--") + 1], argv[argv.index("--") + 2:]
    fifo: list[int] = []
    seen: list[str] = []

    def prepare() -> tuple[int, ...]:
        if action == "pidns":
            # Before the lock-down, with the most it ever has: root (or its user
            # namespace's root), the host's /proc still mounted. Only the PID namespace
            # stands between it and the processes named in args.
            nspid = next(line for line in Path("/proc/self/status").read_text().splitlines()
                         if line.startswith("NSpid:"))
            seen.append(f"getpid {os.getpid()}; getppid {os.getppid()}; {nspid.split()}")
            for pid in map(int, args):
                seen.append(attempt(f"signal {pid}", functools.partial(_signal_0, pid)))
        if action == "peek":
            # Before the lock-down: the memory of the processes above it, the slot's init
            # (its parent) and the zygote (the init's), by their pids on the host.
            parent = _parent_on_host()
            for name, pid in (("init", parent), ("zygote", _parent_on_host(parent))):
                seen.append(attempt(f"{name} memory", functools.partial(_open_mem, pid)))
        if action == "linger":
            # Before the lock-down, while fork is still allowed: a process of its own that
            # the slot's init adopts, waiting for the next owner's child. Only the first
            # child of the test leaves one (it makes the file named in args).
            with contextlib.suppress(FileExistsError):
                os.close(os.open(args[0], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                _leave_a_lurker()
        # A hang announces each job on a FIFO the test blocks reading: opened now (O_RDWR
        # never blocks on a FIFO), before the jail closes every path.
        # (A worker test's marker that is no FIFO is made by the worker, tests/support/
        # child_worker.py, when this child says on stderr that it hangs.)
        if action == "hang" and args and _is_fifo(args[0]):
            fifo.append(os.open(args[0], os.O_RDWR | os.O_NONBLOCK))
        return tuple(fifo)

    def job(data: bytes, limits: Limits) -> tuple[dict[str, Any], bytes]:
        if action == "hang":
            for fd in fifo:
                os.write(fd, b"1")
            print("hostile: hanging", file=sys.stderr, flush=True)
            while True:
                signal.pause()
        if action == "forge":
            return forged(args[0], data, limits)
        if action == "spin":
            # A decoder stuck in a loop: one CPU second from now, the job's CPU limit.
            per_job_cpu(1)
            while True:
                pass
        if action in ("pidns", "peek"):
            raise DeriveError(ErrorCode.PROCESSING_FAILED, "; ".join(seen))
        if action == "pid-counter":
            # After the lock-down: threads take pids of the namespace, a number the next
            # child of the same namespace would read from its own pid.
            for _ in range(int(args[0])):
                thread = threading.Thread(target=lambda: None)
                thread.start()
                thread.join()
            raise DeriveError(ErrorCode.PROCESSING_FAILED, f"getpid {os.getpid()}")
        raise DeriveError(ErrorCode.PROCESSING_FAILED, report(action, args))

    return main(argv, job=job, prepare=prepare)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
