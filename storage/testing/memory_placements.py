"""`MemoryPlacements`: the placement queue of storage/placements.py in memory, shared by the
in-process "hosts" of a test (`sibling()` is another host on the same queue)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Collection

import attrs

from ..mailbox_watch import MailboxWatch
from ..placements import Claim, HostRow
from ..values import SessionId, check_session_id

__all__ = ["MemoryPlacements"]


@attrs.define(eq=False)
class _Shared:
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    order: itertools.count[int] = attrs.field(factory=itertools.count)
    queue: dict[str, tuple[int, str | None]] = attrs.field(factory=dict)  # id -> (order, claimed_by)
    attempts: dict[str, int] = attrs.field(factory=dict)  # id -> claims so far
    hosts: dict[str, HostRow] = attrs.field(factory=dict)
    watches: list[MailboxWatch] = attrs.field(factory=list)


class MemoryPlacements:
    """One host's view of a placement queue held in memory."""

    def __init__(self, host_id: str = "host-1", *, shared: _Shared | None = None) -> None:
        self.host_id = host_id
        self._shared = shared if shared is not None else _Shared()
        with self._shared.lock:
            self._shared.hosts[host_id] = HostRow(host_id, 0, 0, 0, 0)

    def sibling(self, host_id: str) -> MemoryPlacements:
        """Another host on the same queue."""
        return MemoryPlacements(host_id, shared=self._shared)

    def enqueue(self, session_id: str, *, claimed_before: bool = False) -> None:
        sid = check_session_id(session_id)
        with self._shared.lock:
            if sid not in self._shared.queue and claimed_before:
                self._shared.attempts[sid] = 1
            self._shared.queue.setdefault(sid, (next(self._shared.order), None))
            watches = list(self._shared.watches)
        for watch in watches:
            watch.signal()

    def claim(self, limit: int, skip: Collection[str] = ()) -> list[Claim]:
        with self._shared.lock:
            queue = self._shared.queue.items()
            free = sorted((order, sid) for sid, (order, by) in queue if by is None and sid not in skip)
            taken: list[Claim] = []
            for _, sid in free[: max(limit, 0)]:
                self._shared.queue[sid] = (self._shared.queue[sid][0], self.host_id)
                attempt = self._shared.attempts[sid] = self._shared.attempts.get(sid, 0) + 1
                taken.append(Claim(SessionId(sid), attempt))
            return taken

    def finish(self, session_id: str) -> None:
        with self._shared.lock:
            entry = self._shared.queue.get(session_id)
            if entry is not None and entry[1] == self.host_id:
                del self._shared.queue[session_id]
                self._shared.attempts.pop(session_id, None)

    def unclaim(self, session_id: str) -> None:
        with self._shared.lock:
            entry = self._shared.queue.get(session_id)
            if entry is not None and entry[1] == self.host_id:
                self._shared.queue[session_id] = (entry[0], None)
            watches = list(self._shared.watches)
        for watch in watches:
            watch.signal()

    def take_back(self, session_id: str) -> int | None:
        with self._shared.lock:
            entry = self._shared.queue.get(session_id)
            if entry is None:
                return None
            by = entry[1]
            if by is not None and by in self._shared.hosts and self._shared.hosts[by].alive:
                return None
            del self._shared.queue[session_id]
            return self._shared.attempts.pop(session_id, 0)

    def reclaim_orphans(self) -> list[SessionId]:
        with self._shared.lock:
            gone = {h for h, row in self._shared.hosts.items() if not row.alive}
            orphans = [SessionId(sid) for sid, (_, by) in self._shared.queue.items() if by in gone]
            for sid in orphans:
                self._shared.queue[sid] = (self._shared.queue[sid][0], None)
            return orphans

    def dropped(self, limit: int) -> list[SessionId]:
        return []  # no leases in memory: sessions are dropped only on PostgreSQL

    def serve(self, capacity: int) -> None:
        with self._shared.lock:
            self._shared.hosts[self.host_id] = attrs.evolve(self._shared.hosts[self.host_id], capacity=capacity)

    def serving_hosts(self) -> int:
        with self._shared.lock:
            return sum(1 for row in self._shared.hosts.values() if row.alive and row.capacity > 0)

    def hosts(self) -> list[HostRow]:
        with self._shared.lock:
            return list(self._shared.hosts.values())

    def forget_hosts(self, older_than: float) -> list[str]:
        return []  # no clock in memory: a test's hosts are never gone long enough

    def watch(self) -> MailboxWatch:
        watch = MailboxWatch.pipe(None)
        with self._shared.lock:
            self._shared.watches.append(watch)
        watch.on_close = self._forget_watch
        return watch

    def _forget_watch(self, watch: MailboxWatch) -> None:
        with self._shared.lock:
            if watch in self._shared.watches:
                self._shared.watches.remove(watch)

    def close(self) -> None:
        with self._shared.lock:
            row = self._shared.hosts.get(self.host_id)
            if row is not None:
                self._shared.hosts[self.host_id] = attrs.evolve(row, alive=False, capacity=0)
