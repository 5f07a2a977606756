"""The decoder jail, proven against the real child: one test per protection.

The state tests read what the kernel says about the live child (`/proc/<child>/status`,
`limits`, `environ`, `ns/net`, `fd`, `cwd`). The hostile tests run a compromised decoder
through the same jail (`tests/derive/hostile_child.py`, given as the child program):
instead of decoding it tries an attack and answers what happened, and the parent must
record an ordinary outcome for the file (`processing_failed`) and go on decoding.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from darkroom.config import load_settings
from darkroom.derive import Limits, _vips, derive
from darkroom.errors import DeriveError, ErrorCode
from darkroom.jail import KILLED, OWN_UID_BASE, PROTECTIONS, SYSCALLS
from darkroom.sandbox import (
    DECODER,
    MALLOC_TUNABLES,
    DecoderProcess,
    child_environment,
    jail_log_fields,
    probe_jail,
)
from tests.derive import images as im
from tests.derive.hostile_child import hostile
from tests.support.services import wait_for

DUNE = (im.CORPUS / "Dune.jpg").read_bytes()
LIMITS = Limits.from_settings(load_settings())
SECRETS = {
    "DARKROOM_DATABASE_URL": "postgresql://darkroom:hunter2-db@db.internal/darkroom",
    "AWS_SECRET_ACCESS_KEY": "hunter2-s3-secret-key",
    "AWS_ACCESS_KEY_ID": "AKIAHUNTER2",
}
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return SECRETS


@pytest.fixture
def jailed(secrets: dict[str, str]) -> Iterator[DecoderProcess]:
    """A child that holds the worker's secrets in its parent and has done one job."""
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        proc.derive(DUNE)  # the jail is complete once a job has been answered
        yield proc


@pytest.fixture
def sibling() -> Iterator[DecoderProcess]:
    """A live decoder child of the same worker, as another slot's would be."""
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        proc.derive(DUNE)
        yield proc


def child_pid(proc: DecoderProcess) -> int:
    assert proc.pid is not None
    return proc.pid


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def ended(pid: int) -> bool:
    """Gone, or a zombie waiting for its reaper."""
    try:
        return status(pid)["State"].startswith("Z")
    except FileNotFoundError:
        return True


def limit(pid: int, name: str) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            soft, hard = re.split(r"\s{2,}", line[len(name):].strip())[:2]
            return soft, hard
    raise AssertionError(f"no {name} in limits")


def compromised(action: str, *args: str) -> DecoderProcess:
    """A decoder child that an image has taken over: it tries `action` on every job."""
    return DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024, program=hostile(action, *args))


def attack(proc: DecoderProcess) -> DeriveError:
    with pytest.raises(DeriveError) as info:
        proc.derive(DUNE)
    assert info.value.code == ErrorCode.PROCESSING_FAILED
    return info.value


def world_writable_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="darkroom-jail-test-"))
    path.chmod(0o777)  # so only the jail, not the directory, can refuse the write
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    yield from world_writable_dir()


# -- the child's state, as the kernel reports it ----------------------------------------


def test_no_new_privs_and_seccomp_filter(jailed: DecoderProcess) -> None:
    st = status(child_pid(jailed))
    assert st["NoNewPrivs"] == "1"
    assert st["Seccomp"] == "2"  # SECCOMP_MODE_FILTER
    # Every thread is filtered, libvips' workers included (TSYNC).
    for task in Path(f"/proc/{child_pid(jailed)}/task").iterdir():
        assert status_of_task(task)["Seccomp"] == "2"


def status_of_task(task: Path) -> dict[str, str]:
    lines = (task / "status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def test_environment_is_empty_of_secrets(jailed: DecoderProcess,
                                         secrets: dict[str, str]) -> None:
    raw = Path(f"/proc/{child_pid(jailed)}/environ").read_bytes()
    names = {entry.split(b"=", 1)[0].decode() for entry in raw.split(b"\0") if entry}
    # glibc splits GLIBC_TUNABLES in place as it reads it: each setting shows as an entry.
    tunables = {setting.split("=", 1)[0] for setting in MALLOC_TUNABLES.split(":")}
    assert names <= set(child_environment()) | tunables
    for value in secrets.values():
        assert value.encode() not in raw


