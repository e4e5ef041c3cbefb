"""The PostgreSQL store's schema (SPEC §9) and its migration by version.

One row in `schema_version` says which version the tables are. `ensure_schema` creates the current
version in an empty database, migrates an older one step by step (each step in the same
transaction as the version row: a crash leaves the old version whole), leaves a current one alone and refuses a newer one (`UnsupportedLog`,
STORAGE_UNSUPPORTED_FORMAT; nothing touched); it runs under a transaction-scoped advisory lock, so stores starting at once
cannot race. A later version adds a step to `MIGRATIONS`.

Tables (version 1):
- `sessions`: one row per published session: line 1 exactly as format 1 writes it (`header`,
  newline included) and, beside it, the fields listings filter on, the event count (the next
  seq: appends check it), the plain form's byte size and a `generation` that tells a session id's
  lifecycles apart (a listing's revision).
- `batches`: one row per durable append: its exact JSON lines (`data`; a zstd frame when
  `compressed`), so an export to format 1 is byte-identical. Stored EXTERNAL: PostgreSQL must not
  compress what is already compressed (or too small to gain).
- `checkpoints`: projection checkpoint rows (SPEC §3.5), one per session and unit.

Version 2 adds the mailbox (pg_mailbox):
- `mailbox`: one row per pending delivery, the envelope's exact bytes (what the file form's
  `<delivery_id>.json` holds) and its `created_at`; key `(session_id, delivery_id)` like the file
  form's one folder per session, so a delivery id is unique within its session. `delivery_id` is
  collated "C": byte order, which is ULID order, so `ORDER BY delivery_id` is delivery order
  whatever the database's locale. No reference to `sessions`: a delivery may come first.
- `mailbox_rejected`: rows a drain found holding no valid envelope, moved here whole with the
  reason, under a name free in the session (`<delivery_id>`, else `~1`, `~2`, …, as `rejected/`).

Version 3 adds leases with fencing (pg_leases), hosts and placements (SPEC §9):
- `leases`: one row per session ever claimed: its writer (`owner`, a host id), the writer's
  `epoch` (grows by one at every takeover, never goes back: releasing only expires the row) and
  `expires_at` (the database clock). Every append checks owner and epoch in its transaction.
  `released` says its writer let go cleanly (closed its handle); a lease that expired, or whose
  host died, without it was dropped with work perhaps unfinished (the failover sweep's rows).
- `hosts`: one row per store that has claimed a session (or registered as a serving host): when
  it started, its capacity, its last lease renewal, its process id and machine.
- `placements`: background children waiting for a serving host to claim them, who claimed each
  and how many times it was claimed (pg_placements).

Version 4 makes checkpoint rows answer only for the batches they were written from: the store
only ever INSERTs batches, so an UPDATE or DELETE of one (a hand edit, a repair) forgets its
session's checkpoint rows in the same transaction (two statement-level triggers), and the next
listing or open reads the log again — as the file store's index drops the rows of a log edited
in place.

Version 5 moves the append's fence onto the session row (pg_append): `sessions.writer` and
`sessions.writer_epoch` are the owner and epoch of the session's lease, kept equal to them by a
row trigger on `leases` (`leases_writer`: an insert, a change of owner or epoch — every takeover
— or a delete of a lease row writes them in the same transaction; a renewal or a release, which
change neither, fires nothing) and a statement trigger on its TRUNCATE. So whatever code takes a
lease over — this version's, an older one's, an operator's UPDATE — the session row says so when
that transaction commits. The step takes the lease table's lock first (its trigger), then copies
every lease into its session's row, so no takeover slips between the copy and the trigger.
"""

from __future__ import annotations

from typing import Any

from .errors import StoreNotInitialized, UnsupportedLog
from .pg_connect import redact

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "check_schema", "ensure_schema"]

SCHEMA_VERSION = 5
_MIGRATION_LOCK = 0x5355_4241_4745_4E54  # "SUBAGENT": one key for every store's migration

_V1 = [
    "CREATE TABLE schema_version (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row), version integer NOT NULL)",
    """CREATE TABLE sessions (
        id text PRIMARY KEY,
        header bytea NOT NULL,
        created_at bigint NOT NULL,
        parent_session text,
        origin text,
        is_seeded boolean NOT NULL,
        inherited_event_count bigint NOT NULL,
        delegation_depth bigint NOT NULL,
        event_count bigint NOT NULL,
        last_time bigint,
        byte_size bigint NOT NULL,
        generation bigserial NOT NULL
    )""",
    "CREATE INDEX sessions_parent ON sessions (parent_session)",
    """CREATE TABLE batches (
        session_id text NOT NULL REFERENCES sessions (id),
        first_seq bigint NOT NULL,
        count integer NOT NULL CHECK (count > 0),
        data bytea NOT NULL,
        compressed boolean NOT NULL,
        epoch bigint,
        PRIMARY KEY (session_id, first_seq)
    )""",
    "ALTER TABLE batches ALTER COLUMN data SET STORAGE EXTERNAL",
    """CREATE TABLE checkpoints (
        session_id text NOT NULL REFERENCES sessions (id),
        unit text NOT NULL,
        ver bigint NOT NULL,
        lifecycle bytea NOT NULL,
        seq bigint NOT NULL,
        log_offset bigint NOT NULL,
        value bytea NOT NULL,
        PRIMARY KEY (session_id, unit)
    )""",
]

