"""The embedded PostgreSQL is private: another local user cannot reach it by any way in.

Each test attacks a real server the way an unprivileged local user would (`nobody`, via
setpriv): the Unix socket, TCP, the files in the data dir. The server is started by
darkroom's own code as root (the server then runs as its own system user) and as an
ordinary user (a throwaway account made for the test when the tests run as root).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from darkroom.config import ConfigError
from darkroom.db import embedded
from darkroom.storage.local import check_data_dir, opened_data_dir, private_dir
from tests.support.services import wait_for

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="switching to another local user needs root")


def pg_binary(name: str) -> str:
    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.submodule_search_locations
    return str(Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / name)


def as_nobody(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           *args], capture_output=True, text=True, timeout=60, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "PGCONNECT_TIMEOUT": "5", **(env or {})})


def modes(path: Path) -> dict[Path, int]:
    """The mode of `path` and of every directory above it."""
    return {p: stat.S_IMODE(p.stat().st_mode) for p in (path, *path.parents)}


def stop(pgdata: Path) -> None:
    if not (pgdata / "postmaster.pid").exists():
        return
    owner = pgdata.stat()
    subprocess.run([pg_binary("pg_ctl"), "-D", str(pgdata), "-w", "-m", "immediate", "stop"],
                   user=owner.st_uid if ROOT else None, group=owner.st_gid if ROOT else None,
                   extra_groups=[] if ROOT else None, cwd="/", capture_output=True,
                   timeout=60, check=False)


def migrate_with(data_dir: Path, command: str = "migrate") -> subprocess.CompletedProcess[str]:
    """`darkroom migrate` (or another command) with `data_dir` and no other DARKROOM_
    setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")}
    return subprocess.run([sys.executable, "-m", "darkroom.cli", command],
                          env={**env, "DARKROOM_DATA_DIR": str(data_dir)},
                          capture_output=True, text=True, timeout=120)


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused start prints (exit code 2)."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def postmaster(pgdata: Path) -> psutil.Process:
    return psutil.Process(int((pgdata / "postmaster.pid").read_text().splitlines()[0]))


def assert_private(pgdata: Path, before: dict[Path, int]) -> None:
    """What any owner's server must show, and every way in that `nobody` tries."""
    data_dir = pgdata.parent
    # No directory's mode widened: the data dir 0700 (as root: root's, the server's
    # group may only pass through), its parents as they were.
    served = postmaster(pgdata).username() == embedded.SERVICE_USER
    assert stat.S_IMODE(data_dir.stat().st_mode) == (
        embedded.SERVED_DATA_DIR_MODE if served else 0o700)
    if served:
        assert data_dir.stat().st_uid == 0
    assert stat.S_IMODE(pgdata.stat().st_mode) == 0o700
    assert modes(data_dir.parent) == {p: m for p, m in before.items() if p != data_dir}
    # The socket is in the cluster's own directory and nowhere else; no TCP listener.
    server = postmaster(pgdata)
    assert server.net_connections(kind="inet") == []
    sockets: list[object] = [c.laddr for c in server.net_connections(kind="unix") if c.laddr]
    assert sockets == [str(pgdata / ".s.PGSQL.5432")], sockets
    assert server.uids().real != 0
    # Shared memory: PostgreSQL's POSIX segments and its SysV one, its user's alone.
    uid = server.uids().real
    for segment in Path("/dev/shm").glob("PostgreSQL.*"):
        with contextlib.suppress(FileNotFoundError):
            info = segment.stat()
            assert info.st_uid != uid or not info.st_mode & 0o077, segment
    for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[7]) == uid:  # uid column
            assert not int(fields[2], 8) & 0o077, line  # perms column
    # Even with the directory's permission, no connection without the password.
    refused = subprocess.run([pg_binary("psql"), f"host={pgdata} user=postgres dbname=postgres",
                              "-c", "select 1"], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "PGPASSFILE": "/dev/null"}, cwd="/")
    assert refused.returncode != 0
    assert "password" in refused.stderr, refused.stderr
    # And `nobody`: the socket, TCP on both loopbacks, and the files.
    attempts = {
        "socket": as_nobody(pg_binary("psql"), f"host={pgdata} user=postgres dbname=postgres",
                            "-c", "select 1"),
        "list": as_nobody("ls", str(data_dir)),
        "passfile": as_nobody("cat", str(embedded.passfile(pgdata))),
        "pid file": as_nobody("cat", str(pgdata / "postmaster.pid")),
        "hba": as_nobody("cat", str(pgdata / "pg_hba.conf")),
    }
    entered = {name: done.stdout for name, done in attempts.items() if done.returncode == 0}
    assert entered == {}, entered
    # TCP on both loopbacks: whatever answers there (another PostgreSQL on the machine,
    # say) is not this server, which has no TCP socket at all (above).
    for host in ("127.0.0.1", "::1"):
        tcp = as_nobody(pg_binary("psql"), f"host={host} port=5432 user=postgres "
                        "dbname=postgres sslmode=disable", "-tAc",
                        "select current_setting('data_directory')")
        assert tcp.returncode != 0 or tcp.stdout.strip() != str(pgdata), tcp.stdout
    assert "Permission denied" in attempts["socket"].stderr, attempts["socket"].stderr


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="darkroom-embedded-"))
    path.chmod(0o755)  # a parent a service user can traverse, as /var/lib is
    try:
        yield path
    finally:
        for version in path.glob("**/PG_VERSION"):
            stop(version.parent)
        shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_as_root_the_server_runs_as_its_own_user_and_nobody_gets_in(base: Path) -> None:
    pgdata = base / "data" / "pg"
    (base / "data").mkdir(mode=0o700)
    before = modes(base / "data")
    server = embedded.start(pgdata, stop_on_exit=True)
    with psycopg.connect(server.get_uri()) as conn:
        assert conn.execute("select current_user").fetchone() == ("postgres",)
    assert_private(pgdata, before)
    assert postmaster(pgdata).username() == embedded.SERVICE_USER


