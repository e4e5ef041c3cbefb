"""`list()` and `stat()` of the file store: log revisions reconciled against the index.

Theory of operation. One `Fs.scan` pass yields every real session folder with the revisions of
its log files. A log whose revision equals its index row is answered from the row and never
opened. A log that only grew (same form, same inode, larger) is scanned from where the row's
scan stopped; any doubt about that tail (it does not start at a record, the seqs do not
continue) falls back to a full rescan, which is always authoritative. Everything else is
rescanned whole. Checkpoint rows answer for the revision they were written at (or a pure append
of it): a log rescanned whole (edited in place, replaced, re-created) forgets its session's
checkpoint rows in the transaction that saves its new row, unless the stored row is already at
that revision (`SessionIndex.save`); a changed inode or header forgets them whatever the scan;
a vanished log loses its row. When that write fails, this process ignores those sessions'
stored rows (`suspect`) until a later write forgets them. Rows are mirrored in memory after the
first load, and written back in one transaction per listing. A writer of this store keeps its log's row in step with its appends
(`remember`, in memory; saved with the next index write or at close), so a listing finds that
log at the revision its writer left it and neither opens nor scans it. The index is a cache: when it cannot be read or written the listing
is computed from the logs alone.

One pass per byte (issue 28 item 1). A catalog given the store's `projections` folds the events
a whole rescan decoded to validate a healthy log into every unit, and writes the checkpoint rows
that proves (at the log's last event) in the same index transaction as the row, by the rules of
a reader's observed rows (`SessionIndex.save_observed`): a listing that needs them finds them
beside the row and never decodes those bytes again. A catalog with a `focus` (the one parent
whose children a command lists) answers a log without a row whose line 1 is a valid header
naming another parent from that line alone (`LogInfo.checked` False; kept in memory only, never
an index row): the listing places such a log by its line 1 only, so its damage is not asked;
`stat` (and so readers and writers) still reads it whole. A `subtree` focus (a command listing
the focus's descendants) first reads line 1 of every log without a row, then reads whole the
ones the focus's tree reaches through the parents those lines name.

Listing never fails because of one session: damage becomes the row's `damage`, and a log that
cannot be read because of an I/O error is skipped (and logged) — it is retried next time.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Collection, Sequence

from ._records import HeaderError, HeaderRecord
from .errors import PersistenceFailed, UnsafePath
from .forms import FORMS, LogForm
from .fs import FolderScan, Fs, NotRegularFile
from .index import IndexRow, SessionIndex
from .projection import ObservedCheckpoint, ProjectionRegistry
from .scans import damaged_info, may_have_grown, scan_growth, scan_line_one, scan_whole, still_holds
from .values import LogInfo, Revision, SessionId, decode_session_id
from .watch import Watch

__all__ = ["SESSIONS", "Catalog"]

log = logging.getLogger(__name__)

SESSIONS = "sessions"
_FORM_BY_FILE: dict[str, LogForm] = {form.file_name: form for form in FORMS.values()}
_LOG_FILES = (FORMS["zstd"].file_name, FORMS["none"].file_name)  # the default form first
_NO_REVISION = Revision(size=0, mtime_ns=0, inode=0)


class Catalog:
    def __init__(
        self,
        fs: Fs,
        index: SessionIndex | None,
        *,
        watch: bool = True,
        projections: ProjectionRegistry | None = None,
        focus: str | None = None,
        subtree: bool = False,
    ) -> None:
        self.fs = fs
        self.index = index
        # The one parent whose children (or, `subtree`, whose descendants) the listings of this
        # catalog are for (None: any).
        self._focus = focus
        self._subtree = subtree and focus is not None
        self._heads: dict[SessionId, LogInfo] = {}  # line-1-only answers (`_head_only`), never stored
        # The units whose checkpoint rows a whole rescan proves for the index (None: none).
        self._projections = projections if index is not None else None
        self._rows: dict[SessionId, IndexRow] | None = None
        self._ids: dict[str, SessionId | None] = {}  # folder name → id (decoding is not free)
        self._lock = threading.Lock()
        # Change notification (see `watch`): the folders of the last pass, kept while a watch
        # vouches for them; None means the next listing makes a full pass.
        self._watching = watch
        self._watch: Watch | None = None
        self._folders: dict[str, FolderScan] | None = None
        self._listed = False
        self._scan_lock = threading.Lock()
        # The last complete answer of `list()`, good while the watched folders are those of the
        # same generation: every change to a log goes with an event that starts a new one.
        self._generation = 0
        self._answer: tuple[int, list[LogInfo]] | None = None
        self._unsaved: dict[SessionId, IndexRow] = {}  # rows writers kept in memory only (`remember`)
        # Rows of whole rescans whose checkpoint rows could not be forgotten (the index write
        # failed): their stored checkpoints are ignored here, and forgetting them is retried
        # with the next write.
        self._suspect: dict[SessionId, IndexRow] = {}

    @property
    def watching(self) -> bool:
        """Whether the next listing may re-stat only the folders a watch names."""
        return self._folders is not None

    def list(self) -> list[LogInfo]:
        folders, generation = self._folders_now() if self._watching else (self._scan(None), None)
        if folders is None:
            return []  # no sessions/ yet: nothing to list, and no index to create
        with self._lock:
            answer = self._answer
            if generation is not None and answer is not None and answer[0] == generation:
                return list(answer[1])  # the kernel reports no change since
            rows = self._load()
            slots: list[LogInfo | None] = []
            deferred: list[tuple[int, SessionId, FolderScan]] = []
            complete = True
            changed: list[IndexRow] = []
            whole: list[IndexRow] = []
            proved: list[ObservedCheckpoint] = []
            seen: set[SessionId] = set()
            known, ids = self._ids, {}
            forms = _FORM_BY_FILE
            for folder in sorted(folders):
                name, files = folder
                sid = ids[name] = known[name] if name in known else decode_session_id(name)
                if sid is None or not files:
                    continue  # not a session folder, or an unpublished one (its row goes)
                seen.add(sid)
                if len(files) == 1:
                    # The usual case, inline: one log, unchanged since its row.
                    ((file_name, revision),) = files.items()
                    row = rows.get(sid)
                    if (
                        row is not None
                        and revision is not None
                        and row.form == forms[file_name].compression
                        and row.info.revision == revision
                    ):
                        slots.append(row.info)
                        continue
                if self._subtree and sid not in rows:
                    deferred.append((len(slots), sid, folder))
                    slots.append(None)  # placed once the focus's tree is known
                    continue
                info = self._info(sid, folder, rows, changed, whole, proved, heads=True)
                if info is not None:
                    slots.append(info)
                    complete = complete and info.checked  # line-1-only answers are never kept
                else:
                    complete = False  # skipped after an I/O error: retried by the next listing
            if deferred:
                complete = self._place_subtree(deferred, slots, rows, changed, whole, proved) and complete
            infos = [info for info in slots if info is not None]
            self._ids = ids
            gone = [sid for sid in rows if sid not in seen]
            self._commit(rows, changed, gone, whole, proved)
            if generation is not None and complete:
                self._answer = (generation, infos)
                return list(infos)
        return infos

    def stat(self, sid: SessionId, name: str) -> LogInfo | None:
        folders = self._scan([name])
        if folders is None:
            return None
        with self._lock:
            rows = self._load()
            changed: list[IndexRow] = []
            whole: list[IndexRow] = []
            proved: list[ObservedCheckpoint] = []
            info = self._info(sid, folders[0], rows, changed, whole, proved) if folders else None
            gone = [sid] if info is None and sid in rows else []
            self._commit(rows, changed, gone, whole, proved)
        return info

    def validated(self, sid: SessionId, name: str, compression: str, revision: Revision) -> IndexRow | None:
        """The row of a log at exactly `revision` if a scan found it whole and healthy — a
        writer holding the lock may then skip re-validating it (refreshing a stale row first)."""

        def fresh(row: IndexRow | None) -> bool:
            return (
                row is not None
                and row.form == compression
                and row.revision == revision
                and row.info.damage is None
                and row.info.header is not None
                and row.scan_end == revision.size  # no torn tail to cut
                and row.scan_events == row.info.event_count  # no recovered lines to re-frame
            )

        with self._lock:
            row = self._load().get(sid)
        if not fresh(row):
            self.stat(sid, name)
            with self._lock:
                row = self._load().get(sid)
        return row if fresh(row) else None

    def vouches(self, sid: SessionId, compression: str, revision: Revision, size: int) -> bool:
        """Whether a row already in memory says a scan (or the writer) found the log whole and
        healthy at exactly `revision` — its payloads validated then — and `size` bytes are all
        of it. Never loads the index for the asking (a reader's thread is not the index's)."""
        with self._lock:
            row = self._rows.get(sid) if self._rows is not None else None
        return (
            row is not None
            and row.form == compression
            and row.revision == revision
            and row.info.damage is None
            and row.scan_end == revision.size == size
        )

    def observed_end(self, sid: SessionId, revision: Revision, event_count: int) -> int | None:
        """The record boundary after the last event of a log a reader found healthy at exactly
        `revision` with `event_count` events (where rows observed there start over), or None
        when the index row says otherwise (the log changed since, or a scan left a doubt)."""
        with self._lock:
            row = self._rows.get(sid) if self._rows is not None else None
        if (
            row is None
            or row.revision != revision
            or row.info.damage is not None
            or row.info.event_count != event_count
            or row.scan_events != event_count  # recovered lines of a torn frame: re-framed later
        ):
            return None
        return row.scan_end

    def known_head(self, sid: SessionId, compression: str) -> tuple[bytes, HeaderRecord] | None:
        """The raw head bytes of a healthy row in memory and the header record they were parsed
        into when the row was made (a reader whose log starts with the same bytes need not parse
        them again). Never loads the index for the asking."""
        with self._lock:
            row = self._rows.get(sid) if self._rows is not None else None
        if row is None or row.form != compression or row.info.damage is not None or not row.head:
            return None
        header = row.info.header
        if header is None:
            return None
        return row.head, HeaderRecord(header=header, inherited_event_count=row.info.inherited_event_count)

    def suspect(self, sids: Collection[str]) -> set[str]:
        """Those of `sids` whose stored checkpoint rows this process must not use: their log
        was rescanned whole and the index write that forgets such rows failed."""
        if not self._suspect:  # the usual case, without the lock
            return set()
        with self._lock:
            return {sid for sid in sids if sid in self._suspect}

    def save_observed(self, observed: Sequence[ObservedCheckpoint]) -> int:
        """Store rows a reader proved (`SessionIndex.save_observed`), each at the end offset of
        its log's row, only while that row is still at the revision and event count observed
        and is the stored row too (rows writers kept in memory only are saved first). How many
        sessions were written."""
        index = self.index
        if index is None:
            return 0
        entries: list[tuple[ObservedCheckpoint, int]] = []
        for one in observed:
            end = self.observed_end(one.session_id, one.revision, one.event_count)
            if end is not None:
                entries.append((one, end))
        if not entries:
            return 0
        with self._lock:
            rows = self._rows
            if rows is not None and (self._suspect or self._unsaved):
                # The stored rows must be these (`SessionIndex.save_observed` compares): what
                # writers kept in memory is saved first, and forgetting that failed is retried.
                self._save(rows, [], [], [], ())
        return index.save_observed(entries)

    def remembers(self, sid: SessionId) -> bool:
        """Whether the rows are in memory (a store that has listed or stat'ed): only then does a
        writer's `remember` keep anything (it never loads the index for that)."""
        return self._rows is not None

    def remember(self, row: IndexRow) -> None:
        """A row a writer vouches for, kept in memory only (the index on disk catches up at the
        writer's next `record`): a listing then finds the log at the revision its writer left
        it and neither opens nor scans it. The revision is compared with a fresh stat as every
        row's is, so a change by anyone else still shows."""
        # Never waits for a listing under way (an append must not): skipped then, the next
        # listing scans the log's tail as it would have.
        if not self._lock.acquire(blocking=False):
            return
        try:
            rows = self._rows
            if rows is None:
                return
            old = rows.get(row.id)
            if old is not None and (old.revision.inode != row.revision.inode or old.info.header != row.info.header):
                return  # another lifecycle: its checkpoints must go with the old row (a scan does that)
            rows[row.id] = row
            self._unsaved[row.id] = row
        finally:
            self._lock.release()

    def record(self, row: IndexRow) -> None:
        """A row a writer vouches for (it wrote every byte of the log since a validated state)."""
        with self._lock:
            self._commit(self._load(), [row], [])

    def close(self) -> None:
        with self._scan_lock:
            self._watching = False
            self._folders = None
            if self._watch is not None:
                self._watch.close()
                self._watch = None
        if self.index is not None:
            with self._lock:
                rows = self._rows or {}
                kept = [row for sid, row in self._unsaved.items() if rows.get(sid) is row]
                self._unsaved.clear()
            if kept:
                self.index.save(kept, [])  # what writers kept in memory, for the next process
            self.index.close()

    # --- internals ---

    def _folders_now(self) -> tuple[list[FolderScan] | None, int | None]:
        """The folders as a stat pass would find them now, re-stat'ing only what the watch
        names; a full pass (which also sets the watches up) when it cannot vouch. With them,
        the generation of the watched folders (None when no watch vouches for them)."""
        with self._scan_lock:
            if not self._watching:
                return self._scan(None), None  # closed meanwhile
            watch, known = self._watch, self._folders
            if watch is not None and known is not None:
                changed = watch.changes()
                if changed is not None:
                    if changed:
                        self._folders = None  # until the partial pass is complete
                        self._generation += 1
                        for name in changed:
                            known.pop(name, None)
                        for folder in self._scan(changed, watch) or ():
                            known[folder.name] = folder
                        watch.gone(name for name in changed if name not in known)
                        self._folders = known
                    return list(known.values()), self._generation
            self._folders = None
            self._generation += 1
            if watch is None:
                if not self._listed:
                    # Watches cost more than the stats they save in a store that lists once (a
                    # command): they are set up by the second listing.
                    self._listed = True
                    return self._scan(None), None
                watch = self._watch = self.fs.watch(SESSIONS)
                if watch is None and self.fs.root_exists() and self.fs.kind(SESSIONS) == "dir":
                    self._watching = False  # no change notification here: stat passes from now on
            if watch is None or not watch.reset():
                return self._scan(None), None
            folders = self._scan(None, watch)
            if folders is None or not watch.vouches:
                return folders, None
            self._folders = {folder.name: folder for folder in folders}
            return folders, self._generation

    def _scan(self, only: Collection[str] | None, watch: Watch | None = None) -> list[FolderScan] | None:
        try:
            return self.fs.scan(SESSIONS, _LOG_FILES, only, watch)
        except FileNotFoundError:
            if self.fs.root_exists():
                return None
            raise PersistenceFailed("the store root does not exist") from None
        except OSError as exc:
            if exc.errno == errno.ENOTDIR and not self.fs.root_exists():
                raise PersistenceFailed("the store root is not a folder") from exc
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafePath("sessions/ is not a folder (a planted link?): refusing the root") from exc
            raise PersistenceFailed(f"listing sessions/ failed: {exc.strerror or exc}") from exc

    def _load(self) -> dict[SessionId, IndexRow]:
        if self._rows is None:
            loaded = self.index.load() if self.index is not None else None
            self._rows = loaded if loaded is not None else {}
        return self._rows

    def _commit(
        self,
        rows: dict[SessionId, IndexRow],
        changed: list[IndexRow],
        gone: list[SessionId],
        whole: Sequence[IndexRow] = (),
        proved: Sequence[ObservedCheckpoint] = (),
    ) -> None:
        forget: list[SessionId] = []
        for row in changed:
            old = rows.get(row.id)
            if old is not None and (old.revision.inode != row.revision.inode or old.info.header != row.info.header):
                forget.append(row.id)  # another lifecycle: its checkpoints are not ours
            rows[row.id] = row
        for sid in gone:
            rows.pop(sid, None)
        if self.index is None:
            return
        for sid in gone:
            self._suspect.pop(sid, None)  # its checkpoint rows go with its row
        if changed or gone:
            self._save(rows, changed, gone, forget, whole, proved)

    def _save(
        self,
        rows: dict[SessionId, IndexRow],
        changed: list[IndexRow],
        gone: list[SessionId],
        forget: list[SessionId],
        whole: Sequence[IndexRow],
        proved: Sequence[ObservedCheckpoint] = (),
    ) -> bool:
        """One index write (under the lock): the rows, with those writers kept in memory, the
        checkpoint rows to forget, and those whole rescans proved (`proved`, each at the end
        offset of its new row); what could not be forgotten becomes `suspect`."""
        assert self.index is not None
        suspect = self._suspect
        # Rows writers kept in memory go with any write the index gets anyway (and at close).
        kept = [row for sid, row in self._unsaved.items() if rows.get(sid) is row]
        self._unsaved.clear()
        # Forgetting that failed before is retried (with the row it failed with): against the
        # stored row while the rescan's row still stands, else (changed again) unconditionally.
        retried = [row for sid, row in suspect.items() if rows.get(sid) is row]
        forget = [*forget, *(sid for sid, row in suspect.items() if rows.get(sid) is not row)]
        rescanned = [*whole, *retried]
        # Rows a rescan proved start over from where its scan stopped (its row's `scan_end`).
        ends = {row.id: row.scan_end for row in changed}
        observed = [(one, ends[one.session_id]) for one in proved if one.session_id in ends]
        if self.index.save([*kept, *retried, *changed], gone, forget, rescanned, observed):
            suspect.clear()
            return True
        for row in rescanned:
            suspect[row.id] = row
        for sid in forget:
            row = rows.get(sid)
            if row is not None:
                suspect[sid] = row
        return False

    def _info(
        self,
        sid: SessionId,
        folder: FolderScan,
        rows: dict[SessionId, IndexRow],
        changed: list[IndexRow],
        whole: list[IndexRow],
        proved: list[ObservedCheckpoint],
        *,
        heads: bool = False,
    ) -> LogInfo | None:
        """`heads`: a log without a row may be answered from its line 1 (`_head_only`)."""
        files = folder.files
        if not files:
            return None  # unpublished: invisible
        path = f"{SESSIONS}/{folder.name}"
        if len(files) > 1:
            return damaged_info(sid, self._plain_header(sid, path), "corrupt", _NO_REVISION, 0)
        file_name, revision = next(iter(files.items()))
        if revision is None:
            return damaged_info(sid, None, "corrupt", _NO_REVISION, 0)  # a planted link or FIFO
        form = _FORM_BY_FILE[file_name]
        row = rows.get(sid)
        if row is not None and row.form == form.compression and row.revision == revision:
            return row.info
        try:
            if (
                heads
                and row is None
                and self._focus is not None
                and (head := self._head_only(sid, path, form, revision))
            ):
                return head
            new, rescanned, observed = self._rescan(sid, f"{path}/{file_name}", form, row)
        except OSError as exc:
            if isinstance(exc, NotRegularFile) or exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
                return damaged_info(sid, None, "corrupt", _NO_REVISION, 0)
            log.warning("session %r: skipped by the listing: %s", sid, exc)
            return None
        changed.append(new)
        if rescanned:
            whole.append(new)
        if observed is not None:
            proved.append(observed)
        return new.info

    def _head_only(self, sid: SessionId, folder: str, form: LogForm, revision: Revision) -> LogInfo | None:
        """The answer for a log without a row from its line 1 alone (`LogInfo.checked` False),
        when that line is a valid header naming a parent other than the focus and the log is
        not the focus's own; else None (the log is scanned whole). Kept in memory only: a
        `stat`, a writer or a listing of another catalog reads such a log whole."""
        if sid == self._focus:
            return None
        head = self._line_one(sid, folder, form, revision)
        if head is None or head.header is None or head.header.parent_session == self._focus:
            return None
        return head

    def _place_subtree(
        self,
        deferred: list[tuple[int, SessionId, FolderScan]],
        slots: list[LogInfo | None],
        rows: dict[SessionId, IndexRow],
        changed: list[IndexRow],
        whole: list[IndexRow],
        proved: list[ObservedCheckpoint],
    ) -> bool:
        """A subtree focus's logs without a row: each is placed by its line 1 first; those the
        focus's tree reaches through the parents line 1 names (and every log whose line 1 does
        not place it) are then read whole, the rest answered from line 1 (`checked` False).
        Fills `slots`; False when an answer is not one to keep (line 1 only, or skipped)."""
        complete = True
        heads: dict[SessionId, LogInfo] = {}
        for at, sid, folder in deferred:
            head = None
            if sid != self._focus and len(folder.files) == 1:
                ((file_name, revision),) = folder.files.items()
                if revision is not None:
                    form = _FORM_BY_FILE[file_name]
                    try:
                        head = self._line_one(sid, f"{SESSIONS}/{folder.name}", form, revision)
                    except OSError:
                        head = None  # the whole read below meets it again and answers for it
            if head is not None:
                heads[sid] = head
                continue
            slots[at] = info = self._info(sid, folder, rows, changed, whole, proved)
            complete = complete and info is not None
        below: dict[str, list[str]] = {}  # parent id -> the ids whose line 1 (or claim) names it
        for info in [*(i for i in slots if i is not None), *heads.values()]:
            parent = info.header.parent_session if info.header is not None else None
            if parent is None and info.claimed is not None:
                parent = info.claimed.parent_session  # a damaged log's claim: read its children too
            if parent is not None:
                below.setdefault(parent, []).append(info.id)
        assert self._focus is not None
        tree, todo = {self._focus}, [self._focus]
        while todo:
            for child in below.get(todo.pop(), ()):
                if child not in tree:
                    tree.add(child)
                    todo.append(child)
        for at, sid, folder in deferred:
            head = heads.get(sid)
            if head is None:
                continue
            if sid in tree:
                slots[at] = info = self._info(sid, folder, rows, changed, whole, proved)
                complete = complete and info is not None
            else:
                slots[at] = head
                complete = False  # line-1-only answers are never kept
        return complete

    def _line_one(self, sid: SessionId, folder: str, form: LogForm, revision: Revision) -> LogInfo | None:
        """`scan_line_one`, kept in memory for this revision (never an index row)."""
        known = self._heads.get(sid)
        if known is not None and known.revision == revision:
            return known
        file = self.fs.open(f"{folder}/{form.file_name}", "read")
        try:
            info = scan_line_one(file, sid, form, revision)
        finally:
            file.close()
        if info is not None:
            self._heads[sid] = info
        return info

    def _plain_header(self, sid: SessionId, path: str) -> HeaderRecord | HeaderError | None:
        try:
            file = self.fs.open(f"{path}/{FORMS['none'].file_name}", "read")
            try:
                head = file.pread(0, 1 << 16)
            finally:
                file.close()
        except OSError:
            return None
        return FORMS["none"].header_of(sid, head)

    def _rescan(
        self, sid: SessionId, path: str, form: LogForm, row: IndexRow | None
    ) -> tuple[IndexRow, bool, ObservedCheckpoint | None]:
        """The log's new row, whether it was scanned whole (else only what it grew by), and the
        checkpoint rows a whole scan proved (with the catalog's `projections`)."""
        file = self.fs.open(path, "read")
        try:
            revision = file.revision()
            if row is not None and may_have_grown(row, form, revision) and still_holds(file, row):
                tail = file.pread(row.scan_end, revision.size - row.scan_end)
                grown = scan_growth(sid, form, row, revision, tail)
                if grown is not None:
                    return grown, False, None
            data = file.pread(0, revision.size)
        finally:
            file.close()
        new, observed = scan_whole(sid, form, revision, data, self._projections)
        return new, True, observed
