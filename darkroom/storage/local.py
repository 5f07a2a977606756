"""The embedded default store: versioned objects in a local directory.

Layout: the key's segments are directories, and each version of the key is a file in the
key's directory named `@<version>`, with its content type in `@<version>.type` beside
it. Key segments can never start with "@" or ".", so version files, their sidecars and
the `.tmp-*` files of puts in progress can never be mistaken for keys.

A put writes temporary files, fsyncs them, renames them into place and fsyncs the
directory. The data file is renamed last, so a version becomes visible only complete and
with its content type already beside it; a crash at any point leaves nothing visible but
at most a stray temporary file or sidecar, which readers ignore, and which
`remove_stale_temporaries` (run by the sweeper at its start) deletes once they are older
than any put could be.

Owners' originals are private: directories are created 0700 and files 0600, from their
creation (never created readable and narrowed afterwards).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from darkroom.config import ConfigError
from darkroom.errors import ObjectMissing, StorageConfigError, StorageUnavailable
from darkroom.storage.base import (
    CHUNK_SIZE,
    Body,
    ObjectInfo,
    ObjectVersion,
    PresignedRequest,
    validate_content_type,
    validate_key,
    validate_prefix,
)

log = logging.getLogger(__name__)

_VERSION = re.compile(r"[0-9a-f]{16}-[0-9a-f]{8}")
_DATA_FILE = re.compile(r"@([0-9a-f]{16}-[0-9a-f]{8})")
_TEMP_PREFIX = ".tmp-"
_TYPE_SUFFIX = ".type"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
DIR_MODE = 0o700
FILE_MODE = 0o600
# A put's temporary files live seconds; one this old was left by a crash.
STALE_TEMP_SECONDS = 3600.0

_version_lock = threading.Lock()
_last_version_ns = 0


def new_version() -> str:
    """A unique version id that sorts by creation time.

    The time part never repeats or goes backwards within a process, so the versions a
    process writes sort in the order it wrote them even if the wall clock steps back; the
    random part keeps concurrent processes from colliding.
    """
    global _last_version_ns
    with _version_lock:
        now = max(time.time_ns(), _last_version_ns + 1)
        _last_version_ns = now
    return f"{now:016x}-{uuid.uuid4().hex[:8]}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _BodyReadFailed(Exception):
    """Carries an error raised by the caller's body, which is not a storage fault."""


def _write_body(body: Body, out: BinaryIO) -> int:
    if isinstance(body, bytes | bytearray | memoryview):
        view = memoryview(body)
        for start in range(0, len(view), CHUNK_SIZE):
            out.write(view[start : start + CHUNK_SIZE])
        return len(view)
    size = 0
    while True:
        try:
            chunk = body.read(CHUNK_SIZE)
        except Exception as exc:
            raise _BodyReadFailed from exc
        if not chunk:
            return size
        out.write(chunk)
        size += len(chunk)


