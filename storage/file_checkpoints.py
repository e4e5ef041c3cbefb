"""The projection checkpoints of the file store, in its index (docs/format.md, "The index").

A writer's checkpoint covers exactly its durable log and records the log's index row with it (the
writer knows its log whole); rows a reader proved are stored only while the log is still at the
revision observed; rows are read back only for the lifecycle asked for, and never for a session
whose rows may answer for a revision that is gone (`Catalog.suspect`). All fail-soft: the index
is a cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .catalog import Catalog
from .file_handles import written_row
from .index_rows import StoredCheckpoint
from .log_store import ObservedCheckpoint, WriteHandle
from .projection import CheckpointRow, Lifecycle
from .values import SessionHeader

__all__ = ["FileCheckpoints"]


class FileCheckpoints:
    """The `CheckpointRows` of a file store and its writers' checkpoints, over its `catalog`
    (whose index may be None: then nothing is stored or found)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def write_checkpoint(self, handle: WriteHandle, rows: Mapping[str, CheckpointRow]) -> bool:
        """Store the rows that cover exactly the durable log (seq = the last durable seq), at
        its end offset, under the session's lifecycle identity. Fail-soft: False when not."""
        if self.catalog.index is None or not handle.published or handle.dead is not None:
            return False
        self._record_row(handle)
        last = handle.next_seq - 1
        current = {key: row for key, row in rows.items() if row.seq == last}
        if not current:
            return True  # nothing to checkpoint (no units, or none healthy): not a failure
        lifecycle = Lifecycle.of(handle.header, handle.inherited_event_count)
        return self.catalog.index.save_checkpoint(handle.session_id, lifecycle, current, handle.end_offset)

    def write_observed_checkpoints(self, observed: Sequence[ObservedCheckpoint]) -> int:
        """Store rows a reader proved by folding whole logs (docs/format.md, "The index"), in
        one index transaction: each at the end offset of its log's index row, only while that
        row, in memory and as stored, is still at the revision and event count observed (a log
        edited and rescanned since by another process is not). Fail-soft, quiet (a read-only
        folder is no error): how many sessions were written."""
        return self.catalog.save_observed(observed)

    def _record_row(self, handle: WriteHandle) -> None:
        """The writer knows its log whole (every event it appended was valid): record the index
        row, so the next open or listing need not scan the log. Fail-soft."""
        row = written_row(handle)
        if row is not None:
            self.catalog.record(row)

    def read_checkpoint(
        self, session_id: str, header: SessionHeader, inherited_event_count: int
    ) -> tuple[dict[str, CheckpointRow], int] | None:
        """The stored rows of this lifecycle of the session and their log offset, if any."""
        index = self.catalog.index
        if index is None:
            return None
        loaded = index.load_checkpoints([session_id])
        if not loaded or self.catalog.suspect([session_id]):
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
        self,
        session_ids: Sequence[str],
        keys: Sequence[str] | None = None,
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]] | None:
        """Every stored checkpoint row of these sessions (of the unit `keys` only, if given; see
        `SessionIndex.load_checkpoints` for `skip` and `keep`), in one query (None on a cache miss); the
        caller checks versions and lifecycles. None stored for a session whose rows may answer
        for a revision that is gone (`Catalog.suspect`)."""
        index = self.catalog.index
        if index is None:
            return None
        found = index.load_checkpoints(list(session_ids), keys, skip, keep)
        if found:
            for sid in self.catalog.suspect(found):
                found[sid] = []
        return found