@pytest.fixture
def ordinary_user() -> Iterator[pwd.struct_passwd]:
    """An unprivileged account: a throwaway one as root, else the tests' own."""
    if not ROOT:
        yield pwd.getpwuid(os.getuid())
        return
    name = f"drt{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                           "--shell", "/usr/sbin/nologin", name], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create a throwaway user (useradd exit {made.returncode})")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


# Run as the ordinary user: every module it needs is imported while still root (the
# interpreter lives under /root, which that user cannot read), then it drops to the user.
_AS_USER = """
import os, sys
from pathlib import Path
import psycopg, psycopg.pq, psycopg.rows
from darkroom.db import embedded
uid, gid, pgdata = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
if os.geteuid() != uid:
    os.setgroups([]); os.setgid(gid); os.setuid(uid)
server = embedded.start(pgdata)
with psycopg.connect(server.get_uri()) as conn:
    conn.execute("select 1")
print(server.get_uri())
"""


def test_as_an_ordinary_user_the_server_is_theirs_alone(
        base: Path, ordinary_user: pwd.struct_passwd) -> None:
    home = base / "home"
    home.mkdir(mode=0o755)
    os.chown(home, ordinary_user.pw_uid, ordinary_user.pw_gid)
    pgdata = home / "data" / "pg"
    before = modes(home)
    try:
        done = subprocess.run([sys.executable, "-c", _AS_USER, str(ordinary_user.pw_uid),
                               str(ordinary_user.pw_gid), str(pgdata)],
                              capture_output=True, text=True, timeout=180,
                              cwd=Path(__file__).parents[2])
        assert done.returncode == 0, done.stderr
        assert postmaster(pgdata).uids().real == ordinary_user.pw_uid
        assert (home / "data").stat().st_uid == ordinary_user.pw_uid
        before[home / "data"] = 0o700
        if not ROOT:
            pytest.skip("attacking as another local user needs root; modes checked above")
        assert_private(pgdata, before)
    finally:
        stop(pgdata)


def test_a_data_dir_too_long_for_the_socket_is_refused_in_one_line(base: Path) -> None:
    data_dir = base / ("d" * (106 - len(str(base))))
    runtime = Path(f"/tmp/runtime-{os.geteuid()}")
    had_runtime = set(runtime.iterdir()) if runtime.exists() else set()
    line = refusal(migrate_with(data_dir))
    assert "too long" in line and "DARKROOM_DATA_DIR" in line, line
    # Refused, not moved to a common directory.
    assert not (data_dir / "pg" / "PG_VERSION").exists()
    now = set(runtime.iterdir()) if runtime.exists() else set()
    assert now == had_runtime


@needs_root
def test_as_root_a_data_dir_its_user_cannot_reach_is_refused_not_opened(base: Path) -> None:
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    before = modes(closed)
    line = refusal(migrate_with(closed / "data"))
    assert f"cannot enter {closed}" in line, line
    assert modes(closed) == before
    assert not (closed / "data" / "pg").exists()


