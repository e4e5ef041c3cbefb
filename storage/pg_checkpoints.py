"""Projection checkpoints in the PostgreSQL store (SPEC §3.5; table `checkpoints`, pg_schema).

The rows of one session replace each other whole, in one statement (one transaction, one round
trip) that also checks that the session's event count is still the one the writing handle knows:
a checkpoint may lag the log, never lead it. `log_offset` here is the event count the rows cover
(seq + 1), the place `read_after` continues from. Reads are single queries; any failure is a
cache miss (None or False, logged), never an error a caller sees.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Final

import attrs
import msgspec

from .errors import StorageError
from .index_rows import StoredCheckpoint, stored_lifecycle
from .log_store import ObservedCheckpoint, WriteHandle
from .pg_connect import Pool, first_line
from .projection import CheckpointRow, Lifecycle
from .values import SessionHeader

__all__ = ["PgCheckpoints"]

log = logging.getLogger(__name__)

_LIFECYCLES = 4096  # distinct lifecycle records kept decoded


# A session's rows replaced in one statement (one round trip, one transaction): written only
# while the session row, held FOR SHARE, still has the event count the writing handle knows; the
# units not written are deleted and the others upserted — disjoint rows, so the two parts of the
# statement never touch the same row.
_REPLACE: Final = (
    "WITH c AS (SELECT id FROM sessions WHERE id = %(id)s AND event_count = %(count)s FOR SHARE), "
    "d AS (DELETE FROM checkpoints WHERE session_id = (SELECT id FROM c) AND NOT (unit = ANY(%(units)s::text[]))) "
    "INSERT INTO checkpoints (session_id, unit, ver, lifecycle, seq, log_offset, value) "
    "SELECT c.id, r.unit, r.ver, %(life)s, %(seq)s, %(count)s, r.value "
    "FROM c, unnest(%(units)s::text[], %(vers)s::bigint[], %(values)s::bytea[]) AS r (unit, ver, value) "
    "ON CONFLICT (session_id, unit) DO UPDATE SET ver = excluded.ver, lifecycle = excluded.lifecycle, "
    "seq = excluded.seq, log_offset = excluded.log_offset, value = excluded.value"
)


class PgCheckpoints:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._lifecycles: dict[bytes, Lifecycle] = {}
        self._lock = threading.Lock()

    def write(self, handle: WriteHandle, rows: Mapping[str, CheckpointRow]) -> bool:
        """Store the rows that cover exactly the durable log (seq = the last durable seq),
        replacing the session's earlier ones. Fail-soft: False when not stored."""
        import psycopg

        if not handle.published or handle.dead is not None or handle.closed:
            return False
        last = handle.next_seq - 1
        current = {key: row for key, row in rows.items() if row.seq == last}
        if not current:
            return True
        sid = handle.session_id
        try:
            life = msgspec.json.encode(attrs.asdict(Lifecycle.of(handle.header, handle.inherited_event_count)))
            values = [
                (sid, key, row.ver, life, row.seq, handle.next_seq, msgspec.json.encode(row.val))
                for key, row in current.items()
            ]
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            log.warning("session %r: checkpoint not JSON (%s); not written", sid, exc)
            return False
        args = {
            "id": sid,
            "count": handle.next_seq,
            "seq": last,
            "life": life,
            "units": [v[1] for v in values],
            "vers": [v[2] for v in values],
            "values": [v[6] for v in values],
        }
        try:
            with self._pool.cursor() as cur:
                written = cur.execute(_REPLACE, args).rowcount
        except (psycopg.Error, StorageError) as exc:
            log.warning("session %r: checkpoint not written: %s", sid, first_line(exc))
            return False
        # None written: the session's count is not the one this handle knows (never lead the log).
        return written == len(values)

    def write_observed(self, observed: Sequence[ObservedCheckpoint]) -> int:
        """Store rows a reader proved by folding whole logs, in one transaction: each only
        while its session still has the event count and generation observed, and never over
        rows of the same lifecycle at that seq or later. Fail-soft and quiet (a role without
        write rights is no error): how many sessions were written."""
        import psycopg

        entries = [one for one in observed if one.rows and one.event_count > 0]
        if not entries:
            return 0
        written = 0
        try:
            with self._pool.connection() as conn, conn.transaction():
                for one in entries:
                    last = one.event_count - 1
                    found = conn.execute(
                        "SELECT event_count, generation FROM sessions WHERE id = %s FOR SHARE", (one.session_id,)
                    ).fetchone()
                    if found is None or (found[0], found[1]) != (one.event_count, one.revision.inode):
                        continue  # the log changed since it was read
                    stored = conn.execute(
                        "SELECT unit, ver, seq, lifecycle FROM checkpoints WHERE session_id = %s AND seq >= %s",
                        (one.session_id, last),
                    ).fetchall()
                    ours = [(key, ver, at) for key, ver, at, life in stored if self._is(bytes(life), one.lifecycle)]
                    plan = one.rows_to_write(ours)
                    if plan is None:
                        continue
                    rows, replace = plan
                    if replace:
                        conn.execute("DELETE FROM checkpoints WHERE session_id = %s", (one.session_id,))
                    life = msgspec.json.encode(attrs.asdict(one.lifecycle))
                    with conn.cursor() as cur:
                        cur.executemany(
                            "INSERT INTO checkpoints (session_id, unit, ver, lifecycle, seq, log_offset, value) "
                            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (session_id, unit) DO UPDATE SET "
                            "ver = excluded.ver, lifecycle = excluded.lifecycle, seq = excluded.seq, "
                            "log_offset = excluded.log_offset, value = excluded.value",
                            [(one.session_id, key, ver, life, last, one.event_count, val) for key, ver, val in rows],
                        )
                    written += 1
        except (psycopg.Error, StorageError) as exc:
            log.debug("observed checkpoints not written: %s", first_line(exc))
            return 0
        return written

    def _is(self, raw: bytes, lifecycle: Lifecycle) -> bool:
        try:
            return self._lifecycle(raw) == lifecycle
        except Exception:  # a garbled lifecycle record: not this lifecycle
            return False

    def read(
        self, session_id: str, header: SessionHeader, inherited_event_count: int
    ) -> tuple[dict[str, CheckpointRow], int] | None:
        loaded = self.rows([session_id])
        if not loaded:
            return None
        lifecycle = Lifecycle.of(header, inherited_event_count)
        stored = [s for s in loaded.get(session_id, []) if s.lifecycle == lifecycle]
        if not stored:
            return None
        offset, seq = stored[0].log_offset, stored[0].row.seq
        return {s.key: s.row for s in stored if s.log_offset == offset and s.row.seq == seq}, offset

    def rows(
        self,
        session_ids: Sequence[str],
        keys: Sequence[str] | None = None,
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]] | None:
        """Every stored checkpoint row of these sessions (of the units `keys` only, if given; a
        row of unit `k` whose JSON contains `skip[k]` left out, and one whose JSON does not contain
        `keep[k]`), in one query; None on a failure."""
        import psycopg

        out: dict[str, list[StoredCheckpoint]] = {sid: [] for sid in session_ids}
        if not session_ids:
            return out
        where, params = "", [list(session_ids)]
        if keys is not None:
            where += " AND unit = ANY(%s)"
            params.append(list(keys))
        for key, part in (skip or {}).items():
            where += " AND NOT (unit = %s AND position(%s::bytea IN value) > 0)"
            params += [key, bytes(part)]
        for key, part in (keep or {}).items():
            where += " AND (unit <> %s OR position(%s::bytea IN value) > 0)"
            params += [key, bytes(part)]
        try:
            with self._pool.connection() as conn:
                rows = conn.execute(
                    "SELECT session_id, unit, ver, seq, value, log_offset, lifecycle FROM checkpoints "
                    f"WHERE session_id = ANY(%s){where}",
                    params,
                ).fetchall()
        except (psycopg.Error, StorageError) as exc:
            log.warning("checkpoint read failed (a cache miss): %s", first_line(exc))
            return None
        for sid, key, ver, seq, value, offset, life in rows:
            try:
                lifecycle = self._lifecycle(bytes(life))
            except Exception:  # a garbled lifecycle record: the row is ignored
                continue
            if sid in out and seq >= 0 and offset >= 0:
                out[sid].append(
                    StoredCheckpoint(
                        key=key, ver=ver, seq=seq, val_json=bytes(value), log_offset=offset, lifecycle=lifecycle
                    )
                )
        return out

    def _lifecycle(self, raw: bytes) -> Lifecycle:
        with self._lock:
            found = self._lifecycles.get(raw)
            if found is None:
                if len(self._lifecycles) > _LIFECYCLES:
                    self._lifecycles.clear()
                found = self._lifecycles[raw] = stored_lifecycle(msgspec.json.decode(raw))
        return found
