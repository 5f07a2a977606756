"""The decoder jail: what the decoder child gives up before it reads its first image.

`darkroom.sandbox` makes the child a crash boundary; this module makes it a jail, so that
a memory-safety bug in a decoder (libwebp's CVE-2023-4863 was one) hands an attacker a
process that holds no secret and can reach nothing. Layers, in the order the child
applies them (`docs/SECURITY.md` says what each stops and what it does not):

1. Started by the parent with an empty environment, an empty working directory it may
   not write, and no descriptor but its three pipes (`DecoderProcess._spawn`).
2. Namespaces, while single-threaded: a network namespace (no interface but a down
   loopback), a PID namespace and a mount namespace of the child's own — directly as
   root, through a user namespace otherwise. A slot's zygote makes the network, PID (and
   user) namespaces once for all its children (`enter_slot_namespaces`): its init, PID 1,
   forks each child, which adds its own mount namespace (`enter_child_namespace`). A
   child started on its own makes them all (`enter_namespaces`) and is PID 2 under an
   init of its own (`_enter_pid_namespace`).
3. The child imports Python modules and initialises libvips: everything that reads files
   happens here, before the doors close.
4. `lock_down()`: `/proc` is covered by an empty read-only tmpfs (other processes'
   `environ` and `mem` disappear), root drops to a uid of its own (`own_uid`), the
   resource limits are set, `PR_SET_NO_NEW_PRIVS`, Landlock closes the whole filesystem
   and scopes signals to the child, and finally the seccomp filter (`SYSCALLS`, and
   `FILTERED` for the calls allowed only with some arguments) for every thread at once
   (TSYNC).

Where the kernel refuses a layer (no user namespaces, no seccomp, libseccomp missing) the
child goes on with the others; `Jail.report` says exactly which are active, and the worker
logs it once at start (`darkroom.sandbox.probe_jail`).

The seccomp filter uses libseccomp through `pyseccomp`, never hand-written BPF. Anything
not on the allow-list fails with EPERM, so a library that merely probes for a feature goes
on and the child still answers; the calls only an exploit makes (execve, ptrace, reading
another process's memory) kill the child outright with SIGSYS.

Adding a decoder (HEIC, AVIF, TIFF): load its library and plugins before `lock_down()`
(in `derive.warm_up`, which `decoder_child.serve` calls): the jailed child can open no
file. Then run its test corpus through the jailed child; a syscall it still needs at
decode time goes into `SYSCALLS` under a group named for the reason, or into `FILTERED`
with the arguments it needs, never into the default action.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import select
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Imported now: once the child drops root it may not read the interpreter's files
# (a Python under /root, say), so nothing may be imported late.
try:
    import pyseccomp
except (ImportError, OSError, RuntimeError) as exc:  # libseccomp.so.2 missing
    pyseccomp = None
    _SECCOMP_MISSING = f"libseccomp unavailable: {exc}"

# Every protection, by the name the worker's log line and docs/SECURITY.md use.
PROTECTIONS = (
    "empty_environment",
    "empty_working_directory",
    "pipes_only",
    "network_namespace",
    "mount_namespace_proc_hidden",
    "pid_namespace",
    "user_namespace",
    "unprivileged_uid",
    "rlimits",
    "no_new_privs",
    "filesystem_closed",
    "signal_scope",
    "seccomp",
)

# Inactive by design, not a gap: root needs no user namespace, others keep their uid.
BY_DESIGN = {
    "user_namespace": "not needed: started as root",
    "unprivileged_uid": "not root: keeps the worker's own uid",
}
# A child started as root runs as a uid and gid of its own: this base plus its pid, so no
# two live children, and no other process on the host, share one. Keep this range
# (1879048192 to 1883242496, the base plus the kernel's largest pid) unassigned.
OWN_UID_BASE = 0x7000_0000


def own_uid(host_pid: int | None = None) -> int:
    """The uid (and gid) a decoder whose pid on the host is `host_pid` takes when it drops
    root (its pid inside its PID namespace is the same for many children)."""
    return OWN_UID_BASE + (os.getpid() if host_pid is None else host_pid)

# Descriptors: the child needs its pipes and the files Python may read for a traceback.
_FD_LIMIT = 64
# RLIMIT_NPROC counts every task of the uid; a non-root worker's children share its uid,
# so a sibling started later must not leave this child unable to start the libvips
# threads it needs. fork is refused by seccomp anyway; this bounds a thread bomb (so does
# RLIMIT_AS: every thread reserves a stack).
_THREAD_HEADROOM = 256

# Linux ABI numbers Python's os module does not export on 3.11.
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_PR_SET_NAME, _PR_GET_NAME = 15, 16
_PR_SET_NO_NEW_PRIVS, _PR_GET_NO_NEW_PRIVS = 38, 39
_CLONE_THREAD = 0x00010000
_O_TMPFILE_BIT = getattr(os, "O_TMPFILE", 0o20200000) & ~os.O_DIRECTORY
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | _O_TMPFILE_BIT
# O_PATH gives a handle Landlock does not check (metadata, a directory to resolve from).
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_OPEN_FORBIDDEN = _WRITE_FLAGS | _O_PATH

# The seccomp allow-list, one group per reason: calls that reach nothing outside the
# child whatever their arguments. Calls whose arguments could reach outside it are in
# `FILTERED`, allowed only with the arguments that cannot.
SYSCALLS: dict[str, tuple[str, ...]] = {
    # The allocator and libvips' tile caches. mmap and mprotect are in FILTERED.
    "memory": ("brk", "munmap", "mremap", "madvise", "membarrier"),
    # libvips' worker threads and Python's GIL; new threads only (clone is in FILTERED).
    "threads": (
        "futex", "futex_waitv", "set_robust_list", "rseq", "set_tid_address", "gettid",
        "sched_yield", "exit", "exit_group", "restart_syscall",
    ),
    "signals": (
        "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "rt_sigsuspend",
        "pause",
    ),
    "time": (
        "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday",
        "time", "getrusage", "times",
    ),
    # The request and response pipes, stderr, and files already open read-only. fcntl is
    # in FILTERED.
    "descriptors": (
        "read", "readv", "pread64", "preadv", "preadv2", "write", "writev", "close",
        "fstat", "lseek", "dup", "dup2", "dup3", "poll", "ppoll", "select", "pselect6",
    ),
    # Python's error formatting stats source files; Landlock refuses their contents.
    "read_only_files": (
        "stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2",
        "readlink", "readlinkat", "getcwd", "getdents64",
    ),
    "identity": (
        "getpid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getresuid",
        "getresgid", "getgroups", "uname", "getrandom", "sysinfo", "getrlimit",
    ),
}

# Argument values the filter compares with. `SELF` is the child's own pid, as the kernel
# sees it from inside the child, filled in when the filter is built.
SELF = -1
_F_DUPFD, _F_GETFD, _F_SETFD, _F_GETFL, _F_SETFL, _F_DUPFD_CLOEXEC = 0, 1, 2, 3, 4, 1030
_O_ASYNC = 0o20000
_PROT_EXEC = 4
_PRIO_PROCESS = 0
# clone flags a thread never needs: new namespaces, a traced, untraced or vfork child, a
# sibling of the caller (CLONE_PARENT), a pidfd. Masked with CLONE_THREAD, which must be set.
_CLONE_FORBIDDEN = (
    _CLONE_THREAD | _CLONE_NEWNS | _CLONE_NEWUSER | _CLONE_NEWNET
    | 0x00001000  # CLONE_PIDFD
    | 0x00002000  # CLONE_PTRACE
    | 0x00004000  # CLONE_VFORK
    | 0x00008000  # CLONE_PARENT
    | 0x00800000  # CLONE_UNTRACED
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x20000000  # CLONE_NEWPID
)


@dataclass(frozen=True)
class Rule:
    """One seccomp rule: `syscall` is allowed (or answers `action`) when every condition
    holds. A condition is (argument index, value, mask): `arg & mask == value`, or
    `arg == value` when mask is 0."""

    syscall: str
    why: str
    when: tuple[tuple[int, int, int], ...] = ()
    action: str = "allow"  # or "enosys": glibc then falls back to an older call


# Every call whose arguments could reach outside the child, with the arguments it may
# take and why. Several rules for one call are alternatives.
FILTERED: tuple[Rule, ...] = (
    # Descriptors: F_SETOWN/F_SETSIG/O_ASYNC would let the kernel signal any process with
    # the child's rights when the worker reads its pipe; leases and pipe sizes reach the
    # files' other holders. Python and glibc need only these.
    Rule("fcntl", "close-on-exec and status flags of its own descriptors",
         ((1, _F_GETFD, 0),)),
    Rule("fcntl", "close-on-exec flag", ((1, _F_SETFD, 0),)),
    Rule("fcntl", "status flags (Python checks blocking mode)", ((1, _F_GETFL, 0),)),
    Rule("fcntl", "status flags, never O_ASYNC (signal delivery on I/O)",
         ((1, _F_SETFL, 0), (2, 0, _O_ASYNC))),
    Rule("fcntl", "duplicating a descriptor", ((1, _F_DUPFD, 0),)),
    Rule("fcntl", "duplicating a descriptor, close-on-exec", ((1, _F_DUPFD_CLOEXEC, 0),)),
    # Files: read-only opens only (Landlock refuses the contents anyway). openat2 hides
    # its flags in a struct seccomp cannot read.
    Rule("open", "read-only opens, no O_PATH", ((1, 0, _OPEN_FORBIDDEN),)),
    Rule("openat", "read-only opens, no O_PATH", ((2, 0, _OPEN_FORBIDDEN),)),
    Rule("openat2", "flags in a struct: glibc falls back to openat", action="enosys"),
    # Memory: no new executable pages, so injected bytes cannot be made code.
    Rule("mmap", "memory, never executable", ((2, 0, _PROT_EXEC),)),
    Rule("mprotect", "page protection, never executable", ((2, 0, _PROT_EXEC),)),
    # Threads but no processes, no namespaces, no tracing. clone3's flags are in a struct
    # too: ENOSYS makes glibc use clone.
    Rule("clone", "threads only", ((0, _CLONE_THREAD, _CLONE_FORBIDDEN),)),
    Rule("clone3", "flags in a struct: glibc falls back to clone", action="enosys"),
    # Signals to itself only (abort, raise, Python's signal handling).
    Rule("kill", "signals to itself", ((0, SELF, 0),)),
    Rule("tgkill", "signals to its own threads", ((0, SELF, 0),)),
    # Its own scheduling and limits only, never another process's.
    Rule("sched_getaffinity", "its own CPU set (glib counts processors)", ((0, 0, 0),)),
    Rule("sched_getaffinity", "its own CPU set, by pid", ((0, SELF, 0),)),
    Rule("get_robust_list", "its own robust futex list", ((0, 0, 0),)),
    Rule("getpriority", "its own niceness", ((0, _PRIO_PROCESS, 0), (1, 0, 0))),
    Rule("prlimit64", "its own resource limits", ((0, 0, 0),)),
    # Thread names (glib names libvips' workers) and reading no_new_privs; nothing else
    # (PR_SET_PDEATHSIG, PR_SET_PTRACER, PR_SET_MM … reach or expose other processes).
    Rule("prctl", "naming its threads", ((0, _PR_SET_NAME, 0),)),
    Rule("prctl", "reading a thread's name", ((0, _PR_GET_NAME, 0),)),
    Rule("prctl", "reading no_new_privs", ((0, _PR_GET_NO_NEW_PRIVS, 0),)),
)

# Refused (EPERM, the default) although a decoder might seem to want them, and why.
REFUSED: dict[str, str] = {
    "ioctl": "no terminal or device: every request reaches a driver",
    "tkill": "a thread id alone may name another process; glibc uses tgkill",
    "rt_sigqueueinfo": "signals with a payload: not needed, could name other processes",
    "rt_tgsigqueueinfo": "as rt_sigqueueinfo",
    "pkey_mprotect": "could make pages executable around the mprotect rule",
    "socket": "no network",
    "fork": "no processes",
    "vfork": "no processes",
}

# Only an exploit makes these: the child dies with SIGSYS instead of getting an error.
KILLED: tuple[str, ...] = (
    "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
)


@dataclass
class Jail:
    """What the child has applied so far: protection name → active, and why not."""

    active: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(PROTECTIONS, False))
    reasons: dict[str, str] = field(default_factory=dict)
    # A private mount namespace is ready for the /proc cover, laid in `lock_down()`.
    private_mounts: bool = False
    # This process's pid as the host (and the worker) sees it.
    host_pid: int = field(default_factory=os.getpid)

    def on(self, name: str) -> None:
        self.active[name] = True
        self.reasons.pop(name, None)

    def off(self, name: str, why: str | BaseException) -> None:
        self.active[name] = False
        if isinstance(why, OSError) and why.errno is not None:
            why = errno.errorcode.get(why.errno, str(why.errno))
        self.reasons[name] = str(why)[:200]

    @property
    def report(self) -> dict[str, Any]:
        return {"active": dict(self.active), "inactive_reasons": dict(self.reasons)}


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)))


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(_libc.mount(
        source.encode(), target.encode(), fstype.encode() if fstype else None,
        ctypes.c_ulong(flags), data.encode() if data else None,
    ))


def _prctl(option: int, arg: int = 0) -> int:
    result = _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                         ctypes.c_ulong(0), ctypes.c_ulong(0))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(result)


_PR_SET_DUMPABLE, _PR_GET_DUMPABLE = 4, 3


def shield_parent() -> bool:
    """Make the calling worker non-dumpable; answers whether it now is.

    For a child that shares the worker's uid and sees its `/proc` (no user namespace for
    a mount namespace, say in a default container): a non-dumpable process's
    `/proc/<pid>/environ`, `mem` and `maps` belong to root, so the child cannot read the
    secrets there. ssh-agent does the same for its keys. The cost: the worker cannot be
    attached to by a debugger of the same uid, nor dump core.
    """
    try:
        _prctl(_PR_SET_DUMPABLE, 0)
        return _prctl(_PR_GET_DUMPABLE) == 0
    except OSError:
        return False


def unshield() -> None:
    """Undo a `shield_parent()` inherited from the slot's init: a child's own `/proc`
    files belong to its uid again, as its start needs (its autogroup, say)."""
    with contextlib.suppress(OSError):
        _prctl(_PR_SET_DUMPABLE, 1)


def _unshare_one(jail: Jail, flag: int, protection: str) -> bool:
    """As root: one namespace; if the kernel refuses, `protection` is off and says why."""
    try:
        _unshare(flag)
    except OSError as exc:
        jail.off(protection, exc)
        return False
    return True


def _enter_user_namespace(jail: Jail, flags: int) -> bool | None:
    """Not root: a user namespace with the namespaces of `flags` (the PID namespace among
    them), mapping our own ids only, so files look the same from inside. Answers whether
    the PID namespace came too; None when there is no user namespace (nor any other)."""
    uid, gid = os.getuid(), os.getgid()
    pid_namespace = True
    try:
        try:
            _unshare(_CLONE_NEWUSER | flags)
        except OSError as exc:
            jail.off("pid_namespace", exc)
            pid_namespace = False
            _unshare(_CLONE_NEWUSER | (flags & ~_CLONE_NEWPID))
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as exc:
        jail.off("user_namespace", exc)
        for name in ("network_namespace", "mount_namespace_proc_hidden", "pid_namespace"):
            jail.off(name, "needs root or a user namespace")
        return None
    jail.on("user_namespace")
    jail.on("network_namespace")
    return pid_namespace


def enter_namespaces(jail: Jail) -> None:
    """Own network, mount and PID namespaces. Must run while the process is
    single-threaded. Returns in the decoder, PID 2 of its namespace (`_enter_pid_namespace`);
    the processes above it never return."""
    if os.geteuid() != 0:
        pid_namespace = _enter_user_namespace(
            jail, _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWNS)
        if pid_namespace is None:
            return
        _private_mounts(jail)
        if pid_namespace:
            _enter_pid_namespace(jail)
        return
    jail.off("user_namespace", BY_DESIGN["user_namespace"])
    if _unshare_one(jail, _CLONE_NEWNET, "network_namespace"):
        jail.on("network_namespace")
    if _unshare_one(jail, _CLONE_NEWNS, "mount_namespace_proc_hidden"):
        _private_mounts(jail)
    if _unshare_one(jail, _CLONE_NEWPID, "pid_namespace"):
        _enter_pid_namespace(jail)


def enter_slot_namespaces(jail: Jail, control: int) -> None:
    """The zygote's half of the namespaces (`darkroom.zygote`): user, network and PID
    namespaces made once for every child of one worker slot. Must run while the zygote is
    single-threaded. Returns in the slot's init, PID 1 of the new PID namespace, which
    serves the forks on `control`; the zygote itself stays on the host's side
    (`_outer`) and never returns.

    A child forked by that init is PID 2 or later of the slot's namespace (so the kernel
    delivers it every signal, the CPU limit's included), lays its own mount namespace over
    the slot's (`enter_child_namespace`) and takes a uid of its own; the slot's earlier
    children are gone by then (the worker retires one before it asks for the next).
    """
    if os.geteuid() != 0:
        if not _enter_user_namespace(jail, _CLONE_NEWPID | _CLONE_NEWNET):
            return  # no PID namespace: the zygote serves the forks itself
    else:
        jail.off("user_namespace", BY_DESIGN["user_namespace"])
        if _unshare_one(jail, _CLONE_NEWNET, "network_namespace"):
            jail.on("network_namespace")
        if not _unshare_one(jail, _CLONE_NEWPID, "pid_namespace"):
            return
    # The zygote's death (the worker killed it) ends the slot's init, and with it every
    # child in the namespace. The zygote holds no image either: not dumpable, as its init.
    _fork_init(close=(control,), shield=True)
    jail.on("pid_namespace")


def enter_child_namespace(jail: Jail, slot: Jail) -> None:
    """A forked child's half: the slot's namespaces (`enter_slot_namespaces`) and a mount
    namespace of its own, where `lock_down()` covers `/proc` for this child alone."""
    for name in ("user_namespace", "network_namespace", "pid_namespace"):
        if slot.active[name]:
            jail.on(name)
        else:
            jail.off(name, slot.reasons.get(name, "not entered"))
    jail.host_pid = _host_pid()
    if not slot.active["user_namespace"] and os.geteuid() != 0:
        jail.off("mount_namespace_proc_hidden", "needs root or a user namespace")
        return
    try:
        _unshare(_CLONE_NEWNS)
    except OSError as exc:
        jail.off("mount_namespace_proc_hidden", exc)
    else:
        _private_mounts(jail)


def _enter_pid_namespace(jail: Jail) -> None:
    """Become PID 2 of the namespace just unshared, under an init of our own.

    Three processes, each with one job. The outer one (the worker's child, whose pid it
    kills on a timeout) stays on the host's side: it waits for the init and ends as the
    decoder ended, by the same signal or with the same code, so the worker sees what
    happened. The init (PID 1) waits for the decoder and exits with its status; it cannot
    simply be the decoder: the kernel drops every signal PID 1 has no handler for, the
    CPU limit's SIGXCPU among them. The decoder (PID 2) keeps the pipes and returns from
    here. A SIGKILL to the outer process reaches the init (its parent-death signal), and
    the init's death kills everything in the namespace: nothing outlives the worker's kill.
    """
    _fork_init()
    try:
        decoder = os.fork()
    except BaseException:
        os._exit(1)
    if decoder == 0:
        jail.host_pid = _host_pid()
        jail.on("pid_namespace")
        return
    _init(decoder)


def _fork_init(close: tuple[int, ...] = (), shield: bool = False) -> None:
    """Fork the new PID namespace's init; returns in it, with the parent-death signal of
    SIGKILL. The caller stays on the host's side (`_outer`, after closing `close`) and
    never returns."""
    host_parent = os.getppid()
    # The init learns here whether the outer process died before the init could ask for
    # its parent-death signal (an EOF on this pipe).
    alive_r, alive_w = os.pipe()
    init = os.fork()
    if init:
        os.close(alive_r)
        for fd in close:
            os.close(fd)
        if shield:
            shield_parent()
        _outer(init, host_parent)
    os.close(alive_w)
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive_r], [], [], 0)[0]:
            os._exit(1)
        os.close(alive_r)
    except BaseException:
        os._exit(1)


def _host_pid() -> int:
    """Our pid on the host: the first NSpid entry, read through the host's /proc (still
    mounted here; the namespace's own pid is the last)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    return os.getpid()


