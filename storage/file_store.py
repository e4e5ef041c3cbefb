"""`FileLogStore`: session logs as files under `<root>/sessions/<encoded-id>/` (SPEC 3.3).

Theory of operation. `create` makes the folder and takes the flock on its `lock` file but
writes no log: the first `append` publishes, writing header and batches to `publish.tmp`,
fsyncing it, hard-linking it to the log name (which fails if a log exists, so publication never
overwrites), then fsyncing the folder, `sessions/` and, once per store, the root. Later appends
write at the end and fsync once per call; a failed write is truncated back (durably), a failed
fsync kills the handle. `open_write` takes the lock before it looks at the tail, validates the
whole log and cuts a torn tail, so readers and writers always agree on where the log ends.

Every path is reached through the `Fs` seam without following links; every `OSError` is mapped
here, once, into the storage error tree.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import attrs
import msgspec

from .codec import Event, decode_events, encode_events
from .errors import (
    AlreadyOwned,
    CorruptLog,
    HandleClosed,
    HandleDead,
    InvalidEvent,
    PersistenceFailed,
    SequenceConflict,
    SessionAlreadyExists,
    SessionNotFound,
    StorageError,
    UnsafePath,
    UnsupportedLog,
)
from .framing import check_seed_marker, decode_event_lines, is_seed_marker, plain_layout, read_header
from .fs import File, Fs, OsFs
from .log_store import Batch, ReadHandle, WriteHandle
from .records import HeaderError, HeaderRecord, decode_header_line, encode_header_line
from .values import (
    Checkpoint,
    LogInfo,
    Offset,
    Revision,
    SessionHeader,
    SessionId,
    check_session_id,
    decode_session_id,
    encode_session_id,
)

__all__ = ["FileLogStore", "LOG_NAMES"]

log = logging.getLogger(__name__)

Compression = Literal["none", "zstd"]
LOG_NAMES: dict[Compression, str] = {"none": "session.jsonl", "zstd": "session.jsonl.zst"}
LOCK_NAME = "lock"
PUBLISH_TEMP = "publish.tmp"
SESSIONS = "sessions"


@attrs.define(eq=False)
class _WriteState:
    lock: File
    file: File | None = None
    end: int = 0  # bytes of the log this handle has written or validated


@attrs.frozen
class _ReadState:
    path: str


@attrs.frozen
class _Parsed:
    record: HeaderRecord
    events: list[Event]
    complete_end: int
    size: int


class FileLogStore:
    def __init__(
        self,
        root: str | None = None,
        *,
        fs: Fs | None = None,
        compression: Compression = "none",
    ) -> None:
        if fs is None:
            if root is None:
                raise TypeError("FileLogStore needs a root or an fs")
            fs = OsFs(root)
        if compression != "none":
            # The zstd form arrives with the framed reader (issue 3); refuse rather than pretend.
            raise ValueError(f"compression {compression!r} is not available yet; use 'none'")
        self.fs = fs
        self.compression: Compression = compression
        self._root_durable = False

    # --- paths ---

    @staticmethod
    def _folder(session_id: str) -> str:
        return f"{SESSIONS}/{encode_session_id(session_id)}"

    def _log_forms(self, folder: str) -> list[tuple[str, Revision]]:
        forms = []
        for name in LOG_NAMES.values():
            rev = self.fs.revision(f"{folder}/{name}")
            if rev is not None:
                forms.append((f"{folder}/{name}", rev))
        return forms

    def _single_form(self, session_id: SessionId, folder: str) -> str:
        forms = self._log_forms(folder)
        if not forms:
            raise SessionNotFound(session_id)
        if len(forms) > 1:
            raise CorruptLog(session_id, "the folder holds both a plain and a zstd log")
        path = forms[0][0]
        if not path.endswith(LOG_NAMES["none"]):
            raise UnsupportedLog(session_id, "the zstd log form is not readable by this build yet")
        return path

    # --- claiming ---

    def create(self, header: SessionHeader, *, inherited_event_count: Offset = Offset(0)) -> WriteHandle:
        sid = check_session_id(header.id)
        if type(inherited_event_count) is not int or inherited_event_count < 0:
            raise ValueError(f"inherited_event_count must be a non-negative int, got {inherited_event_count!r}")
        if header.is_seeded != (inherited_event_count > 0):
            raise ValueError("header.is_seeded must be true exactly when inherited_event_count > 0")
        folder = self._folder(sid)
        with _mapped(sid, "create"):
            self.fs.make_root()
            self.fs.mkdir(SESSIONS)
            self.fs.mkdir(folder)
            lock = self._lock(sid, folder)
            try:
                if self._log_forms(folder):
                    raise SessionAlreadyExists(sid)
            except BaseException:
                lock.close()
                raise
        return WriteHandle(
            session_id=sid,
            header=header,
            inherited_event_count=inherited_event_count,
            next_seq=Offset(0),
            published=False,
            impl=_WriteState(lock=lock),
        )

    def _lock(self, sid: SessionId, folder: str) -> File:
        lock = self.fs.open(f"{folder}/{LOCK_NAME}", "lock")
        if not lock.try_lock():
            lock.close()
            raise AlreadyOwned(sid)
        return lock

    def open_write(self, session_id: str) -> WriteHandle:
        sid = check_session_id(session_id)
        folder = self._folder(sid)
        with _mapped(sid, "open for writing"):
            if self.fs.kind(folder) is None:
                raise SessionNotFound(sid)
            lock = self._lock(sid, folder)
            file: File | None = None
            try:
                file = self.fs.open(self._single_form(sid, folder), "append")
                parsed = self._parse(sid, file.pread(0, file.size()), checkpoint=None)
                if parsed.complete_end < parsed.size:
                    # Cut the torn tail durably before anyone appends after it. None of those
                    # bytes were acknowledged, so nothing acknowledged is lost.
                    file.truncate(parsed.complete_end)
                    file.fsync()
            except BaseException:
                if file is not None:
                    file.close()
                lock.close()
                raise
        return WriteHandle(
            session_id=sid,
            header=parsed.record.header,
            inherited_event_count=parsed.record.inherited_event_count,
            next_seq=Offset(len(parsed.events)),
            published=True,
            impl=_WriteState(lock=lock, file=file, end=parsed.complete_end),
        )

    def open_read(self, session_id: str) -> ReadHandle:
        sid = check_session_id(session_id)
        folder = self._folder(sid)
        with _mapped(sid, "open for reading"):
            path = self._single_form(sid, folder)
            file = self.fs.open(path, "read")
            try:
                record = self._read_header_only(sid, file)
            finally:
                file.close()
        return ReadHandle(
            session_id=sid,
            header=record.header,
            inherited_event_count=record.inherited_event_count,
            impl=_ReadState(path),
        )

    def _read_header_only(self, sid: SessionId, file: File) -> HeaderRecord:
        size = file.size()
        want = 4096
        while True:
            head = file.pread(0, min(want, size))
            nl = head.find(b"\n")
            if nl >= 0:
                break
            if len(head) >= size:
                raise CorruptLog(sid, "the header line is incomplete", offset=0)
            want *= 4
        try:
            return decode_header_line(memoryview(head)[:nl], sid)
        except HeaderError as exc:
            raise exc.to_storage_error(sid) from None

    def close(self, handle: ReadHandle | WriteHandle) -> None:
        if handle.closed:
            return
        handle.closed = True
        state = handle.impl
        if isinstance(state, _WriteState):
            for f in (state.file, state.lock):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        log.warning("session %r: closing a file failed", handle.session_id, exc_info=True)

    # --- appending ---

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "append")
        if handle.dead is not None:
            raise HandleDead(sid, handle.dead)
        events, payload = _check_batches(handle, batches)
        if not events:
            return handle.next_seq
        state = handle.impl
        assert isinstance(state, _WriteState)
        if handle.published:
            self._append_durably(handle, state, payload)
        else:
            self._publish(handle, state, payload)
        handle.next_seq = Offset(handle.next_seq + len(events))
        return handle.next_seq

    def _append_durably(self, handle: WriteHandle, state: _WriteState, payload: bytes) -> None:
        sid = handle.session_id
        file = state.file
        assert file is not None
        try:
            _write_all(file, payload)
        except OSError as exc:
            self._roll_back(handle, state, exc)
            raise _persistence(sid, "append", exc) from exc
        self._fsync(handle, file, "fsync")
        state.end += len(payload)

    def _roll_back(self, handle: WriteHandle, state: _WriteState, exc: OSError) -> None:
        """Cut a failed write back to the last acknowledged byte, durably, or die trying."""
        assert state.file is not None
        try:
            state.file.truncate(state.end)
            state.file.fsync()
        except OSError as cut:
            handle.dead = f"rolling back a failed write ({exc.strerror}) failed: {cut.strerror}"

    def _fsync(self, handle: WriteHandle, file: File | None, what: str, folder: str | None = None) -> None:
        try:
            if folder is None:
                assert file is not None
                file.fsync()
            else:
                self.fs.fsync_dir(folder)
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the dirty pages: retrying could
            # report durability that does not exist. The handle never writes again.
            handle.dead = f"{what} failed: {exc.strerror}"
            raise _persistence(handle.session_id, what, exc) from exc

    def _publish(self, handle: WriteHandle, state: _WriteState, payload: bytes) -> None:
        sid = handle.session_id
        folder = self._folder(sid)
        temp = f"{folder}/{PUBLISH_TEMP}"
        head = encode_header_line(
            HeaderRecord(header=handle.header, inherited_event_count=handle.inherited_event_count)
        )
        with _mapped(sid, "publish"):
            if self.fs.kind(temp) is not None:
                self.fs.unlink(temp)  # a leftover of a crashed publication: never published
            file = self.fs.open(temp, "create")
        try:
            try:
                _write_all(file, head + payload)
            except OSError as exc:
                raise _persistence(sid, "publish", exc) from exc
            self._fsync(handle, file, "fsync of the new log")
            try:
                self.fs.link(temp, f"{folder}/{LOG_NAMES[self.compression]}")
            except FileExistsError:
                raise SessionAlreadyExists(sid) from None
            except OSError as exc:
                raise _persistence(sid, "publish", exc) from exc
        except BaseException:
            file.close()
            try:
                self.fs.unlink(temp)
            except OSError:
                pass  # an unpublished leftover is invisible and the next publication removes it
            raise
        try:
            self.fs.unlink(temp)
        except OSError:
            log.warning("session %r: removing %s failed", sid, temp, exc_info=True)
        state.file = file
        self._fsync(handle, None, "fsync of the session folder", folder)
        self._fsync(handle, None, "fsync of sessions/", SESSIONS)
        if not self._root_durable:
            self._fsync(handle, None, "fsync of the root", "")
            self._root_durable = True
        state.end = len(head) + len(payload)
        handle.published = True

    # --- reading ---

    def read(
        self,
        handle: ReadHandle | WriteHandle,
        start: Offset = Offset(0),
        stop: Offset | None = None,
        *,
        checkpoint: Checkpoint | None = None,
    ) -> list[Event]:
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        state = handle.impl
        with _mapped(sid, "read"):
            if isinstance(state, _WriteState):
                if not handle.published or state.file is None:  # type: ignore[union-attr]
                    return []
                data = state.file.pread(0, state.end)
            else:
                assert isinstance(state, _ReadState)
                file = self.fs.open(state.path, "read")
                try:
                    data = file.pread(0, file.size())
                finally:
                    file.close()
        parsed = self._parse(sid, data, checkpoint=checkpoint)
        if parsed.record.header != handle.header:
            raise CorruptLog(sid, "the log's header changed since the handle was opened", offset=0)
        return parsed.events[start:stop]

    def _parse(self, sid: SessionId, data: bytes, *, checkpoint: Checkpoint | None) -> _Parsed:
        layout = plain_layout(sid, data)
        record = read_header(sid, data, layout)
        events = decode_event_lines(sid, data, layout.header_end, layout.complete_end, checkpoint=checkpoint)
        check_seed_marker(sid, events, record.inherited_event_count)
        return _Parsed(record=record, events=events, complete_end=layout.complete_end, size=layout.size)

    # --- listing ---

    def stat(self, session_id: str) -> LogInfo | None:
        sid = check_session_id(session_id)
        return self._info(sid, self._folder(sid))

    def list(self) -> list[LogInfo]:
        try:
            names = self.fs.listdir(SESSIONS)
        except FileNotFoundError:
            if self.fs.root_exists():
                return []
            raise PersistenceFailed("the store root does not exist") from None
        except OSError as exc:
            raise PersistenceFailed(f"listing sessions/ failed: {exc.strerror}") from exc
        infos = []
        for name in sorted(names):
            sid = decode_session_id(name)
            if sid is None:
                continue
            info = self._info(sid, f"{SESSIONS}/{name}")
            if info is not None:
                infos.append(info)
        return infos

    def _info(self, sid: SessionId, folder: str) -> LogInfo | None:
        """One listing row; damage is reported, an unreadable session is skipped (and logged)."""
        try:
            if self.fs.kind(folder) != "dir":
                return None
            forms = self._log_forms(folder)
            if not forms:
                return None
            path, revision = forms[0]
            if len(forms) > 1 or not path.endswith(LOG_NAMES["none"]):
                damage: Literal["corrupt", "unsupported"] = "corrupt" if len(forms) > 1 else "unsupported"
                return _damaged(sid, None, damage, revision, 0)
            file = self.fs.open(path, "read")
            try:
                revision = file.revision()
                data = file.pread(0, revision.size)
            finally:
                file.close()
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
                return _damaged(sid, None, "corrupt", Revision(0, 0, 0), 0)
            log.warning("session %r: skipped by the listing: %s", sid, exc)
            return None
        try:
            parsed = self._parse(sid, data, checkpoint=None)
        except (CorruptLog, UnsupportedLog) as exc:
            damage = "unsupported" if isinstance(exc, UnsupportedLog) else "corrupt"
            count = getattr(exc, "seq", None) or 0
            return _damaged(sid, _header_of(sid, data), damage, revision, count)
        return LogInfo(
            id=sid,
            header=parsed.record.header,
            damage=None,
            inherited_event_count=parsed.record.inherited_event_count,
            revision=revision,
            event_count=Offset(len(parsed.events)),
        )


def _damaged(
    sid: SessionId,
    record: HeaderRecord | SessionHeader | None,
    damage: Literal["corrupt", "unsupported"],
    revision: Revision,
    event_count: int,
) -> LogInfo:
    header = record.header if isinstance(record, HeaderRecord) else record
    k = record.inherited_event_count if isinstance(record, HeaderRecord) else 0
    return LogInfo(
        id=sid,
        header=header,
        damage=damage,
        inherited_event_count=Offset(k),
        revision=revision,
        event_count=Offset(event_count),
    )


def _header_of(sid: SessionId, data: bytes) -> HeaderRecord | SessionHeader | None:
    """Line 1 under the format-1 rules except the format value (SPEC 3.3), if it parses."""
    nl = data.find(b"\n")
    if nl < 0:
        return None
    try:
        return decode_header_line(memoryview(data)[:nl], sid)
    except HeaderError as exc:
        return exc.header


def _check_batches(handle: WriteHandle, batches: Sequence[Batch]) -> tuple[list[Event], bytes]:
    sid = handle.session_id
    events: list[Event] = []
    nxt = handle.next_seq
    for batch in batches:
        if batch.expected_seq != nxt:
            raise SequenceConflict(sid, expected=batch.expected_seq, actual=handle.next_seq)
        for i, event in enumerate(batch.events):
            if type(event) is not Event:
                raise InvalidEvent(f"session {sid!r}: batches hold Event values, got {type(event).__name__}")
            if event.seq != batch.expected_seq + i:
                raise InvalidEvent(
                    f"session {sid!r}: batch expecting seq {batch.expected_seq} holds seq {event.seq} "
                    f"at position {i}"
                )
        events.extend(batch.events)
        nxt = Offset(nxt + len(batch.events))
    k = handle.inherited_event_count
    if k:
        if not handle.published and nxt <= k:
            raise InvalidEvent(
                f"session {sid!r}: a seeded log is published with its whole seed and the "
                f"end-seed marker at seq {k}"
            )
        if handle.next_seq <= k < nxt and not is_seed_marker(events[k - handle.next_seq]):
            raise InvalidEvent(f"session {sid!r}: seq {k} must be the tagged session/end-seed marker")
    # Raw data must be the JSON its readers expect: a round trip through the reader's codec
    # refuses what `make_event` would have refused, whoever built the events.
    payload = encode_events(events)
    try:
        decode_events(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidEvent(f"session {sid!r}: an event would not read back: {exc}") from None
    return events, payload


def _write_all(file: File, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = file.write(view)
        view = view[n:]


def _persistence(sid: str, op: str, exc: OSError) -> StorageError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return UnsafePath(f"session {sid!r}: {op}: refusing a symlink or non-regular file ({exc.filename})")
    return PersistenceFailed(f"session {sid!r}: {op} failed: {exc.strerror or exc}")


@contextmanager
def _mapped(sid: SessionId, op: str) -> Iterator[None]:
    """Map the foreign errors of one operation into the storage tree."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError:
        raise SessionNotFound(sid) from None
    except OSError as exc:
        raise _persistence(sid, op, exc) from exc

