"""The durable mailbox: deliveries to any session from any process (SPEC §9; docs/format.md,
"The mailbox").

Theory of operation. `deliver` publishes one file per envelope, `<delivery_id>.json`, in
`sessions/<encoded-id>/mailbox/`, the way a log is published: a temp file in the same folder
(`.<delivery_id>.<random>.tmp`), written, fsynced, hard-linked to its final name (never
replacing: the same id twice is idempotent if the bytes are equal, else `DeliveryConflict`),
then the temp name is removed and the folder fsynced. So a final name only ever appears with
its whole, durable content, and `deliver` returns only once the name is durable. Any process
may deliver to any session, owned or not; a session with no folder yet gets one (folders
without a log are unpublished sessions: invisible, and `create` reuses them).

`drain` lists the folder and returns the valid envelopes in file-name order, which is
delivery order (ULIDs sort by time). It moves bad files aside to `mailbox/rejected/` (and says
why, in the result and the log) instead of raising, skips temp files, and removes those older
than `stale_after` (an interrupted delivery never returned, so nothing acknowledged is lost).
`ack` unlinks the file and fsyncs the folder; the owner calls it only after the event that
records the delivery (with its `delivery_id`) is durable, so a crash between the two redelivers
an envelope whose id the owner already recorded: at least once, recorded once.

Synchronous like the log store (the actors layer calls it from worker threads); every file
operation goes through the `Fs` seam, so `MemoryMailbox` runs this code over a `CrashFs`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import NamedTuple, Protocol

from .catalog import SESSIONS
from .envelope import (
    MAX_ENVELOPE_BYTES,
    ULID_PATTERN,
    DeliveryIds,
    Envelope,
    check_delivery_id,
    decode_envelope,
    encode_envelope,
)
from .errors import DeliveryConflict, InvalidEnvelope, PersistenceFailed, StorageError, UnsafePath
from .fs import File, Fs, NotRegularFile, OsFs
from .mailbox_watch import DEFAULT_POLL_INTERVAL, LocalWakeups, MailboxWatch, open_inotify_watch
from .values import SessionId, check_session_id, encode_session_id

__all__ = ["DrainResult", "FileMailbox", "Mailbox", "RejectedEnvelope"]

log = logging.getLogger(__name__)

MAILBOX = "mailbox"
REJECTED = "rejected"
REASON_SUFFIX = ".reason"
STALE_AFTER = 600.0  # seconds: a temp file this old belongs to a delivery that will never finish
_NAME = re.compile(rf"({ULID_PATTERN.pattern})\.json")
_TEMP = re.compile(rf"\.({ULID_PATTERN.pattern})\.[0-9a-f]{{16}}\.tmp")


class RejectedEnvelope(NamedTuple):
    """A file of the mailbox that holds no valid envelope: its name, why, and where it went
    (`rejected/<moved_to>`, or None when it could not be moved and stays where it is)."""

    name: str
    reason: str
    moved_to: str | None


class DrainResult(NamedTuple):
    envelopes: list[Envelope]  # pending, in delivery order
    rejected: list[RejectedEnvelope]  # found by this drain


class Mailbox(Protocol):
    """Durable deliveries to sessions (the file form here; PostgreSQL later, SPEC §9)."""

    ids: DeliveryIds  # makes the delivery ids of the envelopes sent through it

    def deliver(self, session_id: str, envelope: Envelope) -> None:
        """Enqueue `envelope` for the session, durably before returning. Raises
        `InvalidSessionId`, `InvalidEnvelope`, `DeliveryConflict`, `PersistenceFailed`."""
        ...

    def drain(self, session_id: str) -> list[Envelope]:
        """Every delivered, unacknowledged envelope in delivery order (bad ones moved aside)."""
        ...

    def drain_report(self, session_id: str) -> DrainResult:
        """`drain`, plus what it moved aside."""
        ...

    def ack(self, session_id: str, delivery_id: str) -> None:
        """Remove a delivery for good (idempotent). Call it only once the event recording the
        delivery is durable."""
        ...

    def watch(self, session_id: str) -> MailboxWatch:
        """A wake-up for the session's deliveries (`mailbox_watch`)."""
        ...

    def now_ms(self) -> int:
        """Epoch ms on the clock every sender and owner of this mailbox share: what an envelope's
        `created_at` is stamped with and an owner's start is compared on (stale interrupts). The
        file form's is the host's wall clock (one host); PostgreSQL's the database's."""
        ...

    def sync_clock(self) -> None:
        """Measure that clock now (blocking: call it from a thread before the first `now_ms`);
        nothing to do for the file form. Raises `StorageError` when it cannot be read."""
        ...