def test_a_trust_cluster_made_before_is_upgraded_in_place(base: Path) -> None:
    """A data dir from the pgserver wrapper (trust authentication, server left running)
    becomes private on the next start, keeping its rows."""
    pgdata = base / "data" / "pg"
    (base / "data").mkdir(mode=0o755)  # what the old start left it as
    import pgserver  # the old way in

    old = pgserver.get_server(pgdata, cleanup_mode=None)  # type: ignore[attr-defined]
    with psycopg.connect(old.get_uri(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('every row')")
    old_uri = old.get_uri()
    old_server = postmaster(pgdata)
    before = modes(base)

    server = embedded.start(pgdata, stop_on_exit=True)
    # The old server was stopped first: never two postmasters on one cluster.
    assert not old_server.is_running()
    with psycopg.connect(server.get_uri()) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("every row",)]
    assert "trust" not in (pgdata / "pg_hba.conf").read_text()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(old_uri, connect_timeout=5).close()
    before[base / "data"] = 0o700
    if ROOT:
        assert postmaster(pgdata).username() == embedded.SERVICE_USER
        assert_private(pgdata, before)
    # A second start joins the upgraded server as it is.
    again = embedded.start(pgdata)
    with psycopg.connect(again.get_uri()) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (1,)


@needs_root
def test_a_data_dir_another_user_made_is_refused(base: Path) -> None:
    """A data dir made in advance by another local user (in /tmp, say) stays theirs to
    open again, whatever mode darkroom sets: it is refused, not used."""
    theirs = base / "theirs"
    theirs.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    line = refusal(migrate_with(theirs))
    assert "belongs to another user" in line, line
    assert not (theirs / "pg").exists()


@needs_root
@pytest.mark.parametrize("parent", ["another user's", "writable by all, not sticky"])
def test_a_data_dir_under_a_directory_others_control_is_refused(base: Path, parent: str) -> None:
    """Whoever controls a parent can move the data dir aside and put their own in its
    place, socket and passfile included: refused, whatever the data dir's own mode."""
    above = base / "above"
    above.mkdir()
    if parent == "another user's":
        nobody = pwd.getpwnam("nobody")
        os.chown(above, nobody.pw_uid, nobody.pw_gid)
        above.chmod(0o755)
    else:
        above.chmod(0o777)
    line = refusal(migrate_with(above / "data"))
    assert f"{above}, above the data dir" in line, line
    assert not (above / "data").exists()


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o775])
def test_a_data_dir_others_may_write_to_is_refused_and_left_as_it_was(
        base: Path, mode: int) -> None:
    """A directory other users may write to (/tmp, a group's common folder) is theirs too:
    refused in one line, never narrowed, which would take it from them (as root it was
    made root's, 0710, locking every other user out of /tmp)."""
    open_dir = base / "common"
    open_dir.mkdir()
    open_dir.chmod(mode)
    (open_dir / "someone-elses").write_text("kept")
    owner = open_dir.stat()
    line = refusal(migrate_with(open_dir))
    assert "other users may write" in line, line
    after = open_dir.stat()
    assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid) == (
        mode, owner.st_uid, owner.st_gid)
    assert sorted(p.name for p in open_dir.iterdir()) == ["someone-elses"]


def state(path: Path) -> tuple[int, int, int, list[str]]:
    """What a refused start must leave as it was: mode, owner, group and the names in it."""
    st = path.lstat()
    names = sorted(p.name for p in path.iterdir()) if stat.S_ISDIR(st.st_mode) else []
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, names


