"""Listing cancellation (SPEC 4 "Cancellation model", 5.4): an `Abort` at every stage ends in
`CANCELLED`, an enclosing cancel scope in a plain `trio.Cancelled`.

Each case lists a parent with eight persisted cold children (two of them seeded) and, for
`list_descendants`, two grandchildren below them. The store has no index, so there are no
checkpoint rows and every child goes through an observation. The stages are driven by a
`trio.testing.Sequencer`: the store (a `FaultyLogStore` that can run a hook in the Trio thread
before an operation) or the counting query reaches a sequence point, and only then does the test
set the abort (or cancel the enclosing scope) — so each stage is hit exactly, without sleeping:

    (a) before the call                    (b) during `list_sessions` (its thread held)
    (c) inside four reads (held)           (d) after a read returned, before the next check
                                               (the reader's, and the listing's: an observation
                                               held, or waiting at a cancellation point)
    (e) four held reads fail once the abort has landed (a raw OSError, or PersistenceFailed)

Every case checks the outcome (`SubagentError` CANCELLED with no rows, or a bare `Cancelled`),
that every observation that was entered was released exactly once, and that when the call ended
no task it started was left, no storage call was running and no limiter token was held. A last
case sets the abort while the listing waits for its live children's answers. Real IO and worker
threads: real clock. On files (a store without its index) and on PostgreSQL (children written
straight through the store: no checkpoint rows either), the `place` fixture (issue 18).
"""

from __future__ import annotations

import errno
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from clocks import ticking_ms
from descriptors import descriptor
from drafts import descriptor_draft, turn_start
from events import seed_marker, turn_end_event
from log_lines import header, persist_log
from places import Place
from subagents.actors import Abort, SessionStore, open_session_store
from subagents.runtime.delegation import listing as listing_module
from subagents.runtime.delegation.listing import ListingService
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.runtime.foundation.errors import SubagentCancelled
from subagents.runtime.query import Observation, SessionQuery
from subagents.storage import (
    LogStore,
    PersistenceFailed,
    make_event,
)
from subagents.storage.projection import ProjectionRegistry
from subagents.storage.testing import FaultyLogStore

now_ms = ticking_ms()


def child(store: LogStore, sid: str, created_at: int, parent: str = "p", *, label: str) -> None:
    """A persisted child: its descriptor, then a turn that is left open."""
    events = [make_event(0, "subagent/descriptor", 1, descriptor(label)), make_event(1, "turn/start", 2, {"turn": 1})]
    persist_log(store, header(sid, created_at, origin="subagent", parent_session=parent), events)


def seeded_child(store: LogStore, sid: str, created_at: int, parent: str = "p", *, label: str) -> None:
    """A seeded child: the parent's descriptor and a completed turn inherited, the tagged marker,
    then its own descriptor and an open turn."""
    seed = [
        make_event(0, "subagent/descriptor", 1, descriptor("the parent's")),
        make_event(1, "turn/start", 2, {"turn": 1}),
        turn_end_event(2, 3, 1),
    ]
    events = [
        *seed,
        seed_marker(3, 4),
        make_event(4, "subagent/descriptor", 5, descriptor(label)),
        make_event(5, "turn/start", 6, {"turn": 2}),
    ]
    session_header = header(sid, created_at, origin="subagent", parent_session=parent, is_seeded=True)
    persist_log(store, session_header, events, len(seed))


CHILDREN = [f"c{i}" for i in range(8)]
SEEDED = {"c2", "c5"}


def family(place: Place) -> None:
    """Eight cold children of "p" (two seeded); c1 has a child g0, which has a child g1."""
    store = place.store(use_index=False)
    for i, sid in enumerate(CHILDREN):
        (seeded_child if sid in SEEDED else child)(store, sid, i + 1, label=f"child {i}")
    child(store, "g0", 20, parent="c1", label="grand")
    child(store, "g1", 21, parent="g0", label="great")


# --- the instruments ------------------------------------------------------------------------------

