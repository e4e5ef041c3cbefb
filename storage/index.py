"""`index.sqlite3`: the derived index of session headers (and projection checkpoints).

Theory of operation. The durable state is `sessions/`; this file is a cache that any command
may create, refresh or rebuild inside an existing root, and deleting it loses nothing. A row
records what a full or incremental scan of one log found, keyed by the log's revision (size,
mtime_ns, inode), plus where the scan stopped (`scan_end`, `scan_events`) so a log that only
grew can be scanned from there. `user_version` names the schema; a mismatch, or a file that is
not a database, drops and rebuilds it. Every `sqlite3.Error` is a cache miss: reads return
`None`, writes are logged and dropped. All access is serialized by one lock (actors reach the
index through one worker thread anyway).

The checkpoint table holds projection checkpoints `{session, unit key} → {ver, seq, val,
log_offset, lifecycle}`; its rows arrive with the projections (SPEC 3.5).
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import stat as stat_mod
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from typing import Any

import attrs
import msgspec

from .projection import CheckpointRow, Lifecycle
from .values import HeaderClaim, LogInfo, Offset, Revision, SessionHeader, SessionId

__all__ = ["INDEX_NAME", "SCHEMA_VERSION", "UNREADABLE", "IndexRow", "SessionIndex", "StoredCheckpoint"]

log = logging.getLogger(__name__)

_json = msgspec.json
INDEX_NAME = "index.sqlite3"
SCHEMA_VERSION = 3  # 3: the `claim` of a damaged header (SPEC 5.4 step 3)
# Ids per query: SQLite >= 3.32 takes 32,766 bound parameters (older ones 999).
_IN_LIMIT = 30_000 if sqlite3.sqlite_version_info >= (3, 32) else 900
_LIFECYCLES = 1 << 16  # decoded lifecycle records kept at most (then forgotten at once)
_DAMAGED = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB: rebuild; anything else is a cache miss
_UNREADABLE: Any = object()  # a stored checkpoint value that does not decode
UNREADABLE = _UNREADABLE

_SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    form TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    has_header INTEGER NOT NULL,
    format INTEGER,
    created_at INTEGER,
    is_seeded INTEGER,
    delegation_depth INTEGER,
    cwd TEXT,
    parent_session TEXT,
    origin TEXT,
    agent_preset TEXT,
    damage TEXT,
    inherited_event_count INTEGER NOT NULL,
    event_count INTEGER NOT NULL,
    scan_end INTEGER NOT NULL,
    scan_events INTEGER NOT NULL,
    head BLOB NOT NULL,
    anchor BLOB NOT NULL,
    claim TEXT
);
CREATE TABLE checkpoints (
    session_id TEXT NOT NULL,
    unit_key TEXT NOT NULL,
    ver INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    val BLOB NOT NULL,
    log_offset INTEGER NOT NULL,
    lifecycle BLOB NOT NULL,
    PRIMARY KEY (session_id, unit_key)
);
"""

_COLUMNS = (
    "id, form, size, mtime_ns, inode, has_header, format, created_at, is_seeded, delegation_depth, "
    "cwd, parent_session, origin, agent_preset, damage, inherited_event_count, event_count, "
    "scan_end, scan_events, head, anchor, claim"
)


@attrs.frozen(kw_only=True)
class StoredCheckpoint:
    """One stored checkpoint row. Its value stays JSON until `row` or `value()` is read: a
    listing decodes only the rows of the unit it needs."""

    key: str
    ver: int
    seq: int
    val_json: bytes | str = attrs.field(repr=False)  # the value, still JSON
    log_offset: int  # a record boundary just after `seq`
    lifecycle: Lifecycle

    @functools.cached_property
    def row(self) -> CheckpointRow:
        val = self.value()
        if val is _UNREADABLE:
            # Not a value this build wrote: a version no unit has (every state_version is
            # >= 0), so every reader ignores the row, as if it were not there.
            return CheckpointRow(ver=-1, seq=self.seq, val=None)
        return CheckpointRow(ver=self.ver, seq=self.seq, val=val)

    def value(self) -> Any:
        """The decoded value (a fresh one on every call), or `UNREADABLE`."""
        try:
            return _json.decode(self.val_json)
        except msgspec.DecodeError:
            return _UNREADABLE


@attrs.frozen(kw_only=True)
class IndexRow:
    """What a scan of one log at one revision found."""

    info: LogInfo
    form: str
    scan_end: int  # bytes of complete records (plain) or frames (zstd) the scan covered
    scan_events: int  # events in those bytes (a torn frame's recovered lines excluded)
    # What a log that only grew must still hold: its first bytes and the bytes just before
    # `scan_end`. A file rewritten in place (same inode, larger) fails this and is rescanned.
    head: bytes = b""
    anchor: bytes = b""

    @property
    def id(self) -> SessionId:
        return self.info.id

    @property
    def revision(self) -> Revision:
        return self.info.revision