def _drop_pipes() -> None:
    # The decoder alone holds the request and response pipes: its death is the worker's EOF.
    for fd in (0, 1):
        with contextlib.suppress(OSError):
            os.close(fd)


def _init(decoder: int) -> None:
    """PID 1: reap, and exit with the decoder's status (a signal as 128 + its number)."""
    _drop_pipes()
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == decoder:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def _outer(init: int, host_parent: int) -> None:
    """The host side: end with the init, and end the init if the worker dies."""
    _drop_pipes()

    # Not PR_SET_PDEATHSIG: the worker spawns from short-lived threads. No thread either:
    # the init's pidfd wakes us the moment it exits, the timeout to look at our parent.
    done = os.pidfd_open(init)
    while not select.select([done], [], [], 0.5)[0]:
        if os.getppid() != host_parent:
            os.kill(init, signal.SIGKILL)
            os._exit(1)
    while True:
        try:
            _, status = os.waitpid(init, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    number = -code if code < 0 else code - 128 if code > 128 else 0
    if number:
        # Die as the decoder did, so the worker's log names the signal (SIGSYS, SIGXCPU).
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(number, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(code)


def _private_mounts(jail: Jail) -> None:
    # Without this a shared root would carry our /proc cover to the host.
    try:
        _mount("none", "/", None, _MS_REC | _MS_PRIVATE, None)
    except OSError as exc:
        jail.off("mount_namespace_proc_hidden", exc)
    else:
        jail.private_mounts = True


def _own_uid_tasks(uid: int) -> int:
    """Processes and threads whose owner is `uid`: RLIMIT_NPROC counts them all."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += max(1, os.stat(f"/proc/{entry.name}/task").st_nlink - 2)
    return count


def lock_down(jail: Jail, *, cpu_seconds: int, cpu_lifetime_seconds: int,
              threads: int, extra_fds: tuple[int, ...] = ()) -> None:
    """Close every door. Call after all imports and library initialisation."""
    root = os.geteuid() == 0
    run_as = own_uid(jail.host_pid) if root else os.getuid()
    # As root the uid is this child's alone (`own_uid`): nothing else counts against it.
    tasks = (0 if root else _own_uid_tasks(run_as)) + len(os.listdir("/proc/self/task"))
    if jail.private_mounts:
        try:
            _mount("none", "/proc", "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                   "size=4k,nr_inodes=1,mode=555")
            jail.on("mount_namespace_proc_hidden")
        except OSError as exc:
            jail.off("mount_namespace_proc_hidden", exc)
    if os.geteuid() == 0:
        try:
            os.setgroups([])
            os.setresgid(run_as, run_as, run_as)
            os.setresuid(run_as, run_as, run_as)
            jail.on("unprivileged_uid")
        except OSError as exc:
            jail.off("unprivileged_uid", exc)
    else:
        jail.off("unprivileged_uid", BY_DESIGN["unprivileged_uid"])
    _set_limits(jail, cpu_seconds, cpu_lifetime_seconds, tasks + threads + _THREAD_HEADROOM,
                extra_fds)
    try:
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        jail.on("no_new_privs")
    except OSError as exc:
        jail.off("no_new_privs", exc)
    _landlock(jail)
    if pyseccomp is None:
        jail.off("seccomp", _SECCOMP_MISSING)
        return
    try:
        _seccomp_filter().load()
        jail.on("seccomp")
    except (OSError, RuntimeError) as exc:  # the kernel refused the filter
        jail.off("seccomp", exc)


def _set_limits(jail: Jail, cpu_seconds: int, cpu_lifetime_seconds: int, nproc: int,
                extra_fds: tuple[int, ...]) -> None:
    used = int(sum(os.times()[:2]))
    highest_fd = max((2, *extra_fds))
    try:
        # CPU: the hard limit bounds the child's life (the parent replaces it before it
        # gets there); the soft one is moved before each job by `per_job_cpu`.
        resource.setrlimit(resource.RLIMIT_CPU,
                           (used + cpu_seconds, used + cpu_lifetime_seconds + cpu_seconds))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        nofile = max(_FD_LIMIT, highest_fd + 8)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        jail.on("rlimits")
    except (OSError, ValueError) as exc:
        jail.off("rlimits", exc)


def per_job_cpu(cpu_seconds: int) -> None:
    """Give the next job `cpu_seconds` of CPU (soft RLIMIT_CPU; SIGXCPU past it)."""
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(sum(os.times()[:2])) + cpu_seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


# Landlock's system calls (the same numbers on every architecture) and flags.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_RESTRICT_SELF = 444, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2


def _landlock(jail: Jail) -> None:
    """No filesystem access at all, and no signal out of the child (Landlock).

    Every module and library is loaded by now, so the child needs no file: the ruleset
    handles every access right the kernel knows and grants none. Already open descriptors
    (its pipes) are not affected. From ABI 6 the child may also signal nobody outside its
    own domain (SIGIO through F_SETOWN included) nor reach an abstract unix socket; from
    ABI 4 it may neither bind nor connect TCP. Applies to this thread and those it starts:
    the child is single-threaded here (the parent watcher starts after lock-down).
    """
    libc_syscall = _libc.syscall
    abi = libc_syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        code = ctypes.get_errno()
        jail.off("filesystem_closed", OSError(code, os.strerror(code)))
        jail.off("signal_scope", "needs Landlock ABI 6 (Linux 6.12)")
        return
    fs = (1 << 13) - 1  # ABI 1: execute, read, write, make and remove every kind of file
    for version, right in ((2, 1 << 13), (3, 1 << 14), (5, 1 << 15)):  # refer, truncate, ioctl
        if abi >= version:
            fs |= right
    attr = _RulesetAttr(fs, 3 if abi >= 4 else 0,
                        _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = libc_syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                      ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        if fd < 0 or libc_syscall(ctypes.c_long(_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd),
                                  ctypes.c_uint32(0)) != 0:
            code = ctypes.get_errno()
            jail.off("filesystem_closed", OSError(code, os.strerror(code)))
            jail.off("signal_scope", "Landlock refused")
            return
    finally:
        if fd >= 0:
            os.close(fd)
    jail.on("filesystem_closed")
    if abi >= 6:
        jail.on("signal_scope")
    else:
        jail.off("signal_scope", f"needs Landlock ABI 6, kernel has {abi}")


def _seccomp_filter() -> Any:
    sc = pyseccomp
    syscall_filter = sc.SyscallFilter(sc.ERRNO(errno.EPERM))
    # Every thread, including libvips' and the parent watcher already running.
    syscall_filter.set_attr(sc.Attr.CTL_TSYNC, 1)

    def add(action: int, name: str, *args: Any) -> None:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0:
            return  # not a syscall on this architecture (dup2 on arm64, say)
        syscall_filter.add_rule(action, name, *args)

    for names in SYSCALLS.values():
        for name in names:
            add(sc.ALLOW, name)
    for name in KILLED:
        add(sc.KILL_PROCESS, name)
    own_pid = os.getpid()
    for rule in FILTERED:
        conditions = []
        for index, value, mask in rule.when:
            value = own_pid if value == SELF else value
            conditions.append(sc.Arg(index, sc.MASKED_EQ, mask, value) if mask
                              else sc.Arg(index, sc.EQ, value))
        action = sc.ALLOW if rule.action == "allow" else sc.ERRNO(errno.ENOSYS)
        add(action, rule.syscall, *conditions)
    return syscall_filter