@pytest.mark.skipif(not AS_ROOT, reason="the uid drop applies to a child started as root")
def test_started_as_root_each_child_runs_as_a_uid_of_its_own(
        jailed: DecoderProcess, sibling: DecoderProcess) -> None:
    uids = set()
    for proc in (jailed, sibling):
        st = status(child_pid(proc))
        uid = OWN_UID_BASE + child_pid(proc)
        assert st["Uid"].split() == [str(uid)] * 4
        assert st["Gid"].split() == [str(uid)] * 4
        assert st["Groups"] == ""
        assert st["CapEff"] == "0000000000000000"
        uids.add(uid)
    assert len(uids) == 2  # siblings cannot signal, trace or read each other by uid
    assert not uids & {os.getuid(), 65534}


def test_own_network_namespace(jailed: DecoderProcess) -> None:
    ours = os.readlink("/proc/self/ns/net")
    assert os.readlink(f"/proc/{child_pid(jailed)}/ns/net") != ours


def test_own_mount_namespace_with_proc_hidden(jailed: DecoderProcess) -> None:
    pid = child_pid(jailed)
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    proc_mounts = [line.split(" - ")[1].split()[0] for line in mounts if line.split()[4] == "/proc"]
    assert proc_mounts[-1] == "tmpfs"  # the last mount on /proc is the one it sees
    # The cover stays inside the child: ours is still procfs.
    assert Path("/proc/self/status").exists()


def test_resource_limits(jailed: DecoderProcess) -> None:
    pid = child_pid(jailed)
    assert limit(pid, "Max file size") == ("0", "0")
    assert limit(pid, "Max core file size") == ("0", "0")
    assert limit(pid, "Max open files") == ("64", "64")
    cpu_soft, cpu_hard = limit(pid, "Max cpu time")
    assert 0 < int(cpu_soft) < int(cpu_hard) != 0
    nproc_soft, _ = limit(pid, "Max processes")
    assert nproc_soft != "unlimited"
    as_soft, _ = limit(pid, "Max address space")
    assert int(as_soft) == 1024 * 1024 * 1024


def test_only_its_pipes_and_an_empty_unwritable_working_directory(
        jailed: DecoderProcess) -> None:
    pid = child_pid(jailed)
    fds = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    # 0 requests, 1 stderr again (stdout redirected), 2 stderr, the response pipe.
    assert all(target.startswith("pipe:") for target in fds.values()), fds
    assert len(fds) <= 4
    cwd = Path(f"/proc/{pid}/cwd").resolve()
    assert cwd != Path("/") and not any(cwd.iterdir())
    assert cwd.stat().st_mode & 0o777 == 0o111


def every_kind_of_input() -> dict[str, bytes]:
    """One of each decode path: colour management, bit depths, alpha, each loader."""
    from PIL import Image

    vips = _vips()
    red = vips.Image.black(64, 64).new_from_image([255, 0, 0]).copy(interpretation="srgb")
    frames = [Image.new("RGB", (50, 40), colour) for colour in (im.RED, im.GREEN, im.BLUE)]
    rgba = Image.new("RGBA", (300, 100), (255, 0, 0, 0))
    rgba.paste((0, 0, 255, 255), (0, 0, 150, 100))
    return {
        "cmyk jpeg with profile": red.icc_transform("cmyk").jpegsave_buffer(Q=95),
        "cmyk jpeg without profile": im.save(Image.new("CMYK", (64, 64), (0, 255, 255, 0)),
                                             "JPEG"),
        "p3 png": red.icc_transform("p3", input_profile="srgb").pngsave_buffer(),
        "16-bit png": vips.Image.black(40, 30, bands=3).linear(1, [65535, 32896, 0])
        .cast("ushort").copy(interpretation="rgb16").pngsave_buffer(bitdepth=16),
        "grey 16-bit png": im.save(Image.new("I;16", (30, 20), 40_000), "PNG"),
        "rgba png": im.save(rgba, "PNG"),
        "progressive jpeg": im.save(im.quadrants(2500, 1500), "JPEG", progressive=True),
        "rotated jpeg": im.jpeg_with_orientation(im.quadrants(64, 48), 6),
        "animated gif": im.save(frames[0], "GIF", save_all=True, append_images=frames[1:]),
        "webp": im.save(im.quadrants(300, 100), "WEBP", quality=90),
    }


