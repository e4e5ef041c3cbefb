"""The append path of the file store (file_store): publication of a new log, durable appends,
and the fsyncs of the folders that make a log's entries durable.

Theory of operation. The first `append` publishes: header and batches go to `publish.tmp`, which
is fsynced, hard-linked to the log name (which fails if a log exists, so publication never
overwrites), then the folder, `sessions/` and, once per store, the root are fsynced. Later
appends write at the end and fsync once per call; a failed write is truncated back (durably), a
failed fsync kills the handle (the kernel may have dropped the dirty pages).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ._records import HeaderRecord, encode_header_line
from .append_check import check_append
from .catalog import SESSIONS, Catalog
from .errors import SessionAlreadyExists
from .file_handles import WriteState, mapped, persistence_error, write_all, written_row
from .fs import File, Fs
from .log_store import Batch, WriteHandle
from .values import Offset

__all__ = ["PUBLISH_TEMP", "FileAppender"]

log = logging.getLogger(__name__)

PUBLISH_TEMP = "publish.tmp"


class FileAppender:
    """Appends of one file store: over its `fs`, keeping its `catalog`'s rows in step;
    `folder(session_id)` is the session's folder."""

    def __init__(self, fs: Fs, catalog: Catalog, folder: Callable[[str], str]) -> None:
        self.fs = fs
        self.catalog = catalog
        self.folder = folder
        self._root_durable = False

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        """`LogStore.append` on files: publish, or write at the end and fsync once."""
        checked = check_append(handle, batches)
        if checked is None:
            return handle.next_seq
        events, payload = checked
        state = handle.impl
        assert isinstance(state, WriteState)
        if handle.published:
            self._append_durably(handle, state, payload)
        else:
            self._publish(handle, state, payload)
        handle.next_seq = Offset(handle.next_seq + len(events))
        if events:
            state.last_time = events[-1].time
        if self.catalog.remembers(handle.session_id):
            # The listing's row follows the log this handle writes (in memory: the index is
            # saved at checkpoints), so the next listing finds it at its new revision and
            # neither opens nor scans it; any other change to the file shows as another revision.
            row = written_row(handle)
            if row is not None:
                self.catalog.remember(row)
        return handle.next_seq

    def _append_durably(self, handle: WriteHandle, state: WriteState, payload: bytes) -> None:
        sid = handle.session_id
        file = state.file
        assert file is not None
        data = state.form.append_bytes(payload)
        try:
            write_all(file, data)
        except OSError as exc:
            self._roll_back(handle, state, exc)
            raise persistence_error(sid, "append", exc) from exc
        self._fsync(handle, file, "fsync")
        state.end += len(data)
        handle.end_offset = state.end

    def _roll_back(self, handle: WriteHandle, state: WriteState, exc: OSError) -> None:
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
            raise persistence_error(handle.session_id, what, exc) from exc

    def _publish(self, handle: WriteHandle, state: WriteState, payload: bytes) -> None:
        sid = handle.session_id
        folder = self.folder(sid)
        temp = f"{folder}/{PUBLISH_TEMP}"
        head = state.form.head_bytes(
            encode_header_line(HeaderRecord(header=handle.header, inherited_event_count=handle.inherited_event_count))
        )
        data = head + state.form.append_bytes(payload)
        state.head_len = len(head)
        with mapped(sid, "publish"):
            if self.fs.kind(temp) is not None:
                self.fs.unlink(temp)  # a leftover of a crashed publication: never published
            file = self.fs.open(temp, "create")
        try:
            try:
                write_all(file, data)
            except OSError as exc:
                raise persistence_error(sid, "publish", exc) from exc
            self._fsync(handle, file, "fsync of the new log")
            try:
                self.fs.link(temp, f"{folder}/{state.form.file_name}")
            except FileExistsError:
                raise SessionAlreadyExists(sid) from None
            except OSError as exc:
                raise persistence_error(sid, "publish", exc) from exc
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
            self.fsync_entries(folder)
        except OSError as exc:
            handle.dead = f"fsync of the session's folders failed: {exc.strerror}"
            raise persistence_error(sid, "publish", exc) from exc
        state.end = len(data)
        handle.end_offset = state.end
        handle.published = True

    def fsync_entries(self, folder: str) -> None:
        """Make the session's folder, its entry in `sessions/` and `sessions/` itself durable."""
        self.fs.fsync_dir(folder)
        self.fs.fsync_dir(SESSIONS)
        if not self._root_durable:
            self.fs.fsync_dir("")
            self._root_durable = True
