"""Lease renewal: the task that keeps a PostgreSQL store's leases alive (SPEC §9, storage/pg_leases.py).

`open_runtime` starts `renew_leases` in its nursery; it returns at once for a store whose
`leased` capability is None (the file store: its flocks need no renewal). Every
`lease_renew_interval` seconds it renews all the store's leases in one statement, in a worker
thread. Sessions found lost (another host took them over: this host was paused or cut off past its
ttl; or the renewals failed for a whole ttl, so another host may take them now: storage/pg_leases.py)
are logged and handed to `on_lost` (the runtime stops their actors and mailbox owners at
once: an idle session's owner must not act for it; a running one's next append is refused with
`OwnershipLost` anyway). A failed renewal is logged and tried again at the next interval: the
leases last a ttl, three intervals by default. A lost owner connection (cut by the server, or a
restart) is replaced by the next renewal, which takes the host's liveness lock again: no other
host takes a session from a host merely cut off, only from one whose leases expired.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from subagents.storage import LogStore, StorageError

__all__ = ["renew_leases"]

log = logging.getLogger(__name__)


async def renew_leases(store: LogStore, on_lost: Callable[[str], None] | None = None) -> None:
    """Renew `store`'s leases every `lease_renew_interval` seconds until cancelled; returns at
    once for a store without leases (`store.leased` is None). `on_lost(session_id)` for each
    session found lost."""
    leased = store.leased
    if leased is None:
        return
    interval = float(leased.lease_renew_interval)
    renew = leased.renew_leases
    while True:
        await trio.sleep(interval)
        try:
            # Abandoned if the runtime closes meanwhile: a renewal stuck on the network must not
            # hold the shutdown (the store closes its leases itself, under the same lock).
            lost = await trio.to_thread.run_sync(renew, abandon_on_cancel=True)
        except StorageError as exc:
            log.warning("renewing the store's leases failed (tried again in %.1f s): %s", interval, exc)
            continue
        for session_id in sorted(lost):
            log.warning(
                "session %r: its lease is lost (taken over, or not renewed for a ttl); it stops here", session_id
            )
            if on_lost is not None:
                on_lost(session_id)