def test_every_decode_path_works_inside_the_jail(jailed: DecoderProcess) -> None:
    # A syscall or file a decode path needs after lock-down would fail here, not in
    # production: the jailed child must give exactly the in-process result.
    for name, data in every_kind_of_input().items():
        assert jailed.derive(data) == derive(data, LIMITS), name


# -- a compromised decoder: each attack is refused, the file gets an ordinary outcome ----


def test_hostile_reading_secrets_finds_none(secrets: dict[str, str]) -> None:
    with compromised("environ") as proc:
        detail = attack(proc).detail
        pid = proc.pid
        assert "parent environ: refused" in detail
        assert "init environ: refused" in detail
        for name, value in secrets.items():
            assert name not in detail and value not in detail
        attack(proc)  # refused with an error, not killed: the same child answers again
        assert proc.pid == pid


def test_hostile_tcp_socket_is_refused() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        with compromised("socket", str(port)) as proc:
            detail = attack(proc).detail
        assert "socket: refused (EPERM)" in detail
        assert "connect: refused" in detail
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection ever arrived


def test_hostile_file_write_is_refused(open_dir: Path) -> None:
    target = open_dir / "pwned"
    with compromised("write", str(target)) as proc:
        detail = attack(proc).detail
    assert "write: refused (EPERM)" in detail
    assert "write cwd: refused (EPERM)" in detail
    assert not target.exists()


def test_hostile_exec_kills_the_child_and_the_next_file_is_fine(
        open_dir: Path) -> None:
    target = open_dir / "pwned-by-sh"
    with compromised("exec", str(target)) as proc:
        detail = attack(proc).detail
        first = proc.pid
        assert "SIGSYS" in detail  # KILL_PROCESS: no shell ever ran
        assert not target.exists()
        proc.program = DECODER
        assert proc.derive(DUNE).width > 0  # a fresh child took over
        assert proc.pid != first


def test_hostile_ptrace_of_the_worker_kills_the_child() -> None:
    with compromised("ptrace") as proc:
        detail = attack(proc).detail
    assert "SIGSYS" in detail
    assert status(os.getpid())["TracerPid"] == "0"


def test_hostile_fork_is_refused() -> None:
    with compromised("fork") as proc:
        detail = attack(proc).detail
    assert detail == "fork: refused (EPERM)"


# -- the report the worker logs once ----------------------------------------------------


def test_probe_reports_every_protection_this_host_allows() -> None:
    report = probe_jail()
    assert set(report["active"]) == set(PROTECTIONS)
    expected_off = {"user_namespace"} if AS_ROOT else {"unprivileged_uid"}
    on = {name for name, active in report["active"].items() if active}
    # This test host (like CI) allows every layer; a host that does not would show here.
    assert on == set(PROTECTIONS) - expected_off, report["inactive_reasons"]
    level, fields = jail_log_fields()
    assert level == 20  # INFO: nothing missing but by design
    assert fields["jail_seccomp"] is True
    assert fields["inactive"].startswith(next(iter(expected_off)))


def test_allow_list_is_grouped_and_never_allows_what_it_kills() -> None:
    allowed = {name for group in SYSCALLS.values() for name in group}
    assert not allowed & set(KILLED)
    for dangerous in ("socket", "connect", "execve", "ptrace", "fork", "vfork", "unshare",
                      "mount", "setns", "chmod", "unlink", "bpf", "ioctl"):
        assert dangerous not in allowed


def test_child_is_replaced_between_jobs_before_its_lifetime_cpu_runs_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import darkroom.sandbox as sandbox

    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        proc.derive(DUNE)
        first = child_pid(proc)
        # Any CPU used now counts as within one job's budget of the hard limit.
        monkeypatch.setattr(sandbox, "_cpu_lifetime", lambda budget: budget)
        assert proc.derive(DUNE).width == 1680  # the job itself is not affected
        assert child_pid(proc) != first