_V2 = [
    """CREATE TABLE mailbox (
        session_id text NOT NULL,
        delivery_id text COLLATE "C" NOT NULL,
        envelope bytea NOT NULL,
        created_at bigint NOT NULL,
        PRIMARY KEY (session_id, delivery_id)
    )""",
    """CREATE TABLE mailbox_rejected (
        session_id text NOT NULL,
        name text COLLATE "C" NOT NULL,
        envelope bytea NOT NULL,
        reason text NOT NULL,
        rejected_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (session_id, name)
    )""",
]

_V3 = [
    """CREATE TABLE leases (
        session_id text PRIMARY KEY,
        owner text NOT NULL,
        epoch bigint NOT NULL,
        expires_at timestamptz NOT NULL,
        released boolean NOT NULL DEFAULT false
    )""",
    "CREATE INDEX leases_owner ON leases (owner)",
    """CREATE TABLE hosts (
        id text PRIMARY KEY,
        started_at timestamptz,
        capacity integer,
        renewed_at timestamptz,
        pid integer,
        hostname text
    )""",
    """CREATE TABLE placements (
        session_id text PRIMARY KEY,
        claimed_by text,
        claimed_at timestamptz,
        attempts integer NOT NULL DEFAULT 0,
        enqueued_at timestamptz NOT NULL DEFAULT now()
    )""",
]

_V4 = [
    """CREATE OR REPLACE FUNCTION subagents_forget_checkpoints() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM checkpoints WHERE session_id IN (SELECT DISTINCT session_id FROM gone);
        RETURN NULL;
    END $$""",
    "DROP TRIGGER IF EXISTS batches_updated ON batches",
    "DROP TRIGGER IF EXISTS batches_deleted ON batches",
    "CREATE TRIGGER batches_updated AFTER UPDATE ON batches REFERENCING OLD TABLE AS gone "
    "FOR EACH STATEMENT EXECUTE FUNCTION subagents_forget_checkpoints()",
    "CREATE TRIGGER batches_deleted AFTER DELETE ON batches REFERENCING OLD TABLE AS gone "
    "FOR EACH STATEMENT EXECUTE FUNCTION subagents_forget_checkpoints()",
]

_V5 = [
    """CREATE OR REPLACE FUNCTION subagents_lease_writer() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND OLD.session_id = NEW.session_id AND OLD.owner IS NOT DISTINCT FROM NEW.owner
                AND OLD.epoch IS NOT DISTINCT FROM NEW.epoch THEN
            RETURN NULL;
        END IF;
        IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.session_id <> NEW.session_id) THEN
            UPDATE sessions SET writer = NULL, writer_epoch = NULL WHERE id = OLD.session_id;
        END IF;
        IF TG_OP <> 'DELETE' THEN
            UPDATE sessions SET writer = NEW.owner, writer_epoch = NEW.epoch WHERE id = NEW.session_id;
        END IF;
        RETURN NULL;
    END $$""",
    """CREATE OR REPLACE FUNCTION subagents_leases_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE sessions SET writer = NULL, writer_epoch = NULL WHERE writer IS NOT NULL OR writer_epoch IS NOT NULL;
        RETURN NULL;
    END $$""",
    "DROP TRIGGER IF EXISTS leases_writer ON leases",
    "DROP TRIGGER IF EXISTS leases_truncated ON leases",
    # First on `leases` (the trigger's lock, held to the commit: no lease changes hands until
    # then), then the session rows; an append of an older build locks them in the same order.
    "CREATE TRIGGER leases_writer AFTER INSERT OR DELETE OR UPDATE OF session_id, owner, epoch ON leases "
    "FOR EACH ROW EXECUTE FUNCTION subagents_lease_writer()",
    "CREATE TRIGGER leases_truncated AFTER TRUNCATE ON leases FOR EACH STATEMENT "
    "EXECUTE FUNCTION subagents_leases_truncated()",
    "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS writer text, ADD COLUMN IF NOT EXISTS writer_epoch bigint",
    "UPDATE sessions s SET writer = l.owner, writer_epoch = l.epoch FROM leases l WHERE l.session_id = s.id",
]

# version -> the statements that bring the version before it to this one (0: an empty database)
MIGRATIONS: dict[int, list[str]] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5}


def ensure_schema(conn: Any) -> int:
    """Create or migrate the schema on `conn` (a psycopg connection); returns the version."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()[0]
        found = 0
        if exists:
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            found = row[0] if row else 0
        if found > SCHEMA_VERSION:
            raise UnsupportedLog(
                None,
                f"the PostgreSQL store has schema version {found}; this build knows versions up to {SCHEMA_VERSION}",
            )
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        if found < SCHEMA_VERSION:
            conn.execute(
                "INSERT INTO schema_version (version) VALUES (%s) "
                "ON CONFLICT (only_row) DO UPDATE SET version = excluded.version",
                (SCHEMA_VERSION,),
            )
    return SCHEMA_VERSION


def check_schema(conn: Any, url: str) -> None:
    """The schema is the one this build writes: `StoreNotInitialized` when it is missing or
    older (nothing created or migrated), `UnsupportedLog` when it is newer. Reads only."""
    exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()[0]
    row = conn.execute("SELECT version FROM schema_version").fetchone() if exists else None
    found = row[0] if row else 0
    if found > SCHEMA_VERSION:
        raise UnsupportedLog(
            None,
            f"the PostgreSQL store at {redact(url)} has schema version {found}; "
            f"this build knows versions up to {SCHEMA_VERSION}",
        )
    if found == 0:
        raise StoreNotInitialized(
            f"the PostgreSQL store at {redact(url)} is not initialized: run `subagents store init URL`"
        )
    if found < SCHEMA_VERSION:
        raise StoreNotInitialized(
            f"the PostgreSQL store at {redact(url)} has schema version {found} (this build: {SCHEMA_VERSION}): "
            "run `subagents store init URL` to migrate it"
        )
