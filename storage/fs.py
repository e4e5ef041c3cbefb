"""The file-system seam: every byte storage reads or writes goes through an `Fs`.

Paths are relative to the store's root, `/`-separated, and never contain `.` or `..`
components (the log store builds them from encoded ids). `OsFs` walks every component below
the root with `O_NOFOLLOW`, so a planted symlink anywhere inside the root is refused with
`ELOOP`/`ENOTDIR` instead of being followed. `CrashFs` (in `subagents.storage.testing`) is the
in-memory twin that can simulate a crash.

Implementations raise plain `OSError`; the log store maps them into the storage error tree.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat as stat_mod
from collections.abc import Collection, Sequence
from typing import Literal, NamedTuple, Protocol

from .locks import holder_paths
from .values import Revision
from .watch import Watch

__all__ = ["File", "Folder", "FolderScan", "Fs", "NotRegularFile", "OpenMode", "OsFs", "PathKind", "open_folder"]


class FolderScan(NamedTuple):
    """A real folder (not a link) and the revisions of the wanted files it holds.

    A file that exists but is not a regular file (a link, a FIFO) maps to `None`.
    """

    name: str
    files: dict[str, Revision | None]


class NotRegularFile(OSError):
    """A path that should be a regular file is a FIFO, a device, a socket or a folder."""


OpenMode = Literal["read", "append", "create", "lock"]
PathKind = Literal["file", "dir", "other"]


class File(Protocol):
    """An open file. Writes always go to the end (logs are append-only)."""

    def size(self) -> int: ...
    def pread(self, offset: int, size: int) -> bytes: ...
    def write(self, data: bytes | memoryview) -> int: ...
    def truncate(self, size: int) -> None: ...
    def fsync(self) -> None: ...
    def try_lock(self) -> bool: ...
    def revision(self) -> Revision: ...
    def close(self) -> None: ...


class Fs(Protocol):
    def root_exists(self) -> bool: ...
    def make_root(self) -> None: ...
    def mkdir(self, path: str) -> None: ...
    def listdir(self, path: str) -> list[str]: ...
    def kind(self, path: str) -> PathKind | None: ...
    def revision(self, path: str) -> Revision | None: ...
    def open(self, path: str, mode: OpenMode) -> File: ...
    def link(self, src: str, dst: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...
    def scan(
        self, path: str, names: Sequence[str], only: Collection[str] | None = None, watch: Watch | None = None
    ) -> list[FolderScan]:
        """The sub-folders of `path` (or just those of `only` that exist), each with the
        revisions of `names`: the one pass a listing makes, so it can stay within a small factor
        of scandir + stat. Put the name most folders hold first. With `watch` (from `watch()`),
        each folder and file is watched before it is stat'ed."""
        ...

    def held_locks(self, paths: Sequence[str]) -> dict[str, int | None]:
        """The `paths` whose lock a writer elsewhere holds now (another process; for an
        in-memory Fs, any open file), found without taking them, each with its holder's pid
        (None where there is no process to name)."""
        ...

    def watch(self, path: str) -> Watch | None:
        """Change notification for the folder `path` and its sub-folders, or None."""
        ...


_FLAGS: dict[str, int] = {
    "read": os.O_RDONLY,
    "append": os.O_RDWR | os.O_APPEND,
    "create": os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND,
    "lock": os.O_RDWR | os.O_CREAT,
}
# O_NONBLOCK: opening a planted FIFO must not wait for a writer (regular files ignore it).
_COMMON = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # the root, which may be a link, or its parent
_DIR = _FOLDER | os.O_NOFOLLOW


def _revision(st: os.stat_result) -> Revision:
    return Revision(size=st.st_size, mtime_ns=st.st_mtime_ns, inode=st.st_ino)