def test_a_long_time_limit_does_not_replace_the_child_every_job() -> None:
    with DecoderProcess(LIMITS, timeout=3_600.0, memory_mb=1024) as proc:
        proc.derive(DUNE)
        first = child_pid(proc)
        proc.derive(DUNE)
        assert child_pid(proc) == first
        _, hard = limit(first, "Max cpu time")
        assert int(hard) >= 10 * 3_601


def test_working_directory_of_a_killed_worker_is_removed_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import darkroom.sandbox as sandbox

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sandbox, "_EMPTY_DIR", None)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"darkroom-decoder-{dead}-x1"
    stale.mkdir(mode=0o111)
    alive = tmp_path / f"darkroom-decoder-{os.getpid()}-x2"
    alive.mkdir(mode=0o111)
    fresh = Path(sandbox._empty_dir())
    assert fresh.parent == tmp_path and not any(fresh.iterdir())
    assert fresh.stat().st_mode & 0o777 == 0o111
    assert not stale.exists()
    assert alive.exists()  # its worker still runs
    monkeypatch.setattr(sandbox, "_EMPTY_DIR", None)  # the atexit hook removes `fresh`
    fresh.rmdir()
    alive.rmdir()


def test_an_exposed_worker_makes_itself_non_dumpable() -> None:
    # Where the child would share the worker's uid and see its /proc, the worker's
    # environ and mem become root's (checked here through the kernel's own answer).
    code = ("import ctypes; from darkroom.jail import shield_parent; print(shield_parent(), "
            "ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["True", "0"]


# -- a compromised decoder against its siblings, the worker and the files around it -----


class _LineSeen(logging.Handler):
    """Set when the worker's drain thread has read `text` from a child's stderr."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def test_hostile_f_setown_cannot_make_the_worker_kill_a_sibling(
        sibling: DecoderProcess) -> None:
    # F_SETOWN + F_SETSIG(SIGKILL) + O_ASYNC on its stderr pipe: when the worker reads the
    # next line, the kernel would send SIGKILL to the named process with the child's rights.
    victim = child_pid(sibling)
    line = _LineSeen("hostile: the worker reads this line")
    child_log = logging.getLogger("darkroom.sandbox.child")
    child_log.addHandler(line)
    try:
        with compromised("setown", str(victim)) as proc:
            detail = attack(proc).detail
            assert line.seen.wait(10), "the worker never read the child's line"
    finally:
        child_log.removeHandler(line)
    assert "F_SETOWN: refused (EPERM)" in detail
    assert "F_SETSIG: refused (EPERM)" in detail
    assert "O_ASYNC: refused (EPERM)" in detail
    assert sibling.derive(DUNE).width == 1680  # the same sibling, alive, answers
    assert child_pid(sibling) == victim


def test_hostile_kill_reaches_no_sibling_nor_the_worker(sibling: DecoderProcess) -> None:
    victim = child_pid(sibling)
    with compromised("kill", str(victim), str(os.getpid())) as proc:
        detail = attack(proc).detail
    assert f"kill {victim}: refused (EPERM)" in detail
    assert f"kill {os.getpid()}: refused (EPERM)" in detail
    assert sibling.derive(DUNE).width == 1680 and child_pid(sibling) == victim


def test_own_pid_namespace_under_an_init_of_its_own(jailed: DecoderProcess) -> None:
    pid = child_pid(jailed)
    # The decoder is PID 2 of a namespace of its own (NSpid: host pid, namespace pid) ...
    assert status(pid)["NSpid"].split() == [str(pid), "2"]
    # ... whose PID 1, its init, is the only other process there.
    init = int(status(pid)["PPid"])
    assert status(init)["NSpid"].split() == [str(init), "1"]
    assert Path(f"/proc/{pid}/ns/pid").readlink() != Path("/proc/self/ns/pid").readlink()
    assert Path(f"/proc/{init}/ns/pid").readlink() == Path(f"/proc/{pid}/ns/pid").readlink()


def test_hostile_with_all_its_rights_sees_and_signals_no_pid_outside(
        sibling: DecoderProcess) -> None:
    victim = child_pid(sibling)
    with compromised("pidns", str(victim), str(os.getpid()), "1") as proc:
        detail = attack(proc).detail
        own = child_pid(proc)
    # Even before the lock-down, as root: the sibling, the worker and the host's init do
    # not exist in its namespace (ESRCH, not EPERM: no other layer answered).
    assert detail.startswith(f"getpid 2; getppid 1; ['NSpid:', '{own}', '2']"), detail
    assert f"signal {victim}: refused (ESRCH)" in detail
    assert f"signal {os.getpid()}: refused (ESRCH)" in detail
    assert "signal 1: done None" in detail  # pid 1 is its own init, not the host's
    assert sibling.derive(DUNE).width == 1680 and child_pid(sibling) == victim


def test_the_next_owners_child_shares_its_slots_namespace_with_its_init_alone() -> None:
    # A slot's children live in one PID namespace, made by the slot's zygote once; the
    # second owner's child is PID 2 there too, the first one gone. Even with all its
    # rights (before the lock-down) it reaches nothing on the host but its init.
    with compromised("pidns", str(os.getpid()), "1") as proc:
        first = attack_as(proc, "alice")
        second = attack_as(proc, "bob")
        own = child_pid(proc)
    assert first.startswith("getpid 2; getppid 1;"), first
    assert second.startswith(f"getpid 2; getppid 1; ['NSpid:', '{own}', '2']"), second
    assert f"signal {os.getpid()}: refused (ESRCH)" in second
    assert "signal 1: done None" in second


def test_no_child_learns_how_many_pids_the_one_before_it_used() -> None:
    # Every child of a slot is the same PID of the slot's namespace, whatever the one
    # before it did: its pid carries nothing from one owner's child to the next.
    with compromised("pid-counter", "40") as proc:
        details = [attack_as(proc, owner) for owner in ("alice", "bob", "carol")]
    assert details == ["getpid 2"] * 3


@pytest.mark.skipif(not AS_ROOT, reason="the first child marks itself with a file in /tmp")
def test_nothing_a_child_leaves_in_its_slots_namespace_outlives_it(tmp_path: Path) -> None:
    # Before its lock-down a child could still fork a process of its own, which the
    # slot's init adopts. The next owner's child shares the namespace with no such
    # process: only with the init.
    with compromised("linger", str(tmp_path / "lurking")) as proc:
        attack_as(proc, "alice")
        attack_as(proc, "bob")
        child = child_pid(proc)
        init = int(status(child)["PPid"])
        namespace = Path(f"/proc/{child}/ns/pid").readlink()
        inside = set()
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and (entry / "ns/pid").readlink() == namespace:
                    inside.add(int(entry.name))
    assert inside == {init, child}


def attack_as(proc: DecoderProcess, owner: str) -> str:
    with pytest.raises(DeriveError) as info:
        proc.derive(DUNE, owner=owner)
    return info.value.detail


def test_a_decoder_spinning_forever_is_ended_by_its_cpu_limit() -> None:
    # The wall-clock limit is far away: only the CPU limit's SIGXCPU can end this job,
    # and the decoder is not its namespace's init, which would ignore it.
    with DecoderProcess(LIMITS, timeout=120.0, memory_mb=1024, program=hostile("spin")) as proc:
        error = attack(proc)
    assert error.detail == "child killed by SIGXCPU"


def test_a_timeout_kills_the_decoder_and_closing_ends_its_slots_init() -> None:
    with DecoderProcess(LIMITS, timeout=1.0, memory_mb=1024, program=hostile("hang")) as proc:
        proc.start()
        decoder = child_pid(proc)
        init = int(status(decoder)["PPid"])
        with pytest.raises(DeriveError) as info:
            proc.derive(DUNE)
        assert info.value.code == ErrorCode.PROCESSING_TIMEOUT
        # The decoder is killed (and reaped by the slot's init, which serves on).
        wait_for(lambda: ended(decoder), timeout=5.0, what="decoder ended")
        assert not ended(init)
    # Closing the slot ends its init, at most a zombie for the host to reap.
    wait_for(lambda: ended(init), timeout=5.0, what="init ended")


def test_a_new_owner_gets_a_fresh_child_forked_by_the_zygote(secrets: dict[str, str]) -> None:
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        proc.derive(DUNE, owner="a")
        first, zygote = child_pid(proc), proc.zygote_pid
        first_parent = int(status(first)["PPid"])
        assert zygote is not None
        proc.derive(DUNE, owner="b")
        second = child_pid(proc)
        assert second != first
        wait_for(lambda: ended(first), timeout=5.0, what="first child ended")
        # decoder → the slot's init (PID 1 of the slot's namespace) → the same zygote
        init = int(status(second)["PPid"])
        assert init == int(status(first_parent)["Pid"])
        assert int(status(init)["PPid"]) == zygote == proc.zygote_pid
        assert status(init)["NSpid"].split()[-1] == "1"
        assert status(second)["NSpid"].split() == [str(second), "2"]
        # The slot's PID namespace, a mount namespace of its own (its /proc cover).
        namespace = {name: Path(f"/proc/{second}/ns/{name}").readlink() for name in ("pid", "mnt")}
        assert namespace["pid"] == Path(f"/proc/{init}/ns/pid").readlink()
        assert namespace["mnt"] != Path(f"/proc/{init}/ns/mnt").readlink()
        if AS_ROOT:
            assert status(second)["Uid"].split()[0] == str(OWN_UID_BASE + second)
        # The zygote and the init: no secret, no privilege to gain by exec, a seccomp
        # filter of their own; of its live child the init holds only a pidfd and the pipe
        # for its exit code (besides its stdin, stdout, stderr and control socket): none
        # of the child's own pipes. The zygote holds its stderr, its init's pidfd and the
        # pipe whose end tells the init it still lives.
        for process in (zygote, init):
            environ = Path(f"/proc/{process}/environ").read_bytes()
            assert not any(value.encode() in environ for value in secrets.values())
            assert status(process)["NoNewPrivs"] == "1" and status(process)["Seccomp"] == "2"
        assert len(os.listdir(f"/proc/{init}/fd")) == 4 + 2
        assert len(os.listdir(f"/proc/{zygote}/fd")) == 3
    assert ended(zygote) and ended(init)  # close() ends the zygote and its init too


def test_a_child_started_on_its_own_is_jailed_the_same() -> None:
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024, zygote=False) as proc:
        assert proc.derive(DUNE).width == 1680
        pid = child_pid(proc)
        assert proc.zygote_pid is None
        assert status(pid)["NSpid"].split() == [str(pid), "2"]
        assert status(pid)["Seccomp"] == "2" and status(pid)["NoNewPrivs"] == "1"
        if AS_ROOT:
            assert status(pid)["Uid"].split()[0] == str(OWN_UID_BASE + pid)


def test_a_dead_zygote_is_replaced_and_the_next_file_is_fine() -> None:
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        proc.derive(DUNE, owner="a")
        zygote = proc.zygote_pid
        assert zygote is not None
        os.kill(zygote, 9)
        wait_for(lambda: ended(zygote), timeout=5.0, what="zygote killed")
        assert proc.derive(DUNE, owner="b").width == 1680
        assert proc.zygote_pid not in (None, zygote)


def test_hostile_cannot_map_executable_memory() -> None:
    with compromised("exec-memory") as proc:
        detail = attack(proc).detail
    assert "mmap rwx: refused (EPERM)" in detail
    assert "mprotect rwx: refused (EPERM)" in detail


def test_hostile_sees_no_process() -> None:
    with compromised("proc") as proc:
        detail = attack(proc).detail
    assert "list /proc: done 0" in detail or "list /proc: refused" in detail
    assert "parent status: refused" in detail


def service_files(root: Path, owner: int | None = None) -> dict[str, Path]:
    """What lies around a worker: its data directory (0700) with the admin key file and
    the local store's originals of several owners, PostgreSQL's data directory (0700),
    and a world-readable file beside them."""
    data, pgdata = root / "data", root / "pgdata"
    files = {
        "key file": data / "admin.key",
        "another owner's original": data / "store" / "owner-b" / "original.jpg",
        "data dir": data,
        "postgres file": pgdata / "PG_VERSION",
        "world-readable file": root / "public.txt",
    }
    for path in (data / "store" / "owner-b", pgdata):
        path.mkdir(parents=True, exist_ok=True)
    files["key file"].write_text("admin-key-hunter2")
    files["another owner's original"].write_bytes(DUNE[:100])
    files["postgres file"].write_text("16")
    files["world-readable file"].write_text("public-hunter2")
    for path in (data, data / "store", data / "store" / "owner-b", pgdata):
        path.chmod(0o700)
    for path in (files["key file"], files["postgres file"]):
        path.chmod(0o600)
    files["another owner's original"].chmod(0o644)
    files["world-readable file"].chmod(0o644)
    root.chmod(0o755)
    if owner is not None:
        for path in (root, *root.rglob("*")):
            os.chown(path, owner, owner)
    return files


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A directory every user may traverse, as the parents of a service's files are."""
    path = Path(tempfile.mkdtemp(prefix="darkroom-host-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_hostile_reads_nothing_around_it(host_dir: Path) -> None:
    root = host_dir
    files = service_files(root)
    targets = [*map(str, files.values()), "/etc/passwd", str(Path(__file__))]
    with compromised("read", *targets) as proc:
        detail = attack(proc).detail
    for i, target in enumerate(targets):
        assert f"read #{i}: refused" in detail, (target, detail)
    assert "hunter2" not in detail and "root:" not in detail


def test_hostile_gets_no_path_handle(host_dir: Path) -> None:
    files = service_files(host_dir)
    targets = [str(files["key file"]), "/etc/passwd", "/"]
    with compromised("o_path", *targets) as proc:
        detail = attack(proc).detail
    for i, target in enumerate(targets):
        assert f"O_PATH #{i}: refused (EPERM)" in detail, (target, detail)


NON_ROOT_UID = 4242
NON_ROOT_SCRIPT = """
import os, sys
from darkroom.config import load_settings
from darkroom.derive import Limits
from darkroom.errors import DeriveError
from darkroom.sandbox import DecoderProcess
from tests.derive.hostile_child import hostile
from tests.support.services import wait_for
limits = Limits.from_settings(load_settings())
# The worker's own user reads all of them: only the jail may stand in the way.
for path in sys.argv[2:]:
    if not os.path.isdir(path):
        open(path, "rb").close()
with DecoderProcess(limits, timeout=30.0, memory_mb=1024,
                    program=hostile("read", *sys.argv[2:])) as proc:
    try:
        proc.derive(open(sys.argv[1], "rb").read())
    except DeriveError as exc:
        print(exc.detail)
"""


def non_root_env(home: Path) -> dict[str, str]:
    # This checkout and its packages, importable by an interpreter outside the venv.
    paths = [str(Path(__file__).resolve().parents[2]), sysconfig.get_paths()["purelib"]]
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
            "PYTHONPATH": os.pathsep.join(paths)}


def python_for(as_user: list[str]) -> str:
    """An interpreter of this version that the other user may run (a venv's may live in a
    private home), able to start a child as the worker does."""
    spawn = "import subprocess, sys, pyvips; subprocess.run([sys.executable, '-c', ''], check=True)"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, shutil.which(version, path="/usr/local/bin:/usr/bin")):
        if python and not subprocess.run([*as_user, python, "-c", spawn], capture_output=True,
                                         cwd="/", env=non_root_env(Path("/")),
                                         check=False).returncode:
            return python
    pytest.skip("no Python of this version that another user may start")


@pytest.mark.skipif(not AS_ROOT or not shutil.which("setpriv"),
                    reason="needs root and setpriv to start a worker as another user")
def test_hostile_of_a_non_root_worker_reads_none_of_its_users_files(host_dir: Path) -> None:
    # A worker that does not run as root: its child keeps the worker's uid, so only the
    # jail's filesystem layer stands between it and every file of that user.
    as_user = ["setpriv", f"--reuid={NON_ROOT_UID}", f"--regid={NON_ROOT_UID}", "--clear-groups"]
    python = python_for(as_user)
    root = host_dir
    files = service_files(root, owner=NON_ROOT_UID)
    targets = [*map(str, files.values()), "/etc/passwd"]
    done = subprocess.run(
        [*as_user, python, "-c", NON_ROOT_SCRIPT, str(im.CORPUS / "Dune.jpg"), *targets],
        capture_output=True, text=True, timeout=120, cwd="/", env=non_root_env(root),
    )
    assert done.returncode == 0, done.stderr
    for i, target in enumerate(targets):
        assert f"read #{i}: refused" in done.stdout, (target, done.stdout)
    assert "hunter2" not in done.stdout


PEEK_SCRIPT = """
import sys
from darkroom.config import load_settings
from darkroom.derive import Limits
from darkroom.errors import DeriveError
from darkroom.sandbox import DecoderProcess
from tests.derive.hostile_child import hostile
limits = Limits.from_settings(load_settings())
with DecoderProcess(limits, timeout=30.0, memory_mb=1024, program=hostile("peek")) as proc:
    for owner in ("alice", "bob"):
        try:
            proc.derive(open(sys.argv[1], "rb").read(), owner=owner)
        except DeriveError as exc:
            print(exc.detail)
"""


@pytest.mark.skipif(not AS_ROOT or not shutil.which("setpriv"),
                    reason="needs root and setpriv to start a worker as another user")
def test_a_child_of_a_non_root_worker_cannot_open_its_inits_or_zygotes_memory() -> None:
    # The slot's init forks every owner's child; with a non-root worker each child keeps
    # the worker's uid (and, before its lock-down, sees the host's /proc). The init and
    # the zygote are not dumpable, so even then their memory is closed to it.
    as_user = ["setpriv", f"--reuid={NON_ROOT_UID}", f"--regid={NON_ROOT_UID}", "--clear-groups"]
    done = subprocess.run(
        [*as_user, python_for(as_user), "-c", PEEK_SCRIPT, str(im.CORPUS / "Dune.jpg")],
        capture_output=True, text=True, timeout=120, cwd="/", env=non_root_env(Path("/")),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["init memory: refused (EACCES); zygote memory: refused (EACCES)"] * 2


@pytest.mark.parametrize("kind", ["file", "png", "dimensions", "edge", "padded", "thumbhash",
                                  "oversized"])
def test_a_forged_derivative_kills_the_child_and_stores_nothing(kind: str) -> None:
    with compromised("forge", kind) as proc:
        with pytest.raises(DeriveError) as info:
            proc.derive(DUNE)
        assert info.value.code == ErrorCode.PROCESSING_FAILED
        if kind == "oversized":  # refused by its frame, before a byte of it is read
            assert info.value.detail == "child killed by SIGKILL"
        else:
            assert info.value.detail == "invalid child output"
        assert proc.pid is None  # killed and forgotten, never asked again
        proc.program = DECODER
        assert proc.derive(DUNE) == derive(DUNE, LIMITS)


def test_a_child_never_serves_a_second_owner() -> None:
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        proc.derive(DUNE, owner="alice")
        first = child_pid(proc)
        proc.derive(DUNE, owner="alice")
        assert child_pid(proc) == first  # the same owner keeps the warm child
        proc.derive(DUNE, owner="bob")
        second = child_pid(proc)
        assert second != first
        proc.derive(DUNE, owner="alice")
        assert child_pid(proc) not in (first, second)


def test_a_child_started_ahead_takes_its_first_owner_without_a_fork() -> None:
    with DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) as proc:
        proc.start()  # as the worker starts every slot's child: it has decoded nothing
        ahead = child_pid(proc)
        proc.derive(DUNE, owner="alice")
        assert child_pid(proc) == ahead  # nobody's bytes in it: no fresh child needed
        assert proc.owner == "alice"
        proc.derive(DUNE, owner="bob")
        assert child_pid(proc) != ahead  # but once fed, never a second owner's


def test_the_worker_gives_a_job_to_a_child_that_already_holds_its_owners_images() -> None:
    from darkroom.worker import pick_decoder

    decoders = [DecoderProcess(LIMITS, timeout=30.0, memory_mb=1024) for _ in range(3)]
    try:
        decoders[0].derive(DUNE, owner="alice")
        decoders[1].derive(DUNE, owner="bob")
        assert [d.owner for d in decoders] == ["alice", "bob", None]
        assert pick_decoder(decoders, "alice") == 0  # no start-up: its child is warm
        assert pick_decoder(decoders, "bob") == 1
        assert pick_decoder(decoders, "carol") == 2  # a child that has seen nobody's
        assert pick_decoder(decoders[:2], "carol") == 1  # else any: it is replaced
        decoders[0].kill()
        assert decoders[0].owner is None  # no child, nothing held
    finally:
        for decoder in decoders:
            decoder.close()
