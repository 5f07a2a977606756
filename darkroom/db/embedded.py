"""The embedded PostgreSQL: the `pgserver` wheel's binaries, driven directly, in
`$DARKROOM_DATA_DIR/pg`.

Every darkroom process with the same data dir joins the same server (its postmaster.pid
says it runs), so `darkroom up`, `darkroom stats` and `darkroom migrate` all see one
database without any configuration.

The server is private to whoever runs darkroom, by construction:

- no TCP listener at all (`listen_addresses` empty on the command line, which outranks
  every configuration file), and its socket lives in the cluster directory itself (0700,
  owned by the server's user), never in a shared directory: a data dir whose socket path
  would be too long for a Unix socket is refused with one line;
- every connection needs the superuser's password (scram-sha-256; pg_hba.conf has that
  one line, and clients require it), which lives in a 0600 pgpass file beside the
  cluster (`.pg.pass` in the data dir: darkroom's, never the server's user's, who could
  point a link of its own at a file of root's) and reaches clients as a `passfile`
  path, never in a URL or a log line;
- no directory's mode is ever widened: the data dir is made or narrowed to 0700 and its
  parents are left alone; a data dir of another user, or under a directory another user
  owns or may write to, is refused (they could swap in one of their own).

PostgreSQL refuses to run as root. When darkroom runs as root, the server runs as the
unprivileged system user `darkroom` (created if missing), which owns the cluster
directory; the data dir stays root's, that user's group allowed only to pass through
(0710). Nothing is opened up for that user: the server's programs, where it cannot
reach them through their parents' own modes (a virtualenv under `/root`, say), are copied
once to `/usr/local/lib/darkroom` (root's, readable by all); a data dir it cannot reach so is
refused with one line.

The pgserver Python wrapper is not used: it initialises with trust authentication, moves
a long socket path to a world-writable runtime directory, and adds o+rx to every parent.
A cluster it made is upgraded in place on the next start (password set, pg_hba.conf
rewritten, files handed to the service user), keeping every row.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import functools
import hashlib
import importlib.util
import os
import pwd
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from darkroom.config import ConfigError
from darkroom.storage.local import (
    check_data_dir,
    is_own_data_dir,
    linked_own_name,
    opened_data_dir,
    private_dir,
    write_private,
)

# The system user the server runs as when darkroom runs as root.
SERVICE_USER = "darkroom"
SUPERUSER = "postgres"
PORT = 5432
SOCKET_NAME = f".s.PGSQL.{PORT}"
PASSFILE = ".pg.pass"  # in the data dir, beside the cluster
LEGACY_PASSFILE = "darkroom.pgpass"  # in the cluster, by earlier releases
LEGACY_SERVICE_USER = "pgserver"
# sizeof(sockaddr_un.sun_path) on Linux, less its terminating NUL.
MAX_SOCKET_PATH = 107
# The whole client-authentication policy: a password, over the socket only. A line that
# is not this file is a cluster made before (trust) or edited by hand: start rewrites it.
HBA = (
    "# Written by darkroom at every start: password (scram-sha-256) over the Unix socket,\n"
    "# which lives in this 0700 directory; the server listens on no TCP address.\n"
    "local all all scram-sha-256\n"
)


@dataclass(frozen=True)
class Account:
    """Who the server's processes and files belong to (None: darkroom's own uid)."""

    uid: int
    gid: int
    name: str


# Where root keeps its own copy of PostgreSQL's programs when the service user cannot
# reach the copy in darkroom's environment (a virtualenv under /root, say): root-owned,
# writable by root alone, readable by all, as a package manager would install them. Not
# in /var/lib/darkroom, the data dir darkroom suggests (and the service user's in the
# releases before 2026-12-04).
SHARED_INSTALLS = Path("/usr/local/lib/darkroom")
# A cluster's directories nest a few levels (base/<database>/, pg_wal/archive_status/);
# the hand-over walks no deeper (the server's user could nest thousands).
CLUSTER_DEPTH = 16
# As root, the data dir: root's, its group the service user's, who may only pass through.
SERVED_DATA_DIR_MODE = 0o710


def binary(name: str) -> str:
    return str(_install() / "bin" / name)


@functools.cache
def _install() -> Path:
    """PostgreSQL's program tree: the pgserver wheel's, or, as root when the service user
    cannot traverse to it, a copy of it that it can (no directory's mode is widened)."""
    # Located without importing pgserver, whose import probes and warns about the
    # runtime directory this module exists not to use.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the embedded PostgreSQL needs the pgserver package; "
                          "install darkroom's dependencies or set DARKROOM_DATABASE_URL")
    wheel = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    account = service_account()
    if account is None or all(_reachable(p, account) for p in (wheel, *wheel.parents)):
        return wheel
    # Named by the server program's bytes: another build gets a copy of its own.
    with (wheel / "bin" / "postgres").open("rb") as program:
        digest = hashlib.file_digest(program, "sha256").hexdigest()[:16]
    # The programs find their shared libraries beside the package (pgserver.libs, by a
    # relative rpath), so the copy keeps both where they stand to each other.
    copy = SHARED_INSTALLS / f"postgresql-{digest}"
    SHARED_INSTALLS.mkdir(mode=0o755, parents=True, exist_ok=True)
    _check_roots_alone(SHARED_INSTALLS)
    if not (copy / "pgserver" / "pginstall" / "bin" / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix=".postgresql-", dir=SHARED_INSTALLS))
        tree = staging / "tree"
        shutil.copytree(wheel, tree / "pgserver" / "pginstall", symlinks=True)
        libs = wheel.parent.parent / "pgserver.libs"
        if libs.is_dir():
            shutil.copytree(libs, tree / "pgserver.libs", symlinks=True)
        for path in (tree, *tree.rglob("*")):
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        with contextlib.suppress(OSError):  # another start made it first: the same tree
            tree.rename(copy)
        shutil.rmtree(staging, ignore_errors=True)
    return copy / "pgserver" / "pginstall"


