"""Change notification for followed logs: an fd readable when a watched session's log changed.

Why. A stream follows sessions another process writes (runtime/log_follow.py); looking at their
logs on a timer costs a stat each time and answers late. The kernel can say when one changed:
an inotify watch on a session folder reports its log written (`IN_MODIFY`, through any process
on this host) and a log published or replaced in it (`IN_CREATE`, `IN_MOVED_TO`). Storage never
imports trio, so the caller waits for the fd to be readable, then `clear()`s it and looks.

Only where the kernel can vouch (Linux, a file system in `watch.LOCAL_FILE_SYSTEMS`: a network
file system reports nothing written on another host): elsewhere the store gives no watch and
its logs are polled. A watch that loses events (its queue overflowed, its fd unreadable) stops
vouching for good: the caller polls from then on. A folder not created yet is not watched (the
caller's poll finds its log); `follow` tries again on its next call.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import weakref
from collections.abc import Callable, Collection

from .watch import (
    IN_CREATE,
    IN_DONT_FOLLOW,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    LOCAL_FILE_SYSTEMS,
    Libc,
    inotify_events,
)

__all__ = ["LogWatch"]

log = logging.getLogger(__name__)

_MASK = IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_ONLYDIR | IN_DONT_FOLLOW


class LogWatch:
    """inotify watches on the folders of the followed sessions of one file store (see above)."""

    def __init__(self, libc: Libc, fd: int, root: str, folder_of: Callable[[str], str]) -> None:
        self._libc = libc
        self._fd = fd
        self._base = os.fsencode(root) + b"/"
        self._folder_of = folder_of
        self._wds: dict[str, int] = {}  # session id → the watch on its folder
        self._lost = False
        self._close = weakref.finalize(self, os.close, fd)  # a watch nobody closed frees its fd

    @classmethod
    def open(
        cls, root: str, folder_of: Callable[[str], str], local: frozenset[int] = LOCAL_FILE_SYSTEMS
    ) -> LogWatch | None:
        """A watch over the session folders under `root` (`folder_of(id)`: a folder's path
        relative to it), or None where inotify cannot vouch for them."""
        try:
            libc = Libc(ctypes.CDLL(None, use_errno=True))
        except (OSError, AttributeError):
            return None
        if libc.fs_type(root) not in local:
            return None
        fd = libc.init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            log.debug("inotify_init1 failed (%s): followed logs are polled", os.strerror(ctypes.get_errno()))
            return None
        return cls(libc, fd, root, folder_of)

    @property
    def vouches(self) -> bool:
        """Whether every change to a watched log since the last `clear` makes the fd readable."""
        return not self._lost and self._close.alive

    def fileno(self) -> int:
        if not self._close.alive:
            raise ValueError("the log watch is closed")
        return self._fd

    def follow(self, session_ids: Collection[str]) -> None:
        """Watch exactly these sessions' folders (those that exist); drop the other watches."""
        if not self._close.alive:
            return
        for session_id in [s for s in self._wds if s not in session_ids]:
            self._libc.rm_watch(self._fd, self._wds.pop(session_id))
        for session_id in session_ids:
            if session_id in self._wds:
                continue
            path = self._base + os.fsencode(self._folder_of(session_id))
            wd = self._libc.add_watch(self._fd, path, _MASK)
            if wd >= 0:
                self._wds[session_id] = wd
            elif ctypes.get_errno() not in (errno.ENOENT, errno.ENOTDIR):
                # The per-user watch limit: nothing vouches for this folder any more.
                log.debug("no watch on %r (%s): followed logs are polled", path, os.strerror(ctypes.get_errno()))
                self._lost = True

    def clear(self) -> bool:
        """Read what was signalled so far (call it before looking); True if anything was."""
        if not self._close.alive:
            return False
        any_event = False
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return any_event
            except OSError as exc:
                log.warning("reading the log watch failed (%s): followed logs are polled from now on", exc)
                self._lost = True
                return True
            if not data:
                return any_event
            any_event = True
            for wd, mask in inotify_events(data):
                if mask & IN_Q_OVERFLOW:
                    self._lost = True
                elif mask & IN_IGNORED:
                    # The folder is gone: `follow` watches its successor, if one is made.
                    self._wds = {s: w for s, w in self._wds.items() if w != wd}

    def close(self) -> None:
        self._close()
        self._wds.clear()

    def __enter__(self) -> LogWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