def stand_in(base: Path, case: str) -> tuple[Path, Path]:
    """A data dir darkroom must not take, and the path whose state it must leave alone."""
    nobody = pwd.getpwnam("nobody")
    if case == "a file":
        target = base / "passwd"
        target.write_text("root:x:0:0\n")
        target.chmod(0o644)
        return target, target
    if case == "a path through a file":
        target = base / "afile"
        target.write_text("x")
        return target / "data", target
    if case == "a directory other services use":  # /var/lib, say
        target = base / "varlib"
        (target / "otherapp").mkdir(parents=True)
        target.chmod(0o755)
        os.chown(target / "otherapp", nobody.pw_uid, nobody.pw_gid)
        return target, target
    if case == "another user's home":
        target = base / "home"
        target.mkdir(mode=0o755)
        (target / "notes").write_text("theirs")
        os.chown(target, nobody.pw_uid, nobody.pw_gid)
        return target, target
    if case == "root's private directory holding other files":  # /root, say
        target = base / "rootdir"
        target.mkdir(mode=0o700)
        (target / ".profile").write_text("x")
        return target, target
    if case == "a link another user planted":  # /tmp/darkroom -> /etc, say
        open_dir, target = base / "common", base / "etc"
        open_dir.mkdir()
        open_dir.chmod(0o1777)
        target.mkdir(mode=0o755)
        (target / "hosts").write_text("x")
        (open_dir / "darkroom").symlink_to(target)
        os.chown(open_dir / "darkroom", nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
        return open_dir / "darkroom", target
    if case == "a link another user planted, reached through ..":
        # To a private directory that looks like darkroom's own.
        open_dir, target = base / "common", base / "private"
        open_dir.mkdir()
        open_dir.chmod(0o1777)
        (target / "pg").mkdir(parents=True, mode=0o700)
        target.chmod(0o700)
        (target / "secret").write_text("x")
        (open_dir / "dr").symlink_to(target)
        os.chown(open_dir / "dr", nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
        return open_dir / "missing" / ".." / "dr", target
    if case == "a git repository":  # its `objects` is not darkroom's store
        target = base / "repo"
        for name in ("objects", "refs"):
            (target / name).mkdir(parents=True)
        (target / "HEAD").write_text("ref: refs/heads/main\n")
        for path in (target, target / "objects", target / "refs"):
            path.chmod(0o755)
        return target, target
    if case == "another user's files beside a name of darkroom's":
        target = base / "mixed"
        target.mkdir(mode=0o755)
        (target / "objects").mkdir(mode=0o700)
        (target / "notes.txt").write_text("theirs")
        for name in ("objects", "notes.txt"):
            os.chown(target / name, nobody.pw_uid, nobody.pw_gid)
        return target, target
    if case == "a data dir whose names of darkroom's are links":
        # Made by the service user in a directory open to all, as if an earlier release's.
        service = pwd.getpwnam(embedded.SERVICE_USER)
        victim = base / "victim"
        victim.mkdir(mode=0o755)
        (victim / "keep").write_text("x")
        target = base / "data"
        target.mkdir(mode=0o700)
        (target / ".pg.x").write_text("")
        (target / "objects").symlink_to(victim)
        for path in (target, target / ".pg.x", target / "objects"):
            os.chown(path, service.pw_uid, service.pw_gid, follow_symlinks=False)
        return target, victim
    if case == "a data dir the service user made, with a store of its own":
        # In a directory open to all (/tmp), before root's first start: a store root's
        # processes would write through, wherever its links lead (found by attack).
        service = pwd.getpwnam(embedded.SERVICE_USER)
        victim = base / "victim"
        victim.mkdir(mode=0o700)
        target = base / "data"
        target.mkdir(mode=0o700)
        (target / "objects").mkdir(mode=0o700)
        (target / "objects" / "originals").symlink_to(victim)
        (target / "local-api-key").write_text("dk_planted\n")
        for path in (target, target / "objects", target / "objects" / "originals",
                     target / "local-api-key"):
            os.chown(path, service.pw_uid, service.pw_gid, follow_symlinks=False)
        return target, victim
    if case == "a data dir whose cluster is a file":
        target = base / "data"
        target.mkdir(mode=0o700)
        (target / "pg").write_text("x")
        return target, target
    assert case == "one its server cannot reach"
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    target = closed / "data"
    target.mkdir(mode=0o755)
    return target, target


@needs_root
@pytest.mark.parametrize("case", ["a file", "a path through a file",
                                  "a directory other services use", "another user's home",
                                  "root's private directory holding other files",
                                  "a link another user planted",
                                  "a link another user planted, reached through ..",
                                  "a git repository", "a data dir whose cluster is a file",
                                  "another user's files beside a name of darkroom's",
                                  "a data dir whose names of darkroom's are links",
                                  "a data dir the service user made, with a store of its own",
                                  "one its server cannot reach"])
def test_as_root_a_data_dir_that_is_not_darkrooms_is_refused_before_anything_changes(
        base: Path, case: str) -> None:
    """Whatever the refusal, it comes first: no mode narrowed, no owner or group handed
    to the server, nothing made in it (found by attack: a link planted in /tmp had root's
    darkroom take a directory of the system's, and refusals came after a chmod)."""
    data_dir, watched = stand_in(base, case)
    before = state(watched)
    line = refusal(migrate_with(data_dir))
    assert str(base) in line, line
    assert state(watched) == before


@pytest.mark.parametrize("owner", ["mine", "another user's"])
def test_a_link_put_where_the_data_dir_was_checked_missing_is_not_followed(
        base: Path, owner: str) -> None:
    """The data dir was missing when its path was checked, and a link took its place
    before darkroom made it (in /tmp anyone may put one there): the directory it leads to
    is left as it was, whoever made the link (found by attack)."""
    victim = base / "victim"
    victim.mkdir(mode=0o755)
    before = state(victim)
    data_dir = base / "data"
    check_data_dir(data_dir)  # nothing there yet
    data_dir.symlink_to(victim)
    if owner != "mine" and ROOT:
        nobody = pwd.getpwnam("nobody")
        os.chown(data_dir, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
    with pytest.raises(ConfigError):
        private_dir(data_dir)
    with pytest.raises(ConfigError), opened_data_dir(data_dir):
        pass
    assert state(victim) == before


def test_a_link_put_in_the_data_dirs_missing_path_is_not_followed(base: Path) -> None:
    """A parent of the data dir was missing when its path was checked, and a link took its
    place before darkroom made it: nothing is made where the link leads (the walk that
    makes the path opens each name without following a link)."""
    victim = base / "victim"
    victim.mkdir(mode=0o755)
    before = state(victim)
    data_dir = base / "parent" / "data"
    check_data_dir(data_dir)  # nothing there yet
    (base / "parent").symlink_to(victim)
    with pytest.raises(ConfigError, match="link"), opened_data_dir(data_dir):
        pass
    assert state(victim) == before
    assert not (victim / "data").exists()


def test_up_refuses_a_data_dir_others_could_move_aside_before_making_it(base: Path) -> None:
    """`darkroom up` with its embedded database refuses a data dir under a directory
    anyone may write to (not sticky) before it makes or narrows anything (found by
    attack: it made the data dir, then refused)."""
    open_dir = base / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    before = state(open_dir)
    line = refusal(migrate_with(open_dir / "data", "up"))
    assert "writable by other users" in line, line
    assert state(open_dir) == before


@needs_root
def test_up_with_its_own_database_leaves_another_users_directory_alone(base: Path) -> None:
    """`darkroom up` with DARKROOM_DATABASE_URL makes only its data dir private (no
    embedded server, so none of the server's checks): another user's directory is refused
    like any other (found by attack: it was narrowed)."""
    theirs = base / "theirs"
    theirs.mkdir(mode=0o755)
    nobody = pwd.getpwnam("nobody")
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    before = state(theirs)
    with pytest.raises(ConfigError, match="belongs to another user"):
        private_dir(theirs)
    assert state(theirs) == before


@pytest.fixture(scope="module")
def hidden_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """darkroom's PostgreSQL wheel installed under /root (0700), out of the service
    user's reach."""
    hidden = Path(tempfile.mkdtemp(prefix="darkroom-hidden-", dir="/root"))
    try:
        wheels = tmp_path_factory.mktemp("wheel")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                        str(wheels), "pgserver"], check=True, timeout=300)
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                        str(hidden / "site"), *map(str, wheels.iterdir())], check=True,
                       timeout=300)
        yield hidden / "site"
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