class LocalStore:
    """A directory of versioned objects (`file:///abs/dir`)."""

    inline_head = True

    def __init__(self, root: Path) -> None:
        root = Path(root)
        if not root.is_absolute():
            raise StorageConfigError("the local object directory must be an absolute path")
        self.root = root

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    # -- paths ------------------------------------------------------------------------

    def _key_dir(self, key: str) -> Path:
        return self.root.joinpath(*validate_key(key).split("/"))

    def _version_paths(self, key: str, version: str) -> tuple[Path, Path] | None:
        """The data file and sidecar of a version, or None if `version` is malformed."""
        directory = self._key_dir(key)
        # A version id from outside is never joined into a path unless it has exactly the
        # shape this store produces, so it cannot name anything but a version file.
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            return None
        return directory / f"@{version}", directory / f"@{version}{_TYPE_SUFFIX}"

    def _ensure_dir(self, directory: Path) -> None:
        """Create `directory` and its parents, making each new entry durable."""
        if directory.is_dir():
            return
        if not self.root.is_dir():
            make_private_dirs(self.root)
            _fsync_dir(self.root.parent)
        current = self.root
        for part in directory.relative_to(self.root).parts:
            parent, current = current, current / part
            try:
                current.mkdir(mode=DIR_MODE)
            except FileExistsError:
                continue
            _fsync_dir(parent)

    # -- writing ----------------------------------------------------------------------

    def put(self, key: str, body: Body, *, content_type: str = DEFAULT_CONTENT_TYPE) -> str:
        directory = self._key_dir(key)
        validate_content_type(content_type)
        version = new_version()
        data_tmp = directory / f"{_TEMP_PREFIX}{version}"
        type_tmp = directory / f"{_TEMP_PREFIX}{version}{_TYPE_SUFFIX}"
        try:
            out = self._open_temp(directory, data_tmp)
            with out:
                _write_body(body, out)
                out.flush()
                os.fsync(out.fileno())
            with _create(type_tmp) as meta:
                meta.write(content_type.encode("ascii"))
                meta.flush()
                os.fsync(meta.fileno())
            os.rename(type_tmp, directory / f"@{version}{_TYPE_SUFFIX}")
            # The data file last: from this rename on, the version exists, complete.
            os.rename(data_tmp, directory / f"@{version}")
            _fsync_dir(directory)
        except BaseException as exc:
            for leftover in (data_tmp, type_tmp):
                with contextlib.suppress(OSError):
                    leftover.unlink()
            if isinstance(exc, _BodyReadFailed) and exc.__cause__ is not None:
                raise exc.__cause__ from None
            if isinstance(exc, OSError):
                log.warning("local put of %s failed: %s", key, exc)
                raise StorageUnavailable("the local object store could not write") from exc
            raise
        return version

    def _open_temp(self, directory: Path, path: Path) -> BinaryIO:
        # A concurrent delete of the last version may remove the (then empty) directory
        # between our mkdir and our open; a temp file inside keeps it alive after that.
        for _ in range(3):
            self._ensure_dir(directory)
            try:
                return _create(path)
            except FileNotFoundError:
                continue
        self._ensure_dir(directory)
        return _create(path)

    def delete(self, key: str, version: str | None = None) -> None:
        directory = self._key_dir(key)
        try:
            if version is None:
                self._delete_all(directory)
            else:
                paths = self._version_paths(key, version)
                if paths is None:
                    return
                removed = False
                for path in paths:  # the data file first: that hides the version
                    try:
                        path.unlink()
                        removed = True
                    except (FileNotFoundError, NotADirectoryError):
                        pass
                if removed:
                    _fsync_dir(directory)
            self._prune(directory)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            log.warning("local delete of %s failed: %s", key, exc)
            raise StorageUnavailable("the local object store could not delete") from exc

    def _delete_all(self, directory: Path) -> None:
        removed = False
        with os.scandir(directory) as entries:
            names = [e.name for e in entries if e.name.startswith("@") and not e.is_dir()]
        # Data files before sidecars, so no version is ever visible without its type.
        names.sort(key=lambda name: name.endswith(_TYPE_SUFFIX))
        for name in names:
            try:
                (directory / name).unlink()
                removed = True
            except FileNotFoundError:
                pass
        if removed:
            _fsync_dir(directory)

    def _prune(self, directory: Path) -> None:
        """Remove now-empty key directories up to (not including) the root."""
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    return
                raise
            _fsync_dir(directory.parent)
            directory = directory.parent

    # -- reading ----------------------------------------------------------------------

    def get(self, key: str, version: str) -> bytes:
        paths = self._version_paths(key, version)
        if paths is None:
            raise ObjectMissing("object version not found")
        try:
            with open(paths[0], "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectMissing("object version not found") from exc
        except OSError as exc:
            log.warning("local get of %s@%s failed: %s", key, version, exc)
            raise StorageUnavailable("the local object store could not read") from exc

    def head(self, key: str, version: str) -> ObjectInfo:
        paths = self._version_paths(key, version)
        if paths is None:
            raise ObjectMissing("object version not found")
        data, sidecar = paths
        try:
            st = data.stat()
            if not stat.S_ISREG(st.st_mode):
                raise ObjectMissing("object version not found")
            size = st.st_size
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ObjectMissing("object version not found") from exc
        except OSError as exc:
            log.warning("local head of %s@%s failed: %s", key, version, exc)
            raise StorageUnavailable("the local object store could not read") from exc
        return ObjectInfo(key, version, size, self._content_type(sidecar))

    def digest(self, key: str, version: str) -> str:
        paths = self._version_paths(key, version)
        if paths is None:
            raise ObjectMissing("object version not found")
        try:
            with open(paths[0], "rb") as f:
                return hashlib.file_digest(f, "sha256").hexdigest()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectMissing("object version not found") from exc
        except OSError as exc:
            log.warning("local digest of %s@%s failed: %s", key, version, exc)
            raise StorageUnavailable("the local object store could not read") from exc

    def _content_type(self, sidecar: Path) -> str:
        try:
            return validate_content_type(_read_noatime(sidecar).decode("ascii"))
        except (OSError, ValueError):
            return DEFAULT_CONTENT_TYPE

    def list(self, prefix: str) -> Iterator[ObjectVersion]:
        validate_prefix(prefix)
        head, _, rest = prefix.rpartition("/")
        base = self.root.joinpath(*head.split("/")) if head else self.root
        key_base = f"{head}/" if head else ""
        try:
            with os.scandir(base) as entries:
                children = sorted(e.name for e in entries if e.is_dir() and e.name.startswith(rest))
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in children:
            yield from self._walk(base / name, key_base + name)

    def _walk(self, directory: Path, key: str) -> Iterator[ObjectVersion]:
        versions: list[tuple[str, int, float]] = []
        subdirs: list[str] = []
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir():
                            if not entry.name.startswith(("@", ".")):
                                subdirs.append(entry.name)
                        elif m := _DATA_FILE.fullmatch(entry.name):
                            st = entry.stat()
                            versions.append((m.group(1), st.st_size, st.st_mtime))
                    except FileNotFoundError:
                        continue  # deleted while we were looking: it is simply gone
        except (FileNotFoundError, NotADirectoryError):
            return
        for version, size, mtime in sorted(versions, reverse=True):
            yield ObjectVersion(key, version, size, datetime.fromtimestamp(mtime, UTC))
        for name in sorted(subdirs):
            yield from self._walk(directory / name, f"{key}/{name}")

    # -- the rest ---------------------------------------------------------------------

    def presign_put(
        self, key: str, *, content_type: str, expires: int = 900, size: int | None = None
    ) -> PresignedRequest | None:
        validate_key(key)
        return None  # the API receives the bytes itself

    def presign_get(self, key: str, version: str, *, expires: int = 300) -> str | None:
        validate_key(key)
        return None  # the API serves the bytes itself

    def check(self) -> None:
        try:
            self._ensure_dir(self.root)
            self._narrow_root()
            if not os.access(self.root, os.W_OK | os.X_OK):
                log.error("local object directory %s is not writable", self.root)
                raise StorageConfigError("the local object directory is not writable")
            free = shutil.disk_usage(self.root).free
        except OSError as exc:
            log.error("local object directory %s is unusable: %s", self.root, exc)
            if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EROFS):
                raise StorageConfigError("the local object directory is not usable") from exc
            raise StorageUnavailable("the local object directory is unavailable") from exc
        if free == 0:
            raise StorageUnavailable("the local object directory has no free space")


    def _narrow_root(self) -> None:
        """A store made before objects were private is narrowed to 0700: its own
        directory only (this process's), never through a link, which could take the
        change to any file or directory."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return  # a link the operator configured: its target is theirs to narrow
            raise
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
                os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)

    def remove_stale_temporaries(self, older_than: float = STALE_TEMP_SECONDS) -> int:
        """Delete the temporary files of puts a crash cut short; answers how many."""
        removed = 0
        cutoff = time.time() - older_than
        for directory, subdirs, files in os.walk(self.root):
            subdirs[:] = [d for d in subdirs if not d.startswith(".")]
            for name in files:
                if not name.startswith(_TEMP_PREFIX):
                    continue
                path = Path(directory) / name
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
        if removed:
            log.info("removed %d stale temporary files from the local store", removed)
        return removed


def make_private_dirs(path: Path) -> None:
    """`mkdir -p` whose new directories are 0700 from their creation (the parents too,
    which `Path.mkdir(parents=True)` would create with the default mode)."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=DIR_MODE)