class FileMailbox:
    """Mailboxes under `<root>/sessions/<encoded-id>/mailbox/`.

    `now_ns` (wall clock) dates temp files against their mtime; `stale_after` (seconds) is how old
    a temp file must be to be removed; `poll_interval` is what a watch asks for where inotify
    cannot vouch; `random` makes delivery ids (`new_id`) and temp names; `wakeups` is shared by
    mailboxes whose local deliveries should signal each other's self-pipe watches.
    """

    def __init__(
        self,
        root: str | None = None,
        *,
        fs: Fs | None = None,
        now_ns: Callable[[], int] = time.time_ns,
        stale_after: float = STALE_AFTER,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        random: Callable[[int], bytes] = os.urandom,
        wakeups: LocalWakeups | None = None,
    ) -> None:
        if fs is None:
            if root is None:
                raise TypeError("FileMailbox needs a root or an fs")
            fs = OsFs(root)
        self.fs = fs
        self.ids = DeliveryIds(random)
        self._random = random
        self._now_ns = now_ns
        self._stale_after_ns = int(stale_after * 1e9)
        self._poll_interval = poll_interval
        self._wakeups = wakeups if wakeups is not None else LocalWakeups()
        self._durable: set[str] = set()  # sessions whose mailbox folder this instance made durable

    @staticmethod
    def _folder(sid: SessionId) -> str:
        return f"{SESSIONS}/{encode_session_id(sid)}/{MAILBOX}"

    # --- delivering ---

    def deliver(self, session_id: str, envelope: Envelope) -> None:
        sid = check_session_id(session_id)
        data = encode_envelope(envelope)
        folder = self._folder(sid)
        final = f"{folder}/{envelope.delivery_id}.json"
        temp = f"{folder}/.{envelope.delivery_id}.{self._random(8).hex()}.tmp"
        with _mapped(sid, "deliver"):
            self._make_folder(sid, folder)
            try:
                file = self.fs.open(temp, "create")
            except FileNotFoundError:
                # The folder this instance made is gone (removed by hand): make it again.
                self._durable.discard(sid)
                self._make_folder(sid, folder)
                file = self.fs.open(temp, "create")
            try:
                try:
                    _write_all(file, data)
                    file.fsync()
                finally:
                    file.close()
                try:
                    self.fs.link(temp, final)
                except FileExistsError:
                    # A retry of a delivery that reached the disk: the same bytes are the same
                    # delivery (idempotent); anything else under its id is a conflict.
                    if self._read(final) != data:
                        raise DeliveryConflict(sid, envelope.delivery_id) from None
            finally:
                try:
                    self.fs.unlink(temp)
                except OSError:
                    pass  # a leftover temp is ignored by drain and removed once stale
            self.fs.fsync_dir(folder)
        self._wakeups.notify(sid)

    def _make_folder(self, sid: SessionId, folder: str) -> None:
        """Create the mailbox folder (and the session's folder: a delivery may come before the
        session's log), and make every entry on the way durable once per instance."""
        if sid in self._durable:
            return
        session_folder = folder.rpartition("/")[0]
        self.fs.make_root()
        self.fs.mkdir(SESSIONS)
        self.fs.mkdir(session_folder)
        self.fs.mkdir(folder)
        self.fs.fsync_dir(session_folder)
        self.fs.fsync_dir(SESSIONS)
        self.fs.fsync_dir("")
        self._durable.add(sid)

    def _read(self, path: str) -> bytes:
        file = self.fs.open(path, "read")
        try:
            size = file.size()
            if size > MAX_ENVELOPE_BYTES:
                raise InvalidEnvelope(f"the file is {size} bytes; an envelope is at most {MAX_ENVELOPE_BYTES}")
            return file.pread(0, size)
        finally:
            file.close()

    # --- the owner's side ---

    def drain(self, session_id: str) -> list[Envelope]:
        return self.drain_report(session_id).envelopes

    def drain_report(self, session_id: str) -> DrainResult:
        sid = check_session_id(session_id)
        folder = self._folder(sid)
        envelopes: list[Envelope] = []
        rejected: list[RejectedEnvelope] = []
        with _mapped(sid, "drain"):
            if self.fs.kind(folder) is None:
                return DrainResult(envelopes, rejected)  # nothing was ever delivered
            names = sorted(self.fs.listdir(folder))
            cleaned = False
            for name in names:
                if name == REJECTED:
                    continue
                if _TEMP.fullmatch(name):
                    cleaned = self._clean_if_stale(sid, f"{folder}/{name}") or cleaned
                    continue
                if not _NAME.fullmatch(name):
                    rejected.append(self._reject(sid, folder, name, "the name is not <ULID>.json"))
                    continue
                try:
                    envelope = decode_envelope(self._read(f"{folder}/{name}"), name)
                except FileNotFoundError:
                    continue  # acknowledged meanwhile
                except InvalidEnvelope as exc:
                    rejected.append(self._reject(sid, folder, name, exc.message))
                    continue
                except OSError as exc:
                    if not _unsafe(exc):
                        raise
                    rejected.append(self._reject(sid, folder, name, "not a regular file"))
                    continue
                envelopes.append(envelope)
            if cleaned:
                try:
                    self.fs.fsync_dir(folder)  # or the removed temp files come back at a crash
                except OSError:
                    log.debug("session %r: fsync of %s failed", sid, folder, exc_info=True)
        return DrainResult(envelopes, rejected)

    def _clean_if_stale(self, sid: SessionId, path: str) -> bool:
        """Remove a temp file older than `stale_after`; True if it was removed."""
        try:
            revision = self.fs.revision(path)
            if revision is not None and revision.mtime_ns < self._now_ns() - self._stale_after_ns:
                self.fs.unlink(path)
                return True
        except OSError:
            log.debug("session %r: removing the stale %s failed", sid, path, exc_info=True)
        return False

    def _reject(self, sid: SessionId, folder: str, name: str, reason: str) -> RejectedEnvelope:
        """Move `name` to `rejected/` (under a free name) with a `.reason` file beside it, durably
        before it leaves the mailbox; never raises (what cannot be moved stays, and is reported
        by every drain)."""
        moved_to: str | None = None
        aside = f"{folder}/{REJECTED}"
        try:
            if self.fs.kind(aside) is None:
                self.fs.mkdir(aside)
                self.fs.fsync_dir(folder)
            for attempt in range(100):
                target = name if attempt == 0 else f"{name}~{attempt}"
                try:
                    self.fs.link(f"{folder}/{name}", f"{aside}/{target}")
                except FileExistsError:
                    continue
                moved_to = target
                break
            if moved_to is not None:
                _write_reason(self.fs, f"{aside}/{moved_to}{REASON_SUFFIX}", reason)
                self.fs.fsync_dir(aside)  # the evidence is kept before it leaves the mailbox
                self.fs.unlink(f"{folder}/{name}")
                self.fs.fsync_dir(folder)
        except OSError as exc:
            log.warning("session %r: moving the bad mailbox file %r aside failed: %s", sid, name, exc)
            if moved_to is not None and self.fs.kind(f"{folder}/{name}") is not None:
                moved_to = None  # still in the mailbox: the next drain tries again
        log.warning("session %r: mailbox file %r rejected: %s", sid, name, reason)
        return RejectedEnvelope(name, reason, moved_to)

    def ack(self, session_id: str, delivery_id: str) -> None:
        sid = check_session_id(session_id)
        check_delivery_id(delivery_id)
        folder = self._folder(sid)
        with _mapped(sid, "ack"):
            if self.fs.kind(folder) is None:
                return
            try:
                self.fs.unlink(f"{folder}/{delivery_id}.json")
            except FileNotFoundError:
                pass  # acknowledged before; its removal is made durable below all the same
            self.fs.fsync_dir(folder)

    # --- the clock ---

    def now_ms(self) -> int:
        """The wall clock (every process of a host shares it; `now_ns` dates temp files only)."""
        return time.time_ns() // 1_000_000

    def sync_clock(self) -> None:
        """Nothing to measure: the wall clock is the shared one."""

    # --- wake-ups ---

    def watch(self, session_id: str) -> MailboxWatch:
        """A wake-up for deliveries to the session: inotify on its mailbox folder (created now if
        missing) where the kernel can vouch for it, else a self-pipe that this mailbox's (and
        its `wakeups`') deliveries signal, with `poll_interval` set."""
        sid = check_session_id(session_id)
        folder = self._folder(sid)
        with _mapped(sid, "watch"):
            self._make_folder(sid, folder)
        if isinstance(self.fs, OsFs):
            watch = open_inotify_watch(self.fs.root, folder.split("/"))
            if watch is not None:
                return watch
        watch = MailboxWatch.pipe(self._poll_interval)
        self._wakeups.add(sid, watch)
        watch.on_close = lambda w: self._wakeups.remove(sid, w)
        return watch


def _write_reason(fs: Fs, path: str, reason: str) -> None:
    try:
        fs.unlink(path)  # a leftover of an interrupted move of the same name
    except FileNotFoundError:
        pass
    file = fs.open(path, "create")
    try:
        _write_all(file, reason.encode("utf-8", "replace") + b"\n")
        file.fsync()
    finally:
        file.close()


def _write_all(file: File, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = file.write(view)
        view = view[n:]


def _unsafe(exc: OSError) -> bool:
    return isinstance(exc, (NotRegularFile, IsADirectoryError)) or exc.errno in (errno.ELOOP, errno.ENOTDIR)


@contextmanager
def _mapped(sid: SessionId, op: str) -> Generator[None]:
    """Map the OSErrors of one operation into the storage tree."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        if _unsafe(exc):
            raise UnsafePath(f"session {sid!r}: {op}: refusing a symlink or non-folder ({exc.filename})") from exc
        raise PersistenceFailed(f"session {sid!r}: mailbox {op} failed: {exc.strerror or exc}") from exc