def _trusted_header(row: tuple[Any, ...]) -> SessionHeader:
    """A header the index wrote from a validated one: rebuilt without re-running validators
    (a listing of a thousand sessions must not pay for a thousand validations)."""
    header = object.__new__(SessionHeader)
    for name, value in (
        ("id", row[0]),
        ("format", row[6]),
        ("created_at", row[7]),
        ("is_seeded", bool(row[8])),
        ("delegation_depth", row[9]),
        ("cwd", row[10]),
        ("parent_session", row[11]),
        ("origin", row[12]),
        ("agent_preset", row[13]),
    ):
        object.__setattr__(header, name, value)
    return header


def _row_from_sql(row: tuple[Any, ...]) -> IndexRow:
    """A row as SQLite returns it (untyped columns; a row this build did not write raises
    TypeError/ValueError and is rescanned)."""
    damage = row[14]
    if damage not in (None, "corrupt", "unsupported"):
        raise ValueError(f"unknown damage {damage!r}")
    info = LogInfo(
        id=SessionId(str(row[0])),
        header=_trusted_header(row) if row[5] else None,
        damage=damage,
        inherited_event_count=Offset(int(row[15])),
        revision=Revision(size=int(row[2]), mtime_ns=int(row[3]), inode=int(row[4])),
        event_count=Offset(int(row[16])),
        claimed=_claim_from_sql(row[21]),
    )
    return IndexRow(
        info=info,
        form=str(row[1]),
        scan_end=int(row[17]),
        scan_events=int(row[18]),
        head=bytes(row[19]),
        anchor=bytes(row[20]),
    )


def _row_to_sql(row: IndexRow) -> tuple[object, ...]:
    info = row.info
    h = info.header
    rev = info.revision
    return (
        info.id,
        row.form,
        rev.size,
        rev.mtime_ns,
        rev.inode,
        1 if h is not None else 0,
        h.format if h else None,
        h.created_at if h else None,
        int(h.is_seeded) if h else None,
        h.delegation_depth if h else None,
        h.cwd if h else None,
        h.parent_session if h else None,
        h.origin if h else None,
        h.agent_preset if h else None,
        info.damage,
        info.inherited_event_count,
        info.event_count,
        row.scan_end,
        row.scan_events,
        row.head,
        row.anchor,
        None if info.claimed is None else _json.encode(list(info.claimed)).decode(),
    )


def _claim_from_sql(value: object) -> HeaderClaim | None:
    """A stored claim (JSON `[origin, parent_session, created_at]`); another shape raises
    ValueError, so the row is rescanned."""
    if value is None:
        return None
    try:
        origin, parent, created = _json.decode(str(value))
    except (msgspec.DecodeError, TypeError, ValueError):
        raise ValueError("unreadable claim") from None
    if not (origin is None or type(origin) is str) or not (parent is None or type(parent) is str):
        raise ValueError("unreadable claim")
    if not (created is None or type(created) is int):
        raise ValueError("unreadable claim")
    return HeaderClaim(origin=origin, parent_session=parent, created_at=created)


