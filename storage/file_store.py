"""`FileLogStore`: session logs as files under `<root>/sessions/<encoded-id>/` (docs/format.md).

Theory of operation. `create` makes the folder and takes the flock on its `lock` file but
writes no log: the first `append` publishes, writing header and batches to `publish.tmp`,
fsyncing it, hard-linking it to the log name (which fails if a log exists, so publication never
overwrites), then fsyncing the folder, `sessions/` and, once per store, the root. Later appends
write at the end and fsync once per call; a failed write is truncated back (durably), a failed
fsync kills the handle (the append path: file_append). `open_write` takes the lock before it
looks at the tail, validates the whole log and cuts a torn tail, so readers and writers always
agree on where the log ends. Checkpoints live in the index (file_checkpoints); listing is the
catalog's (catalog).

Every path is reached through the `Fs` seam without following links; every `OSError` is mapped
once, into the storage error tree (file_handles).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator, Mapping, Sequence

from ._codec import Event
from ._records import HeaderError, HeaderRecord
from .append_check import check_new_session
from .catalog import SESSIONS, Catalog
from .errors import (
    AlreadyOwned,
    CorruptLog,
    HandleClosed,
    InvalidRange,
    SessionAlreadyExists,
    SessionNotFound,
    StorageError,
    UnsupportedLog,
)
from .file_append import FileAppender
from .file_checkpoints import FileCheckpoints
from .file_handles import ReadState, WriteState, mapped, write_all
from .forms import FORMS, Compression, LogForm, ParsedLog
from .fs import File, Folder, Fs, OsFs, open_folder
from .index import INDEX_NAME, SessionIndex, StoredCheckpoint
from .log_store import Batch, Handle, ObservedCheckpoint, ReadHandle, WriteHandle
from .log_watch import LogWatch
from .projection import CheckpointRow, ProjectionRegistry
from .scans import still_holds
from .values import (
    ANOTHER_PROCESS,
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
_FOLDERS_KEPT = 1 << 16  # folder names kept at most (a few MB)


class FileLogStore:
    def __init__(
        self,
        root: str | None = None,
        *,
        fs: Fs | None = None,
        compression: Compression = "zstd",
        use_index: bool = True,
        watch: bool = True,
        projections: ProjectionRegistry | None = None,
        focus: str | None = None,
        subtree: bool = False,
    ) -> None:
        """`projections`: the units of the runtime that reads this store; given them, a log
        the index scans whole gets its checkpoint rows in the same pass (`Catalog`). `focus`:
        the one parent whose children this store is opened to list — `list()` answers a log
        without an index row whose line 1 names another parent from that line alone
        (`LogInfo.checked` False); `stat`, readers and writers still read such a log whole. With
        `subtree`, the focus's descendants are listed: a log's line 1 must place it outside the
        focus's tree (by the parents line 1 names) to be answered from that line."""
        if fs is None:
            if root is None:
                raise TypeError("FileLogStore needs a root or an fs")
            fs = OsFs(root)
        if compression not in FORMS:
            raise ValueError(f"compression must be one of {sorted(FORMS)}, got {compression!r}")
        self.fs = fs
        self.compression: Compression = compression
        if not use_index:
            index = None
        elif isinstance(fs, OsFs):
            index = SessionIndex(os.path.join(fs.root, INDEX_NAME))
        else:
            index = SessionIndex(None)  # an in-memory Fs gets an in-memory index
        self._catalog = Catalog(fs, index, watch=watch, projections=projections, focus=focus, subtree=subtree)
        self._lock_paths: dict[str, str] = {}  # id -> its lock's path, for `held_elsewhere`
        self._folders: dict[str, str] = {}  # id -> its folder (encoding is not free)
        self._appender = FileAppender(fs, self._catalog, self._folder)
        self._checkpoints = FileCheckpoints(self._catalog)

    # --- paths ---

    def _folder(self, session_id: str) -> str:
        folder = self._folders.get(session_id)
        if folder is None:
            if len(self._folders) >= _FOLDERS_KEPT:
                self._folders.clear()
            folder = self._folders[session_id] = f"{SESSIONS}/{encode_session_id(session_id)}"
        return folder

    def _log_forms(self, folder: str) -> list[tuple[str, LogForm, Revision]]:
        found: list[tuple[str, LogForm, Revision]] = []
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
        with mapped(sid, "create"):
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
            impl=WriteState(lock=lock, form=FORMS[self.compression]),
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
        with mapped(sid, "open for writing"):
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
                    last_time = row.info.last_time
                else:
                    parsed = form.parse(sid, file.pread(0, file.size()), poll=None)
                    end = _repair_tail(file, form, parsed)
                    header, k = parsed.record.header, parsed.record.inherited_event_count
                    count, head_len = Offset(len(parsed.events)), parsed.header_end
                    last_time = parsed.events[-1].time if parsed.events else 0
                # The log may be visible without its folder entries being durable (a publication
                # whose folder fsync failed): make them durable before acknowledging appends.
                self._appender.fsync_entries(folder)
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
            impl=WriteState(lock=lock, form=form, file=file, end=end, head_len=head_len, last_time=last_time),
        )

    def open_read(self, session_id: str) -> ReadHandle:
        sid = check_session_id(session_id)
        folder = self._folder(sid)
        with mapped(sid, "open for reading"):
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
            impl=ReadState(f"{folder}/{name}", form, (head, record)),
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
        if isinstance(state, WriteState):
            for f in (state.file, state.lock):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        log.warning("session %r: closing a file failed", handle.session_id, exc_info=True)

    # --- appending ---

    # --- appending (file_append) ---

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        return self._appender.append(handle, batches)

    # --- checkpoints (file_checkpoints) ---

    def write_checkpoint(self, handle: WriteHandle, rows: Mapping[str, CheckpointRow]) -> bool:
        return self._checkpoints.write_checkpoint(handle, rows)

    def write_observed_checkpoints(self, observed: Sequence[ObservedCheckpoint]) -> int:
        return self._checkpoints.write_observed_checkpoints(observed)

    def read_checkpoint(
        self, session_id: str, header: SessionHeader, inherited_event_count: int
    ) -> tuple[dict[str, CheckpointRow], int] | None:
        return self._checkpoints.read_checkpoint(session_id, header, inherited_event_count)

    def read_checkpoint_rows(
        self,
        session_ids: Sequence[str],
        keys: Sequence[str] | None = None,
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]] | None:
        return self._checkpoints.read_checkpoint_rows(session_ids, keys, skip, keep)

    # --- reading ---

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
        with mapped(sid, "read"):
            if isinstance(state, WriteState):
                if state.file is None or log_offset > state.end:
                    return None
                data = state.file.pread(log_offset, state.end - log_offset)
            else:
                assert isinstance(state, ReadState)
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

    def read_window(self, handle: ReadHandle, start: int, stop: int) -> list[Event] | None:
        """Events `[start, stop)` of the log, decoding only the records that hold them: where they
        lie is found by counting line ends (`LogForm.window`: no event decoded before them, a zstd
        frame only decompressed), then those bytes are decoded and checked as `read_after` checks
        a tail. None when the log holds no such seqs or its bytes do not split as expected: read
        it as before. Damage before `start` is not looked for (a whole read finds it)."""
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        if type(start) is not int or type(stop) is not int or not 0 <= start < stop:
            raise InvalidRange(f"session {sid!r}: window [{start!r}, {stop!r}) is not a range of seqs")
        state = handle.impl
        assert isinstance(state, ReadState)  # a ReadHandle's
        with mapped(sid, "read"):
            file = self.fs.open(state.path, "read")
            try:
                found = state.form.window(file.pread, file.size(), start, stop)
                if found is None:
                    return None
                offset, first_seq, end = found
                data = file.pread(offset, end - offset)
            finally:
                file.close()
        try:
            events = state.form.scan_tail(sid, data, first_seq=first_seq).events
        except (CorruptLog, UnsupportedLog):
            return None
        window = [e for e in events if start <= e.seq < stop]
        return window if len(window) == stop - start else None

    def read(
        self, handle: Handle, start: Offset = Offset(0), stop: Offset | None = None, *, poll: AbortPoll | None = None
    ) -> list[Event]:
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        if type(start) is not int or start < 0 or (stop is not None and (type(stop) is not int or stop < start)):
            raise InvalidRange(f"session {sid!r}: read range [{start!r}, {stop!r}) is not a range of offsets")
        # The stream, kept whole: it never holds the file (a zstd log's compressed bytes) nor a
        # growing buffer, only each chunk's plain bytes, which the events reference. Every
        # event is validated, those past `stop` too, as a whole read always has.
        events: list[Event] = []
        for chunk in self._chunks(handle, Offset(start), poll):
            events.extend(chunk)
        return events if stop is None else events[: max(0, stop - start)]

    def read_chunks(
        self, handle: Handle, *, start: Offset = Offset(0), poll: AbortPoll | None = None
    ) -> Iterator[list[Event]]:
        """`read(handle, start)` a chunk at a time (`LogReader.read_chunks`): the file is read
        through a bounded window (forms: `LogForm.stream`)."""
        sid = handle.session_id
        if handle.closed:
            raise HandleClosed(sid, "read")
        if type(start) is not int or start < 0:
            raise InvalidRange(f"session {sid!r}: read start {start!r} is not an offset")
        return self._chunks(handle, start, poll)

    def _chunks(self, handle: Handle, start: Offset, poll: AbortPoll | None) -> Iterator[list[Event]]:
        sid = handle.session_id
        state = handle.impl
        with mapped(sid, "read"):
            if isinstance(state, WriteState):
                if not (isinstance(handle, WriteHandle) and handle.published) or state.file is None:
                    return
                file, owned = state.file, False
            else:
                assert isinstance(state, ReadState)
                file, owned = self.fs.open(state.path, "read"), True
            try:
                if isinstance(state, WriteState):
                    # Every byte up to `end` was validated when the handle opened (a parse, or a
                    # row the index vouches for) or appended by it (events are valid by
                    # construction, payloads included): their payloads need no second check.
                    size, known, payloads = state.end, None, False
                else:
                    size, known = file.size(), state.known
                    # Payloads are checked once per revision of a log: by the scan whose row
                    # vouches for exactly these bytes (or by the writer that recorded it).
                    payloads = not self._catalog.vouches(sid, state.form.compression, file.revision(), size)

                def read_at(offset: int, length: int) -> bytes:
                    got = file.pread(offset, length)
                    if len(got) != length:
                        # Logs only grow, but a writer may cut a torn tail meanwhile: an IO
                        # failure of this read (a retry reads the repaired log), never a loop.
                        raise OSError(errno.EIO, f"the log ended at byte {offset + len(got)} while being read")
                    return got

                yield from state.form.stream(
                    sid, read_at, size, header=handle.header, start=start, poll=poll, known=known, payloads=payloads
                )
            finally:
                if owned:
                    file.close()  # each read opens the log afresh, at its path

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
        return set(self.holders(session_ids))

    def holders(self, session_ids: Sequence[str]) -> dict[str, str]:
        """`held_elsewhere` with who holds each: `pid N` from the lock table (`another
        process` where it names none: an in-memory Fs)."""
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
            return {}
        try:
            held = self.fs.held_locks(list(paths))
        except OSError:
            return {}  # advice for display only: an unreadable folder holds nothing we can see
        return {paths[path]: ANOTHER_PROCESS if pid is None else f"pid {pid}" for path, pid in held.items()}

    @property
    def leased(self) -> None:
        """None: the file store's writers hold flocks, which need no renewal, and it has no
        placement queue (a folder is not shared by hosts)."""
        return None

    @property
    def watching(self) -> bool:
        """Whether change notification spares the next `list()` a stat per session (`watch`)."""
        return self._catalog.watching

    def log_watch(self) -> LogWatch | None:
        """A change notification for followed logs (`log_watch`), or None where the kernel
        cannot vouch for this store's folders (an in-memory Fs, a network file system)."""
        if not isinstance(self.fs, OsFs):
            return None
        return LogWatch.open(self.fs.root, self._folder)

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
        write_all(file, framed)
        end += len(framed)
    file.fsync()
    return end
