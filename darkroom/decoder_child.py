"""The decoder child: jail itself, then answer one job at a time on its pipes.

Started by `darkroom.sandbox.DecoderProcess` as `python -m darkroom.decoder_child MEMORY_MB
NICE CPU_SECONDS [--no-jail]` (or `--probe MEMORY_MB` for the jail report alone), with the
environment of `ENVIRONMENT_NAMES` only. The order is the jail's (`darkroom.jail`): enter
the namespaces while single-threaded, import and initialise every decoder, then lock down,
and only then read the first image.

`serve()` takes the job to run as a parameter: production runs `decode_job`; the test
suite runs its own hostile programs through exactly this jail by calling `main()` with
another job. Nothing here reads a switch that turns attacks or hangs on.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from darkroom.derive import OUT_OF_MEMORY, Limits
from darkroom.errors import DeriveError, ErrorCode
from darkroom.jail import (
    PROTECTIONS,
    Jail,
    enter_child_namespace,
    enter_namespaces,
    enter_slot_namespaces,
    lock_down,
    per_job_cpu,
    shield_parent,
)
from darkroom.wire import FRAME, HELLO, MAX_META, ProtocolError, read_exact, write_frame

# Every variable the parent gives a child (`darkroom.sandbox.child_environment`).
ENVIRONMENT_NAMES = frozenset({
    "VIPS_CONCURRENCY", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "VIPS_BLOCK_UNTRUSTED",
    "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "LC_ALL",
})
# libvips threads in a child. The worker's parallelism is its number of children (one per
# slot), each decoding on one core; a single thread also keeps the jail's thread count and
# a job's CPU budget small.
VIPS_THREADS = 1
# A child is replaced before it has used this much CPU in all (its hard RLIMIT_CPU), or
# ten jobs' worth when jobs may take longer.
CPU_LIFETIME_SECONDS = 3_600

# A job: untrusted bytes and the limits in, the response's meta and payload out.
Job = Callable[[bytes, Limits], tuple[dict[str, Any], bytes]]
# Run before lock-down, after the decoders are initialised: returns descriptors to keep.
Prepare = Callable[[], tuple[int, ...]]


def cpu_budget(timeout: float) -> int:
    """CPU seconds one job may use: its wall-clock limit on every libvips thread."""
    return math.ceil(timeout * VIPS_THREADS) + 1


def cpu_lifetime(budget: int) -> int:
    return max(CPU_LIFETIME_SECONDS, 10 * budget)


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


def _start_jail(memory_mb: int, nice: int, jailed: bool, slot: Jail | None) -> Jail:
    """Everything the child does before importing libvips (see `darkroom.jail`)."""
    jail = Jail()
    # Given by the parent (`DecoderProcess._spawn`): checked here so the report is true.
    if set(os.environ) <= ENVIRONMENT_NAMES:
        jail.on("empty_environment")
    else:
        jail.off("empty_environment", "started with extra variables")
    # One more than the three pipes: the listing's own descriptor.
    if len(set(os.listdir("/proc/self/fd")) - {"0", "1", "2"}) <= 1:
        jail.on("pipes_only")
    else:
        jail.off("pipes_only", "inherited descriptors")
    # Mode 0111 from `_empty_dir`: nobody (and, once seccomp forbids chmod, not even its
    # owner) may list or create anything there. Root could, but root drops its uid.
    try:
        listed = os.listdir(".")
    except PermissionError:
        listed = []  # its owner, not root: 0111 hides even the (empty) listing
    if not listed and not os.stat(".").st_mode & 0o222:
        jail.on("empty_working_directory")
    else:
        jail.off("empty_working_directory", "working directory not empty or writable")
    _harden(memory_mb, nice)
    if jailed and slot is not None:
        enter_child_namespace(jail, slot)  # a fork of the slot's init (`_zygote`)
    elif jailed:
        enter_namespaces(jail)  # returns in the decoder, PID 2 of its own namespace
    else:
        for name in PROTECTIONS:
            jail.off(name, "jail disabled")
    return jail


def decode_job(data: bytes, limits: Limits) -> tuple[dict[str, Any], bytes]:
    """The production job: derive the preview, its thumb and thumbhash."""
    from darkroom.derive import derive

    result = derive(data, limits)
    reply: dict[str, Any] = {"width": result.width, "height": result.height,
                             "sha256": result.sha256}
    payload = result.data
    if result.thumb is not None:
        reply["thumb"] = {"width": result.thumb.width, "height": result.thumb.height,
                          "sha256": result.thumb.sha256, "bytes": result.thumb.size}
        reply["thumbhash"] = result.thumbhash
        payload += result.thumb.data
    return reply, payload


def _zygote(jailed: bool) -> Jail | None:
    """Import everything once, enter the slot's namespaces, then fork a child per request
    (`darkroom.zygote`). In a forked child, answers the slot's jail (what its namespaces
    gave), and the child goes on as a child started on its own does; None when done."""
    import resource
    import socket

    from darkroom.derive import _heif, warm_up
    from darkroom.zygote import lock_down_zygote, serve_forks

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    control = socket.socket(fileno=os.dup(0))
    os.dup2(2, 0)
    warm_up()
    _heif()
    # Everything imported so far outlives every child: kept out of the collector's reach,
    # a child's collections do not write to (and so copy) the zygote's pages.
    gc.collect()
    gc.freeze()
    slot = Jail()
    if jailed:
        lock_down_zygote(slot)
        # Returns in the slot's init; the zygote waits for it on the host's side.
        enter_slot_namespaces(slot, control.fileno())
        # The init outlives every child of the slot: none of them, even with the rights
        # a child has before its lock-down, may read or write its memory (its children
        # make themselves dumpable again, `darkroom.zygote`).
        shield_parent()
    return slot if serve_forks(control) else None


def serve(memory_mb: int, nice: int = 0, cpu_seconds: int = 61, *, jailed: bool = True,
          probe: bool = False, job: Job = decode_job,
          prepare: Prepare | None = None, zygote: bool = False) -> int:
    slot = None
    if zygote:
        slot = _zygote(jailed)
        if slot is None:
            return 0
    jail = _start_jail(memory_mb, nice, jailed, slot)
    # The protocol owns fd 1. Anything else that writes to stdout (a stray print, a
    # library message) is sent to stderr instead of corrupting a frame.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if not probe:
        # Before the slow imports: the worker waits for this to know which process decodes.
        out.write(HELLO.pack(jail.host_pid))
        out.flush()
    requests = sys.stdin.buffer
    logging.basicConfig(
        level=logging.WARNING, format="darkroom.decoder[%(process)d] %(name)s: %(message)s"
    )
    if not probe:
        from darkroom.derive import _heif, warm_up

        # Pay for libvips and thumbhash before the first job, not inside its time limit.
        warm_up()
        # And pillow-heif, although only HEIC needs it (~25 MB of address space): once
        # locked down the child can neither read a module nor map a library executable.
        _heif()
    kept = prepare() if prepare is not None else ()
    if jailed:
        # Still single-threaded: Landlock binds this thread and those it starts later.
        lock_down(jail, cpu_seconds=cpu_seconds, cpu_lifetime_seconds=cpu_lifetime(cpu_seconds),
                  threads=VIPS_THREADS, extra_fds=(out.fileno(), *kept))
    if not jail.active["pid_namespace"]:
        # In a PID namespace the worker's death already ends this child: its init (or
        # the slot's) is killed with the process the worker started.
        _watch_parent()
    if probe:
        out.write(json.dumps(jail.report).encode())
        out.flush()
        return 0

    while True:
        head = requests.read(FRAME.size)
        if not head:
            return 0  # the parent closed our stdin: a clean stop
        try:
            if len(head) != FRAME.size:
                raise ProtocolError("short header")
            meta_len, data_len = FRAME.unpack(head)
            if meta_len > MAX_META:
                raise ProtocolError("oversized limits")
            limits = Limits(**json.loads(read_exact(requests, meta_len)))
            data = read_exact(requests, data_len)
        except (ProtocolError, ValueError, TypeError) as exc:
            # Out of step with the parent: no way to resynchronise the stream.
            print(f"darkroom.decoder: protocol error: {exc}", file=sys.stderr)
            return 2
        if jailed:
            per_job_cpu(cpu_seconds)
        try:
            reply, payload = job(data, limits)
        except DeriveError as exc:
            reply, payload = {"error_code": str(exc.code), "detail": exc.detail}, b""
        except MemoryError:
            reply = {"error_code": str(ErrorCode.PROCESSING_FAILED), "detail": OUT_OF_MEMORY}
            payload = b""
        del data
        try:
            write_frame(out, reply, payload)
        except BrokenPipeError:
            return 0  # the parent went away (or killed this job's reader): nothing to do


def main(argv: list[str], *, job: Job = decode_job, prepare: Prepare | None = None) -> int:
    """`MEMORY_MB [NICE CPU_SECONDS] [--no-jail] [--zygote] [-- PROGRAM ARGS]`, or `--probe
    MEMORY_MB`. What follows `--` belongs to the program that called this (a test's)."""
    if "--" in argv:
        argv = argv[: argv.index("--")]
    flags = {arg for arg in argv if arg.startswith("--")}
    numbers = [int(arg) for arg in argv if not arg.startswith("--")]
    if "--probe" in flags:
        memory_mb = [*numbers, 1024][0]
        return serve(memory_mb, 0, cpu_budget(60), probe=True)
    memory_mb, nice, cpu_seconds = [*numbers, *[1024, 0, 61][len(numbers):]][:3]
    return serve(memory_mb, nice, cpu_seconds, jailed="--no-jail" not in flags, job=job,
                 prepare=prepare, zygote="--zygote" in flags)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
