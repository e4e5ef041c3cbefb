"""Both mailbox forms behind one harness: new instances on one disk, files planted by hand."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from clocks import T
from subagents.storage import DeliveryIds, Envelope, FileLogStore, FileMailbox, LogStore, encode_session_id
from subagents.storage.mailbox_watch import LocalWakeups
from subagents.storage.testing import CrashFs, MemoryLogStore, MemoryMailbox


def rel_mailbox(sid: str) -> str:
    """A session's mailbox folder relative to the store root."""
    return f"sessions/{encode_session_id(sid)}/mailbox"


def envelope(ids: DeliveryIds, n: int = 0, *, kind: str = "message", at: int = T, **body: Any) -> Envelope:
    """The n-th test envelope: body `{"n": n, ...}`."""
    return Envelope.new(ids, at, kind, {"n": n, **body}, sender="parent")  # type: ignore[arg-type]  # tests pass kinds as plain strings


class MailboxHarness:
    """Makes mailboxes sharing one disk ("processes" on one host) and plants files by hand."""

    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.crash_fs = CrashFs()
        self.wakeups = LocalWakeups()

    def new(self, **options: Any) -> FileMailbox:
        if self.kind == "file":
            return FileMailbox(str(self.root), **options)
        return MemoryMailbox(fs=self.crash_fs, wakeups=self.wakeups, **options)

    def log_store(self) -> LogStore:
        if self.kind == "file":
            return FileLogStore(str(self.root), compression="none")
        return MemoryLogStore(fs=self.crash_fs, compression="none")

    def _mkdirs(self, rel: str) -> None:
        if self.kind == "file":
            (self.root / rel).mkdir(parents=True, exist_ok=True)
            return
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            self.crash_fs.mkdir("/".join(parts[:i]))
            self.crash_fs.fsync_dir("/".join(parts[: i - 1]))
        self.crash_fs.fsync_dir(rel)

    def plant(self, sid: str, name: str, data: bytes) -> None:
        """A file written by hand into the session's mailbox (durably)."""
        folder = rel_mailbox(sid)
        self._mkdirs(folder)
        if self.kind == "file":
            (self.root / folder / name).write_bytes(data)
        else:
            self.crash_fs.write_bytes(f"{folder}/{name}", data)

    def plant_dir(self, sid: str, name: str) -> None:
        self._mkdirs(f"{rel_mailbox(sid)}/{name}")

    def names(self, sid: str, sub: str = "") -> list[str]:
        """The entries of the mailbox folder (or of `sub` inside it), sorted; [] if absent."""
        folder = rel_mailbox(sid) + (f"/{sub}" if sub else "")
        if self.kind == "file":
            path = self.root / folder
            return sorted(os.listdir(path)) if path.is_dir() else []
        try:
            return sorted(self.crash_fs.listdir(folder))
        except FileNotFoundError:
            return []

    def read(self, sid: str, name: str) -> bytes:
        path = f"{rel_mailbox(sid)}/{name}"
        if self.kind == "file":
            return (self.root / path).read_bytes()
        return self.crash_fs.read_bytes(path)
