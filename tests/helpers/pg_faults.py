"""Append faults on a real PostgreSQL, injected by the server itself: the PostgreSQL forms of the
failed write and the failed fsync that `CrashFs` injects into the file store.

`arm(url, times, mode)` puts a trigger on `batches` that spoils the next `times` batch inserts
(every append inserts one batch row, in the same statement that advances the session's count):
`mode="error"` makes the statement fail whole (nothing written, the connection fine: the store
answers `PersistenceFailed` and the handle lives, like a write the file store cut back);
`mode="disconnect"` has the server end the connection in the middle of the statement (nothing
written either, but the client cannot tell: it asks on a fresh connection and sends the batch
once more; two in a row leave the outcome unknown and the handle dead, like a failed fsync). The
count survives the rollback of the spoiled statement (a sequence is not transactional).
`disarm(url)` drops the trigger.

For a connection cut mid-statement: `lock_waiter(db, query_start, what)` is the backend of a
statement (another process) blocked on a row lock, to terminate there; `outcome_of(fn, *args)` what
a call returned or raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pg_damage import sql

__all__ = ["arm", "disarm", "lock_waiter", "outcome_of"]

_FUNCTION = """
CREATE OR REPLACE FUNCTION test_fault_batches() RETURNS trigger AS $$
DECLARE
    armed record;
BEGIN
    SELECT times, mode INTO armed FROM test_fault;
    IF NOT FOUND OR armed.times <= 0 OR nextval('test_fault_seen') > armed.times THEN
        RETURN NEW;
    END IF;
    IF armed.mode = 'disconnect' THEN
        -- This backend ends at its next interrupt check (inside pg_sleep, at once): the
        -- statement never commits and the client sees its connection cut.
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(5);
    END IF;
    RAISE EXCEPTION 'injected failure of a batch insert (tests/helpers/pg_faults.py)';
END
$$ LANGUAGE plpgsql
"""


def arm(url: str, times: int = 1, mode: str = "error") -> None:
    """Spoil the next `times` batch inserts on the database at `url` (see the module docstring)."""
    if mode not in ("error", "disconnect"):
        raise ValueError(f"mode must be 'error' or 'disconnect', got {mode!r}")
    sql(url, "CREATE SEQUENCE IF NOT EXISTS test_fault_seen")
    sql(url, "CREATE TABLE IF NOT EXISTS test_fault (times integer NOT NULL, mode text NOT NULL)")
    sql(url, _FUNCTION)
    sql(url, "DELETE FROM test_fault")
    sql(url, "INSERT INTO test_fault (times, mode) VALUES (%s, %s)", (times, mode))
    sql(url, "ALTER SEQUENCE test_fault_seen RESTART WITH 1")
    sql(url, "DROP TRIGGER IF EXISTS test_fault ON batches")
    sql(url, "CREATE TRIGGER test_fault BEFORE INSERT ON batches FOR EACH ROW EXECUTE FUNCTION test_fault_batches()")


def disarm(url: str) -> None:
    """No more spoiled inserts (the trigger dropped, if there was one)."""
    sql(
        url,
        "DO $$ BEGIN IF to_regclass('batches') IS NOT NULL THEN DROP TRIGGER IF EXISTS test_fault ON batches; END IF; END $$",
    )


def lock_waiter(db: Any, query_start: str, what: str) -> int:
    """The pid of the backend whose statement, starting with `query_start`, waits on a lock
    (polled: it is another process; AssertionError naming `what` after 30 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            (query_start + "%",),
        ).fetchone()
        if row is not None:
            return int(row[0])
    raise AssertionError(f"{what} never blocked on the row")


def outcome_of(fn: Callable[..., Any], *args: Any) -> object:
    """What `fn(*args)` returned, or the exception it raised."""
    try:
        return fn(*args)
    except Exception as exc:  # the outcome under test
        return exc
