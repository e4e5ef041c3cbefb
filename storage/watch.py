"""Change notification for the listing: inotify over `sessions/` and every session folder.

Why. A listing must notice every append, replacement, removal and planted second log form. On
its own that costs a `stat` and an `access` per session per listing, which is most of a warm
list. The kernel can say what changed instead: a watch on `sessions/` names folders that appear
or vanish; a watch on a session folder names files created, removed, renamed, written or touched
in it; a watch on a log file reports writes to its inode through any path (a hard link
elsewhere). A warm listing re-stats only the folders the kernel named and answers the others
from the last pass, exactly as a stat pass would have found them.

What the kernel cannot vouch for falls back to the stat pass: a folder whose watch could not be
added (the per-user watch limit) is re-stat'ed on every listing; an overflowed event queue,
`sessions/` moved, removed or replaced (also by replacing the root: its identity is checked by
path on every listing), an unreadable inotify descriptor, or a file system not known to be local
(network file systems do not report changes made on other hosts) mean a full pass. No inotify at
all (another OS, no free inotify instance) means the store lists with stat passes only.

Ordering. A folder's watches are added before its files are stat'ed, and pending events are read
before anything is re-stat'ed, so a change made after the stat the listing keeps always leaves an
event for the next listing. The kernel queues an event inside the write itself, before the
writer's syscall returns: a listing that starts after an append returned sees it.

Not thread-safe: the catalog calls it under its scan lock.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Self

__all__ = ["LOCAL_FILE_SYSTEMS", "Watch"]

log = logging.getLogger(__name__)

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000

# Everything that can change a stat result or a folder's entries (not IN_ACCESS, IN_OPEN, IN_CLOSE_*).
_EVENTS = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_DIR_MASK = _EVENTS | IN_ONLYDIR | IN_DONT_FOLLOW
_FILE_MASK = _EVENTS | IN_DONT_FOLLOW
_LOST = IN_Q_OVERFLOW | IN_UNMOUNT
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


def inotify_events(data: bytes) -> Iterator[tuple[int, int]]:
    """The (watch descriptor, mask) of each `struct inotify_event` one read returned."""
    pos = 0
    while pos + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
        pos += _EVENT.size + length
        yield wd, mask


_READ_SIZE = 1 << 16

# statfs f_type values of local file systems, where every change made on this host is reported.
LOCAL_FILE_SYSTEMS = frozenset(
    {
        0xEF53,  # ext2/3/4
        0x58465342,  # xfs
        0x9123683E,  # btrfs
        0x01021994,  # tmpfs
        0x858458F6,  # ramfs
        0x794C7630,  # overlayfs
        0xF2F52010,  # f2fs
        0x2FC12FC1,  # zfs
        0xCA451A4E,  # bcachefs
    }
)

AddWatch = Callable[[int, bytes, int], int]  # inotify_add_watch: a wd, or -1 with errno set


class Libc:
    """The few libc calls a watch needs, with their C signatures."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self.init = libc.inotify_init1
        self.init.argtypes = [ctypes.c_int]
        self.add_watch: AddWatch = libc.inotify_add_watch
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
        self.rm_watch = libc.inotify_rm_watch
        self.rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self.statfs = libc.statfs
        self.statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        self.fstatfs = libc.fstatfs
        self.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]

    def fs_type(self, target: str | int) -> int | None:
        """statfs f_type of a path or an open descriptor, or None if it cannot be read."""
        buffer = ctypes.create_string_buffer(512)  # struct statfs, f_type first (a C long)
        ok = self.fstatfs(target, buffer) if isinstance(target, int) else self.statfs(os.fsencode(target), buffer)
        return None if ok != 0 else ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