# What darkroom keeps in its data directory: the embedded cluster (`pg`, and its `.pg.*`
# lock and start files, db/embedded.py), the local store (`objects`, config.py, 0700 from
# its creation: a git repository's `objects` is not one) and the key of `darkroom up`
# (up.py). A directory holding any of them is darkroom's own, made by this release or an
# older one.
DATA_DIR_OWN_PREFIX = ".pg."


def _is_own_entry(entry: os.DirEntry[str]) -> bool:
    if entry.name.startswith(DATA_DIR_OWN_PREFIX) or entry.name == "local-api-key":
        return entry.is_file(follow_symlinks=False)
    if entry.name == "pg":
        return entry.is_dir(follow_symlinks=False)
    if entry.name == "objects":
        return (entry.is_dir(follow_symlinks=False)
                and not stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) & 0o077)
    return False


def is_own_data_dir(path: Path | int, owners: tuple[int, ...] | None = None, *,
                    served_by: tuple[int, ...] = ()) -> bool:
    """Whether the directory (a path, or an open descriptor) is empty or holds darkroom's
    data, and nothing of another user's (`owners`: the users darkroom's files may belong
    to, this process's by default; `served_by`: the users the embedded cluster, `pg`
    alone, may belong to besides): a name like darkroom's beside another user's files
    does not make a directory darkroom's, nor does a store or a key that the database's
    own user put there for root to write through."""
    allowed = owners or (os.geteuid(),)
    try:
        with os.scandir(path) as entries:
            seen = list(entries)
        if any(entry.stat(follow_symlinks=False).st_uid
               not in (allowed + served_by if entry.name == "pg" else allowed)
               for entry in seen):
            return False
    except OSError:
        return False
    # Nor one where a name of darkroom's is a link: darkroom would change, as its own,
    # whatever the link leads to (the store narrows `objects`).
    if any(_is_own_name(entry.name) and entry.is_symlink() for entry in seen):
        return False
    return not seen or any(_is_own_entry(entry) for entry in seen)


