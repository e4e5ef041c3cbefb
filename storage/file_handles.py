"""What a file store handle holds (`WriteHandle.impl`, `ReadHandle.impl`), and the file store's
one mapping of foreign errors (`OSError`) into the storage tree (file_store, file_append).
"""

from __future__ import annotations

import errno
from collections.abc import Generator
from contextlib import contextmanager

import attrs

from ._records import HeaderRecord
from .errors import PersistenceFailed, SessionNotFound, StorageError, UnsafePath
from .forms import LogForm
from .fs import File, NotRegularFile
from .index_rows import IndexRow
from .log_store import WriteHandle
from .scans import ANCHOR
from .values import LogInfo, SessionId

__all__ = ["ReadState", "WriteState", "mapped", "persistence_error", "write_all", "written_row"]


@attrs.define(eq=False)
class WriteState:
    """A write handle's files: its lock, and its log once published (`end`: where it ends)."""

    lock: File
    form: LogForm
    file: File | None = None
    end: int = 0  # bytes of the log this handle has written or validated
    head_len: int = 0  # bytes of the stored header record
    last_time: int = 0  # the `time` of the log's last event (listing rows carry it: `LogInfo`)


@attrs.frozen
class ReadState:
    """A read handle's log: its path (each read opens it afresh) and form."""

    path: str
    form: LogForm
    known: tuple[bytes, HeaderRecord] | None = None  # line 1 as open_read parsed it


def write_all(file: File, data: bytes) -> None:
    """Write all of `data` at the file's position (a short write is continued)."""
    view = memoryview(data)
    while view:
        n = file.write(view)
        view = view[n:]


def persistence_error(sid: str, op: str, exc: OSError) -> StorageError:
    """`UnsafePath` for a link or non-regular file met on the way, else `PersistenceFailed`."""
    if isinstance(exc, NotRegularFile) or exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return UnsafePath(f"session {sid!r}: {op}: refusing a symlink or non-regular file ({exc.filename})")
    return PersistenceFailed(f"session {sid!r}: {op} failed: {exc.strerror or exc}")


@contextmanager
def mapped(sid: SessionId, op: str) -> Generator[None]:
    """Map the foreign errors of one operation into the storage tree."""
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError:
        raise SessionNotFound(sid) from None
    except OSError as exc:
        raise persistence_error(sid, op, exc) from exc


def written_row(handle: WriteHandle) -> IndexRow | None:
    """The index row of the log exactly as this handle wrote it (None when it cannot tell:
    bytes past its end, or the file cannot be read)."""
    state = handle.impl
    if not isinstance(state, WriteState) or state.file is None or not state.head_len:
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
        handle.session_id, handle.header, handle.inherited_event_count, revision, handle.next_seq, state.last_time
    )
    return IndexRow(
        info=info,
        form=state.form.compression,
        scan_end=state.end,
        scan_events=handle.next_seq,
        head=head,
        anchor=anchor,
    )
