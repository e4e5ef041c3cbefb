"""The corpus pulse: what keeps the overview and the roots pages current, and tells every open
page when the store went away and when it is back (issue 31, items 2 and 4).

Why not one event stream per session. The console runs no actor, so no durable feed pushes it
anything: every log is written by another process, and following 10,000 of them per page would
stat every log per look per page. Instead one `CorpusPulse` per console looks at the corpus —
one listing (`SessionQuery.list_sessions(probe_locks=True)`, the index and a stat pass) — at
most once per `interval` seconds, and only while some page follows it: each `/live` stream asks
for the pulse after the generation it saw, and whichever stream finds the last look older than
the interval makes the next one, under one lock, for all of them. The work is bounded per
second, not per event: a session appending a thousand events in that second costs one look.

A look reduces each session to a mark — its event count, whether it is damaged, live here or
held by another process, whether it is stalled (a running child quiet past `stall_after`:
time alone makes it so) — and, on PostgreSQL, each host to its liveness, capacity and load. A
generation passes when a mark differs from the last look's (a session added, grown, damaged,
taken or let go, removed) or the store's state changed (it failed to answer, or answered again).
A page learns the generation and what changed, and fetches itself again; the listing it
renders from is its own (a page is one request, as when it was loaded).

On PostgreSQL, which tells a reader of no change, a look first asks the store's change mark
(`LeasedStore.change_mark`: one small aggregate query over the sessions and the leases in force)
and lists the corpus only when it moved, or when the sessions live in this process changed;
otherwise the last listing's records stand, and only the running ones are judged again against
the clock (stalled is a matter of time). A folder store lists with inotify instead (its warm
listing re-stats only the folders the kernel named).
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio
from subagents.storage import StorageError

from ...delegation.listing_rows import last_event_ms
from ...foundation.errors import SessionQueryError
from .security import security_headers

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.types import Receive, Scope, Send

    from ...query_corpus import SessionRecord
    from ...read_side import ReadSide

__all__ = ["CorpusPulse", "LiveRoute", "Pulse", "StateRoute"]

NAMED = 20  # changed session ids a pulse names (the rest are counted)
Mark = tuple[object, ...]


@attrs.frozen
class Pulse:
    """The corpus as of one generation: `problem` is why the store did not answer (None: it did);
    `changed` the sessions (at most `NAMED`) whose marks changed, `count` how many did."""

    generation: int
    problem: str | None
    changed: tuple[str, ...] = ()
    count: int = 0


class CorpusPulse:
    """One console's look at the corpus (see the module docstring)."""

    def __init__(self, side: ReadSide, interval: float = 1.0, now_ms: Callable[[], int] | None = None) -> None:
        """`now_ms`: the wall clock stalled is judged by (epoch ms; the real one by default)."""
        if not interval > 0:
            raise ValueError(f"the pulse interval must be a positive number of seconds, got {interval!r}")
        self.side = side
        self._now_ms = now_ms or _wall_ms
        self.interval = float(interval)
        self._lock = trio.Lock()
        self._looked = -math.inf  # trio time of the last look
        self._marks: dict[str, Mark] | None = None  # None: no look has answered yet
        self.current = Pulse(0, None)
        self.looks = 0  # looks made (the tests read it to see the coalescing)
        self.listings = 0  # of them, the full listings (on PostgreSQL, only when the mark moved)
        self._listed: tuple[object, list[SessionRecord]] | None = None  # (change key, records)

    async def after(self, generation: int) -> Pulse:
        """The first pulse past `generation` (-1: the current one, after a first look). Waits
        while nothing changes; looks at most once per interval, whoever asks."""
        while self.current.generation <= generation or self.looks == 0:
            async with self._lock:
                if self.current.generation > generation and self.looks > 0:
                    break
                await trio.sleep_until(self._looked + self.interval)
                await self._look()
        return self.current

    async def fresh(self) -> Pulse:
        """The pulse as of a look at most one interval old (a page that holds its own feed asks
        this now and then instead of holding a `/live` stream too)."""
        async with self._lock:
            if self.looks == 0 or trio.current_time() - self._looked >= self.interval:
                await self._look()
        return self.current

    async def _look(self) -> None:
        try:
            marks = await self._marks_now()
        except (StorageError, SessionQueryError, OSError) as exc:
            problem = str(exc) or exc.__class__.__name__
            self._record(None, problem)
        else:
            self._record(marks, None)
        finally:
            self._looked = trio.current_time()
            self.looks += 1

    def _record(self, marks: dict[str, Mark] | None, problem: str | None) -> None:
        current = self.current
        if marks is None:  # the store did not answer: the marks of the last answer stand
            if current.problem != problem:
                self.current = Pulse(current.generation + 1, problem)
            return
        before = self._marks
        self._marks = marks
        if before is None:  # the first answer is the baseline; after a failed first look, news
            if current.problem is not None:
                self.current = Pulse(current.generation + 1, None)
            return
        changed = [sid for sid, mark in marks.items() if before.get(sid) != mark]
        changed += [sid for sid in before if sid not in marks]
        if changed or current.problem is not None:
            self.current = Pulse(current.generation + 1, None, tuple(changed[:NAMED]), len(changed))

    async def _marks_now(self) -> dict[str, Mark]:
        side = self.side
        now = self._now_ms()
        stall_ms = side.listing.stall_after_ms
        leased = side.log_store.leased
        listed, before = self._listed, self._marks
        key: object = None
        if leased is not None:  # no change notification: one small query says whether to list
            mark = await trio.to_thread.run_sync(leased.change_mark)
            key = (mark, frozenset(str(ref.session_id) for ref in side.sessions.list()))
        if key is not None and listed is not None and listed[0] == key and before is not None:
            marks = {sid: m for sid, m in before.items() if not sid.startswith("host:")}
            for r in listed[1]:
                if r.live or r.held:  # only a running session turns stalled with time alone
                    marks[str(r.id)] = _mark(r, now, stall_ms)
        else:
            records = await side.query.list_sessions(probe_locks=True)
            self.listings += 1
            self._listed = None if key is None else (key, records)
            marks = {str(r.id): _mark(r, now, stall_ms) for r in records}
        if leased is not None:  # PostgreSQL: the hosts table is part of the overview
            hosts = await trio.to_thread.run_sync(lambda: leased.placements().hosts())
            for host in hosts:
                marks[f"host:{host.host_id}"] = (host.alive, host.capacity, host.sessions_held)
        return marks


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _mark(record: SessionRecord, now_ms: int, stall_ms: int) -> Mark:
    running = record.live or record.held
    last = last_event_ms(record)
    stalled = running and last is not None and now_ms - last > stall_ms
    return (record.event_count, record.damage, record.live, record.held, stalled)