def _is_own_name(name: str) -> bool:
    return name.startswith(DATA_DIR_OWN_PREFIX) or name in ("pg", "objects", "local-api-key")


def linked_own_name(path: Path) -> Path | None:
    """A name of darkroom's in the data dir that is a link (which `is_own_data_dir`
    refuses), for a refusal that names it."""
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if _is_own_name(entry.name) and entry.is_symlink():
                    return path / entry.name
    except OSError:
        pass
    return None


def _refusal(path: Path, st: os.stat_result, fd: int | None,
             owners: tuple[int, ...]) -> str | None:
    """Why `path` (as `st` shows it) is not a data dir darkroom may take, or None."""
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return f"the data dir {path} is not a directory"
    if st.st_uid not in owners:
        return (f"the data dir {path} belongs to another user (uid {st.st_uid}); choose a "
                f"data dir of your own")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"the data dir {path} is a directory other users may write to (mode "
                f"{mode:04o}); choose a directory of darkroom's own, such as "
                f"{path / 'darkroom'}")
    if mode & 0o067 and not is_own_data_dir(path if fd is None else fd, owners):
        return (f"the data dir {path} holds other files and other users may enter it (mode "
                f"{mode:04o}); darkroom narrows only a new, empty or darkroom's own "
                f"directory: choose one")
    return None


