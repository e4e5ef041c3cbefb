"""`FaultyLogStore`: wraps any `LogStore` and injects failures, delays and hangs per operation.

Storage never imports trio: a delay or hang waits on a `threading.Event` in short slices and
calls the operation's `poll` between them (the actors pass
`trio.from_thread.check_cancelled`), so a cancelled caller ends it. `release()` ends every hang.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import attrs

from .._codec import Event
from ..errors import PersistenceFailed
from ..index_rows import StoredCheckpoint
from ..log_store import Batch, Handle, LeasedStore, LogStore, ObservedCheckpoint, ReadHandle, WriteHandle
from ..projection import CheckpointRow
from ..values import AbortPoll, LogInfo, Offset, SessionHeader

__all__ = ["FaultyLogStore", "Operation"]

Operation = Literal[
    "create",
    "open_read",
    "open_write",
    "append",
    "read",
    "stat",
    "list",
    "close",
    "write_checkpoint",
    "write_observed",
    "read_checkpoint",
    "read_after",
]
_SLICE = 0.01


@attrs.define
class _Rule:
    op: Operation
    session_id: str | None
    error: BaseException | None
    delay: float | None  # seconds; None with no error means hang
    times: int | None  # None: forever


class FaultyLogStore:
    def __init__(self, inner: LogStore) -> None:
        self.inner = inner
        self.calls: Counter[Operation] = Counter()
        self._rules: list[_Rule] = []
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._entered = threading.Condition(self._lock)  # notified on every call

    # --- test controls ---

    def fail(
        self,
        op: Operation,
        error: BaseException | None = None,
        *,
        session_id: str | None = None,
        times: int | None = 1,
    ) -> None:
        err = error if error is not None else PersistenceFailed(f"injected {op} failure")
        self._add(_Rule(op, session_id, err, None, times))

    def delay(self, op: Operation, seconds: float, *, session_id: str | None = None, times: int | None = 1) -> None:
        self._add(_Rule(op, session_id, None, seconds, times))

    def hang(self, op: Operation, *, session_id: str | None = None, times: int | None = 1) -> None:
        self._add(_Rule(op, session_id, None, None, times))

    def release(self) -> None:
        """End every current and future hang; clears the rules."""
        with self._lock:
            self._rules.clear()
        self._released.set()

    def wait_calls(self, op: Operation, count: int, timeout: float = 60.0) -> None:
        """Block the calling thread until `op` has been called `count` times (from a Trio test:
        `await trio.to_thread.run_sync(store.wait_calls, "read", n)`), so a test waits on the
        calls themselves rather than sleeping; `timeout` is a hang guard (TimeoutError)."""
        with self._entered:
            if not self._entered.wait_for(lambda: self.calls[op] >= count, timeout):
                raise TimeoutError(f"{op} was called {self.calls[op]} times, not {count}")

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)
            self._released.clear()

    def _enter(self, op: Operation, session_id: str | None, poll: AbortPoll | None = None) -> None:
        with self._lock:
            self.calls[op] += 1
            self._entered.notify_all()
            rule = next((r for r in self._rules if r.op == op and r.session_id in (None, session_id)), None)
            if rule is None:
                return
            if rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    self._rules.remove(rule)
        if rule.error is not None:
            raise rule.error
        self._wait(rule.delay, poll)

    def _wait(self, seconds: float | None, poll: AbortPoll | None) -> None:
        remaining = seconds
        while remaining is None or remaining > 0:
            step = _SLICE if remaining is None else min(_SLICE, remaining)
            if self._released.wait(step):
                return
            if poll is not None:
                poll()
            if remaining is not None:
                remaining -= step

    # --- the LogStore protocol ---

    def create(self, header: SessionHeader, *, inherited_event_count: Offset = Offset(0)) -> WriteHandle:
        self._enter("create", header.id)
        return self.inner.create(header, inherited_event_count=inherited_event_count)

    def open_write(self, session_id: str) -> WriteHandle:
        self._enter("open_write", session_id)
        return self.inner.open_write(session_id)

    def open_read(self, session_id: str) -> ReadHandle:
        self._enter("open_read", session_id)
        return self.inner.open_read(session_id)

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        self._enter("append", handle.session_id)
        return self.inner.append(handle, batches)

    def read(
        self, handle: Handle, start: Offset = Offset(0), stop: Offset | None = None, *, poll: AbortPoll | None = None
    ) -> list[Event]:
        self._enter("read", handle.session_id, poll)
        return self.inner.read(handle, start, stop, poll=poll)

    def read_chunks(
        self, handle: Handle, *, start: Offset = Offset(0), poll: AbortPoll | None = None
    ) -> Iterator[list[Event]]:
        chunks = self.inner.read_chunks(handle, start=start, poll=poll)  # its argument errors now
        return self._streamed(handle.session_id, chunks, poll)

    def _streamed(
        self, session_id: str, chunks: Iterator[list[Event]], poll: AbortPoll | None
    ) -> Iterator[list[Event]]:
        # A read's faults, met where a stream starts: rules for "read" script streams alike.
        self._enter("read", session_id, poll)
        yield from chunks

    def stat(self, session_id: str) -> LogInfo | None:
        self._enter("stat", session_id)
        return self.inner.stat(session_id)

    def list(self) -> list[LogInfo]:
        self._enter("list", None)
        return self.inner.list()

    def close(self, handle: Handle) -> None:
        self._enter("close", handle.session_id)
        self.inner.close(handle)

    def held_elsewhere(self, session_ids: Sequence[str]) -> set[str]:
        return self.inner.held_elsewhere(session_ids)  # advice only: no faults are injected here

    def holders(self, session_ids: Sequence[str]) -> dict[str, str]:
        return self.inner.holders(session_ids)  # advice only: no faults are injected here

    def write_checkpoint(self, handle: WriteHandle, rows: Mapping[str, CheckpointRow]) -> bool:
        self._enter("write_checkpoint", handle.session_id)
        return self.inner.write_checkpoint(handle, rows)

    def write_observed_checkpoints(self, observed: Sequence[ObservedCheckpoint]) -> int:
        self._enter("write_observed", None)
        return self.inner.write_observed_checkpoints(observed)

    def read_checkpoint(
        self, session_id: str, header: SessionHeader, inherited_event_count: int
    ) -> tuple[dict[str, CheckpointRow], int] | None:
        self._enter("read_checkpoint", session_id)
        return self.inner.read_checkpoint(session_id, header, inherited_event_count)

    def read_checkpoint_rows(
        self,
        session_ids: Sequence[str],
        keys: Sequence[str] | None = None,
        skip: Mapping[str, bytes] | None = None,
        keep: Mapping[str, bytes] | None = None,
    ) -> dict[str, list[StoredCheckpoint]] | None:
        self._enter("read_checkpoint", None)
        return self.inner.read_checkpoint_rows(session_ids, keys, skip, keep)

    def read_after(
        self, handle: Handle, log_offset: int, first_seq: int, *, poll: AbortPoll | None = None
    ) -> list[Event] | None:
        self._enter("read_after", handle.session_id, poll)
        return self.inner.read_after(handle, log_offset, first_seq, poll=poll)

    @property
    def leased(self) -> LeasedStore | None:
        """None, whatever the inner store: the wrapper injects faults into logs, not leases."""
        return None

    def close_store(self) -> None:
        self.inner.close_store()