class Watch:
    """Watches over `sessions/` (at `path`) and the session folders below it.

    Every full pass (`reset`) starts a new inotify instance and closes the old one, so the
    kernel drops every watch of the last pass at once: nothing a pass set up outlives the next
    full one. Between full passes, a folder's watches that no longer speak for it (a replaced
    log, a folder gone or renamed) are removed as its folder is re-scanned.
    """

    def __init__(self, libc: Libc, path: str, local: frozenset[int]) -> None:
        self._libc = libc
        self._add_watch = libc.add_watch
        self.path = path
        self._local = local
        self._base = os.fsencode(path) + b"/"
        self._fd = -1
        self._close: weakref.finalize[[int], Self] | None = None
        self._sessions_wd = -1
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the watched sessions/
        self._folders: dict[int, str | set[str]] = {}  # wd → the folder(s) it speaks for
        self._wds: dict[str, list[int]] = {}  # folder → its watches of the last scan of it
        self._previous: list[int] = []  # the watches of the folder being scanned, before it
        self._dirty: set[str] = set()
        self._unwatched: set[str] = set()  # folders whose watch could not be added
        self._lost = True  # nothing vouched for yet: the first pass is a full one

    @classmethod
    def open(cls, path: str, local: frozenset[int] = LOCAL_FILE_SYSTEMS) -> Watch | None:
        """A watch for the `sessions/` folder at `path`, or None where inotify cannot vouch for it
        (not Linux, or a file system not in `local`; also while `path` cannot be read)."""
        try:
            libc = Libc(ctypes.CDLL(None, use_errno=True))
        except (OSError, AttributeError):
            return None
        fs_type = libc.fs_type(path)
        if fs_type is None:
            return None  # no sessions/ yet, or unreadable: the caller tries again next time
        if fs_type not in local:
            log.debug("%s: file system 0x%x is not known to be local: listing with stat passes", path, fs_type)
            return None
        return cls(libc, path, local)

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None
        self._fd = -1

    # --- a full pass ---

    def reset(self) -> bool:
        """Start a full pass: a new inotify instance watching sessions/ itself. False when
        sessions/ cannot be watched now (the pass then vouches for nothing)."""
        self.close()
        self._folders.clear()
        self._wds.clear()
        self._dirty.clear()
        self._unwatched.clear()
        self._lost = True
        try:
            folder = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            # The very folder opened is checked and watched (through its descriptor), so the
            # identity kept is the watched folder's even if the path changes meanwhile.
            if self._libc.fs_type(folder) not in self._local:
                return False
            st = os.fstat(folder)
            fd = self._libc.init(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                log.debug("inotify_init1 failed (%s): listing with stat passes", os.strerror(ctypes.get_errno()))
                return False
            self._fd = fd
            self._close = weakref.finalize(self, os.close, fd)  # a store nobody closed frees it too
            wd = self._add_watch(fd, f"/proc/self/fd/{folder}".encode(), _EVENTS | IN_ONLYDIR)
            if wd < 0:
                return False  # no /proc, or the watch limit: stat passes this time
        finally:
            os.close(folder)
        self._sessions_wd = wd
        self.identity = (st.st_dev, st.st_ino)
        self._lost = False
        return True

    @property
    def vouches(self) -> bool:
        """Whether the pass since `reset` (or the last `changes`) can be trusted."""
        return not self._lost

    def lose(self) -> None:
        """The next listing must make a full pass (a pass failed half-way, or scanned another
        sessions/ than the one watched)."""
        self._lost = True

    def folder(self, name: str) -> bool:
        """Watch folder `name` (before its files are stat'ed); False if it is gone or is not a
        folder, which the watch on sessions/ reports should that change."""
        self._previous = self._wds.pop(name, [])
        wd = self._add_watch(self._fd, self._base + os.fsencode(name), _DIR_MASK)
        if wd >= 0:
            self._speaks_for(wd, name)
            return True
        gone = ctypes.get_errno() in (errno.ENOENT, errno.ENOTDIR)
        if not gone:
            self._failed(name)
        self._release(name, self._previous)
        return not gone

    def file(self, folder: str, file_name: str) -> bool:
        """Watch `folder/file_name` (before it is stat'ed); False if it does not exist, which the
        folder's watch will report should it appear."""
        wd = self._add_watch(self._fd, self._base + os.fsencode(f"{folder}/{file_name}"), _FILE_MASK)
        if wd >= 0:
            self._speaks_for(wd, folder)
            return True
        if ctypes.get_errno() == errno.ENOENT:
            return False
        self._failed(folder)
        return True  # present or not, the stat decides; the folder is re-stat'ed every time

    def scanned(self, name: str) -> None:
        """Folder `name` is watched as it is now: drop the watches it no longer needs."""
        current = self._wds.get(name, [])
        self._release(name, [wd for wd in self._previous if wd not in current])
        self._previous = []

    def gone(self, names: Iterable[str]) -> None:
        """These folders are gone from sessions/: drop their watches."""
        for name in names:
            self._release(name, self._wds.pop(name, []))

    # --- a warm pass ---

    def changes(self) -> set[str] | None:
        """The folders to re-stat since the last pass, or None when a full pass is needed."""
        self._drain()
        if self._lost:
            return None
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) != self.identity:
            return None  # sessions/ (or the root above it) was replaced
        dirty, self._dirty = self._dirty, set()
        if self._unwatched:
            # Re-stat'ed now; those whose watch still cannot be added come back while scanned.
            dirty |= self._unwatched
            self._unwatched = set()
        return dirty

    # --- internals ---

    def _failed(self, folder: str) -> None:
        code = ctypes.get_errno()
        log.debug("no watch for %s/%s (%s): re-stat'ed on every listing", self.path, folder, os.strerror(code))
        self._unwatched.add(folder)

    def _speaks_for(self, wd: int, folder: str) -> None:
        self._wds.setdefault(folder, []).append(wd)
        current = self._folders.get(wd)
        if current is None:
            self._folders[wd] = folder
        elif isinstance(current, set):
            current.add(folder)
        elif current != folder:
            self._folders[wd] = {current, folder}  # one inode seen in two folders (a hard link)

    def _release(self, folder: str, wds: Iterable[int]) -> None:
        for wd in wds:
            current = self._folders.get(wd)
            if current is None:
                continue  # its inode is gone (IN_IGNORED came): nothing to remove
            if isinstance(current, set):
                current.discard(folder)
                if len(current) == 1:
                    self._folders[wd] = next(iter(current))
                if current:
                    continue
            elif current != folder:
                continue
            del self._folders[wd]
            self._libc.rm_watch(self._fd, wd)  # its IN_IGNORED is skipped: the wd is forgotten

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("reading inotify events failed (%s): the next listing rescans everything", exc)
                self._lost = True
                return
            self.take(data)

    def take(self, data: bytes) -> None:
        """Fold a buffer of `struct inotify_event` records into the pending changes."""
        folders, dirty, sessions_wd = self._folders, self._dirty, self._sessions_wd
        pos, end = 0, len(data)
        while pos + 16 <= end:
            wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
            name_at = pos + 16
            pos = name_at + length
            if mask & _LOST:
                self._lost = True
            elif wd == sessions_wd:
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    self._lost = True
                elif length:
                    dirty.add(os.fsdecode(data[name_at:pos].rstrip(b"\0")))
            else:
                target = folders.get(wd)
                if target is None:
                    continue
                if isinstance(target, str):
                    dirty.add(target)
                else:
                    dirty.update(target)
                if mask & IN_IGNORED:
                    del folders[wd]  # the inode is gone; a rescan watches its successor