Hook = Callable[[str | None], Awaitable[None]]
READ_OPS = ("list", "stat", "open_read", "read", "close", "read_checkpoint")


@attrs.define
class _HookRule:
    op: str
    session_id: str | None
    hook: Hook
    times: int | None


class SequencedStore(FaultyLogStore):
    """A `FaultyLogStore` that can first run an async hook in the Trio thread (in the task that
    called the store, through `trio.from_thread.run`), so a test can put a Sequencer point or a
    gate inside an operation; the injected failure or hang follows the hook. It also counts the
    read-side storage calls still running in worker threads."""

    def __init__(self, inner: LogStore) -> None:
        super().__init__(inner)
        self._hooks: list[_HookRule] = []
        self._hook_lock = threading.Lock()
        self.running: Counter[str] = Counter()
        self.raised: Counter[str] = Counter()  # read-side calls that ended in an exception

    def on(self, op: str, hook: Hook, *, session_id: str | None = None, times: int | None = None) -> None:
        with self._hook_lock:
            self._hooks.append(_HookRule(op, session_id, hook, times))

    def _enter(self, op: Any, session_id: str | None, poll: Any = None) -> None:
        with self._hook_lock:
            rule = next((r for r in self._hooks if r.op == op and r.session_id in (None, session_id)), None)
            if rule is not None and rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    self._hooks.remove(rule)
        if rule is not None:
            trio.from_thread.run(rule.hook, session_id)
        super()._enter(op, session_id, poll)

    @contextmanager
    def _running(self, op: str) -> Iterator[None]:
        with self._hook_lock:
            self.running[op] += 1
        try:
            yield
        except BaseException:
            with self._hook_lock:
                self.raised[op] += 1
            raise
        finally:
            with self._hook_lock:
                self.running[op] -= 1

    def list(self) -> Any:
        with self._running("list"):
            return super().list()

    def stat(self, session_id: str) -> Any:
        with self._running("stat"):
            return super().stat(session_id)

    def open_read(self, session_id: str) -> Any:
        with self._running("open_read"):
            return super().open_read(session_id)

    def read(self, handle: Any, *args: Any, **kwargs: Any) -> Any:
        with self._running("read"):
            return super().read(handle, *args, **kwargs)

    def read_chunks(self, handle: Any, **kwargs: Any) -> Any:
        chunks = super().read_chunks(handle, **kwargs)

        def counted() -> Any:  # a streamed read runs (and may raise) while it is iterated
            with self._running("read"):
                yield from chunks

        return counted()

    def close(self, handle: Any) -> None:
        with self._running("close"):
            super().close(handle)

    def read_checkpoint_rows(self, session_ids: Any, keys: Any = None, skip: Any = None, keep: Any = None) -> Any:
        with self._running("read_checkpoint"):
            return super().read_checkpoint_rows(session_ids, keys, skip, keep)