def start_with_site(site: Path, pgdata: Path, installs: Path | None = None
                    ) -> subprocess.CompletedProcess[str]:
    """The embedded server started with PostgreSQL's wheel taken from `site` (and its
    programs copied, where needed, to `installs`); prints the programs' directory."""
    program = ("import sys; from pathlib import Path; from darkroom.db import embedded; "
               + ("embedded.SHARED_INSTALLS = Path(sys.argv[2]); " if installs else "")
               + "s = embedded.start(Path(sys.argv[1])); print(embedded.binary('postgres')); "
               "s.cleanup()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")}
    return subprocess.run([sys.executable, "-c", program, str(pgdata),
                           *([str(installs)] if installs else [])],
                          env={**env, "PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=180)


@needs_root
def test_as_root_programs_out_of_the_service_users_reach_are_copied_not_widened(
        base: Path, hidden_site: Path) -> None:
    """darkroom installed under /root (0700): the server still starts, from a root-owned
    copy of its programs that the service user can reach, and /root stays closed."""
    before = modes(hidden_site.parent)
    done = start_with_site(hidden_site, base / "data" / "pg")
    assert done.returncode == 0, done.stderr
    used = Path(done.stdout.strip().splitlines()[-1])
    assert used.is_relative_to(embedded.SHARED_INSTALLS), used
    assert modes(hidden_site.parent) == before  # nothing above the wheel was opened up
    for path in (used, *used.parents):
        st = path.stat()
        assert st.st_uid == 0 and not stat.S_IMODE(st.st_mode) & 0o022, path


@needs_root
def test_as_root_programs_are_copied_only_where_root_alone_may_change_them(
        base: Path, hidden_site: Path) -> None:
    """The copy's place belongs to the service user (as /var/lib/darkroom, a data dir
    of the releases before 2026-12-04, did): refused before anything is copied, so that
    user cannot swap the copy's directories for its links and have root write or chmod
    through them (found by attack: a file of root's was made 0755)."""
    service = pwd.getpwnam(embedded.SERVICE_USER)
    theirs = base / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, service.pw_uid, service.pw_gid)
    done = start_with_site(hidden_site, base / "data" / "pg", installs=theirs)
    assert done.returncode != 0
    assert "may be changed by others than root" in done.stderr, done.stderr
    assert list(theirs.iterdir()) == []


def as_service_user(*args: str) -> subprocess.CompletedProcess[str]:
    """What the server's own account can do: anyone who reaches the database as its
    superuser runs commands as it (COPY ... TO PROGRAM)."""
    return subprocess.run(["setpriv", f"--reuid={embedded.SERVICE_USER}",
                           f"--regid={embedded.SERVICE_USER}", "--clear-groups", *args],
                          capture_output=True, text=True, timeout=60, cwd="/",
                          env={"PATH": "/usr/bin:/bin"})


@needs_root
def test_as_root_a_lock_link_the_service_user_plants_is_not_followed(base: Path) -> None:
    """The data dir belongs to the service user (the server must enter it); root's lock
    file there must not follow a link that user plants: root would create (0600, its own)
    any file the link names, /etc/nologin say, shutting every other user out."""
    data_dir = base / "data"
    embedded.start(data_dir / "pg").cleanup()
    stop(data_dir / "pg")
    # As an earlier release left it: the data dir handed to the service user.
    os.chown(data_dir, pwd.getpwnam(embedded.SERVICE_USER).pw_uid,
             pwd.getpwnam(embedded.SERVICE_USER).pw_gid)
    victim = base / "made-by-root"  # base is root's: the service user cannot write there
    lock = data_dir / ".pg.lock"
    planted = as_service_user("sh", "-c", f"rm -f {lock} && ln -s {victim} {lock}")
    assert planted.returncode == 0, planted.stderr
    done = migrate_with(data_dir)
    stop(data_dir / "pg")
    assert not victim.exists() and not victim.is_symlink()
    # Refused in one line naming the file, nothing started.
    line = refusal(done)
    assert str(lock) in line, line


@needs_root
def test_as_root_the_service_user_cannot_swap_names_in_the_data_dir(base: Path) -> None:
    """As root the data dir stays root's: the service user (anyone who reaches the
    database as its superuser runs commands as it) may pass through to its cluster, but
    not rename `objects` (or any file root writes there) to put a link of its own."""
    data_dir = base / "data"
    embedded.start(data_dir / "pg").cleanup()
    stop(data_dir / "pg")
    (data_dir / "objects").mkdir(mode=0o700)
    swapped = as_service_user("sh", "-c", f"mv {data_dir / 'objects'} {data_dir / 'old'} && "
                              f"ln -s /tmp {data_dir / 'objects'}")
    assert swapped.returncode != 0, "the service user renamed root's objects directory"
    assert (data_dir / "objects").is_dir() and not (data_dir / "objects").is_symlink()
    # Nor list it; the server still reaches its cluster through it.
    assert as_service_user("ls", str(data_dir)).returncode != 0
    assert as_service_user("ls", str(data_dir / "pg")).returncode == 0
    st = data_dir.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, embedded.SERVED_DATA_DIR_MODE)


