"""`MemoryMailbox`: the file mailbox over an in-memory `CrashFs`.

The same code as `FileMailbox` runs against memory (as `MemoryLogStore` does for logs), so the
fake cannot drift from the real thing, and `crash()` simulates a power cut. Mailboxes built on
one `CrashFs` (pass `fs=` and `wakeups=` of another) are "processes" sharing a disk; their
watches are self-pipes that every delivery through one of them signals (there is no inotify in
memory), so a test waits on an fd, never on time. Temp files are never stale unless a test
passes `now_ns` (CrashFs mtimes are a counter, not a clock).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..mailbox import FileMailbox
from ..mailbox_watch import LocalWakeups
from .crashfs import CrashFs

__all__ = ["MemoryMailbox"]


class MemoryMailbox(FileMailbox):
    def __init__(
        self,
        *,
        fs: CrashFs | None = None,
        wakeups: LocalWakeups | None = None,
        now_ns: Callable[[], int] = lambda: 0,
        stale_after: float = 600.0,
        random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.crash_fs = fs if fs is not None else CrashFs()
        self.wakeups = wakeups if wakeups is not None else LocalWakeups()
        super().__init__(fs=self.crash_fs, now_ns=now_ns, stale_after=stale_after, random=random, wakeups=self.wakeups)

    def crash(self) -> None:
        """Lose everything not fsynced (every instance on this CrashFs sees it)."""
        self.crash_fs.crash()
        self._durable.clear()

    def sibling(self) -> MemoryMailbox:
        """Another mailbox on the same disk and wake-ups: another process, or this one restarted."""
        return MemoryMailbox(fs=self.crash_fs, wakeups=self.wakeups)