def _check_roots_alone(path: Path) -> None:
    """Refuse a directory that anyone but root may change, it or a parent: the copy of
    PostgreSQL's programs goes there by name, and is run by the server. Walked from / by
    descriptor, no link followed."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in path.parts[1:]:
            try:
                step = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                               | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                raise ConfigError(f"{path} is not a directory darkroom can check (a link?); "
                                  "remove it") from None
            os.close(fd)
            fd = step
            st = os.fstat(fd)
            if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
                raise ConfigError(
                    f"{path} (or a directory above it) may be changed by others than root; "
                    "darkroom keeps its copy of PostgreSQL's programs only where root alone "
                    "may: fix its owner and mode, or install darkroom where the service user "
                    "can reach it")
    finally:
        os.close(fd)


def service_account() -> Account | None:
    """The account the server runs as: None (darkroom's own) unless darkroom is root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        entry = _create_service_user()
    if entry.pw_uid == 0:
        raise ConfigError(f"the system user {SERVICE_USER!r} is root; the embedded "
                          "PostgreSQL must run as an unprivileged user")
    return Account(entry.pw_uid, entry.pw_gid, SERVICE_USER)


def _legacy_owner() -> tuple[int, ...]:
    """The user the pgserver wrapper ran the server as, as root, in earlier releases: a
    cluster it made is darkroom's own, to be handed to the service user."""
    try:
        return (pwd.getpwnam(LEGACY_SERVICE_USER).pw_uid,)
    except KeyError:
        return ()


def _create_service_user() -> pwd.struct_passwd:
    """Create the service account once, however many darkroom processes start together.

    Two `useradd`s at once can both pass their own "does it exist" check and leave
    /etc/passwd with a user other than the one the first of them was told about; so the
    starts take a lock of darkroom's own (in a directory only root may write) and look
    again once they hold it.
    """
    lock_dir = Path("/run") if Path("/run").is_dir() else Path("/etc")
    fd = os.open(lock_dir / ".darkroom-account.lock",
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(SERVICE_USER)
        made = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home",
             "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", SERVICE_USER],
            capture_output=True, check=False)
        try:
            return pwd.getpwnam(SERVICE_USER)
        except KeyError:
            raise ConfigError(
                f"running as root, the embedded PostgreSQL needs the system user "
                f"{SERVICE_USER!r}, which could not be created (useradd exit "
                f"{made.returncode}); create it, run darkroom as an unprivileged user, or "
                f"set DARKROOM_DATABASE_URL") from None
    finally:
        os.close(fd)  # and with it the lock


