"""The placement queue and the host registry on PostgreSQL (SPEC §9; the protocol: placements.py).

`placements(session_id pk, claimed_by, claimed_at, enqueued_at)` holds the background children
waiting for a serving host. `enqueue` inserts a row (nothing if one is there) and notifies
channel `subagents_placement`; `claim` takes the oldest unclaimed rows with `FOR UPDATE SKIP
LOCKED` — two hosts claiming at once get different rows, never the same — and marks them with
this host's id; `finish` deletes a row this host claimed — or whose child's lease this host
holds or held last (the child settled here, even if its row was reclaimed meanwhile); `unclaim`
gives one back.

A claim is an *orphan* when its host is gone — its `hosts` row was removed (it closed) or has
not been renewed for a lease ttl (killed, paused, or cut off past its leases) — and its child's
lease is not in force (unexpired, its owner registered: a child still running is never
reclaimed: its host may renew late, or the hosts use different ttls). A free liveness lock alone
is not a dead host: a host whose owner connection was cut, or whose server restarted, reconnects
and renews within its ttl, and reclaiming its claims then would run (and settle) its children
twice. `reclaim_orphans` makes orphans claimable again in one statement; the child's lease
decides who may write it (a paused host that comes back finds its epoch taken and stops,
pg_store's fencing).

A session is *dropped* when its lease was not released cleanly and is no longer in force (it
expired, or its host's row is gone) — it may have had an open turn, undelivered mail or
unsettled children — or when mail from a session (a parent's message, a child's settlement)
waits for it and no lease in force holds it. Only continuable children are dropped work: a root
is resumed only by a host a person starts for it, and an operator's message (`send`, `send
--queue`) waits for whoever resumes the session next. `dropped` names such sessions that no
placement covers; a serving host's sweep resumes them (the lease decides which sweeper gets
one).

A host serves when its `hosts.capacity` is above 0 (`serve`); `serving_hosts` counts the live
ones, which is what a host starting a child asks before it leaves the child to them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .errors import PersistenceFailed
from .mailbox_watch import DEFAULT_POLL_INTERVAL, MailboxWatch
from .pg_connect import Pool, close_quietly, connect, redact
from .pg_leases import LEASE_CHANNEL, LIVE_HOSTS, LIVENESS_SEED, Leases, lease_in_force
from .pg_mailbox_watch import PgMailboxWatch
from .placements import Claim, HostRow
from .values import SessionId, check_session_id

__all__ = ["PLACEMENT_CHANNEL", "PgPlacements"]

PLACEMENT_CHANNEL = "subagents_placement"

_ENQUEUE = (
    "WITH i AS (INSERT INTO placements (session_id, attempts) VALUES (%(id)s, %(attempts)s) "
    "ON CONFLICT (session_id) DO NOTHING "
    f"RETURNING session_id) SELECT pg_notify('{PLACEMENT_CHANNEL}', session_id) FROM i"
)
_CLAIM = (
    "UPDATE placements p SET claimed_by = %(me)s, claimed_at = now(), attempts = p.attempts + 1 FROM ("
    "SELECT session_id FROM placements WHERE claimed_by IS NULL AND NOT (session_id = ANY(%(skip)s::text[])) "
    "ORDER BY enqueued_at, session_id "
    "LIMIT %(n)s FOR UPDATE SKIP LOCKED) c WHERE p.session_id = c.session_id "
    "RETURNING p.session_id, p.enqueued_at, p.attempts"
)
_FINISH = (
    "DELETE FROM placements p WHERE p.session_id = %(id)s AND (p.claimed_by = %(me)s "
    "OR EXISTS (SELECT 1 FROM leases l WHERE l.session_id = p.session_id AND l.owner = %(me)s))"
)
_UNCLAIM = (
    "WITH u AS (UPDATE placements SET claimed_by = NULL, claimed_at = NULL "
    "WHERE session_id = %(id)s AND claimed_by = %(me)s RETURNING session_id) "
    f"SELECT pg_notify('{PLACEMENT_CHANNEL}', session_id) FROM u"
)
# A claimer is gone when its `hosts` row is (it closed) or was not renewed for a ttl (killed,
# paused, cut off past its leases): never for a free liveness lock alone (pg_leases).
_CLAIMER_GONE = (
    "NOT EXISTS (SELECT 1 FROM hosts h WHERE h.id = p.claimed_by "
    "AND h.renewed_at > now() - make_interval(secs => %(ttl)s))"
)
_RECLAIM = (
    "WITH u AS (UPDATE placements p SET claimed_by = NULL, claimed_at = NULL "
    f"WHERE p.claimed_by IS NOT NULL AND p.claimed_by <> %(me)s AND {_CLAIMER_GONE} "
    f"AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.session_id = p.session_id AND {lease_in_force('l')}) "
    "RETURNING p.session_id) "
    f"SELECT session_id, pg_notify('{PLACEMENT_CHANNEL}', session_id) FROM u"
)
_TAKE_BACK = (
    "DELETE FROM placements p WHERE p.session_id = %(id)s AND (p.claimed_by IS NULL "
    f"OR {_CLAIMER_GONE}) RETURNING p.attempts"
)
# Only children that came from a `subagent` call are taken over (a root is resumed only by a host
# a person starts for it), and an operator's message (`send`, `send --queue`: sender null) is not
# work left behind — it waits for whoever resumes the session next; no model runs for it alone.
_DROPPED = (
    "SELECT session_id FROM ("
    "SELECT l.session_id FROM leases l WHERE NOT l.released AND l.owner <> %(me)s "
    f"AND NOT {lease_in_force('l')} "
    "UNION SELECT m.session_id FROM mailbox m WHERE NOT EXISTS (SELECT 1 FROM leases l "
    f"WHERE l.session_id = m.session_id AND {lease_in_force('l')}) "
    # (the envelope's bytes as encode_envelope writes them; a damaged row is no reason to fail)
    """AND position('"sender":null'::bytea IN m.envelope) = 0"""
    ") d WHERE session_id NOT IN (SELECT session_id FROM placements) "
    "AND session_id IN (SELECT id FROM sessions WHERE origin = 'subagent' AND parent_session IS NOT NULL) "
    "ORDER BY session_id LIMIT %(n)s"
)
_FORGET = (
    "DELETE FROM hosts h WHERE h.id <> %(me)s "
    "AND coalesce(h.renewed_at, h.started_at, '-infinity') < now() - make_interval(secs => %(age)s) "
    f"AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.owner = h.id AND {lease_in_force('l')}) RETURNING h.id"
)
_SERVING = (
    f"WITH {LIVE_HOSTS} SELECT count(*) FROM hosts h WHERE h.capacity > 0 "
    "AND h.renewed_at > now() - make_interval(secs => %(ttl)s) "
    f"AND hashtextextended(h.id, {LIVENESS_SEED}) IN (SELECT key FROM live)"
)
_HOSTS = (
    f"WITH {LIVE_HOSTS} SELECT h.id, (extract(epoch FROM h.started_at) * 1000)::bigint, coalesce(h.capacity, 0), "
    "(SELECT count(*) FROM leases l WHERE l.owner = h.id AND l.expires_at > now()), "
    "(extract(epoch FROM h.renewed_at) * 1000)::bigint, h.pid, h.hostname, "
    f"hashtextextended(h.id, {LIVENESS_SEED}) IN (SELECT key FROM live) "
    "AND h.renewed_at > now() - make_interval(secs => %(ttl)s) "
    "FROM hosts h ORDER BY h.started_at, h.id"
)


class PgPlacements:
    """One host's view of the placement queue of a PostgreSQL store (made by
    `PostgresLogStore.placements()`; it shares the store's pool and host identity)."""

    def __init__(self, url: str, pool: Pool, leases: Leases, *, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self.url = url
        self._pool = pool
        self._leases = leases
        self.poll_interval = poll_interval

    @property
    def host_id(self) -> str:
        return self._leases.host_id

    def _args(self, **more: Any) -> dict[str, Any]:
        return {"me": self.host_id, "ttl": self._leases.ttl, **more}

    def _execute(self, op: str, sql: str, args: dict[str, Any]) -> list[tuple[Any, ...]]:
        """One statement (one transaction); its rows. A failure is `PersistenceFailed`, never
        retried here: the serving loop looks again at its next turn."""
        import psycopg

        try:
            with self._pool.connection() as conn:
                cursor = conn.execute(sql, args)  # pyright: ignore[reportArgumentType]  # `sql` is a statement of this module, built from its constants alone
                return cursor.fetchall() if cursor.description is not None else []
        except psycopg.Error as exc:
            text = str(exc).strip()
            line = text.splitlines()[0] if text else type(exc).__name__
            raise PersistenceFailed(f"the placement queue at {redact(self.url)}: {op} failed: {line}") from None

    def enqueue(self, session_id: str, *, claimed_before: bool = False) -> None:
        sid = check_session_id(session_id)
        self._execute(f"enqueueing {sid!r}", _ENQUEUE, self._args(id=sid, attempts=int(claimed_before)))

    def claim(self, limit: int, skip: Collection[str] = ()) -> list[Claim]:
        if limit < 1:
            return []
        rows = self._execute("claiming placements", _CLAIM, self._args(n=limit, skip=list(skip)))
        return [Claim(SessionId(sid), attempt) for sid, _, attempt in sorted(rows, key=lambda row: (row[1], row[0]))]

    def finish(self, session_id: str) -> None:
        self._execute(f"finishing {session_id!r}", _FINISH, self._args(id=session_id))

    def unclaim(self, session_id: str) -> None:
        self._execute(f"giving back {session_id!r}", _UNCLAIM, self._args(id=session_id))

    def take_back(self, session_id: str) -> int | None:
        rows = self._execute(f"taking back {session_id!r}", _TAKE_BACK, self._args(id=session_id))
        return int(rows[0][0]) if rows else None

    def reclaim_orphans(self) -> list[SessionId]:
        rows = self._execute("reclaiming orphaned placements", _RECLAIM, self._args())
        return [SessionId(row[0]) for row in rows]

    def dropped(self, limit: int) -> list[SessionId]:
        if limit < 1:
            return []
        rows = self._execute("finding dropped sessions", _DROPPED, self._args(n=limit))
        return [SessionId(row[0]) for row in rows]

    def serve(self, capacity: int) -> None:
        self._leases.register(capacity)

    def serving_hosts(self) -> int:
        (row,) = self._execute("counting serving hosts", _SERVING, self._args())
        return int(row[0])

    def hosts(self) -> list[HostRow]:
        rows = self._execute("listing hosts", _HOSTS, self._args())
        return [
            HostRow(
                host_id=r[0],
                started_at=r[1] or 0,
                capacity=r[2],
                sessions_held=r[3],
                renewed_at=r[4],
                pid=r[5],
                hostname=r[6],
                alive=bool(r[7]),
            )
            for r in rows
        ]

    def forget_hosts(self, older_than: float) -> list[str]:
        rows = self._execute("forgetting hosts gone long ago", _FORGET, self._args(age=float(older_than)))
        return sorted(row[0] for row in rows)

    def watch(self) -> MailboxWatch:
        """Readable when a placement is enqueued or given back, or a lease is released."""
        conn = connect(self.url, self._pool.app)
        try:
            # New placements, and leases let go (a session with mail may be free to take now).
            conn.execute(f"LISTEN {PLACEMENT_CHANNEL}")
            conn.execute(f"LISTEN {LEASE_CHANNEL}")
        except BaseException:  # a half-made watch closes its connection (re-raised)
            close_quietly(conn)
            raise
        channels = (PLACEMENT_CHANNEL, LEASE_CHANNEL)
        return PgMailboxWatch(conn, None, channels=channels, poll_interval=self.poll_interval)  # type: ignore[return-value]  # the same interface

    def close(self) -> None:
        self._leases.register(0)
