"""`FileLogStore`: session logs as files under `<root>/sessions/<encoded-id>/` (docs/format.md).

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
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import attrs

from ._codec import Event
from ._records import HeaderError, HeaderRecord, encode_header_line
from .append_check import check_append, check_new_session
from .catalog import SESSIONS, Catalog
from .errors import (
    AlreadyOwned,
    CorruptLog,
    HandleClosed,
    InvalidRange,
    PersistenceFailed,
    SessionAlreadyExists,
    SessionNotFound,
    StorageError,
    UnsafePath,
    UnsupportedLog,
)
from .forms import FORMS, Compression, LogForm, ParsedLog
from .fs import File, Folder, Fs, NotRegularFile, OsFs, open_folder
from .index import INDEX_NAME, IndexRow, SessionIndex, StoredCheckpoint
from .log_store import Batch, Handle, ObservedCheckpoint, ReadHandle, WriteHandle
from .projection import CheckpointRow, Lifecycle
from .scans import ANCHOR, still_holds
from .values import (
    AbortPoll,
    LogInfo,
    Offset,
    Revision,
    SessionHeader,
    SessionId,
    check_session_id,
    encode_session_id,
)

__all__ = ["FileLogStore"]

log = logging.getLogger(__name__)

_LOG_NAMES: dict[Compression, str] = {name: form.file_name for name, form in FORMS.items()}
LOCK_NAME = "lock"
PUBLISH_TEMP = "publish.tmp"
_FOLDERS_KEPT = 1 << 16  # folder names kept at most (a few MB)


@attrs.define(eq=False)
class _WriteState:
    lock: File
    form: LogForm
    file: File | None = None
    end: int = 0  # bytes of the log this handle has written or validated
    head_len: int = 0  # bytes of the stored header record


@attrs.frozen
class _ReadState:
    path: str
    form: LogForm
    known: tuple[bytes, HeaderRecord] | None = None  # line 1 as open_read parsed it


class FileLogStore:
    def __init__(
        self,
        root: str | None = None,
        *,
        fs: Fs | None = None,
        compression: Compression = "zstd",
        use_index: bool = True,
        watch: bool = True,
    ) -> None:
        if fs is None:
            if root is None:
                raise TypeError("FileLogStore needs a root or an fs")
            fs = OsFs(root)
        if compression not in FORMS:
            raise ValueError(f"compression must be one of {sorted(FORMS)}, got {compression!r}")
        self.fs = fs
        self.compression: Compression = compression
        self._root_durable = False
        if not use_index:
            index = None
        elif isinstance(fs, OsFs):
            index = SessionIndex(os.path.join(fs.root, INDEX_NAME))
        else:
            index = SessionIndex(None)  # an in-memory Fs gets an in-memory index
        self._catalog = Catalog(fs, index, watch=watch)
        self._lock_paths: dict[str, str] = {}  # id -> its lock's path, for `held_elsewhere`
        self._folders: dict[str, str] = {}  # id -> its folder (encoding is not free)

    # --- paths ---

    def _folder(self, session_id: str) -> str:
        folder = self._folders.get(session_id)
        if folder is None:
            if len(self._folders) >= _FOLDERS_KEPT:
                self._folders.clear()
            folder = self._folders[session_id] = f"{SESSIONS}/{encode_session_id(session_id)}"
        return folder

    def _log_forms(self, folder: str) -> list[tuple[str, LogForm, Revision]]:
        found = []
        for form in FORMS.values():
            path = f"{folder}/{form.file_name}"
            rev = self.fs.revision(path)
            if rev is not None:
                found.append((path, form, rev))
        return found

    def _single_form(self, session_id: SessionId, folder: str) -> tuple[str, LogForm]:
        found = self._log_forms(folder)
        if not found:
            raise SessionNotFound(session_id)
        if len(found) > 1:
            raise CorruptLog(session_id, "the folder holds both a plain and a zstd log")
        return found[0][0], found[0][1]

    # --- claiming ---

    def create(self, header: SessionHeader, *, inherited_event_count: Offset = Offset(0)) -> WriteHandle:
        sid = check_new_session(header, inherited_event_count)
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
            impl=_WriteState(lock=lock, form=FORMS[self.compression]),
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
                path, form = self._single_form(sid, folder)
                file = self.fs.open(path, "append")
                # With the lock held nobody else writes: a log the index saw whole and healthy
                # at exactly this revision needs no second validation.
                row = self._catalog.validated(sid, encode_session_id(sid), form.compression, file.revision())
                if row is not None and row.info.header is not None and still_holds(file, row):
                    header, k = row.info.header, row.info.inherited_event_count
                    count, end, head_len = row.info.event_count, row.scan_end, len(row.head)
                else:
                    parsed = form.parse(sid, file.pread(0, file.size()), poll=None)
                    end = _repair_tail(file, form, parsed)
                    header, k = parsed.record.header, parsed.record.inherited_event_count
                    count, head_len = Offset(len(parsed.events)), parsed.header_end
                # The log may be visible without its folder entries being durable (a publication
                # whose folder fsync failed): make them durable before acknowledging appends.
                self._fsync_entries(folder)
            except BaseException:
                if file is not None:
                    file.close()
                lock.close()
                raise
        return WriteHandle(
            session_id=sid,
            header=header,
            inherited_event_count=k,
            next_seq=count,
            published=True,
            end_offset=end,
            impl=_WriteState(lock=lock, form=form, file=file, end=end, head_len=head_len),
        )

    def open_read(self, session_id: str) -> ReadHandle:
        sid = check_session_id(session_id)
        folder = self._folder(sid)
        with _mapped(sid, "open for reading"):
            # One walk to the folder for the form check and the open (not one per step).
            with open_folder(self.fs, folder) as held:
                name, form = self._form_in(sid, held)
                file = held.open(name, "read")
            try:
                record, head = self._header_of(sid, file, form)
            finally:
                file.close()  # each read opens the log afresh, at its path
        return ReadHandle(
            session_id=sid,
            header=record.header,
            inherited_event_count=record.inherited_event_count,
            impl=_ReadState(f"{folder}/{name}", form, (head, record)),
        )

    @staticmethod
    def _form_in(sid: SessionId, folder: Folder) -> tuple[str, LogForm]:
        """`_single_form` in a folder already held."""
        found = [form for form in FORMS.values() if folder.revision(form.file_name) is not None]
        if not found:
            raise SessionNotFound(sid)
        if len(found) > 1:
            raise CorruptLog(sid, "the folder holds both a plain and a zstd log")
        return found[0].file_name, found[0]

    def _header_of(self, sid: SessionId, file: File, form: LogForm) -> tuple[HeaderRecord, bytes]:
        """Line 1 (`_read_header_only`), or the record a healthy index row holds for the very
        bytes the log starts with (parsed when the row was made: no second parse)."""
        known = self._catalog.known_head(sid, form.compression)
        if known is not None:
            head = file.pread(0, len(known[0]))
            if head == known[0]:
                return known[1], head
        return _read_header_only(sid, file, form)

    def close(self, handle: Handle) -> None:
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
        checked = check_append(handle, batches)
        if checked is None:
            return handle.next_seq
        events, payload = checked
        state = handle.impl
        assert isinstance(state, _WriteState)
        if handle.published:
            self._append_durably(handle, state, payload)
        else:
            self._publish(handle, state, payload)
        handle.next_seq = Offset(handle.next_seq + len(events))
        if self._catalog.remembers(handle.session_id):
            # The listing's row follows the log this handle writes (in memory: the index is
            # saved at checkpoints), so the next listing finds it at its new revision and
            # neither opens nor scans it; any other change to the file shows as another revision.
            row = self._written_row(handle)
            if row is not None:
                self._catalog.remember(row)
        return handle.next_seq

    def _append_durably(self, handle: WriteHandle, state: _WriteState, payload: bytes) -> None:
        sid = handle.session_id
        file = state.file
        assert file is not None
        data = state.form.append_bytes(payload)
        try:
            _write_all(file, data)
        except OSError as exc:
            self._roll_back(handle, state, exc)
            raise _persistence(sid, "append", exc) from exc
        self._fsync(handle, file, "fsync")
        state.end += len(data)
        handle.end_offset = state.end

    def _roll_back(self, handle: WriteHandle, state: _WriteState, exc: OSError) -> None:
        """Cut a failed write back to the last acknowledged byte, durably, or die trying."""
        assert state.file is not None
        try:
            state.file.truncate(state.end)
            state.file.fsync()
        except OSError as cut:
            handle.dead = f"rolling back a failed write ({exc.strerror}) failed: {cut.strerror}"

    def _fsync(self, handle: WriteHandle, file: File, what: str) -> None:
        try:
            file.fsync()
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the dirty pages: retrying could
            # report durability that does not exist. The handle never writes again.
            handle.dead = f"{what} failed: {exc.strerror}"
            raise _persistence(handle.session_id, what, exc) from exc

    def _publish(self, handle: WriteHandle, state: _WriteState, payload: bytes) -> None:
        sid = handle.session_id
        folder = self._folder(sid)
        temp = f"{folder}/{PUBLISH_TEMP}"
        head = state.form.head_bytes(
            encode_header_line(HeaderRecord(header=handle.header, inherited_event_count=handle.inherited_event_count))
        )
        data = head + state.form.append_bytes(payload)
        state.head_len = len(head)
        with _mapped(sid, "publish"):
            if self.fs.kind(temp) is not None:
                self.fs.unlink(temp)  # a leftover of a crashed publication: never published
            file = self.fs.open(temp, "create")
        try:
            try:
                _write_all(file, data)
            except OSError as exc:
                raise _persistence(sid, "publish", exc) from exc
            self._fsync(handle, file, "fsync of the new log")
            try:
                self.fs.link(temp, f"{folder}/{state.form.file_name}")
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
        try:
            self._fsync_entries(folder)
        except OSError as exc:
            handle.dead = f"fsync of the session's folders failed: {exc.strerror}"
            raise _persistence(sid, "publish", exc) from exc
        state.end = len(data)
        handle.end_offset = state.end
        handle.published = True

    def _fsync_entries(self, folder: str) -> None:
        """Make the session's folder, its entry in `sessions/` and `sessions/` itself durable."""
        self.fs.fsync_dir(folder)
        self.fs.fsync_dir(SESSIONS)
        if not self._root_durable:
            self.fs.fsync_dir("")
            self._root_durable = True

    # --- reading ---

    # --- checkpoints (docs/format.md, "The index") ---

    def write_checkpoint(self, handle: WriteHandle, rows: Mapping[str, CheckpointRow]) -> bool:
        """Store the rows that cover exactly the durable log (seq = the last durable seq), at
        its end offset, under the session's lifecycle identity. Fail-soft: False when not."""
        if self._catalog.index is None or not handle.published or handle.dead is not None:
            return False
        self._record_row(handle)
        last = handle.next_seq - 1
        current = {key: row for key, row in rows.items() if row.seq == last}
        if not current:
            return True  # nothing to checkpoint (no units, or none healthy): not a failure
        lifecycle = Lifecycle.of(handle.header, handle.inherited_event_count)
        return self._catalog.index.save_checkpoint(handle.session_id, lifecycle, current, handle.end_offset)

    def write_observed_checkpoints(self, observed: Sequence[ObservedCheckpoint]) -> int:
        """Store rows a reader proved by folding whole logs (docs/format.md, "The index"), in
        one index transaction: each at the end offset of its log's index row, only while that
        row, in memory and as stored, is still at the revision and event count observed (a log
        edited and rescanned since by another process is not). Fail-soft, quiet (a read-only
        folder is no error): how many sessions were written."""
        return self._catalog.save_observed(observed)

    def _record_row(self, handle: WriteHandle) -> None:
        """The writer knows its log whole (every event it appended was valid): record the index
        row, so the next open or listing need not scan the log. Fail-soft."""
        row = self._written_row(handle)
        if row is not None:
            self._catalog.record(row)

    def _written_row(self, handle: WriteHandle) -> IndexRow | None:
        """The index row of the log exactly as this handle wrote it (None when it cannot tell:
        bytes past its end, or the file cannot be read)."""
        state = handle.impl
        if not isinstance(state, _WriteState) or state.file is None or not state.head_len:
            return None
        try:
            revision = state.file.revision()
            if revision.size != state.end:
                return None  # bytes past what this handle wrote: let a scan decide
            head = state.file.pread(0, state.head_len)
            anchor = state.file.pread(max(0, state.end - ANCHOR), min(ANCHOR, state.end))
        except OSError:
            return None
        info = LogInfo.healthy(
            handle.session_id, handle.header, handle.inherited_event_count, revision, handle.next_seq
        )
        return IndexRow(
            info=info,
            form=state.form.compression,
            scan_end=state.end,
            scan_events=handle.next_seq,
            head=head,
            anchor=anchor,
        )

    def read_checkpoint(
        self, session_id: str, header: SessionHeader, inherited_event_count: int
    ) -> tuple[dict[str, CheckpointRow], int] | None:
        """The stored rows of this lifecycle of the session and their log offset, if any."""
        index = self._catalog.index
        if index is None:
            return None
        loaded = index.load_checkpoints([session_id])
        if not loaded or self._catalog.suspect([session_id]):
            return None
        lifecycle = Lifecycle.of(header, inherited_event_count)
        stored = [s for s in loaded.get(session_id, []) if s.lifecycle == lifecycle]
        if not stored:
            return None
        offset = stored[0].log_offset
        seq = stored[0].row.seq
        rows = {s.key: s.row for s in stored if s.log_offset == offset and s.row.seq == seq}
        return rows, offset

    def read_checkpoint_rows(
        self, session_ids: Sequence[str], keys: Sequence[str] | None = None, skip: Mapping[str, bytes] | None = None
    ) -> dict[str, list[StoredCheckpoint]] | None:
        """Every stored checkpoint row of these sessions (of the unit `keys` only, if given; see
        `SessionIndex.load_checkpoints` for `skip`), in one query (None on a cache miss); the
        caller checks versions and lifecycles. None stored for a session whose rows may answer
        for a revision that is gone (`Catalog.suspect`)."""
        index = self._catalog.index
        if index is None:
            return None
        found = index.load_checkpoints(list(session_ids), keys, skip)
        if found:
            for sid in self._catalog.suspect(found):
                found[sid] = []
        return found

    def read_after(
        self, handle: Handle, log_offset: int, first_seq: int, *, poll: AbortPoll | None = None
    ) -> list[Event] | None:
        """The events after a checkpoint: from the record boundary `log_offset`, which must hold
        seq `first_seq` (or be the end). None when it does not — then fold from the start."""
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        if type(log_offset) is not int or log_offset < 0 or type(first_seq) is not int or first_seq < 0:
            raise InvalidRange(
                f"session {sid!r}: log_offset and first_seq must be non-negative ints, "
                f"got {log_offset!r}, {first_seq!r}"
            )
        state = handle.impl
        with _mapped(sid, "read"):
            if isinstance(state, _WriteState):
                if state.file is None or log_offset > state.end:
                    return None
                data = state.file.pread(log_offset, state.end - log_offset)
            else:
                assert isinstance(state, _ReadState)
                file = self.fs.open(state.path, "read")
                try:
                    size = file.size()
                    if log_offset > size:
                        return None
                    data = file.pread(log_offset, size - log_offset)
                finally:
                    file.close()
        form = state.form
        try:
            scan = form.scan_tail(sid, data, first_seq=first_seq, poll=poll)
        except (CorruptLog, UnsupportedLog):
            return None
        return scan.events

    def read(
        self, handle: Handle, start: Offset = Offset(0), stop: Offset | None = None, *, poll: AbortPoll | None = None
    ) -> list[Event]:
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        if type(start) is not int or start < 0 or (stop is not None and (type(stop) is not int or stop < start)):
            raise InvalidRange(f"session {sid!r}: read range [{start!r}, {stop!r}) is not a range of offsets")
        state = handle.impl
        with _mapped(sid, "read"):
            if isinstance(state, _WriteState):
                if not handle.published or state.file is None:
                    return []
                data = state.file.pread(0, state.end)
                # Every byte up to `end` was validated when the handle opened (a parse, or a
                # row the index vouches for) or appended by it (events are valid by
                # construction, payloads included): their payloads need no second check.
                payloads = False
            else:
                assert isinstance(state, _ReadState)
                file = self.fs.open(state.path, "read")
                try:
                    data = file.pread(0, file.size())
                    # Payloads are checked once per revision of a log: by the scan whose row
                    # vouches for exactly these bytes (or by the writer that recorded it).
                    payloads = not self._catalog.vouches(sid, state.form.compression, file.revision(), len(data))
                finally:
                    file.close()
        known = state.known if isinstance(state, _ReadState) else None
        parsed = state.form.parse(sid, data, poll=poll, known=known, payloads=payloads)
        if parsed.record.header != handle.header:
            raise CorruptLog(sid, "the log's header changed since the handle was opened", offset=0)
        return parsed.events[start:stop]

    # --- listing ---

    def stat(self, session_id: str) -> LogInfo | None:
        sid = check_session_id(session_id)
        return self._catalog.stat(sid, encode_session_id(sid))

    def list(self) -> list[LogInfo]:
        return self._catalog.list()

    def held_elsewhere(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among `session_ids` whose single-writer lock a writer in another process
        holds now, read from the lock table without taking any lock (`locks`); empty where
        the table cannot be read. Invalid ids are never held. (Over an in-memory Fs, every
        holder counts: it has no processes.)"""
        known = self._lock_paths
        paths: dict[str, str] = {}
        for session_id in session_ids:
            path = known.get(session_id)
            if path is None:
                try:
                    sid = check_session_id(session_id)
                except StorageError:
                    continue  # an invalid id names no folder, so nothing can hold its lock
                path = known[sid] = f"{self._folder(sid)}/{LOCK_NAME}"
            paths[path] = session_id
        if not paths:
            return set()
        try:
            held = self.fs.held_locks(list(paths))
        except OSError:
            return set()  # advice for display only: an unreadable folder holds nothing we can see
        return {paths[path] for path in held}

    @property
    def leased(self) -> None:
        """None: the file store's writers hold flocks, which need no renewal, and it has no
        placement queue (a folder is not shared by hosts)."""
        return None

    @property
    def watching(self) -> bool:
        """Whether change notification spares the next `list()` a stat per session (`watch`)."""
        return self._catalog.watching

    def close_store(self) -> None:
        """Release the index connection (handles are closed one by one with `close`)."""
        self._catalog.close()


def _read_header_only(sid: SessionId, file: File, form: LogForm) -> tuple[HeaderRecord, bytes]:
    """Line 1 without reading the whole log (grow the prefix until the header parses), and the
    raw bytes that hold it."""
    size = file.size()
    want = 4096
    while True:
        head = file.pread(0, min(want, size))
        found = form.header_of(sid, head)
        if isinstance(found, HeaderRecord):
            return found, head[: form.header_span(head)]
        if isinstance(found, HeaderError):
            raise found.to_storage_error(sid)
        if len(head) >= size:
            raise CorruptLog(sid, "the header record is incomplete", offset=0)
        want *= 8


def _repair_tail(file: File, form: LogForm, parsed: ParsedLog) -> int:
    """Cut a torn tail durably before anyone appends after it; returns the new end.

    None of the torn bytes were acknowledged, so nothing acknowledged is lost. The complete
    lines of a torn zstd frame are re-appended as one new checksummed frame, so the events a
    reader returned are the events the writer continues from: no seq is ever reused.
    """
    if not parsed.torn:
        return parsed.complete_end
    file.truncate(parsed.complete_end)
    end = parsed.complete_end
    if parsed.recovered:
        framed = form.append_bytes(parsed.recovered)
        _write_all(file, framed)
        end += len(framed)
    file.fsync()
    return end


def _write_all(file: File, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = file.write(view)
        view = view[n:]


def _persistence(sid: str, op: str, exc: OSError) -> StorageError:
    if isinstance(exc, NotRegularFile) or exc.errno in (errno.ELOOP, errno.ENOTDIR):
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