class LiveRoute:
    """`GET /live`: the pulse as server-sent events, until the client goes away. First an
    `event: store` (`{"up": bool, "problem"}`), again whenever the store's state changes; then
    one message per generation, `{"generation", "changed": [ids], "count"}` — a page fetches
    itself again on each (at most one per interval)."""

    def __init__(self, pulse: CorpusPulse) -> None:
        self.pulse = pulse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), *security_headers()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b": open\n\n", "more_body": True})
        async with trio.open_nursery() as nursery:

            async def until_gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()  # the client went away: it costs no more looks

            nursery.start_soon(until_gone)
            pulse = await self.pulse.after(-1)
            await _event(send, "store", {"up": pulse.problem is None, "problem": pulse.problem})
            while True:
                last = pulse
                pulse = await self.pulse.after(last.generation)
                if pulse.problem != last.problem:
                    await _event(send, "store", {"up": pulse.problem is None, "problem": pulse.problem})
                if pulse.problem is None:
                    data = {"generation": pulse.generation, "changed": list(pulse.changed), "count": pulse.count}
                    await _event(send, None, data)


class StateRoute:
    """`GET /live/state`: the store's state once, `{"up": bool, "problem"}`, from a look at most
    one interval old. Pages that follow their own feed poll it: a browser holds six HTTP/1.1
    connections per host, and a feed plus a `/live` stream per tab would stall the fourth tab."""

    def __init__(self, pulse: CorpusPulse) -> None:
        self.pulse = pulse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pulse = await self.pulse.fresh()
        body = json.dumps({"up": pulse.problem is None, "problem": pulse.problem}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"cache-control", b"no-store"),
            *security_headers(),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _event(send: Send, name: str | None, data: dict[str, Any]) -> None:
    head = f"event: {name}\n" if name else ""
    body = f"{head}data: {json.dumps(data)}\n\n".encode()
    await send({"type": "http.response.body", "body": body, "more_body": True})