def _env() -> dict[str, str]:
    # No PG* variable of the caller's may redirect or authenticate a command.
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _run(account: Account | None, args: list[str], *, check: bool = True,
         input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    if account is None:
        return subprocess.run(args, input=input, capture_output=True, check=check,
                              env=_env(), cwd="/", timeout=timeout)
    return subprocess.run(args, input=input, capture_output=True, check=check, env=_env(),
                          cwd="/", timeout=timeout, user=account.uid, group=account.gid,
                          extra_groups=[])


def _owner_of(pgdata: Path, account: Account | None) -> Account | None:
    """Who may stop a running server in `pgdata`: the owner of its files, as root."""
    if account is None:
        return None
    st = pgdata.stat()
    if st.st_uid == 0:
        return account
    return Account(st.st_uid, st.st_gid, str(st.st_uid))


def pg_ctl(pgdata: Path, *args: str, check: bool = True, timeout: float = 120) -> int:
    """Run the bundled pg_ctl on `pgdata` as the server's owner; answers its exit code."""
    owner = _owner_of(pgdata, service_account())
    done = _run(owner, [binary("pg_ctl"), "-D", str(pgdata), *args], check=False,
                timeout=timeout)
    if check and done.returncode != 0:
        raise ConfigError(f"embedded PostgreSQL in {pgdata}: pg_ctl {args[-1]} failed "
                          f"(exit {done.returncode}); see {pgdata / 'log'}")
    return done.returncode


def socket_path(pgdata: Path) -> Path:
    return pgdata / SOCKET_NAME


def _check_socket_length(pgdata: Path) -> None:
    length = len(os.fsencode(socket_path(pgdata)))
    if length > MAX_SOCKET_PATH:
        raise ConfigError(
            f"the data dir path is too long for the embedded PostgreSQL's socket "
            f"({length} bytes with {SOCKET_NAME}; at most {MAX_SOCKET_PATH}): choose a "
            f"shorter DARKROOM_DATA_DIR")


def _reachable(path: Path, account: Account) -> bool:
    """Whether `account` may traverse `path` by the modes as they are (no ACLs widened).
    A path still to be made is made private, root's: not for it to traverse."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == account.uid:
        return bool(mode & stat.S_IXUSR)
    if st.st_gid == account.gid:
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def _check_parents(data_dir: Path) -> None:
    """Refuse a data dir that another local user could move aside and replace (and so
    hand darkroom a socket and a passfile of their own): every parent must belong to
    root or to us, and be writable by no one else unless sticky, as /tmp is."""
    me = os.geteuid()
    for parent in data_dir.parents:
        try:
            st = parent.stat()
        except FileNotFoundError:
            continue  # darkroom makes it, its own and private
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, me):
            raise ConfigError(f"{parent}, above the data dir, belongs to another user "
                              f"(uid {st.st_uid}); choose a data dir in directories of "
                              "your own")
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
            raise ConfigError(f"{parent}, above the data dir, is writable by other users; "
                              "choose a data dir in directories of your own")


def _prepare_data_dir(pgdata: Path, account: Account | None) -> None:
    """The data dir made or narrowed for the cluster; every refusal comes before anything
    is changed, so a refused start leaves every directory as it was."""
    data_dir = pgdata.parent
    _check_parents(data_dir)
    # A data dir someone else made (in /tmp, say) stays theirs to open up again. As root,
    # the server's user (or the one an earlier release ran the server as) may own the
    # data dir, as releases before 2026-12-04 left it, and the cluster in it, but nothing
    # else there: a store or a key that user put in the data dir would be written through
    # by root's processes, wherever its links lead.
    served = (account.uid, *_legacy_owner()) if account else ()
    owners = (os.geteuid(), *served)
    check_data_dir(data_dir, owners)
    # As root it is handed to the server's group (below): only a directory of darkroom's
    # own, never one that holds other files (/root, say).
    if account is not None and data_dir.exists() and not _is_roots_data_dir(data_dir, served):
        if link := linked_own_name(data_dir):
            raise ConfigError(f"{link} is a link; darkroom follows none of its own names "
                              f"in the data dir: remove it")
        raise ConfigError(_HOLDS_OTHER_FILES.format(data_dir=data_dir))
    if os.path.lexists(pgdata) and not stat.S_ISDIR(pgdata.lstat().st_mode):
        raise ConfigError(f"{pgdata} is not a directory; move it away")
    if account is not None:
        for parent in data_dir.parents:
            if not _reachable(parent, account):
                raise ConfigError(
                    f"running as root, the embedded PostgreSQL runs as user "
                    f"{account.name!r}, which cannot enter {parent} (darkroom widens no "
                    f"directory's mode): set DARKROOM_DATA_DIR to a directory outside it "
                    f"(e.g. /var/lib/darkroom), run darkroom as an unprivileged user, or set "
                    f"DARKROOM_DATABASE_URL")
        # The server's own programs too: a virtualenv under /root is out of its reach.
        install = Path(binary("postgres")).parent.parent
        for parent in (install, *install.parents):
            if not _reachable(parent, account):
                raise ConfigError(
                    f"running as root, the embedded PostgreSQL runs as user "
                    f"{account.name!r}, which cannot enter {parent} to run its programs "
                    f"(darkroom widens no directory's mode): install darkroom outside it, "
                    f"run darkroom as an unprivileged user, or set DARKROOM_DATABASE_URL")
    private_dir(data_dir, owners)
    if account is None:
        return
    # The server only has to pass through the data dir to its cluster: root keeps it,
    # and the service user's group may traverse it (0710), never list or rename in it
    # (else it could swap `objects` or a file root writes here for a link of its own).
    with opened_data_dir(data_dir, owners) as fd:
        if not _is_roots_data_dir(fd, served):
            raise ConfigError(_HOLDS_OTHER_FILES.format(data_dir=data_dir))
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (0, account.gid):
            os.fchown(fd, 0, account.gid)
        if stat.S_IMODE(st.st_mode) != SERVED_DATA_DIR_MODE:
            os.fchmod(fd, SERVED_DATA_DIR_MODE)
        # Until then a data dir of the server's user's was that user's to write in: what
        # it put there meanwhile is refused, now that it can put nothing more; and in a
        # sticky parent it could exchange the data dir's name with a directory of its
        # own until root took this one, which it can no longer move.
        if not _is_roots_data_dir(fd, served):
            raise ConfigError(_HOLDS_OTHER_FILES.format(data_dir=data_dir))
        now = os.lstat(data_dir)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise ConfigError(f"the data dir {data_dir} changed while darkroom took it; "
                              "choose a directory of darkroom's own")


def _is_roots_data_dir(data_dir: Path | int, served: tuple[int, ...]) -> bool:
    """As root: darkroom's own data dir, every entry root's but the cluster (`served`'s)."""
    return is_own_data_dir(data_dir, (0,), served_by=served)


_HOLDS_OTHER_FILES = ("the data dir {data_dir} holds other files; running as root, darkroom "
                      "gives its data dir to the server's group: choose a new, empty or "
                      "darkroom's own directory")


@contextlib.contextmanager
def _locked(pgdata: Path) -> Iterator[None]:
    """One process at a time initialises, upgrades or starts the server."""
    lock = pgdata.with_name(f".{pgdata.name}.lock")
    # As root the data dir is the service user's: a link it put here must not make root
    # create (or lock) a file it names elsewhere.
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                     | os.O_NONBLOCK, 0o600)
    except OSError:
        raise ConfigError(f"{lock} is not a file darkroom can lock (a link?); "
                          "remove it") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{lock} is not a regular file; remove it")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _running_postmaster(pgdata: Path) -> tuple[int, list[str]] | None:
    """The pid and postmaster.pid lines of a server running in `pgdata`, else None.

    Checked by darkroom itself rather than by `pg_ctl status` as the files' owner: a
    server made before may belong to a user that can no longer enter the (now private)
    data dir, and must still be seen, and stopped, before its files are touched.
    """
    try:
        lines = _read_inside(pgdata / "postmaster.pid").splitlines()
        pid = int(lines[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (ProcessLookupError, FileNotFoundError):
        return None
    except PermissionError:
        raise ConfigError(f"a PostgreSQL of another user runs in {pgdata}; "
                          "stop it first") from None
    # A stale pid file whose pid now belongs to some other process is not a server.
    try:
        data = os.fsdecode(args[args.index(b"-D") + 1])
        if Path(args[0].decode()).name != "postgres" or not os.path.samefile(data, pgdata):
            return None
    except (ValueError, IndexError, OSError):
        return None
    return pid, lines


def _stop(pid: int, pgdata: Path) -> None:
    """A fast shutdown (what `pg_ctl stop -m fast` sends), waited for."""
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise ConfigError(f"the PostgreSQL running in {pgdata} did not stop within 60 s")


def _read_inside(path: Path) -> str:
    """A file of the cluster directory, read as root reads what the server's user owns:
    never through a link (that user could point one at any file of root's), and only a
    regular file. Raises FileNotFoundError for anything else, as for a missing file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileNotFoundError(errno.ENOENT, "a link, not read", str(path)) from None
        raise
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileNotFoundError(errno.ENOENT, "not a regular file", str(path))
        return file.read(1 << 16).decode(errors="replace")


def _write_owned(path: Path, data: str, account: Account | None, *,
                 group: bool = False) -> None:
    """Replace `path` with `data`: 0600, the server's user's, never half-written. The
    file is handed to that user through its descriptor, never by name: in the cluster
    directory, which that user owns, a name may be a link to a file of root's by the
    time root uses it. With `group`, the file stays root's and that user's group may read
    it (0640): one left behind by a start cut short is root's, not that user's."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            if account is not None and group:
                os.fchown(out.fileno(), -1, account.gid)
                os.fchmod(out.fileno(), 0o640)
            elif account is not None:
                os.fchown(out.fileno(), account.uid, account.gid)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def passfile(pgdata: Path) -> Path:
    """The clients' pgpass file: in the data dir, which is darkroom's (root's, as root)."""
    return pgdata.parent / PASSFILE


def _password(pgdata: Path, path: Path | None = None) -> str | None:
    try:
        line = _read_inside(path or passfile(pgdata)).strip()
    except FileNotFoundError:
        return None
    return line.rsplit(":", 1)[1] if line.count(":") == 4 else None


def _initdb_password_file(pgdata: Path) -> Path:
    """Where initdb reads the new cluster's password from (not in the cluster dir, which
    must be empty)."""
    return pgdata.with_name(f".{pgdata.name}.initpw")


def _initdb(pgdata: Path, account: Account | None) -> None:
    try:
        os.mkdir(pgdata, 0o700)
    except FileExistsError:
        if not stat.S_ISDIR(pgdata.lstat().st_mode):  # a link put there since the checks
            raise ConfigError(f"{pgdata} is not a directory; move it away") from None
    if account is not None:
        os.chown(pgdata, account.uid, account.gid, follow_symlinks=False)
    password = secrets.token_urlsafe(32)
    # initdb reads the password from a file; it may not live in the (empty) cluster dir.
    pwfile = _initdb_password_file(pgdata)
    _write_owned(pwfile, password + "\n", account, group=True)
    try:
        done = _run(account, [binary("initdb"), "-D", str(pgdata), "-U", SUPERUSER,
                              "--encoding=utf8", "--auth=scram-sha-256",
                              f"--pwfile={pwfile}"], check=False)
    finally:
        pwfile.unlink(missing_ok=True)
    if done.returncode != 0:
        raise ConfigError(f"embedded PostgreSQL: initdb in {pgdata} failed "
                          f"(exit {done.returncode})")
    write_private(passfile(pgdata), f"*:*:*:{SUPERUSER}:{password}\n".encode())
    _write_owned(pgdata / "pg_hba.conf", HBA, account)


def _is_private(pgdata: Path, account: Account | None) -> bool:
    try:
        hba = _read_inside(pgdata / "pg_hba.conf")
    except FileNotFoundError:
        return False
    if hba != HBA or _password(pgdata) is None:
        return False
    if account is None:
        return True
    st = pgdata.stat()
    return (st.st_uid, st.st_gid) == (account.uid, account.gid)


def _chown_tree(root: Path, account: Account) -> None:
    """Hand a cluster made before to the server's user, walked by descriptor: every name
    opened without following a link and without blocking (a FIFO is never opened for
    reading), every directory entered through the descriptor of the very directory
    checked, so nothing the server's user swaps in the tree meanwhile leads root out of
    it or holds it."""
    os.chown(root, account.uid, account.gid, follow_symlinks=False)
    ours = (account.uid, *_legacy_owner())
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _hand_over_dir(fd, account, ours, CLUSTER_DEPTH)
    finally:
        os.close(fd)


def _hand_over_dir(dir_fd: int, account: Account, ours: tuple[int, ...], depth: int) -> None:
    if depth == 0:
        raise ConfigError(f"the embedded PostgreSQL's cluster holds directories nested deeper "
                          f"than PostgreSQL makes them ({CLUSTER_DEPTH}); remove them")
    for name in os.listdir(dir_fd):
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                inside = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                try:
                    _hand_over_dir(inside, account, ours, depth - 1)
                finally:
                    os.close(inside)
            _hand_over(fd, st, account, ours)
        finally:
            os.close(fd)


def _hand_over(fd: int, st: os.stat_result, account: Account, ours: tuple[int, ...]) -> None:
    """Chown one file of the cluster, open at `fd` (O_PATH) and checked as `st`, to the
    server's user if a server of darkroom's made it: not root's (a file of root's the
    server's user renamed into its cluster, a key say), not another user's, nor a hard
    link that user made to a file of someone else's it may write to. The file checked is
    the file chowned: a name swapped meanwhile (renameat2's exchange) changes nothing."""
    if (st.st_uid not in ours or stat.S_ISLNK(st.st_mode)
            or (not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1)):
        return
    try:
        # fchown does not take an O_PATH descriptor; its /proc link names that file.
        os.chown(f"/proc/self/fd/{fd}", account.uid, account.gid)
    except FileNotFoundError:
        raise ConfigError("handing the embedded PostgreSQL's cluster to its user needs /proc "
                          "mounted") from None


def _make_private(pgdata: Path, account: Account | None) -> None:
    """Upgrade a stopped cluster made before (trust authentication) in place.

    Each step is idempotent and pg_hba.conf is written last, so a start interrupted at
    any point redoes the rest next time, and no row is touched.
    """
    if account is not None:
        _chown_tree(pgdata, account)
    pgdata.chmod(0o700)
    password = _password(pgdata)
    if password is None:
        # The one an earlier release kept in the cluster, if any: the server has it, so
        # a start interrupted after this write still finds the two agreeing.
        password = (_password(pgdata, pgdata / LEGACY_PASSFILE)
                    or secrets.token_urlsafe(32))
        write_private(passfile(pgdata), f"*:*:*:{SUPERUSER}:{password}\n".encode())
    # Single-user mode: no socket and no listener while the password is set.
    done = _run(account, [binary("postgres"), "--single", "-D", str(pgdata),
                          "-c", "password_encryption=scram-sha-256", "postgres"],
                input=f"ALTER ROLE {SUPERUSER} PASSWORD '{password}'\n".encode(),
                check=False)
    if done.returncode != 0 or b"ERROR" in done.stderr + done.stdout:
        raise ConfigError(f"embedded PostgreSQL in {pgdata}: setting its password failed "
                          f"(exit {done.returncode})")
    _write_owned(pgdata / "pg_hba.conf", HBA, account)
    # An earlier release kept the password in the cluster: no longer read, not left.
    (pgdata / LEGACY_PASSFILE).unlink(missing_ok=True)


def _start(pgdata: Path) -> None:
    options = " ".join([
        "-h ''",  # no TCP address at all
        f"-k {shlex.quote(str(pgdata))}",
        f"-p {PORT}",
        "-c unix_socket_permissions=0700",
        "-c password_encryption=scram-sha-256",
    ])
    pg_ctl(pgdata, "-w", "-t", "60", "-l", str(pgdata / "log"), "-o", options, "start")


@dataclass
class Server:
    """A handle on the running server; `cleanup` stops it if this handle was asked to."""

    pgdata: Path
    stop_on_exit: bool = False
    _stopped: bool = field(default=False, repr=False)

    def get_uri(self, database: str = "postgres") -> str:
        # A password is sent only by SCRAM, which proves it without revealing it, even
        # to a server that the server's user put in the real one's place.
        query = urllib.parse.urlencode({"host": str(self.pgdata), "port": str(PORT),
                                        "passfile": str(passfile(self.pgdata)),
                                        "require_auth": "scram-sha-256"})
        return f"postgresql://{SUPERUSER}@/{urllib.parse.quote(database)}?{query}"

    def cleanup(self) -> None:
        if not self.stop_on_exit or self._stopped:
            return
        self._stopped = True
        if (self.pgdata / "postmaster.pid").exists():
            pg_ctl(self.pgdata, "-w", "-m", "fast", "stop", check=False)


def start(pgdata: Path, *, stop_on_exit: bool = False) -> Server:
    """Start (or join) the private server in `pgdata`, making or upgrading it first."""
    pgdata = pgdata.expanduser().absolute()
    _check_socket_length(pgdata)
    account = service_account()
    _prepare_data_dir(pgdata, account)
    try:
        with _locked(pgdata):
            # One a start cut short during its initdb left (initdb runs under this lock).
            _initdb_password_file(pgdata).unlink(missing_ok=True)
            # The data dir is now root's alone (as root): nothing can put a link at the
            # cluster's name from here on, so one checked now stays checked.
            if os.path.lexists(pgdata) and not stat.S_ISDIR(pgdata.lstat().st_mode):
                raise ConfigError(f"{pgdata} is not a directory; move it away")
            if not (pgdata / "PG_VERSION").exists():
                if pgdata.exists() and any(pgdata.iterdir()):
                    raise ConfigError(f"{pgdata} is not empty and holds no PostgreSQL "
                                      "cluster; move it away")
                _initdb(pgdata, account)
            running = _running_postmaster(pgdata)
            ready = running is not None and len(running[1]) > 7 and (
                running[1][4].strip() == str(pgdata) and running[1][7].strip() == "ready")
            if running is not None and not (ready and _is_private(pgdata, account)):
                # Made or started by an earlier darkroom (trust, a shared socket
                # directory, another owner): stop it, then upgrade it in place.
                _stop(running[0], pgdata)
                running = None
            if not _is_private(pgdata, account):
                _make_private(pgdata, account)
            if running is None:
                _start(pgdata)
    except subprocess.SubprocessError as exc:
        raise ConfigError(f"embedded PostgreSQL in {pgdata} did not start "
                          f"({type(exc).__name__}); see {pgdata / 'log'}") from None
    server = Server(pgdata, stop_on_exit)
    if stop_on_exit:
        atexit.register(server.cleanup)
    return server


def url(pgdata: Path, *, stop_on_exit: bool = False) -> str:
    return start(pgdata, stop_on_exit=stop_on_exit).get_uri()


def remove(pgdata: Path) -> None:
    """Stop the server in `pgdata` if it runs, and delete the cluster (tests, benches)."""
    if (pgdata / "postmaster.pid").exists():
        pg_ctl(pgdata, "-w", "-m", "immediate", "stop", check=False)
    shutil.rmtree(pgdata, ignore_errors=True)
