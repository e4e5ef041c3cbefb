"""`index.sqlite3`: the derived index of session headers (and projection checkpoints).

Theory of operation. The durable state is `sessions/`; this file is a cache that any command
may create, refresh or rebuild inside an existing root, and deleting it loses nothing. A row
records what a full or incremental scan of one log found, keyed by the log's revision (size,
mtime_ns, inode), plus where the scan stopped (`scan_end`, `scan_events`) so a log that only
grew can be scanned from there. `user_version` names the schema; a mismatch, or a file that is
not a database or is damaged (`SQLITE_CORRUPT`, `SQLITE_NOTADB`, whenever it is found), drops and
rebuilds it. Any other failure — a `sqlite3.Error`, but also whatever a garbled file or row makes
Python raise (`UnicodeDecodeError`, `ValueError`, `TypeError`, msgspec errors, ...) — is a cache
miss: reads return `None` (or skip the row), writes are dropped. Every `Exception` counts (the
index is a cache and must never fail an operation); `BaseException`s (cancellation, interrupts)
pass through. One warning line per index at most: later failures log at debug level. Rows are
checked field by field when loaded, so a garbled value is a skipped row (a rescan), never a
wrongly typed header or count handed to a listing. All access is serialized by one lock (actors
reach the index through one worker thread anyway).

The checkpoint table holds projection checkpoints `{session, unit key} → {ver, seq, val,
log_offset, lifecycle}`; its rows arrive with the projections (docs/format.md, "The index"). The
tables and the rows as stored (checksummed, checked when read back) are index_rows.py.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat as stat_mod
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import msgspec

from .index_rows import (
    CHECKPOINT_COLUMNS,
    COLUMNS,
    ROW_WIDTH,
    SCHEMA_SQL,
    SCHEMA_VERSION,
    UNREADABLE,
    IndexRow,
    StoredCheckpoint,
    row_crc,
    row_from_sql,
    row_to_sql,
    same_lifecycle,
    stored_lifecycle,
)
from .projection import CheckpointRow, Lifecycle, ObservedCheckpoint
from .values import SessionId

__all__ = ["INDEX_NAME", "SCHEMA_VERSION", "UNREADABLE", "IndexRow", "SessionIndex", "StoredCheckpoint"]

log = logging.getLogger(__name__)

_json = msgspec.json
INDEX_NAME = "index.sqlite3"
# Ids per query: SQLite >= 3.32 takes 32,766 bound parameters (older ones 999).
_IN_LIMIT = 30_000 if sqlite3.sqlite_version_info >= (3, 32) else 900
_LIFECYCLES = 1 << 16  # decoded lifecycle records kept at most (then forgotten at once)
# Failures that say nothing about the file's contents (PERM, BUSY, LOCKED, NOMEM, READONLY,
# INTERRUPT, IOERR, FULL, CANTOPEN, PROTOCOL): a miss now, another try next time. Any other
# failure of the database (CORRUPT, NOTADB, a text that does not decode, ...) is a damaged file.
_TRANSIENT = {3, 5, 6, 7, 8, 9, 10, 13, 14, 15}


class SessionIndex:
    """One root's index; `path=None` keeps it in memory (for stores over an in-memory Fs)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._lifecycles: dict[bytes, Lifecycle] = {}  # decoded lifecycle records (bounded)
        self.warned = False  # one warning line per index; later failures log at debug level

    def _warn(self, message: str, *args: object) -> None:
        if self.warned:
            log.debug(message, *args)
        else:
            self.warned = True
            log.warning(message, *args)

    def _miss(self, what: str, exc: Exception, *, quiet: bool = False) -> None:
        """A failure of the index: a cache miss. Damage found now (not only when connecting)
        drops the file, so that the next use rebuilds it instead of missing forever. `quiet`:
        an optional refresh failed (e.g. a folder this process may not write): debug level."""
        self._reset()
        if self.path is not None and _damaged(exc):
            self._warn("index %s is damaged (%s: %s); rebuilding it", self.path, what, exc)
            try:
                self._drop_files()
            except OSError:
                pass  # still a miss; the next connection tries again
        elif quiet:
            log.debug("index %s: %s failed (%s: %s); not refreshed", self.path, what, type(exc).__name__, exc)
        else:
            self._warn("index %s: %s failed (%s: %s); working without it", self.path, what, type(exc).__name__, exc)

    def _drop_files(self) -> None:
        assert self.path is not None
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(self.path + suffix)
            except FileNotFoundError:
                pass  # already gone (the -wal/-shm files exist only while SQLite needs them)

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        if self.path is not None:
            _refuse_link(self.path)
        conn = _open(self.path)
        try:
            self._prepare(conn)
        except BaseException as exc:  # the connection is closed on any exit; only damage is handled, the rest re-raised
            conn.close()
            if self.path is None or not isinstance(exc, Exception) or not _damaged(exc):
                raise  # busy, locked, I/O: a cache miss now, another try next time
            # Not a database, or a damaged one: it is a cache, so start over.
            self._warn("index %s is unusable (%s); rebuilding it", self.path, exc)
            self._drop_files()
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
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
                    conn.execute(f'DROP TABLE "{name}"')
                for statement in SCHEMA_SQL.split(";"):
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
                rows = self._connect().execute(f"SELECT {COLUMNS} FROM sessions").fetchall()
            except Exception as exc:  # a cache: any failure is a miss (see the module docstring)
                self._miss("read", exc)
                return None
        out: dict[SessionId, IndexRow] = {}
        for row in rows:
            try:
                parsed = row_from_sql(row)
            except Exception:  # a garbled row, or one this build did not write: it is rescanned
                continue
            out[parsed.id] = parsed
        return out

    def save(
        self,
        changed: Iterable[IndexRow],
        deleted: Iterable[SessionId],
        forget_checkpoints: Iterable[SessionId] = (),
        rescanned: Iterable[IndexRow] = (),
        observed: Sequence[tuple[ObservedCheckpoint, int]] = (),
    ) -> bool:
        """Write changed rows, delete rows of vanished logs and the checkpoint rows of
        `forget_checkpoints`; False (only logged) when not written. `rescanned`: rows a scan
        of the whole log made (its revision is not a pure append of a row the scan knew):
        their sessions' checkpoint rows go too, unless the stored row is already at that very
        revision (then whoever stored it answered for them). Decided here, against the stored
        row in the same transaction, not against a process's copy of it: a process that loaded
        the index before the log had a row cannot tell an edit from a new log. `observed`:
        checkpoint rows the scans proved (with the log offset they start over from), written
        last in the same transaction as `save_observed` writes them (so the rows a rescan
        forgets never outlive it, and those it proved never go without their log's row)."""
        changed = list(changed)
        deleted = list(deleted)
        rescanned = list(rescanned)
        forget = set(forget_checkpoints) | set(deleted)
        if not changed and not deleted and not forget and not rescanned and not observed:
            return True

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(  # before the rows are replaced: compared with the stored ones
                "DELETE FROM checkpoints WHERE session_id = ? AND NOT EXISTS (SELECT 1 FROM sessions "
                "WHERE id = ? AND form = ? AND size = ? AND mtime_ns = ? AND inode = ?)",
                [(row.id, row.id, row.form, *row.revision) for row in rescanned],
            )
            conn.executemany(
                f"INSERT OR REPLACE INTO sessions ({COLUMNS}) VALUES ({', '.join('?' * ROW_WIDTH)})",
                [row_to_sql(row) for row in changed],
            )
            conn.executemany("DELETE FROM sessions WHERE id = ?", [(sid,) for sid in deleted])
            conn.executemany("DELETE FROM checkpoints WHERE session_id = ?", [(sid,) for sid in forget])
            _put_observed(conn, observed)

        return self._write("rows", write)

    def _write(self, what: str, body: Callable[[sqlite3.Connection], None], *, quiet: bool = False) -> bool:
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
            except Exception as exc:  # a cache: any failure is a miss (see the module docstring)
                self._miss(f"{what} write", exc, quiet=quiet)
                return False
        return True

    def _reset(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing what already failed: nothing more to learn from it
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
            values: list[tuple[object, ...]] = []
            for key, row in rows.items():
                fields = (session_id, key, row.ver, row.seq, _json.encode(row.val), log_offset, life)
                values.append((*fields, row_crc(fields)))
        except (TypeError, ValueError, OverflowError) as exc:
            self._warn("session %r: checkpoint not JSON (%s); not written", session_id, exc)
            return False

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM checkpoints WHERE session_id = ?", (session_id,))
            conn.executemany(
                f"INSERT INTO checkpoints ({CHECKPOINT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )

        return self._write("checkpoint", write)

    def save_observed(self, entries: Sequence[tuple[ObservedCheckpoint, int]]) -> int:
        """Checkpoint rows a reader proved, each with the log offset they start over from, in
        one transaction: only while the stored row of its log is at the revision observed (the
        log may have been edited and rescanned since, by another process), and a session's rows
        are replaced only when none of the same lifecycle is stored at that seq or later (a writer's fresher rows, or a listing of the same revision
        in another process, win). How many sessions were written; 0, logged at debug level
        only, when the index cannot be written (it is a cache: a read-only folder lists too)."""
        if not entries:
            return 0
        written = 0

        def write(conn: sqlite3.Connection) -> None:
            nonlocal written
            written = _put_observed(conn, entries)

        return written if self._write("observed checkpoint", write, quiet=True) else 0

    def load_checkpoints(
        self,
        session_ids: Sequence[str],
        keys: Sequence[str] | None = None,
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]] | None:
        """The checkpoint rows of the given sessions in one query; None on any error (a miss).
        `keys`: only the rows of these units. `skip`: unit key → bytes; a row of that unit whose
        stored JSON contains them is not returned (a caller's cheap pre-filter, e.g. for a
        unit's usual empty state, so a listing does not fetch a row per session for nothing).
        `keep`: the converse; a row of that unit is returned only when its JSON contains them
        (e.g. a state only a rare case has, so a listing fetches only the rows of that case)."""
        out: dict[str, list[StoredCheckpoint]] = {sid: [] for sid in session_ids}
        if not session_ids:
            return out
        where, params = "", list[object]()
        if keys is not None:
            where += f" AND unit_key IN ({', '.join('?' * len(keys))})"
            params += list(keys)
        for key, part in (skip or {}).items():
            where += " AND NOT (unit_key = ? AND instr(val, ?) > 0)"
            params += [key, bytes(part)]
        for key, part in (keep or {}).items():
            where += " AND (unit_key <> ? OR instr(val, ?) > 0)"
            params += [key, bytes(part)]
        with self._lock:
            try:
                conn = self._connect()
                rows: list[tuple[Any, ...]] = []  # what sqlite3 returns: each field is checked below
                step = _IN_LIMIT - len(params)
                for start in range(0, len(session_ids), step):
                    chunk = list(session_ids[start : start + step])
                    rows += conn.execute(
                        f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints "
                        f"WHERE session_id IN ({', '.join('?' * len(chunk))}){where}",
                        chunk + params,
                    ).fetchall()
            except Exception as exc:  # a cache: any failure is a miss (see the module docstring)
                self._miss("checkpoint read", exc)
                return None
        lifecycles = self._lifecycles
        if len(lifecycles) > _LIFECYCLES:
            lifecycles.clear()
        decode = _json.decode
        for sid, key, ver, seq, val, offset, life, crc in rows:
            try:
                if (
                    crc != row_crc((sid, key, ver, seq, val, offset, life))
                    or sid not in out
                    or type(key) is not str
                    or type(ver) is not int
                    or type(seq) is not int
                    or type(offset) is not int
                    or seq < 0
                    or offset < 0
                    or type(val) not in (bytes, str)
                    or type(life) not in (bytes, str)
                ):
                    continue  # garbled, or not a row this build wrote: ignored
                # A session's rows share one lifecycle, and it does not change between
                # listings: each distinct record is decoded once (Lifecycle is a frozen value).
                lifecycle = lifecycles.get(life)
                if lifecycle is None:
                    lifecycle = stored_lifecycle(decode(life))
                    lifecycles[life] = lifecycle
                stored = StoredCheckpoint(
                    key=key, ver=ver, seq=seq, val_json=val, log_offset=offset, lifecycle=lifecycle
                )
            except Exception:  # a garbled lifecycle record: the row is ignored
                continue
            out[sid].append(stored)
        return out

    def close(self) -> None:
        with self._lock:
            self._reset()


def _put_observed(conn: sqlite3.Connection, entries: Sequence[tuple[ObservedCheckpoint, int]]) -> int:
    """Write observed checkpoint rows inside the caller's transaction (see `save_observed` for
    the rules); how many sessions got rows."""
    written = 0
    for one, log_offset in entries:
        sid, seq = one.session_id, one.event_count - 1
        if not one.rows or seq < 0:
            continue
        at = conn.execute("SELECT size, mtime_ns, inode FROM sessions WHERE id = ?", (sid,)).fetchone()
        if at is None or tuple(at) != tuple(one.revision):
            continue  # the stored row is another revision's (a rescan forgot rows for it)
        life = _json.encode(attrs.asdict(one.lifecycle))
        stored = conn.execute(
            "SELECT unit_key, ver, seq, lifecycle FROM checkpoints WHERE session_id = ? AND seq >= ?",
            (sid, seq),
        ).fetchall()
        # (The bytes this build writes are equal for equal lifecycles: decoded only if not.)
        ours = [
            (key, ver, at) for key, ver, at, found in stored if found == life or same_lifecycle(found, one.lifecycle)
        ]
        plan = one.rows_to_write(ours)
        if plan is None:
            continue
        rows, replace = plan
        if replace:
            conn.execute("DELETE FROM checkpoints WHERE session_id = ?", (sid,))
        conn.executemany(
            f"INSERT OR REPLACE INTO checkpoints ({CHECKPOINT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (*fields, row_crc(fields))
                for fields in ((sid, key, ver, seq, val, log_offset, life) for key, ver, val in rows)
            ],
        )
        written += 1
    return written


