"""`CrashFs`: an in-memory `Fs` that knows what an fsync made durable, and can crash.

Theory of operation: every file keeps its current bytes and the bytes its last completed
`fsync` covered; every folder keeps its current entries and the entries its last `fsync_dir`
covered. `crash()` drops everything not covered: files fall back to their durable bytes,
folders to their durable entries (recursively, so a folder whose own entry was never made
durable vanishes with all it holds), and every open handle and lock is gone.

Faults are injected per operation (`inject`): an `OSError` raised instead of the operation, or
for `write` after a partial write. `drop_fsync` turns file or folder fsyncs into no-ops, so a
test can prove that its durability checks notice a missing fsync. `counts` tallies operations
for tests that assert how much IO something did.
"""

from __future__ import annotations

import errno
import functools
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Concatenate, ParamSpec, TypeVar

import attrs

from ..fs import FolderScan, OpenMode, PathKind
from ..values import Revision
from ..watch import Watch

__all__ = ["CrashFs"]

S = TypeVar("S", bound="CrashFs | CrashFile")
P = ParamSpec("P")
R = TypeVar("R")


def _locked(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """One lock per CrashFs: actors call it from worker threads, like a real file system."""

    @functools.wraps(method)
    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        fs = self if isinstance(self, CrashFs) else self.fs
        with fs.mutex:
            return method(self, *args, **kwargs)

    return wrapper


@attrs.define(eq=False)
class _FileNode:
    ino: int
    data: bytearray = attrs.field(factory=bytearray)
    durable: bytes = b""
    mtime_ns: int = 0


@attrs.define(eq=False)
class _DirNode:
    entries: dict[str, _FileNode | _DirNode] = attrs.field(factory=dict)
    durable: dict[str, _FileNode | _DirNode] = attrs.field(factory=dict)


@attrs.define
class _Fault:
    op: str
    path_suffix: str | None
    error: OSError
    partial: int | None
    times: int


class CrashFile:
    def __init__(self, fs: CrashFs, node: _FileNode, path: str, generation: int) -> None:
        self.fs = fs
        self._node = node
        self._path = path
        self._generation = generation
        self._closed = False

    def _check(self, op: str) -> _FileNode:
        if self._closed or self._generation != self.fs.generation:
            raise OSError(errno.EBADF, f"bad file descriptor ({op})", self._path)
        self.fs.hit(op, self._path)
        return self._node

    @_locked
    def size(self) -> int:
        return len(self._check("size").data)

    @_locked
    def pread(self, offset: int, size: int) -> bytes:
        return bytes(self._check("read").data[offset : offset + size])

    @_locked
    def write(self, data: bytes | memoryview) -> int:
        node = self._check("write")
        fault = self.fs.take_fault("write", self._path)
        if fault is not None:
            if fault.partial:
                node.data += bytes(data[: fault.partial])
            raise fault.error
        node.data += data
        node.mtime_ns = self.fs.tick()
        return len(data)

    @_locked
    def truncate(self, size: int) -> None:
        node = self._check("truncate")
        self.fs.raise_fault("truncate", self._path)
        del node.data[size:]
        node.mtime_ns = self.fs.tick()

    @_locked
    def fsync(self) -> None:
        node = self._check("fsync")
        self.fs.raise_fault("fsync", self._path)
        if "file" not in self.fs.drop_fsync:
            node.durable = bytes(node.data)

    @_locked
    def try_lock(self) -> bool:
        node = self._check("lock")
        holder = self.fs.locks.get(node.ino)
        if holder is not None and holder is not self:
            return False
        self.fs.locks[node.ino] = self
        return True

    @_locked
    def revision(self) -> Revision:
        node = self._check("stat")
        return Revision(size=len(node.data), mtime_ns=node.mtime_ns, inode=node.ino)

    @_locked
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.fs.locks.get(self._node.ino) is self:
            del self.fs.locks[self._node.ino]


class CrashFs:
    def __init__(self, *, drop_fsync: Iterable[str] = ()) -> None:
        self.drop_fsync = frozenset(drop_fsync)
        self.counts: Counter[str] = Counter()
        self.mutex = threading.RLock()
        self._root = _DirNode()
        self._inos = itertools.count(1)
        self._clock = itertools.count(1)
        self.generation = 0
        self.locks: dict[int, CrashFile] = {}
        self._faults: list[_Fault] = []

    # --- test controls ---

    @_locked
    def crash(self) -> None:
        """Lose everything no fsync covered; every open handle and lock is gone."""
        self.generation += 1
        self.locks.clear()
        self._faults.clear()
        self._restore(self._root)

    def _restore(self, node: _DirNode) -> None:
        node.entries = dict(node.durable)
        for child in node.entries.values():
            if isinstance(child, _DirNode):
                self._restore(child)
            else:
                child.data = bytearray(child.durable)

    def inject(
        self,
        op: str,
        *,
        path_suffix: str | None = None,
        error: OSError | None = None,
        partial: int | None = None,
        times: int = 1,
    ) -> None:
        """Make the next `times` operations `op` (on a path ending with `path_suffix`) fail."""
        err = error if error is not None else OSError(errno.EIO, f"injected {op} failure")
        self._faults.append(_Fault(op, path_suffix, err, partial, times))

    @_locked
    def read_bytes(self, path: str) -> bytes:
        node = self._lookup(path)
        assert isinstance(node, _FileNode), path
        return bytes(node.data)

    @_locked
    def write_bytes(self, path: str, data: bytes) -> None:
        """Plant a file (durably), as a test writing a log by hand would."""
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if not isinstance(node, _FileNode):
            node = _FileNode(next(self._inos))
            parent.entries[name] = node
            parent.durable[name] = node
        node.data = bytearray(data)
        node.durable = bytes(data)
        node.mtime_ns = self.tick()

    # --- what its CrashFiles use (`mutex`, `generation` and `locks` too) ---

    def tick(self) -> int:
        """The next modification time: a logical clock."""
        return next(self._clock)

    def hit(self, op: str, path: str) -> None:
        """Count one operation (`counts`)."""
        self.counts[op] += 1

    def take_fault(self, op: str, path: str) -> _Fault | None:
        """The injected fault this operation on `path` meets, used up once; None if none."""
        for fault in self._faults:
            if fault.op == op and (fault.path_suffix is None or path.endswith(fault.path_suffix)):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def raise_fault(self, op: str, path: str) -> None:
        """Raise the injected fault this operation on `path` meets, if any."""
        fault = self.take_fault(op, path)
        if fault is not None:
            raise fault.error

    def _lookup(self, path: str) -> _FileNode | _DirNode:
        node: _FileNode | _DirNode = self._root
        if not path:
            return node
        for part in path.split("/"):
            if not isinstance(node, _DirNode):
                raise OSError(errno.ENOTDIR, "not a directory", path)
            try:
                node = node.entries[part]
            except KeyError:
                raise FileNotFoundError(errno.ENOENT, "no such file or directory", path) from None
        return node

    def _parent(self, path: str) -> tuple[_DirNode, str]:
        head, _, name = path.rpartition("/")
        parent = self._lookup(head)
        if not isinstance(parent, _DirNode):
            raise OSError(errno.ENOTDIR, "not a directory", path)
        return parent, name

    # --- the Fs protocol ---

    @_locked
    def root_exists(self) -> bool:
        return True

    @_locked
    def make_root(self) -> None:
        pass

    @_locked
    def mkdir(self, path: str) -> None:
        self.counts["mkdir"] += 1
        self.raise_fault("mkdir", path)
        parent, name = self._parent(path)
        existing = parent.entries.get(name)
        if existing is None:
            parent.entries[name] = _DirNode()
        elif not isinstance(existing, _DirNode):
            raise OSError(errno.ENOTDIR, "exists and is not a directory", path)

    @_locked
    def listdir(self, path: str) -> list[str]:
        self.counts["listdir"] += 1
        self.raise_fault("listdir", path)
        node = self._lookup(path)
        if not isinstance(node, _DirNode):
            raise OSError(errno.ENOTDIR, "not a directory", path)
        return list(node.entries)

    @_locked
    def kind(self, path: str) -> PathKind | None:
        self.counts["stat"] += 1
        try:
            node = self._lookup(path)
        except FileNotFoundError:
            return None
        return "dir" if isinstance(node, _DirNode) else "file"

    @_locked
    def revision(self, path: str) -> Revision | None:
        self.counts["stat"] += 1
        self.raise_fault("stat", path)
        try:
            node = self._lookup(path)
        except FileNotFoundError:
            return None
        if not isinstance(node, _FileNode):
            return Revision(size=0, mtime_ns=0, inode=0)
        return Revision(size=len(node.data), mtime_ns=node.mtime_ns, inode=node.ino)

    @_locked
    def open(self, path: str, mode: OpenMode) -> CrashFile:
        self.counts["open"] += 1
        self.raise_fault("open", path)
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if isinstance(node, _DirNode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if node is None:
            if mode in ("read", "append"):
                raise FileNotFoundError(errno.ENOENT, "no such file or directory", path)
            node = _FileNode(next(self._inos), mtime_ns=self.tick())
            parent.entries[name] = node
        elif mode == "create":
            raise FileExistsError(errno.EEXIST, "file exists", path)
        return CrashFile(self, node, path, self.generation)

    @_locked
    def link(self, src: str, dst: str) -> None:
        self.counts["link"] += 1
        self.raise_fault("link", dst)
        node = self._lookup(src)
        if isinstance(node, _DirNode):
            raise PermissionError(errno.EPERM, "hard links to folders are not allowed", src)  # as on Linux
        parent, name = self._parent(dst)
        if name in parent.entries:
            raise FileExistsError(errno.EEXIST, "file exists", dst)
        parent.entries[name] = node

    @_locked
    def unlink(self, path: str) -> None:
        self.counts["unlink"] += 1
        self.raise_fault("unlink", path)
        parent, name = self._parent(path)
        if name not in parent.entries:
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", path)
        del parent.entries[name]

    @_locked
    def scan(
        self, path: str, names: Sequence[str], only: Collection[str] | None = None, watch: Watch | None = None
    ) -> list[FolderScan]:
        self.counts["scan"] += 1
        self.raise_fault("scan", path)
        node = self._lookup(path)
        if not isinstance(node, _DirNode):
            raise OSError(errno.ENOTDIR, "not a directory", path)
        entries = node.entries
        wanted = entries if only is None else {name: entries[name] for name in only if name in entries}
        out: list[FolderScan] = []
        for name, child in wanted.items():
            if not isinstance(child, _DirNode):
                continue
            files: dict[str, Revision | None] = {}
            for file_name in names:
                f = child.entries.get(file_name)
                if isinstance(f, _FileNode):
                    files[file_name] = Revision(size=len(f.data), mtime_ns=f.mtime_ns, inode=f.ino)
                elif f is not None:
                    files[file_name] = None
            out.append(FolderScan(name, files))
        return out

    @_locked
    def held_locks(self, paths: Sequence[str]) -> dict[str, int | None]:
        """The `paths` some open `CrashFile` holds the lock of (its in-memory lock table: an
        in-memory file system has no processes, so every holder counts as elsewhere, and has
        no pid)."""
        held: dict[str, int | None] = {}
        for path in paths:
            try:
                node = self._lookup(path)
            except OSError:
                continue  # no such file: nobody can hold its lock
            if isinstance(node, _FileNode) and node.ino in self.locks:
                held[path] = None
        return held

    def watch(self, path: str) -> Watch | None:
        return None  # no change notification: every listing makes a stat pass

    @_locked
    def fsync_dir(self, path: str) -> None:
        self.counts["fsync_dir"] += 1
        self.raise_fault("fsync_dir", path)
        node = self._lookup(path)
        if not isinstance(node, _DirNode):
            raise OSError(errno.ENOTDIR, "not a directory", path)
        if "dir" not in self.drop_fsync:
            node.durable = dict(node.entries)