class OsFile:
    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def pread(self, offset: int, size: int) -> bytes:
        chunks: list[bytes] = []
        while size > 0:
            chunk = os.pread(self._fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            size -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def write(self, data: bytes | memoryview) -> int:
        return os.write(self._fd, data)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def fsync(self) -> None:
        os.fsync(self._fd)

    def try_lock(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def revision(self) -> Revision:
        return _revision(os.fstat(self._fd))

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


class _Parent:
    """A folder's fd and a name in it; leaving the context closes the fd (a class, not a
    generator: it is on the path of every open and stat)."""

    __slots__ = ("fd", "name")

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name

    def __enter__(self) -> tuple[int, str]:
        return self.fd, self.name

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


class OsFs:
    """The real file system below `root`; the root itself may be a symlink (the user chose it)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self._lock_inodes: dict[str, int] = {}  # lock path -> inode (lock files are never deleted)

    def _parent(self, path: str) -> tuple[int, str]:
        """An fd of `path`'s folder, reached without following links, and the last component."""
        parts = path.split("/")
        fd = os.open(self.root, _FOLDER)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def _at(self, path: str) -> _Parent:
        """`_parent(path)` as a context: its fd closed on leaving."""
        return _Parent(*self._parent(path))

    def _open_dir(self, path: str) -> int:
        """An fd of the folder `path` (the root for ""), reached without following links."""
        if not path:
            return os.open(self.root, _FOLDER)
        with self._at(path) as (fd, name):
            return os.open(name, _DIR, dir_fd=fd)

    def root_exists(self) -> bool:
        return os.path.isdir(self.root)

    def make_root(self) -> None:
        """Create the root (and missing parents) and make its entry durable."""
        if os.path.isdir(self.root):
            return
        os.makedirs(self.root, exist_ok=True)
        _fsync_dir_fd(os.open(os.path.dirname(os.path.abspath(self.root)), _FOLDER))

    def mkdir(self, path: str) -> None:
        with self._at(path) as (fd, name):
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat_mod.S_ISDIR(st.st_mode):
                    raise OSError(errno.ENOTDIR, "exists and is not a directory", path) from None

    def listdir(self, path: str) -> list[str]:
        if not path:
            return os.listdir(self.root)
        dfd = self._open_dir(path)
        try:
            return os.listdir(dfd)
        finally:
            os.close(dfd)

    def kind(self, path: str) -> PathKind | None:
        try:
            st = self._lstat(path)
        except FileNotFoundError:
            return None
        if stat_mod.S_ISREG(st.st_mode):
            return "file"
        if stat_mod.S_ISDIR(st.st_mode):
            return "dir"
        return "other"

    def _lstat(self, path: str) -> os.stat_result:
        with self._at(path) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def revision(self, path: str) -> Revision | None:
        try:
            st = self._lstat(path)
        except FileNotFoundError:
            return None
        return _revision(st)

    def open(self, path: str, mode: OpenMode) -> OsFile:
        with self._at(path) as (fd, name):
            file_fd = os.open(name, _FLAGS[mode] | _COMMON, 0o644, dir_fd=fd)
        if not stat_mod.S_ISREG(os.fstat(file_fd).st_mode):
            os.close(file_fd)
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        return OsFile(file_fd)

    def folder(self, path: str) -> _OsFolder:
        """The folder `path`, reached once without following links: names in it are stat'ed and
        opened relative to its fd (a read's several steps then walk the path once, not once each)."""
        return _OsFolder(self._open_dir(path), path)

    def link(self, src: str, dst: str) -> None:
        with self._at(src) as (sfd, sname), self._at(dst) as (dfd, dname):
            os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)

    def unlink(self, path: str) -> None:
        with self._at(path) as (fd, name):
            os.unlink(name, dir_fd=fd)

    def scan(
        self, path: str, names: Sequence[str], only: Collection[str] | None = None, watch: Watch | None = None
    ) -> list[FolderScan]:
        dfd = self._open_dir(path)
        try:
            if watch is not None:
                st = os.fstat(dfd)
                if (st.st_dev, st.st_ino) != watch.identity:
                    watch.lose()  # not the sessions/ being watched: this pass vouches for nothing
                    watch = None
            if only is not None:
                folders: list[str] = []
                for candidate in only:
                    try:
                        st = os.stat(candidate, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat_mod.S_ISDIR(st.st_mode):
                        folders.append(candidate)
            else:
                with os.scandir(dfd) as entries:
                    folders = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
            return _scan_folders(dfd, folders, names, watch)
        finally:
            os.close(dfd)

    def held_locks(self, paths: Sequence[str]) -> dict[str, int | None]:
        # A plain stat per path (no O_NOFOLLOW walk): the answer is only shown, never acted on.
        return dict(holder_paths(self.root, paths, inodes=self._lock_inodes))

    def watch(self, path: str) -> Watch | None:
        return Watch.open(os.path.join(os.path.abspath(self.root), path))

    def fsync_dir(self, path: str) -> None:
        _fsync_dir_fd(self._open_dir(path))


class Folder(Protocol):
    """A folder held open for a few steps (`open_folder`): `revision` and `open` of a name in it,
    with the rules of `Fs.revision` and `Fs.open`; `close` (or leaving the context) lets it go."""

    def revision(self, name: str) -> Revision | None: ...
    def open(self, name: str, mode: OpenMode) -> File: ...
    def close(self) -> None: ...
    def __enter__(self) -> Folder: ...
    def __exit__(self, *exc: object) -> None: ...


class _OsFolder:
    __slots__ = ("_fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self._fd, self.path = fd, path

    def revision(self, name: str) -> Revision | None:
        try:
            st = os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return _revision(st)

    def open(self, name: str, mode: OpenMode) -> OsFile:
        file_fd = os.open(name, _FLAGS[mode] | _COMMON, 0o644, dir_fd=self._fd)
        if not stat_mod.S_ISREG(os.fstat(file_fd).st_mode):
            os.close(file_fd)
            raise NotRegularFile(errno.EINVAL, "not a regular file", f"{self.path}/{name}")
        return OsFile(file_fd)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> _OsFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PathFolder:
    """`Folder` over any `Fs`, by paths (what an in-memory Fs, or an `OsFs` subclass that
    intercepts `open` or `revision`, is asked exactly as before)."""

    __slots__ = ("fs", "path")

    def __init__(self, fs: Fs, path: str) -> None:
        self.fs, self.path = fs, path

    def revision(self, name: str) -> Revision | None:
        return self.fs.revision(f"{self.path}/{name}")

    def open(self, name: str, mode: OpenMode) -> File:
        return self.fs.open(f"{self.path}/{name}", mode)

    def close(self) -> None:
        pass

    def __enter__(self) -> _PathFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def open_folder(fs: Fs, path: str) -> Folder:
    """`path` held as a `Folder`: by its fd on a plain `OsFs` (one walk for every step), else by
    paths through `fs`. Raises the `OSError` of reaching it (missing: `FileNotFoundError`; a link
    or a file on the way: `ELOOP`/`ENOTDIR`), which a path step would have raised too."""
    kind = type(fs)
    if isinstance(fs, OsFs) and kind.open is OsFs.open and kind.revision is OsFs.revision:
        return fs.folder(path)
    return _PathFolder(fs, path)


def _fsync_dir_fd(fd: int) -> None:
    """fsync a folder's fd, then close it."""
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan_folders(dfd: int, folders: list[str], names: Sequence[str], watch: Watch | None) -> list[FolderScan]:
    out: list[FolderScan] = []
    access, stat, isreg, F_OK = os.access, os.stat, stat_mod.S_ISREG, os.F_OK
    for folder in folders:
        if watch is not None and not watch.folder(folder):
            continue  # gone meanwhile (its return is reported by the watch on the parent)
        files: dict[str, Revision | None] = {}
        for position, file_name in enumerate(names):
            path = f"{folder}/{file_name}"
            if watch is not None:
                if not watch.file(folder, file_name):
                    continue  # absent; its creation is reported by the folder's watch
            # The first name is the usual one: stat it straight away. The others are usually
            # absent, which access() answers without raising.
            elif position and not access(path, F_OK, dir_fd=dfd, follow_symlinks=False):
                continue
            try:
                st = stat(path, dir_fd=dfd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed or replaced meanwhile
            files[file_name] = Revision(st.st_size, st.st_mtime_ns, st.st_ino) if isreg(st.st_mode) else None
        if watch is not None:
            watch.scanned(folder)
        out.append(FolderScan(folder, files))
    return out
