"""The fork server: a fresh decoder child per owner for the price of a fork.

A decoder child costs a Python start-up and libvips' and pillow-heif's imports (about a
tenth of a CPU second); a worker that gives every owner a fresh child would pay that at
every owner change. So each `DecoderProcess` starts one zygote
(`python -m darkroom.decoder_child ... --zygote`): it does those imports once, never reads
an image, and forks a child per request. The child then takes the rest of the jail
(`darkroom.jail`: a mount namespace of its own, its own uid, Landlock, seccomp) and
serves its one owner.

The zygote makes the slot's network, PID and (when not root) user namespaces once
(`darkroom.jail.enter_slot_namespaces`): its fork, PID 1 of that namespace, is the one
that serves the requests below, and every child is PID 2 or later under it. The zygote
itself only waits on the host's side and ends as its init does; killing it kills the
init, and the init's death the namespace.

The worker asks for a child with one byte on the control socket (the zygote's stdin). The
slot's init answers the forked child's pid (in its namespace) and five descriptors
(SCM_RIGHTS): the child's stdin, stdout and stderr pipes (the worker's ends), a pidfd to
kill it by, and a pipe on which it writes the child's exit code (`EXIT`, as `subprocess`
reports it) once reaped.

The zygote holds no secret (the empty environment of every child), no image, and a
seccomp filter of its own: no exec, no tracing, no new socket. It cannot be locked down
further without taking from its children what they need before their own lock-down
(unshare, mount, setuid, reading `/proc/self`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import struct
import sys
from typing import Any

from darkroom.jail import Jail, unshield

# A child's exit code, as the zygote reports it: negative for a signal.
EXIT = struct.Struct("!i")
SPAWN = b"s"
# Descriptors per answer: stdin, stdout, stderr, pidfd, exit pipe.
FDS = 5
_KILLED = ("execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev")
_REFUSED = ("socket", "socketpair", "connect", "bind", "listen", "accept", "accept4")


def lock_down_zygote(jail: Jail) -> None:
    """What the zygote gives up: gaining privileges by exec, and exec, tracing and new
    sockets themselves. A deny-list, because its children still need what their own
    allow-list (`darkroom.jail.lock_down`) later takes from them."""
    from darkroom import jail as jail_module

    with contextlib.suppress(OSError):
        jail_module._prctl(jail_module._PR_SET_NO_NEW_PRIVS, 1)
    sc = getattr(jail_module, "pyseccomp", None)
    if sc is None:
        return
    syscall_filter = sc.SyscallFilter(sc.ALLOW)
    for name in _KILLED:
        syscall_filter.add_rule(sc.KILL_PROCESS, name)
    for name in _REFUSED:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:
            syscall_filter.add_rule(sc.ERRNO(errno.EPERM), name)
    with contextlib.suppress(OSError, RuntimeError):
        syscall_filter.load()


def serve_forks(control: socket.socket) -> bool:
    """Fork a child per request until the worker closes the control socket (run by the
    slot's init, or by the zygote itself where it could make no PID namespace).

    Returns True in a forked child (its pipes on 0, 1 and 2, nothing else open), False in
    the zygote once every child it forked has been reaped.
    """
    children: dict[int, tuple[int, int]] = {}  # pidfd → (pid, exit pipe)
    open_ = True
    while open_ or children:
        ready, _, _ = select.select(([control] if open_ else []) + list(children), [], [])
        for item in ready:
            if item is control:
                try:
                    request = control.recv(1)
                except OSError:
                    request = b""
                if not request:
                    # The worker closed it (after its children) or died: a child still
                    # running would never hear of it (its decoder's parent is its init).
                    open_ = False
                    for pidfd in children:
                        with contextlib.suppress(OSError):
                            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    continue
                if _fork_one(control, children):
                    return True
            else:
                _reap(item, children)
    return False


def _reap(pidfd: Any, children: dict[int, tuple[int, int]]) -> None:
    pid, exit_w = children.pop(pidfd)
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        os.write(exit_w, EXIT.pack(os.waitstatus_to_exitcode(status)))
    os.close(exit_w)
    os.close(pidfd)


_counter_warned = False


def clear_namespace(children: dict[int, tuple[int, int]]) -> None:
    """Run by the slot's init before each fork: nothing of the slot's earlier children
    (the worker has retired them) may meet the next one in the namespace. Every process
    there but the init is killed and reaped: a process a child forked before its
    lock-down and left for the init to adopt, too. Then the namespace's pid counter is
    reset, so every child is PID 2: its own pid tells a child nothing of how many pids the
    one before it used (its threads take pids too)."""
    if os.getpid() != 1:
        return  # not a namespace's init: kill(-1) would reach the host
    with contextlib.suppress(OSError):  # ESRCH: nobody else is here
        os.kill(-1, signal.SIGKILL)  # from PID 1: everyone in the namespace but itself
    for pidfd in list(children):
        _reap(pidfd, children)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    global _counter_warned
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w", encoding="ascii") as counter:
            counter.write("1")
    except OSError as exc:
        # A read-only /proc/sys (a container's default): said once, in the worker's log.
        if not _counter_warned:
            _counter_warned = True
            print(f"darkroom.zygote: cannot reset the slot's pid counter: {exc.strerror}",
                  file=sys.stderr, flush=True)


def _fork_one(control: socket.socket, children: dict[int, tuple[int, int]]) -> bool:
    clear_namespace(children)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    exit_r, exit_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        unshield()
        for target, fd in enumerate((in_r, out_w, err_w)):
            os.dup2(fd, target, inheritable=True)
        # Not the control socket, nor the pipes of the zygote's other children.
        control.detach()
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        return True
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    children[pidfd] = (pid, exit_w)
    # If the worker is gone, the child reads EOF and exits, and is reaped.
    with contextlib.suppress(OSError):
        socket.send_fds(control, [str(pid).encode()], [in_w, out_r, err_r, pidfd, exit_r])
    for fd in (in_w, out_r, err_r, exit_r):
        os.close(fd)
    return False