_SERVICE_ACCOUNT = """
import sys
from darkroom.db import embedded
embedded.SERVICE_USER = sys.argv[1]
account = embedded.service_account()
print(account.uid, account.gid)
"""


@needs_root
def test_starts_at_once_agree_on_the_service_account_they_create() -> None:
    """The API, the workers and the sweeper of `darkroom up` may all start the embedded
    server at once on a machine without the account: each must be told of the one
    account that /etc/passwd ends up holding."""
    name = f"drs{uuid.uuid4().hex[:8]}"
    try:
        starts = [subprocess.Popen([sys.executable, "-c", _SERVICE_ACCOUNT, name],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                  for _ in range(6)]
        told = {start.communicate(timeout=60)[0].decode().strip() for start in starts}
        entry = pwd.getpwnam(name)
        assert told == {f"{entry.pw_uid} {entry.pw_gid}"}
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def test_root_reads_no_file_of_the_cluster_through_a_link(base: Path) -> None:
    """The cluster directory is the server's user's: a link it puts in place of the
    password file, the pg_hba.conf or the pid file is not read through (root would read
    any file it points at, and take a password, a pid, from it: found by attack)."""
    pgdata = base / "pg"
    pgdata.mkdir(mode=0o700)
    victim = base / "roots-secret"
    victim.write_text("a:b:c:d:root-only\n")
    victim.chmod(0o600)
    for name in (embedded.LEGACY_PASSFILE, "pg_hba.conf", "postmaster.pid"):
        (pgdata / name).symlink_to(victim)
    embedded.passfile(pgdata).symlink_to(victim)
    (pgdata / "pg_hba.conf").unlink()
    (pgdata / "pg_hba.conf").symlink_to(base / "hba")
    (base / "hba").write_text(embedded.HBA)
    assert embedded._password(pgdata) is None
    assert not embedded._is_private(pgdata, None)
    (base / "pid").write_text(f"{os.getpid()}\n")
    (pgdata / "postmaster.pid").unlink()
    (pgdata / "postmaster.pid").symlink_to(base / "pid")
    assert embedded._running_postmaster(pgdata) is None


def test_a_data_dir_under_a_missing_parent_is_made_or_refused_in_one_line(base: Path) -> None:
    """A data dir whose parents do not exist yet: made (darkroom's own, private), or,
    as root, refused in one line because the server could not enter them, never a
    traceback (found by attack)."""
    done = migrate_with(base / "missing" / "data")
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode != 0:
        refusal(done)
    stop(base / "missing" / "data" / "pg")


@needs_root
def test_as_root_a_file_the_service_user_hard_links_into_the_cluster_is_not_chowned(
        base: Path) -> None:
    """The service user hard-links another user's file (one it may write to) into the
    cluster, then makes root hand the cluster over again (it edits its pg_hba.conf): the
    file keeps its owner (found by attack: root chowned it to the service user)."""
    data_dir = base / "data"
    embedded.start(data_dir / "pg").cleanup()
    stop(data_dir / "pg")
    nobody = pwd.getpwnam("nobody")
    victim = base / "their-notes"
    victim.write_text("theirs")
    victim.chmod(0o666)
    os.chown(victim, nobody.pw_uid, nobody.pw_gid)
    os.link(victim, data_dir / "pg" / "linked")
    with open(data_dir / "pg" / "pg_hba.conf", "a") as hba:
        hba.write("# changed\n")
    embedded.start(data_dir / "pg").cleanup()
    stop(data_dir / "pg")
    st = victim.stat()
    assert (st.st_uid, st.st_gid) == (nobody.pw_uid, nobody.pw_gid)


@needs_root
def test_as_root_clients_never_read_a_password_file_the_service_user_can_replace(
        base: Path) -> None:
    """The clients' password file is root's, beside the cluster, not in it: the service
    user could put a link in its place there, to a file of root's, and catch what the
    clients then send (found by attack: a server of its own in the socket's place got
    the password fields of root's files, in cleartext). They send a password only by
    SCRAM, and a cluster of an earlier release is moved over with the password it has."""
    data_dir = base / "data"
    embedded.start(data_dir / "pg").cleanup()
    stop(data_dir / "pg")
    # As an earlier release left it: the password file inside the cluster.
    password = embedded._password(data_dir / "pg")
    embedded.passfile(data_dir / "pg").rename(data_dir / "pg" / embedded.LEGACY_PASSFILE)
    server = embedded.start(data_dir / "pg", stop_on_exit=True)
    params = conninfo_to_dict(server.get_uri())
    kept = Path(str(params["passfile"]))
    assert kept.parent == data_dir and params["require_auth"] == "scram-sha-256"
    st = kept.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    assert embedded._password(data_dir / "pg") == password
    assert not (data_dir / "pg" / embedded.LEGACY_PASSFILE).exists()
    with psycopg.connect(server.get_uri()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    server.cleanup()


@needs_root
def test_a_parent_another_user_made_after_the_checks_is_not_walked_into(base: Path) -> None:
    """A parent of the data dir was missing when its parents were checked, and another
    user made it (theirs, open to all) before darkroom walked the path: darkroom makes
    nothing in it, or that user could later move the data dir aside and hand darkroom a
    socket and a password file of their own (found by attack)."""
    nobody = pwd.getpwnam("nobody")
    theirs = base / "p1"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(ConfigError, match="belongs to another user"):
        private_dir(theirs / "data")
    assert list(theirs.iterdir()) == []


@needs_root
def test_as_root_a_file_of_roots_moved_into_the_cluster_is_not_handed_over(base: Path) -> None:
    """The service user renames a file of root's into its cluster (in a data dir an
    earlier release left it, a key say), then makes root hand the cluster over again: the
    file stays root's (found by attack: root chowned its own admin key to that user)."""
    data_dir = base / "data"
    embedded.start(data_dir / "pg").cleanup()
    stop(data_dir / "pg")
    key = data_dir / "pg" / "roots-key"
    key.write_text("dk_secret\n")
    key.chmod(0o600)
    with open(data_dir / "pg" / "pg_hba.conf", "a") as hba:
        hba.write("# changed\n")
    embedded.start(data_dir / "pg").cleanup()
    stop(data_dir / "pg")
    assert (key.stat().st_uid, key.stat().st_gid) == (0, 0)


@needs_root
@pytest.mark.parametrize("database", ["embedded", "elsewhere"])
def test_a_store_link_in_a_data_dir_not_darkrooms_changes_nothing_where_it_leads(
        base: Path, database: str) -> None:
    """Another user makes the data dir in advance (in /tmp) with `objects` a link to a
    directory of root's: the start is refused before the store's check narrows anything
    (found by attack: the store made the link's target 0700, then the data dir was
    refused)."""
    nobody = pwd.getpwnam("nobody")
    victim = base / "victim"
    victim.mkdir(mode=0o755)
    theirs = base / "theirs"
    theirs.mkdir(mode=0o700)
    (theirs / "objects").symlink_to(victim)
    for path in (theirs, theirs / "objects"):
        os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
    from darkroom.config import Settings
    from darkroom.services import start

    url = None if database == "embedded" else "postgresql://postgres@127.0.0.1:1/none"
    with pytest.raises(ConfigError, match="belongs to another user"):
        start(Settings(data_dir=theirs, database_url=url, storage_url=None))
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


@needs_root
def test_a_first_start_cut_short_during_initdb_leaves_a_data_dir_the_next_start_takes(
        base: Path) -> None:
    """`darkroom migrate` killed by a signal while initdb runs (its password file still
    in the data dir): the next start takes the data dir and the cluster initdb finished
    (found by attack: the file left was the service user's, and every later start refused
    the data dir as holding another user's file)."""
    data_dir = base / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")}
    first = subprocess.Popen([sys.executable, "-m", "darkroom.cli", "migrate"],
                             env={**env, "DARKROOM_DATA_DIR": str(data_dir)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (data_dir / ".pg.initpw").exists(), interval=0.005,
                 what="initdb running")
        first.terminate()
        assert first.wait(timeout=60) == -15
    finally:
        if first.poll() is None:
            first.kill()
    # initdb runs on, orphaned, and finishes the cluster.
    wait_for(lambda: not [p for p in psutil.process_iter(["cmdline"])
                          if "initdb" in " ".join(p.info["cmdline"] or [])
                          and str(data_dir) in " ".join(p.info["cmdline"] or [])],
             timeout=120, what="initdb to end")
    assert (data_dir / ".pg.initpw").exists()  # what the signal left
    again = migrate_with(data_dir)
    assert again.returncode == 0, again.stderr
    assert not (data_dir / ".pg.initpw").exists()  # an earlier initdb's password: gone


@needs_root
def test_a_cluster_nested_past_reason_is_refused_in_one_line(base: Path) -> None:
    """The service user nests thousands of directories in its cluster and makes root hand
    it over again: one line, not a traceback (found by attack: RecursionError at every
    start)."""
    data_dir = base / "data"
    embedded.start(data_dir / "pg").cleanup()
    stop(data_dir / "pg")
    service = pwd.getpwnam(embedded.SERVICE_USER)
    fd = os.open(data_dir / "pg", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(3000):
            os.mkdir("d", dir_fd=fd)
            os.chown("d", service.pw_uid, service.pw_gid, dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    with open(data_dir / "pg" / "pg_hba.conf", "a") as hba:
        hba.write("# changed\n")
    try:
        line = refusal(migrate_with(data_dir))
        assert "nested deeper than PostgreSQL makes them" in line, line
    finally:
        # Flattened one level at a time: a recursive removal would meet the same depth.
        top = data_dir / "pg"
        while (top / "d").exists():
            if (top / "d" / "d").exists():
                (top / "d" / "d").rename(top / "x")
                (top / "d").rmdir()
                (top / "x").rename(top / "d")
            else:
                (top / "d").rmdir()
