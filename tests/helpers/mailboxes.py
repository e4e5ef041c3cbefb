"""Every mailbox form behind one harness: new instances on one disk (or one database), entries
planted by hand.

The PostgreSQL form ("pg") speaks of rows as the others speak of files: the entry of a delivery
is `<delivery_id>.json`, planting `<x>.json` inserts a row with delivery id `<x>`.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing
from clocks import T
from subagents.storage import (
    DeliveryIds,
    Envelope,
    FileLogStore,
    FileMailbox,
    LocalWakeups,
    LogStore,
    MailboxWatch,
    PgMailboxWatch,
    PostgresLogStore,
    PostgresMailbox,
    encode_session_id,
)
from subagents.storage.testing import CrashFs, MemoryLogStore, MemoryMailbox


def rel_mailbox(sid: str) -> str:
    """A session's mailbox folder relative to the store root."""
    return f"sessions/{encode_session_id(sid)}/mailbox"


def envelope(ids: DeliveryIds, n: int = 0, *, kind: str = "message", at: int = T, **body: Any) -> Envelope:
    """The n-th test envelope: body `{"n": n, ...}`."""
    return Envelope.new(ids, at, kind, {"n": n, **body}, sender="parent")  # type: ignore[arg-type]  # tests pass kinds as plain strings


Watch = MailboxWatch | PgMailboxWatch


def trio_owner_wakes(owner: Any, sid: str, deliver: Callable[[Watch], None]) -> list[list[Envelope]]:
    """The documented owner loop under Trio (clear, drain, wait on the watch's fd; no thread
    waits) on `owner.watch(sid)`: once it is parked on the fd with nothing drained, `deliver`
    runs in a thread with the watch. Returns what the loop drained when it woke."""
    woke: list[list[Envelope]] = []

    async def owner_loop(watch: Watch) -> None:
        while True:
            watch.clear()
            pending = owner.drain(sid)  # here, not in a thread: a task in a thread counts as blocked
            if pending:
                woke.append(pending)
                return
            await trio.lowlevel.wait_readable(watch.fileno())

    async def main() -> None:
        # A bound on failure only (a wake-up that never comes fails here instead of hanging).
        with trio.fail_after(60), owner.watch(sid) as watch:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(owner_loop, watch)
                await trio.testing.wait_all_tasks_blocked()
                assert woke == []  # parked on the fd, nothing delivered yet
                await trio.to_thread.run_sync(deliver, watch)

    trio.run(main)
    return woke


class MailboxHarness:
    """Makes mailboxes sharing one disk ("processes" on one host) and plants files by hand."""

    def __init__(self, kind: str, root: Path, pg_url: str | None = None) -> None:
        self.kind = kind
        self.root = root
        self.pg_url = pg_url
        self.crash_fs = CrashFs()
        self.wakeups = LocalWakeups()
        self._closers: list[Any] = []
        if kind == "pg":
            assert pg_url is not None
            PostgresMailbox(pg_url).close()  # the schema, for rows planted before any mailbox opens
            reset_mailbox_tables(pg_url)

    def new(self, **options: Any) -> Any:
        """A new mailbox instance on the harness's disk (or database)."""
        if self.kind == "file":
            return FileMailbox(str(self.root), **options)
        if self.kind == "pg":
            mailbox = PostgresMailbox(self.pg_url, **options)
            self._closers.append(mailbox)
            return mailbox
        return MemoryMailbox(fs=self.crash_fs, wakeups=self.wakeups, **options)

    def log_store(self) -> LogStore:
        if self.kind == "file":
            return FileLogStore(str(self.root), compression="none")
        if self.kind == "pg":
            assert self.pg_url is not None
            store = PostgresLogStore(self.pg_url)
            self._closers.append(_StoreCloser(store))
            return store
        return MemoryLogStore(fs=self.crash_fs, compression="none")

    def woken(self, fd: int) -> bool:
        """Whether `fd` is readable: right now for the file forms (the kernel or the sender
        signals before `deliver` returns); for PostgreSQL, once the notification that left with
        the commit arrives (waited for on the fd, at most 10 s so a failure cannot hang)."""
        poller = select.poll()  # not select(): a test may hold fds past FD_SETSIZE
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(10_000 if self.kind == "pg" else 0))

    def close(self) -> None:
        for closer in self._closers:
            closer.close()

    def _mkdirs(self, rel: str) -> None:
        if self.kind == "file":
            (self.root / rel).mkdir(parents=True, exist_ok=True)
            return
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            self.crash_fs.mkdir("/".join(parts[:i]))
            self.crash_fs.fsync_dir("/".join(parts[: i - 1]))
        self.crash_fs.fsync_dir(rel)

    def _db(self) -> Any:
        import psycopg

        return psycopg.connect(self.pg_url, autocommit=True)

    def plant(self, sid: str, name: str, data: bytes) -> None:
        """A file written by hand into the session's mailbox (durably); a row for PostgreSQL."""
        if self.kind == "pg":
            with self._db() as db:
                db.execute(
                    "INSERT INTO mailbox (session_id, delivery_id, envelope, created_at) VALUES (%s, %s, %s, 0)",
                    (sid, name.removesuffix(".json"), data),
                )
            return
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
        if self.kind == "pg":
            assert not sub, "rejected rows: see rejected_rows"
            with self._db() as db:
                rows = db.execute("SELECT delivery_id FROM mailbox WHERE session_id = %s", (sid,)).fetchall()
            return sorted(f"{row[0]}.json" for row in rows)
        folder = rel_mailbox(sid) + (f"/{sub}" if sub else "")
        if self.kind == "file":
            path = self.root / folder
            return sorted(os.listdir(path)) if path.is_dir() else []
        try:
            return sorted(self.crash_fs.listdir(folder))
        except FileNotFoundError:
            return []

    def read(self, sid: str, name: str) -> bytes:
        if self.kind == "pg":
            with self._db() as db:
                row = db.execute(
                    "SELECT envelope FROM mailbox WHERE session_id = %s AND delivery_id = %s",
                    (sid, name.removesuffix(".json")),
                ).fetchone()
            if row is None:
                raise FileNotFoundError(name)
            return bytes(row[0])
        path = f"{rel_mailbox(sid)}/{name}"
        if self.kind == "file":
            return (self.root / path).read_bytes()
        return self.crash_fs.read_bytes(path)


class _StoreCloser:
    def __init__(self, store: PostgresLogStore) -> None:
        self._store = store

    def close(self) -> None:
        self._store.close_store()


def reset_mailbox_tables(url: str) -> None:
    """Empty the store's tables, the mailbox's too, for the next test in a module's database."""
    import psycopg
    from pg_server import reset_tables

    reset_tables(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN IF to_regclass('mailbox') IS NOT NULL THEN "
            "DELETE FROM mailbox; DELETE FROM mailbox_rejected; END IF; END $$"
        )