def check_data_dir(path: Path, owners: tuple[int, ...] | None = None) -> None:
    """Refuse, with one line and before anything is changed, a data directory darkroom
    must not take: a path that is not a directory; one of another user (`owners`: the
    users it may belong to, this process's by default); one other users may write to
    (/tmp, a group's shared folder: narrowing it would take it from them); one others
    may enter that already holds files, none of them darkroom's (a home, /var/lib:
    narrowing it would lock them out). A new or empty directory, or darkroom's own, is
    fine."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"the data dir {path} cannot be reached "
                          f"({os.strerror(exc.errno or 0).lower()})") from None
    why = _refusal(path, st, None, owners or (os.geteuid(),))
    if why:
        raise ConfigError(why)


_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _check_parent(path: Path, fd: int) -> None:
    """Refuse a parent of the data dir (open at `fd`) that another local user could move
    aside and replace: it must belong to root or to us, and be writable by no one else
    unless sticky, as /tmp is. Checked on the directory walked, not on its name: a parent
    another user made where one was missing, after any earlier check, is refused."""
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        raise ConfigError(f"a directory above the data dir {path} belongs to another user "
                          f"(uid {st.st_uid}); choose a data dir in directories of your own")
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        raise ConfigError(f"a directory above the data dir {path} is writable by other "
                          "users; choose a data dir in directories of your own")


def _walk_made(path: Path) -> int:
    """`path` (absolute, its links resolved and checked: config.resolve_trusted), open,
    its missing names made 0700 on the way. Walked from the root one name at a time, each
    opened without following a link: a link put in the path since it was resolved (where
    a parent was missing, in /tmp say) is refused, never followed, so nothing is made
    where it leads; and each parent is checked as it is walked (`_check_parent`)."""
    path = path if path.is_absolute() else Path.cwd() / path
    fd = os.open(path.anchor, _OPEN_DIR)
    try:
        last = len(path.parts) - 1
        for i, name in enumerate(path.parts[1:], start=1):
            try:
                step = os.open(name, _OPEN_DIR, dir_fd=fd)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                step = os.open(name, _OPEN_DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                        os.lstat(name, dir_fd=fd).st_mode):
                    raise ConfigError(f"the data dir {path} changed while darkroom checked "
                                      f"it (a link in its path); choose a directory of "
                                      f"darkroom's own") from None
                raise
            os.close(fd)
            fd = step
            if i < last:
                _check_parent(path, fd)
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"the data dir {path} cannot be made private "
                          f"({os.strerror(exc.errno or 0).lower()})") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened_data_dir(path: Path, owners: tuple[int, ...] | None = None) -> Iterator[int]:
    """The data directory, made if missing, open for changes to its mode and owner: a
    descriptor of the directory itself (never of what a link put in its place since it
    was checked), checked again as `check_data_dir` does."""
    fd = _walk_made(path)
    try:
        why = _refusal(path, os.fstat(fd), fd, owners or (os.geteuid(),))
        if why:
            raise ConfigError(why)
        yield fd
    finally:
        os.close(fd)


def private_dir(path: Path, owners: tuple[int, ...] | None = None) -> Path:
    """The data directory: created 0700, or narrowed to 0700 if it was made before.

    A group allowed only to traverse (the embedded server's, when darkroom runs as root)
    is left: it can reach a name it knows, never list or change one. What
    `check_data_dir` refuses is refused first, and left as it is."""
    check_data_dir(path, owners)
    with opened_data_dir(path, owners) as fd:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o067:
            os.fchmod(fd, DIR_MODE)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, 0600 from the file's creation and never half-written."""
    tmp = path.with_name(f"{_TEMP_PREFIX}{path.name}.{uuid.uuid4().hex[:8]}")
    try:
        with _create(tmp) as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _create(path: Path) -> BinaryIO:
    """A new file, 0600 from its creation; fails if it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 FILE_MODE)
    return os.fdopen(fd, "wb")


def _read_noatime(path: Path) -> bytes:
    """A small file's bytes, without updating its access time where the kernel allows.

    The API reads a sidecar on its event loop for every confirm, and the first read of a
    fresh file would otherwise dirty its inode (relatime): a journal write that can wait
    behind another process's fsync, holding up every request meanwhile.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOATIME", 0)
    try:
        fd = os.open(path, flags)
    except PermissionError:  # O_NOATIME needs the file's owner; read it the plain way
        fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)
