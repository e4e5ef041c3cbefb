"""The store reader: the one read side of the persisted sessions (docs/design.md, "One read
side").

Everything above the actors reads the log store through a `StoreReader` and nothing else: the
session query's corpus and observations, the listing's checkpoint rows, lock probes and stats,
the agent registry's and the subagent service's existence checks. It owns

- the index limiter: the index is used from Trio through one worker thread at a time
  (docs/format.md, "The index"), so every index call (`list`, `stat`, checkpoint rows) takes
  its one slot;
- stat batching: stats asked for at the same time share index hops (`stat`);
- the cold reader (`cold`): full log reads, bounded and grouped (actors/cold_reader.py).

Lock probes (`held_elsewhere`) read the lock table, not the index, and take no slot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import attrs
import trio
from subagents.storage import LogInfo, LogStore, ObservedCheckpoint, PersistenceFailed, StoredCheckpoint

from .cold_reader import ColdReader

__all__ = ["StoreReader"]

_STAT_BATCH = 256  # stats in one index hop at most (about 16 µs each)
_NO_ANSWER = object()
_HANDED_BACK = object()


@attrs.define(eq=False)
class _StatJob:
    session_id: str
    result: LogInfo | None | Exception | object = _NO_ANSWER
    held: bool = False  # another writer holds its lock (asked in the same hop as the stat)
    done: trio.Event = attrs.Factory(trio.Event)


class StoreReader:
    """The read side of one log store: index calls through one slot, batched stats, checkpoint
    rows, lock probes and cold reads (see the module docstring)."""

    def __init__(
        self,
        store: LogStore,
        *,
        cold: ColdReader | None = None,
        index_limiter: trio.CapacityLimiter | None = None,
    ) -> None:
        self.store = store
        self.cold = cold if cold is not None else ColdReader(store)
        self.index_limiter = index_limiter if index_limiter is not None else trio.CapacityLimiter(1)
        self._stats: deque[_StatJob] = deque()  # stats waiting for an index hop
        self._pumping = False  # a task is running index hops for `_stats`

    # --- the corpus ---

    async def list(self, *, probe_locks: bool = False) -> tuple[list[LogInfo], set[str]]:
        """`store.list()` and, with `probe_locks`, the listed ids another process holds the
        lock of, in one index hop. Raises the store's `StorageError` (an unreadable root)."""
        store = self.store

        def listed() -> tuple[list[LogInfo], set[str]]:
            infos = store.list()
            return infos, store.held_elsewhere([info.id for info in infos]) if probe_locks else set()

        return await trio.to_thread.run_sync(listed, limiter=self.index_limiter)

    # --- stats ---

    async def stat(self, session_id: str) -> tuple[LogInfo | None, bool]:
        """`store.stat(session_id)` and whether another writer holds its lock, through the
        index's one worker thread. Stats asked for at the same time share hops: the first asker
        pumps (one hop per `_STAT_BATCH` waiting stats, until none waits), the others just wait
        for their answer. A pump that is cancelled hands the stats it had not reached back to
        their askers, who pump again. Raises the store's `StorageError`, or `PersistenceFailed`
        when the hop that took it failed before reaching it."""
        job = _StatJob(session_id)
        while True:
            self._stats.append(job)
            if self._pumping:
                await job.done.wait()
            else:
                await self._pump_stats()
            if job.result is not _HANDED_BACK:
                break
            job.result, job.done = _NO_ANSWER, trio.Event()
        result = job.result
        if result is _NO_ANSWER:
            raise PersistenceFailed("the index did not answer")
        if isinstance(result, Exception):
            raise result
        return result, job.held  # type: ignore[return-value]  # LogInfo | None once answered

    async def _pump_stats(self) -> None:
        waiting = self._stats
        self._pumping = True
        try:
            while waiting:
                async with self.index_limiter:
                    batch = [waiting.popleft() for _ in range(min(len(waiting), _STAT_BATCH))]
                    try:
                        await trio.to_thread.run_sync(self._stat_batch, batch)
                    finally:
                        for job in batch:
                            job.done.set()
        finally:
            self._pumping = False
            while waiting:  # cancelled: nobody pumps these now
                job = waiting.popleft()
                job.result = _HANDED_BACK
                job.done.set()

    def _stat_batch(self, batch: list[_StatJob]) -> None:
        """In a worker thread: one index hop of stats, and their lock probe."""
        stat = self.store.stat
        for job in batch:
            try:
                job.result = stat(job.session_id)
            except Exception as exc:  # the asker raises it
                job.result = exc
        try:
            held = self.store.held_elsewhere([job.session_id for job in batch if isinstance(job.result, LogInfo)])
        except Exception:  # advice for display only: an unanswered probe is "not held"
            held = set[str]()
        for job in batch:
            job.held = job.session_id in held

    async def stat_many(self, session_ids: Sequence[str]) -> list[LogInfo | None | Exception]:
        """`store.stat` of each id in one index hop, aligned with `session_ids`; a failure is
        that entry's value (the hop itself failing: every entry's)."""
        store = self.store

        def stat_all() -> list[LogInfo | None | Exception]:
            out: list[LogInfo | None | Exception] = []
            for sid in session_ids:
                try:
                    out.append(store.stat(sid))
                except Exception as exc:  # the caller judges it
                    out.append(exc)
            return out

        try:
            return await trio.to_thread.run_sync(stat_all, limiter=self.index_limiter)
        except Exception as exc:  # the thread hop itself failed: every asker judges that error
            return [exc] * len(session_ids)

    # --- checkpoint rows and locks ---

    async def checkpoint_rows(
        self,
        session_ids: Sequence[str],
        keys: Sequence[str],
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]]:
        """The stored checkpoint rows of `session_ids` (units `keys`; see
        `LogStore.read_checkpoint_rows` for `skip` and `keep`) in one query and one index hop; every id
        asked is a key of the answer (no rows: the index is a cache, any failure is a miss)."""
        out: dict[str, list[StoredCheckpoint]] = {sid: [] for sid in session_ids}
        if not session_ids:
            return out
        try:
            rows = await trio.to_thread.run_sync(
                self.store.read_checkpoint_rows, list(session_ids), keys, skip, keep, limiter=self.index_limiter
            )
        except Exception:  # the index is a cache: any failure is a miss
            return out
        if rows:
            out.update((sid, found) for sid, found in rows.items() if sid in out)
        return out

    async def write_observed(self, observed: Sequence[ObservedCheckpoint]) -> int:
        """Write rows observations proved (`LogStore.write_observed_checkpoints`) in one index
        hop; how many sessions were written. Never an error: the index is a cache, and a store
        this process may not write is still listed."""
        if not observed:
            return 0
        try:
            return await trio.to_thread.run_sync(
                self.store.write_observed_checkpoints, list(observed), limiter=self.index_limiter
            )
        except Exception:  # the index is a cache: a refresh that fails is skipped
            return 0

    async def holders(self, session_ids: Sequence[str]) -> dict[str, str]:
        """Who holds each of the ids another process holds the lock of (`LogStore.holders`: one
        thread hop; advice, never an error)."""
        if not session_ids:
            return {}
        try:
            return await trio.to_thread.run_sync(self.store.holders, list(session_ids))
        except Exception:  # advice for display only: unanswered is "not held"
            return {}

    async def held_elsewhere(self, session_ids: Sequence[str]) -> set[str]:
        """The ids another process holds the lock of (one thread hop; advice, never an error)."""
        if not session_ids:
            return set()
        try:
            return await trio.to_thread.run_sync(self.store.held_elsewhere, list(session_ids))
        except Exception:  # advice for display only: unanswered is "not held"
            return set()
