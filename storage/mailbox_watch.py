"""Wake-ups for a mailbox: a file descriptor that becomes readable when a delivery may be waiting.

Why an fd. The owner of a session waits for deliveries from any process, and storage never
imports trio: an fd is what both a thread (`select`) and Trio (`trio.lowlevel.wait_readable`)
can wait on, and what the PostgreSQL form will hand out too (a `LISTEN` connection's socket).

Two sources feed it. Where inotify can vouch for the mailbox folder (Linux, a file system in
`watch.LOCAL_FILE_SYSTEMS`), the fd is an inotify instance watching the folder for files
created or moved in: every delivery's `link` raises an event inside the syscall, from any
process on this host. Elsewhere (no inotify, a network file system, an in-memory `CrashFs`) the
fd is a self-pipe that deliveries made through a mailbox sharing this `LocalWakeups` write to,
and `poll_interval` is set: the waiter must also look again that often, because deliveries from
other processes raise nothing there.

How to wait without missing a delivery (the order matters):

    watch = mailbox.watch(session_id)        # before the first drain
    while True:
        watch.clear()                        # forget what was signalled so far...
        pending = mailbox.drain(session_id)  # ...then look: anything linked after clear() signals
        ...record and ack them...
        if not pending:
            wait until watch.fileno() is readable (or poll_interval passes, if it is not None)

A watch whose folder is removed or replaced (or whose event queue overflowed and lost the
watch) turns into the polling form: `poll_interval` becomes non-None and stays so.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Self

from .watch import (
    IN_CREATE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVE_SELF,
    IN_MOVED_TO,
    IN_ONLYDIR,
    LOCAL_FILE_SYSTEMS,
    Libc,
    inotify_events,
)

__all__ = ["DEFAULT_POLL_INTERVAL", "LocalWakeups", "MailboxWatch", "open_inotify_watch"]

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 1.0  # seconds between looks when nothing can signal a delivery
_MASK = IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class MailboxWatch:
    """A wake-up for one session's mailbox (see the module docstring for how to wait on it)."""

    def __init__(self, fd: int, *, inotify: bool, poll_interval: float | None) -> None:
        self._fd = fd
        self._inotify = inotify
        self._poll_interval: float | None = poll_interval
        self._write_fd = -1
        self._finalize = weakref.finalize(self, os.close, fd)  # a watch nobody closed frees its fd
        self._write_finalize: weakref.finalize[[int], Self] | None = None
        self.on_close: Callable[[MailboxWatch], None] | None = None
        self._lock = threading.Lock()

    @classmethod
    def pipe(cls, poll_interval: float | None) -> Self:
        """A self-pipe watch: readable after `signal()`."""
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        watch = cls(read_fd, inotify=False, poll_interval=poll_interval)
        watch._write_fd = write_fd
        watch._write_finalize = weakref.finalize(watch, os.close, write_fd)
        return watch

    @property
    def inotify(self) -> bool:
        """Whether the kernel signals deliveries from every process (else only local ones)."""
        return self._inotify and self._poll_interval is None

    @property
    def poll_interval(self) -> float | None:
        """None when the fd alone signals every delivery; else how often (seconds) to look anyway."""
        return self._poll_interval

    def fileno(self) -> int:
        """The fd to wait on for readability."""
        if not self._finalize.alive:
            raise ValueError("the mailbox watch is closed")
        return self._fd

    def signal(self) -> None:
        """Make the fd readable (a delivery through this process's mailbox)."""
        with self._lock:
            if self._write_fd < 0 or not self._finalize.alive:
                return
            try:
                os.write(self._write_fd, b"\0")
            except (BlockingIOError, OSError):
                pass  # the pipe is full, so already readable (or closed under us)

    def clear(self) -> bool:
        """Forget what was signalled so far (call it right before `drain`); True if anything was.
        A closed watch says False (its fd number may belong to another file by now)."""
        with self._lock:
            if not self._finalize.alive:
                return False
            return self._clear()

    def _clear(self) -> bool:
        any_event = False
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return any_event
            except OSError as exc:
                log.warning("reading the mailbox watch failed (%s): polling from now on", exc)
                self._poll_interval = self._poll_interval or DEFAULT_POLL_INTERVAL
                return True
            if not data:
                return any_event
            any_event = True
            if self._inotify:
                self._take(data)

    def _take(self, data: bytes) -> None:
        for _wd, mask in inotify_events(data):
            if mask & _GONE:
                # The folder this watch speaks for is gone: nothing will signal again.
                self._poll_interval = self._poll_interval or DEFAULT_POLL_INTERVAL

    def close(self) -> None:
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close(self)
        with self._lock:
            self._finalize()
            if self._write_finalize is not None:
                self._write_finalize()
            self._write_fd = -1

    def __enter__(self) -> MailboxWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalWakeups:
    """The self-pipe watches of one process (or of the mailboxes sharing it), per session:
    `notify` after a delivery signals every watch of that session. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, set[MailboxWatch]] = {}

    def add(self, session_id: str, watch: MailboxWatch) -> None:
        with self._lock:
            self._watches.setdefault(session_id, set()).add(watch)

    def remove(self, session_id: str, watch: MailboxWatch) -> None:
        with self._lock:
            watches = self._watches.get(session_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[session_id]

    def notify(self, session_id: str) -> None:
        with self._lock:
            watches = list(self._watches.get(session_id, ()))
        for watch in watches:
            watch.signal()


def open_inotify_watch(root: str, parts: list[str]) -> MailboxWatch | None:
    """An inotify watch on the folder `root/parts...` (entered without following links), or
    None where inotify cannot vouch for it (see the module docstring)."""
    try:
        libc = Libc(ctypes.CDLL(None, use_errno=True))
    except (OSError, AttributeError):
        return None
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                nxt = os.open(part, _FOLDER, dir_fd=folder)
                os.close(folder)
                folder = nxt
        except BaseException:  # the folder fd closed (re-raised)
            os.close(folder)
            raise
    except OSError:
        return None
    try:
        if libc.fs_type(folder) not in LOCAL_FILE_SYSTEMS:
            return None
        fd = libc.init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            log.debug("inotify_init1 failed (%s): the mailbox is polled", os.strerror(ctypes.get_errno()))
            return None
        # Through the descriptor: the very folder opened is the one watched.
        wd = libc.add_watch(fd, f"/proc/self/fd/{folder}".encode(), _MASK)
        if wd < 0:
            code = ctypes.get_errno()
            os.close(fd)
            log.debug("no inotify watch on the mailbox (%s): it is polled", os.strerror(code or errno.EINVAL))
            return None
    finally:
        os.close(folder)
    return MailboxWatch(fd, inotify=True, poll_interval=None)