class CountingQuery(SessionQuery):
    """Counts observations: attempted, entered (the observation was handed out) and released
    (per observation object); `on_enter` runs once, inside the first observation entered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempts = 0
        self.entered: list[Observation] = []
        self.released: Counter[int] = Counter()
        self.on_enter: Callable[[], Awaitable[None]] | None = None

    @asynccontextmanager
    async def observe_session(
        self, session_id: str, abort: Abort | None = None, **kwargs: Any
    ) -> AsyncIterator[Observation]:
        self.attempts += 1
        async with super().observe_session(session_id, abort, **kwargs) as seen:
            self.entered.append(seen)
            try:
                if self.on_enter is not None:
                    hook, self.on_enter = self.on_enter, None
                    await hook()
                yield seen
            finally:
                self.released[id(seen)] += 1

    def assert_each_released_once(self) -> None:
        assert all(seen.released for seen in self.entered)
        assert self.released == Counter({id(seen): 1 for seen in self.entered})


def all_tasks() -> set[trio.lowlevel.Task]:
    """Every task of the run, walked down from the root task."""
    out: set[trio.lowlevel.Task] = set()
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        out.add(task)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return out


@attrs.define
class Env:
    store: SequencedStore
    sessions: SessionStore
    query: CountingQuery
    service: ListingService


@asynccontextmanager
async def listing_env(place: Place) -> AsyncIterator[Env]:
    store = SequencedStore(place.store(use_index=False))  # no checkpoint rows: every child is observed
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    try:
        async with open_session_store(store, registry, now_ms=now_ms) as sessions:
            query = CountingQuery(store, sessions, registry)
            service = ListingService(registry=registry, sessions=sessions, query=query)
            yield Env(store, sessions, query, service)
    finally:
        store.release()  # no hang outlives the test, whatever happened


@attrs.define
class Outcome:
    rows: list[Any] | None = None
    error: BaseException | None = None
    leftover: set[trio.lowlevel.Task] = attrs.Factory(set)
    running: Counter[str] = attrs.Factory(Counter)
    borrowed: tuple[float, float] = (0, 0)
    done: trio.Event = attrs.Factory(trio.Event)


Call = Callable[[ListingService, Abort], Awaitable[list[Any]]]
CALLS: list[Any] = [
    pytest.param(lambda service, abort: service.list_children("p", abort), id="children"),
    pytest.param(lambda service, abort: service.list_descendants("p", abort), id="descendants"),
]


async def run_listing(
    env: Env, call: Call, abort: Abort, scope: trio.CancelScope, drive: Callable[[Outcome], Awaitable[None]]
) -> Outcome:
    """Run the listing in its own task inside `scope` while the test task runs `drive`. At the
    moment the call ends, record which tasks it left behind, the storage calls still running
    and the limiter tokens still held."""
    outcome = Outcome()

    async def listing() -> None:
        try:
            with scope:
                try:
                    outcome.rows = await call(env.service, abort)
                except BaseException as exc:
                    outcome.error = exc
                    if isinstance(exc, trio.Cancelled):
                        raise
                finally:
                    outcome.leftover = all_tasks() - baseline - {trio.lowlevel.current_task()}
                    outcome.running = +env.store.running
                    outcome.borrowed = (
                        env.query.cold_reader.limiter.borrowed_tokens,
                        env.query.index_limiter.borrowed_tokens,
                    )
        finally:
            outcome.done.set()

    try:
        with trio.fail_after(10):  # a broken listing fails the test instead of hanging it
            async with trio.open_nursery() as nursery:
                baseline = all_tasks()
                nursery.start_soon(listing)
                await drive(outcome)
                await outcome.done.wait()
    finally:
        env.store.release()
    return outcome


def assert_ended(outcome: Outcome, how: str, scope: trio.CancelScope, query: CountingQuery) -> None:
    assert outcome.rows is None  # never a partial result, never a diagnostic row
    if how == "abort":
        error = outcome.error
        assert type(error) is SubagentCancelled, repr(error)
        assert (error.code, error.message) == ("SUBAGENT_CANCELLED", "subagent listing was cancelled")
        assert not scope.cancelled_caught
    else:
        assert type(outcome.error) is trio.Cancelled, repr(outcome.error)  # bare: no group, no SubagentError
        assert scope.cancelled_caught
    query.assert_each_released_once()
    assert outcome.leftover == set()  # no task the listing started outlived the call
    assert outcome.running == Counter()  # no storage call still running in a worker thread
    assert outcome.borrowed == (0, 0)


async def reached(seq: trio.testing.Sequencer, position: int) -> None:
    async with seq(position):
        pass


def nth(n: int, then: Hook, every: Hook | None = None) -> Hook:
    """A hook that runs `then` at its n-th call (and `every` at each call, after it)."""
    count = 0

    async def hook(session_id: str | None) -> None:
        nonlocal count
        count += 1
        if count == n:
            await then(session_id)
        if every is not None:
            await every(session_id)

    return hook


# --- (a)–(e): one stage each ---------------------------------------------------------------------

STAGES = [
    "a-before-call",
    "b-during-list-sessions",
    "c-inside-reads",
    "d-read-returned",
    "d-observation-entered",
    "d-interrupted-inside-observation",
    "e-reads-fail-after-abort-persistence",
    "e-reads-fail-after-abort-oserror",
]


@pytest.mark.parametrize("how", ["abort", "scope"])
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("call", CALLS)
async def test_cancellation_at_each_stage(place: Place, call: Call, stage: str, how: str) -> None:
    family(place)
    async with listing_env(place) as env:
        store, query = env.store, env.query
        seq = trio.testing.Sequencer()
        abort = Abort()
        scope = trio.CancelScope()

        def trigger() -> None:
            if how == "abort":
                abort.set()
            else:
                scope.cancel()

        async def shielded(position: int) -> None:
            """A sequence point the trigger's cancellation cannot break (the work at it is past
            its cancellation points)."""
            with trio.CancelScope(shield=True):
                await reached(seq, position)

        if stage == "a-before-call":
            trigger()

            async def drive(outcome: Outcome) -> None:
                pass

        elif stage == "b-during-list-sessions":
            store.on("list", lambda _: reached(seq, 0), times=1)
            store.hang("list")  # the corpus thread is held until released

            async def drive(outcome: Outcome) -> None:
                async with seq(1):
                    trigger()
                await trio.testing.wait_all_tasks_blocked()
                assert not outcome.done.is_set()  # still waiting for its corpus
                store.release()

        elif stage == "c-inside-reads":
            store.on("read", nth(4, lambda _: reached(seq, 0)))  # the fourth read in flight...
            store.hang("read", times=None)  # ...and every read held until cancelled

            async def drive(outcome: Outcome) -> None:
                async with seq(1):
                    trigger()

        elif stage == "d-read-returned":
            # `close` follows the read that returned its events; the trigger lands there.
            async def at_close(_: str | None) -> None:
                await reached(seq, 0)
                await shielded(2)

            store.on("close", at_close, times=1)

            async def drive(outcome: Outcome) -> None:
                async with seq(1):
                    trigger()

        elif stage == "d-observation-entered":

            async def at_enter() -> None:  # the trigger lands while the listing holds it
                await reached(seq, 0)
                await shielded(2)

            query.on_enter = at_enter

            async def drive(outcome: Outcome) -> None:
                async with seq(1):
                    trigger()

        elif stage == "d-interrupted-inside-observation":
            gate = trio.Event()

            async def at_enter() -> None:  # a cancellation point while the listing holds it
                await reached(seq, 0)
                await gate.wait()

            query.on_enter = at_enter

            async def drive(outcome: Outcome) -> None:
                async with seq(1):
                    trigger()
                await trio.testing.wait_all_tasks_blocked()
                gate.set()  # (only needed if the trigger did not interrupt the observation)

        else:  # (e): the four reads in flight are held past the trigger, then fail
            error: Exception = (
                PersistenceFailed("injected: input/output error")
                if stage.endswith("persistence")
                else OSError(errno.EIO, "injected: input/output error")
            )
            gate = trio.Event()

            async def held(_: str | None) -> None:
                with trio.CancelScope(shield=True):
                    await gate.wait()

            store.on("read", nth(4, lambda _: reached(seq, 0), every=held))
            store.fail("read", error, times=None)  # after the gate, every read raises

            async def drive(outcome: Outcome) -> None:
                async with seq(1):
                    trigger()
                await trio.testing.wait_all_tasks_blocked()
                assert not outcome.done.is_set()
                gate.set()

        outcome = await run_listing(env, call, abort, scope, drive)
        assert_ended(outcome, how, scope, query)

        calls = store.calls
        if stage in ("a-before-call", "b-during-list-sessions"):
            assert calls["list"] == (0 if stage == "a-before-call" else 1)
            assert calls["open_read"] == 0 and query.attempts == 0
        elif stage == "c-inside-reads":
            assert calls["read"] == 4  # the waiting reads never started
            assert query.entered == []
        elif stage == "d-read-returned":
            assert calls["close"] >= 1
        elif stage.startswith(("d-observation", "d-interrupted")):
            assert len(query.entered) >= 1
        else:
            assert calls["read"] == 4 and store.raised["read"] == 4  # the four held reads all failed after the trigger
            assert query.entered == []


async def test_without_a_trigger_every_child_is_observed(place: Place) -> None:
    """The control for the stages above: the same family lists in full, through observations."""
    family(place)
    async with listing_env(place) as env:
        outcome = await run_listing(
            env,
            lambda service, abort: service.list_descendants("p", abort),
            Abort(),
            trio.CancelScope(),
            _just_yield,
        )
        assert outcome.error is None and outcome.rows is not None
        assert [(r.id, r.to_json()["kind"], r.depth) for r in outcome.rows] == [
            ("c0", "child", 1),
            ("c1", "child", 1),
            ("g0", "child", 2),
            ("g1", "child", 3),
            *[(sid, "child", 1) for sid in CHILDREN[2:]],
        ]
        assert {r.id: r.label for r in outcome.rows}["c2"] == "child 2"  # a seeded child's own identity
        assert env.query.attempts == len(env.query.entered) == 10
        assert env.store.calls["read"] == 10
        env.query.assert_each_released_once()
        assert outcome.leftover == set() and outcome.running == Counter() and outcome.borrowed == (0, 0)


# --- live children ----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["abort", "scope"])
@pytest.mark.parametrize("call", CALLS)
async def test_cancellation_while_live_children_are_asked(
    place: Place, monkeypatch: pytest.MonkeyPatch, call: Call, how: str
) -> None:
    """Two live children next to the cold ones; the first live child's actor is busy with an
    append held in storage, so the listing's snapshot ask waits in its mailbox when the trigger
    lands. No cold child is observed afterwards."""
    family(place)
    async with listing_env(place) as env:
        store, query, sessions = env.store, env.query, env.sessions
        live = []
        for i in range(2):
            ref = await sessions.create(header(f"live{i}", 30 + i, origin="subagent", parent_session="p"))
            await ref.append([descriptor_draft(f"live {i}")])
            live.append(ref)
        seq = trio.testing.Sequencer()
        abort = Abort()
        scope = trio.CancelScope()
        real_snapshot_all = listing_module.snapshot_all

        async def snapshot_all(refs: Any, keys: Any = None) -> Any:
            await reached(seq, 1)  # the corpus is taken: the asks go out now
            return await real_snapshot_all(refs, keys)

        monkeypatch.setattr(listing_module, "snapshot_all", snapshot_all)
        store.on("append", lambda _: reached(seq, 0), session_id="live0", times=1)
        store.hang("append", session_id="live0")
        mailbox = live[0]._actor.mailbox  # noqa: SLF001 - to see the ask waiting behind the append

        async with trio.open_nursery() as helpers:
            helpers.start_soon(live[0].append, [turn_start(1)])

            async def drive(outcome: Outcome) -> None:
                async with seq(2):
                    await trio.testing.wait_all_tasks_blocked()
                    assert mailbox.receive.statistics().current_buffer_used == 1  # our snapshot ask, queued
                    trigger = abort.set if how == "abort" else scope.cancel
                    trigger()
                await trio.testing.wait_all_tasks_blocked()
                # Either way the listing has ended already: an actor stuck in storage does not
                # hold a cancelled listing.
                assert outcome.done.is_set()
                store.release()  # the append goes through

            outcome = await run_listing(env, call, abort, scope, drive)
        assert_ended(outcome, how, scope, query)
        assert query.attempts == 0 and store.calls["open_read"] == 0  # no cold child was observed after it


async def _just_yield(_: object) -> None:
    await trio.lowlevel.checkpoint()