class SessionIndex:
    """One root's index; `path=None` keeps it in memory (for stores over an in-memory Fs)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._lifecycles: dict[bytes, Lifecycle] = {}  # decoded lifecycle records (bounded)

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        if self.path is not None:
            _refuse_link(self.path)
        conn = _open(self.path)
        try:
            self._prepare(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if self.path is None or getattr(exc, "sqlite_errorcode", None) not in _DAMAGED:
                raise  # busy, locked, I/O: a cache miss now, another try next time
            # Not a database, or a damaged one: it is a cache, so start over.
            log.warning("index %s is unusable (%s); rebuilding it", self.path, exc)
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(self.path + suffix)
                except FileNotFoundError:
                    pass
            conn = _open(self.path)
            try:
                self._prepare(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        return conn

    @staticmethod
    def _prepare(conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have just rebuilt it.
            if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type='table'"
                ).fetchall():
                    conn.execute(f'DROP TABLE "{name}"')
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            _roll_back(conn)
            raise

    def load(self) -> dict[SessionId, IndexRow] | None:
        """Every row, or `None` when the index cannot be read (a cache miss)."""
        with self._lock:
            try:
                rows = self._connect().execute(f"SELECT {_COLUMNS} FROM sessions").fetchall()
            except (sqlite3.Error, OSError) as exc:
                log.warning("index %s: read failed (%s); listing from the logs", self.path, exc)
                self._reset()
                return None
        out = {}
        for row in rows:
            try:
                parsed = _row_from_sql(row)
            except (TypeError, ValueError):
                continue  # a row this build did not write: it is rescanned
            out[parsed.id] = parsed
        return out

    def save(
        self,
        changed: Iterable[IndexRow],
        deleted: Iterable[SessionId],
        forget_checkpoints: Iterable[SessionId] = (),
    ) -> None:
        """Write changed rows, delete rows of vanished logs; failures only logged."""
        changed = list(changed)
        deleted = list(deleted)
        forget = set(forget_checkpoints) | set(deleted)
        if not changed and not deleted and not forget:
            return
        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                f"INSERT OR REPLACE INTO sessions ({_COLUMNS}) VALUES ({', '.join('?' * 22)})",
                [_row_to_sql(row) for row in changed],
            )
            conn.executemany("DELETE FROM sessions WHERE id = ?", [(sid,) for sid in deleted])
            conn.executemany("DELETE FROM checkpoints WHERE session_id = ?", [(sid,) for sid in forget])

        self._write("rows", write)

    def _write(self, what: str, body: Callable[[sqlite3.Connection], None]) -> bool:
        """Run `body` in one write transaction; a failure is logged and leaves a cache miss."""
        with self._lock:
            try:
                conn = self._connect()
                conn.execute("BEGIN IMMEDIATE")
                try:
                    body(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    _roll_back(conn)
                    raise
            except (sqlite3.Error, OSError, OverflowError, ValueError, TypeError) as exc:
                log.warning("index %s: %s write failed (%s); it stays a cache miss", self.path, what, exc)
                self._reset()
                return False
        return True

    def _reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def save_checkpoint(
        self,
        session_id: SessionId,
        lifecycle: Lifecycle,
        rows: Mapping[str, CheckpointRow],
        log_offset: int,
    ) -> bool:
        """Replace the session's checkpoint rows; False (and logged) when it could not."""
        if not rows:
            return True
        try:
            life = _json.encode(attrs.asdict(lifecycle))
            values = [
                (session_id, key, row.ver, row.seq, _json.encode(row.val), log_offset, life)
                for key, row in rows.items()
            ]
        except (TypeError, ValueError, OverflowError) as exc:
            log.warning("session %r: checkpoint not JSON (%s); not written", session_id, exc)
            return False
        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM checkpoints WHERE session_id = ?", (session_id,))
            conn.executemany(
                "INSERT INTO checkpoints (session_id, unit_key, ver, seq, val, log_offset, lifecycle) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                values,
            )

        return self._write("checkpoint", write)

    def load_checkpoints(
        self,
        session_ids: Sequence[str],
        keys: Sequence[str] | None = None,
        skip: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]] | None:
        """The checkpoint rows of the given sessions in one query; None on any error (a miss).
        `keys`: only the rows of these units. `skip`: unit key → bytes; a row of that unit whose
        stored JSON contains them is not returned (a caller's cheap pre-filter, e.g. for a
        unit's usual empty state, so a listing does not fetch a row per session for nothing)."""
        out: dict[str, list[StoredCheckpoint]] = {sid: [] for sid in session_ids}
        if not session_ids:
            return out
        where, params = "", []
        if keys is not None:
            where += f" AND unit_key IN ({', '.join('?' * len(keys))})"
            params += list(keys)
        for key, part in (skip or {}).items():
            where += " AND NOT (unit_key = ? AND instr(val, ?) > 0)"
            params += [key, bytes(part)]
        with self._lock:
            try:
                conn = self._connect()
                rows = []
                step = _IN_LIMIT - len(params)
                for start in range(0, len(session_ids), step):
                    chunk = list(session_ids[start : start + step])
                    rows += conn.execute(
                        "SELECT session_id, unit_key, ver, seq, val, log_offset, lifecycle FROM checkpoints "
                        f"WHERE session_id IN ({', '.join('?' * len(chunk))}){where}",
                        chunk + params,
                    ).fetchall()
            except (sqlite3.Error, OSError) as exc:
                log.warning("index %s: checkpoint read failed (%s)", self.path, exc)
                self._reset()
                return None
        lifecycles = self._lifecycles
        if len(lifecycles) > _LIFECYCLES:
            lifecycles.clear()
        decode = _json.decode
        for sid, key, ver, seq, val, offset, life in rows:
            try:
                # A session's rows share one lifecycle, and it does not change between
                # listings: each distinct record is decoded once (Lifecycle is a frozen value).
                lifecycle = lifecycles.get(life)
                if lifecycle is None:
                    lifecycle = lifecycles[life] = Lifecycle(**decode(life))
                stored = StoredCheckpoint(
                    key=key, ver=ver, seq=seq, val_json=val, log_offset=offset, lifecycle=lifecycle
                )
            except (TypeError, ValueError, msgspec.DecodeError):
                continue  # a row this build did not write: ignored
            out[sid].append(stored)
        return out

    def close(self) -> None:
        with self._lock:
            self._reset()


def _open(path: str | None) -> sqlite3.Connection:
    # A short busy timeout: the index is a cache, and a listing must not wait long for it.
    return sqlite3.connect(path or ":memory:", timeout=1.0, isolation_level=None, check_same_thread=False)


def _roll_back(conn: sqlite3.Connection) -> None:
    """Roll back without hiding the error that caused it (there may be no open transaction)."""
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _refuse_link(path: str) -> None:
    """The index is opened by sqlite, which follows links: a planted one is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat_mod.S_ISREG(st.st_mode):
        raise sqlite3.OperationalError(f"{path} is not a regular file")