def _damaged(exc: Exception) -> bool:
    """Whether a failure says the file's contents are damaged (then it is rebuilt)."""
    if isinstance(exc, (OSError, MemoryError)):
        return False  # the file system or the machine, not the file (a planted link included)
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) not in _TRANSIENT  # extended codes keep the primary one in the low byte
    if isinstance(exc, sqlite3.Error):
        # Python's own failure to decode a stored text is the file's; the rest (a closed
        # connection, a misuse) is not.
        return str(exc).startswith("Could not decode")
    return True  # a foreign exception from the file's contents (UnicodeDecodeError, ValueError, ...)


def _open(path: str | None) -> sqlite3.Connection:
    # A short busy timeout: the index is a cache, and a listing must not wait long for it.
    return sqlite3.connect(path or ":memory:", timeout=1.0, isolation_level=None, check_same_thread=False)


def _roll_back(conn: sqlite3.Connection) -> None:
    """Roll back without hiding the error that caused it (there may be no open transaction)."""
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


class _NotRegular(OSError):
    """The index path is a link, a folder or another non-file: never opened, never removed."""


def _refuse_link(path: str) -> None:
    """The index is opened by sqlite, which follows links: a planted one is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat_mod.S_ISREG(st.st_mode):
        raise _NotRegular(f"{path} is not a regular file")
