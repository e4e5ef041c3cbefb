"""Placements: background children waiting for a serving host, and the hosts that serve them
(SPEC §9, "Placement and failover").

A host that starts a background child while serving hosts are up may leave the child to them: it
creates the child's session (descriptor and first prompt durable), releases it and enqueues a
placement. A serving host with free capacity claims placements — each claim goes to exactly one
host (PostgreSQL: `FOR UPDATE SKIP LOCKED`) — resumes the child, runs it until it settles (its
settlement reaches the parent through the parent's mailbox) and finishes the placement. A claim
whose host died is claimable again (`reclaim_orphans`) once its lease expired: the child
resumes elsewhere, its interrupted turn closed by the resume's closers (SPEC 3.4).

`PgPlacements` (pg_placements.py) is the real form; `MemoryPlacements` (storage/testing) is the
in-process one the runtime's unit tests use.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import attrs

from .mailbox_watch import MailboxWatch
from .values import SessionId

__all__ = ["Claim", "HostRow", "Placements"]


@attrs.frozen
class Claim:
    """A placement this host claimed. `attempt` counts the claims of this placement: above 1 the
    child was claimed before — by a host that died, or gave it back — and may have finished its
    work there without settling, so it settles here even with nothing left to do."""

    session_id: SessionId
    attempt: int = 1


@attrs.frozen
class HostRow:
    """One host as `subagents hosts` shows it (times in epoch ms, from the database clock)."""

    host_id: str
    started_at: int
    capacity: int
    sessions_held: int
    renewed_at: int | None
    pid: int | None = None
    hostname: str | None = None
    alive: bool = True


class Placements(Protocol):
    """The placement queue and the host registry, as seen by one host (`host_id`)."""

    @property
    def host_id(self) -> str:
        """The host these placements act for."""
        ...

    def enqueue(self, session_id: str, *, claimed_before: bool = False) -> None:
        """Leave the session to the serving hosts, durably (idempotent: an enqueued session
        stays enqueued once). `claimed_before`: count it as claimed once already, so its next
        claim settles it even with nothing left to do (a settlement made and lost)."""
        ...

    def claim(self, limit: int, skip: Collection[str] = ()) -> list[Claim]:
        """Up to `limit` unclaimed placements, oldest first, now claimed by this host; no two
        hosts ever get the same one. Those in `skip` (children this host gave back: it cannot
        serve them, or not now) are left to the others."""
        ...

    def finish(self, session_id: str) -> None:
        """The session settled here: its placement is done (a claim of this host's, or one
        whose session this host holds or held last)."""
        ...

    def unclaim(self, session_id: str) -> None:
        """Give a claimed placement back for another host (this host stops before it settled)."""
        ...

    def take_back(self, session_id: str) -> int | None:
        """Remove the placement of a session its parent's host will run itself (no host serves):
        only when it is unclaimed, or claimed by a host that is gone. Returns how often it was
        claimed before; None when there is no such placement or a live host holds its claim."""
        ...

    def reclaim_orphans(self) -> list[SessionId]:
        """Placements claimed by hosts that are gone (closed, or silent for a lease ttl — never
        merely cut off from the database for a moment), made claimable again — not while the
        session's lease is in force; returns them."""
        ...

    def dropped(self, limit: int) -> list[SessionId]:
        """Up to `limit` continuable children no placement covers that were dropped with work:
        their writer went away without releasing them and their lease expired, or mail from a
        session (not an operator's `send`) waits for them and no lease holds them. Never a root:
        roots are resumed only by a host a person starts for them. The sweep of a serving host
        resumes them (taking the lease decides who does)."""
        ...

    def serve(self, capacity: int) -> None:
        """Announce this host as serving with `capacity` children at once (0: not serving)."""
        ...

    def serving_hosts(self) -> int:
        """How many live hosts serve (capacity above 0), this one included."""
        ...

    def hosts(self) -> list[HostRow]:
        """Every registered host, oldest first."""
        ...

    def forget_hosts(self, older_than: float) -> list[str]:
        """Delete the rows of hosts not renewed for `older_than` seconds that hold no lease in
        force (gone long ago: `subagents hosts` stops listing them); returns their ids. A
        serving host's sweep calls it; a host that comes back writes its row again."""
        ...

    def watch(self) -> MailboxWatch:
        """A wake-up for new placements (its fd becomes readable; `clear()` then)."""
        ...

    def close(self) -> None:
        """Withdraw this host (its unfinished claims become orphans) and free what it holds."""
        ...
