"""The event stream follows the sessions of its tree that are not live in its runtime (issue 29):
a child another runtime on the same store writes, one released here and written elsewhere, one
published only after the stream read its catalog — each delivered once, in seq order, and read
from where it grew rather than whole.

Two runtimes on one folder stand for two processes (each session's lock is a flock per open
file, so they exclude each other as processes do). Real files and the real clock; the tests
wait on what the stream delivers, `trio.fail_after` only guards against hangs. The polled form
(no change notification: an in-memory store) runs on the autojump clock.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from log_lines import log_file, plain_records
from open_fds import inotify_fds
from subagents.actors import EventDraft
from subagents.runtime import StreamEvent, open_event_stream, open_runtime
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.storage import Batch, FileLogStore, LogInfo, Offset, SessionHeader, make_event
from subagents.storage.testing import CrashFs, MemoryLogStore

GUARD = 20.0


def _draft(text: str = "x") -> EventDraft:
    return EventDraft(type="compaction/summary", data={"text": text})


def _catalog(child: str) -> EventDraft:
    data = {"version": 1, "child_id": child, "child_created_at": 2, "mode": "continuable", "label": child}
    return EventDraft(type="subagent/catalog", data=data)


def _child(session_id: str, parent: str = "p") -> SessionHeader:
    return SessionHeader(id=session_id, created_at=2, parent_session=parent, origin="subagent", delegation_depth=1)


class _Counting:
    """A store mixin that counts, per session, whole reads, reads past a boundary and stats,
    and says when one of those counts has grown by `n`."""

    def count_from_here(self) -> None:
        self.whole: dict[str, int] = {}
        self.after: dict[str, int] = {}
        self.stats: dict[str, int] = {}
        self.waits: list[tuple[dict[str, int], str, int, threading.Event]] = []
        self.lock = threading.Lock()

    def _count(self, counts: dict[str, int], session_id: str) -> None:
        with self.lock:
            n = counts[session_id] = counts.get(session_id, 0) + 1
            for which, sid, target, event in self.waits:
                if which is counts and sid == session_id and n >= target:
                    event.set()

    def read(self, handle: Any, start: Any = 0, stop: Offset | None = None, **kw: Any) -> Any:
        self._count(self.whole, handle.session_id)
        return super().read(handle, start, stop, **kw)

    def read_after(self, handle: Any, log_offset: int, first_seq: int, **kw: Any) -> Any:
        self._count(self.after, handle.session_id)
        return super().read_after(handle, log_offset, first_seq, **kw)

    def stat(self, session_id: str) -> LogInfo | None:
        info: LogInfo | None = super().stat(session_id)
        self._count(self.stats, session_id)
        return info

    async def wait_stats(self, session_id: str, more: int) -> None:
        """Until `session_id` has been stat'ed `more` more times than now."""
        await self._wait(self.stats, session_id, more)

    async def wait_whole_reads(self, session_id: str, more: int) -> None:
        await self._wait(self.whole, session_id, more)

    async def _wait(self, counts: dict[str, int], session_id: str, more: int) -> None:
        event = threading.Event()
        with self.lock:
            self.waits.append((counts, session_id, counts.get(session_id, 0) + more, event))
        await trio.to_thread.run_sync(event.wait, GUARD)
        assert event.is_set()


class _Reads(_Counting, FileLogStore):
    def __init__(self, root: Path) -> None:
        FileLogStore.__init__(self, str(root), compression="none")
        self.count_from_here()


class _MemoryReads(_Counting, MemoryLogStore):
    """Over an in-memory folder: no change notification, so the follower polls."""

    def __init__(self, fs: CrashFs) -> None:
        MemoryLogStore.__init__(self, fs=fs, compression="none")
        self.count_from_here()


async def _until(stream: Any, into: list[StreamEvent], session_id: str, seq: int) -> None:
    """Receive into `into` until `session_id`'s event `seq` has arrived."""
    while not any(i.session_id == session_id and i.event.seq == seq for i in into):
        into.append(await stream.receive())


def _seqs(items: Sequence[StreamEvent]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items:
        out.setdefault(item.session_id, []).append(item.event.seq)
    return out


def _disk_seqs(root: Path, session_id: str) -> list[int]:
    _header, *events = plain_records(root, session_id)
    return [e["seq"] for e in events]


async def test_a_child_written_by_another_runtime_is_followed_once_in_order(tmp_path: Path) -> None:
    store = _Reads(tmp_path)
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with (
            open_runtime(tmp_path, log_store=store, clock=ScenarioClock()) as here,
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as there,
        ):
            child = await there.sessions.create(_child("c"))
            await child.append([_draft()])
            parent = await here.sessions.create(SessionHeader(id="p", created_at=1))
            await parent.append([_draft(), _catalog("c")])
            assert here.sessions.get("c") is None
            async with open_event_stream(here.query, "p", follow_interval=0.05) as stream:
                await _until(stream, items, "c", 0)
                # A look has proved where the child's log ends: what it writes next is read from there.
                await store.wait_stats("c", 2)
                for n in range(1, 6):
                    await child.append([_draft(f"{n}")])
                    await _until(stream, items, "c", n)
                await parent.append([_draft()])  # pushed by this runtime's feed meanwhile
                await child.append([_draft(), _draft()])  # durable before `finish`: delivered too
                stream.finish()
                async for item in stream:
                    items.append(item)
    assert _seqs(items) == {"p": [0, 1, 2], "c": list(range(8))}
    assert _disk_seqs(tmp_path, "c") == list(range(8))
    # One whole read (its first), every later one from where the last stat left it.
    assert store.whole["c"] == 1
    assert store.after["c"] >= 5


async def test_a_session_released_here_and_written_elsewhere_is_followed(tmp_path: Path) -> None:
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with (
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as here,
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as there,
        ):
            parent = await here.sessions.create(SessionHeader(id="p", created_at=1))
            child = await here.sessions.create(_child("c"))
            await child.append([_draft()])
            await parent.append([_catalog("c")])
            async with open_event_stream(here.query, "p", follow_interval=0.05) as stream:
                await _until(stream, items, "c", 0)
                await child.append([_draft()])  # live here: pushed
                await _until(stream, items, "c", 1)
                await here.sessions.release("c")
                moved = await there.sessions.open("c")  # "another process" takes it over
                await moved.append([_draft()])
                await _until(stream, items, "c", 2)
                await there.sessions.release("c")
                back = await here.sessions.open("c")  # live here again: pushed again
                await back.append([_draft()])
                await _until(stream, items, "c", 3)
                stream.finish()
                async for item in stream:
                    items.append(item)
    assert _seqs(items) == {"p": [0], "c": [0, 1, 2, 3]}


async def test_a_child_published_after_its_catalog_was_read_is_found_by_a_look(tmp_path: Path) -> None:
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with (
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as here,
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as there,
        ):
            parent = await here.sessions.create(SessionHeader(id="p", created_at=1))
            await parent.append([_catalog("late")])
            async with open_event_stream(here.query, "p", follow_interval=0.05) as stream:
                await _until(stream, items, "p", 0)
                late = await there.sessions.create(_child("late"))
                await late.append([_draft(), _draft()])
                await _until(stream, items, "late", 1)
                stream.finish()
                async for item in stream:
                    items.append(item)
    assert _seqs(items) == {"p": [0], "late": [0, 1]}


async def test_without_change_notification_logs_are_polled_and_an_idle_one_is_only_stat_ed() -> None:
    fs = CrashFs()  # an in-memory folder shared by two stores: no change notification
    here_store = _MemoryReads(fs)
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with (
            open_runtime("unused-here", log_store=here_store, clock=ScenarioClock()) as here,
            open_runtime(
                "unused-there", log_store=MemoryLogStore(fs=fs, compression="none"), clock=ScenarioClock()
            ) as there,
        ):
            assert here.query.log_watch() is None
            child = await there.sessions.create(_child("c"))
            await child.append([_draft()])
            parent = await here.sessions.create(SessionHeader(id="p", created_at=1))
            await parent.append([_catalog("c")])
            async with open_event_stream(here.query, "p", follow_interval=0.01) as stream:
                await _until(stream, items, "c", 0)
                reads = here_store.whole.get("c", 0) + here_store.after.get("c", 0)
                await here_store.wait_stats("c", 5)  # five looks at an idle log
                assert here_store.whole.get("c", 0) + here_store.after.get("c", 0) == reads  # never read
                await child.append([_draft()])
                await _until(stream, items, "c", 1)
                stream.finish()
                async for item in stream:
                    items.append(item)
    assert _seqs(items) == {"p": [0], "c": [0, 1]}
    assert here_store.whole["c"] == 1 and here_store.after["c"] >= 1


async def test_on_a_local_folder_a_change_notification_wakes_the_follower(tmp_path: Path) -> None:
    # A minute between looks: only the watch can bring the child's events within the guard.
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with (
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as here,
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as there,
        ):
            watch = here.query.log_watch()
            assert watch is not None and watch.vouches
            watch.close()
            child = await there.sessions.create(_child("c"))
            await child.append([_draft()])
            parent = await here.sessions.create(SessionHeader(id="p", created_at=1))
            await parent.append([_catalog("c")])
            async with open_event_stream(here.query, "p", follow_interval=60.0) as stream:
                await _until(stream, items, "c", 0)
                for n in range(1, 4):
                    await child.append([_draft()])
                    await _until(stream, items, "c", n)
                stream.finish()
                async for item in stream:
                    items.append(item)
    assert _seqs(items) == {"p": [0], "c": [0, 1, 2, 3]}


async def test_a_followed_log_damaged_by_hand_is_dropped_with_a_warning_and_the_rest_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _Reads(tmp_path)
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with (
            open_runtime(tmp_path, log_store=store, clock=ScenarioClock()) as here,
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as there,
        ):
            child = await there.sessions.create(_child("c"))
            await child.append([_draft()])
            await there.sessions.release("c")
            parent = await here.sessions.create(SessionHeader(id="p", created_at=1))
            await parent.append([_catalog("c")])
            async with open_event_stream(here.query, "p", follow_interval=0.01) as stream:
                await _until(stream, items, "c", 0)
                await store.wait_stats("c", 2)  # its mark is set: the damage is met past it
                with log_file(tmp_path, "c").open("ab") as f:
                    f.write(b'{"seq": 1, "type": "compaction/summary", "time": 1, "data": {}}\nnot json\n')
                # A look finds it damaged; the pump reads it whole (past its mark: damage) and drops it.
                await store.wait_whole_reads("c", 1)
                await parent.append([_draft()])  # the rest of the tree is streamed as before
                await _until(stream, items, "p", 1)
                stream.finish()
                async for item in stream:
                    items.append(item)
    assert _seqs(items) == {"p": [0, 1], "c": [0]}
    assert "session 'c' cannot be read, no longer followed" in caplog.text


async def test_a_read_past_a_mark_falls_back_to_a_whole_read_where_the_mark_is_no_boundary(tmp_path: Path) -> None:
    store = _Reads(tmp_path)
    async with open_runtime(tmp_path, log_store=store, clock=ScenarioClock()) as rt:
        ref = await rt.sessions.create(SessionHeader(id="c", created_at=1))
        await ref.append([_draft("a")])
        await ref.append([_draft("b"), _draft("c")])
        await rt.sessions.release("c")
        info = await rt.query.stat_many(["c"])
        assert isinstance(info[0], LogInfo) and info[0].event_count == 3
        size = info[0].revision.size

        async def seqs(start: int, after: tuple[int, int] | None) -> list[int]:
            _k, events = await rt.query.read_from("c", start, after=after)
            return [e.seq for e in events]

        assert await seqs(3, (size, 3)) == []  # the end: nothing past it, nothing read whole
        assert (store.whole.get("c", 0), store.after["c"]) == (0, 1)
        assert await seqs(2, (size - 5, 2)) == [2]  # mid-record: refused, read whole
        assert (store.whole["c"], store.after["c"]) == (1, 2)
        assert await seqs(1, (size, 3)) == [1, 2]  # a mark past `start` is not used
        assert (store.whole["c"], store.after["c"]) == (2, 2)


async def test_tail_follow_prints_what_another_process_appends(tmp_path: Path) -> None:
    from subagents.runtime.hosts.cli.operator import tail_command

    writer = FileLogStore(str(tmp_path), compression="none")
    handle = writer.create(SessionHeader(id="s", created_at=1))
    lines: list[dict[str, Any]] = []
    wrote = trio.Event()

    def write(data: bytes) -> None:
        lines.extend(json.loads(line) for line in data.splitlines())
        wrote.set()

    def append() -> None:
        writer.append(
            handle, [Batch(handle.next_seq, [make_event(handle.next_seq, "compaction/summary", 1, {"text": "x"})])]
        )

    async def until(n: int) -> None:
        nonlocal wrote
        while len(lines) < n:
            await wrote.wait()
            wrote = trio.Event()

    append()
    args = argparse.Namespace(root=str(tmp_path), store=None, session_id="s", follow=True)
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(tail_command, args, write=write))
            await until(1)
            for n in range(2, 5):
                append()  # by another store, as another process
                await until(n)
            nursery.cancel_scope.cancel()
    writer.close(handle)
    assert [line["seq"] for line in lines] == [0, 1, 2, 3]


@pytest.mark.pg
async def test_on_postgresql_a_child_written_by_another_host_is_polled_once_in_order(
    tmp_path: Path, pg_store_factory: Callable[..., Any]
) -> None:
    # PostgreSQL appends raise no notification: the follower polls (each look one `sessions`
    # row per followed session; the read from the cursor's seq).
    items: list[StreamEvent] = []
    here_store, there_store = pg_store_factory(), pg_store_factory()
    with trio.fail_after(GUARD):
        async with (
            open_runtime(tmp_path / "here", log_store=here_store, clock=ScenarioClock()) as here,
            open_runtime(tmp_path / "there", log_store=there_store, clock=ScenarioClock()) as there,
        ):
            assert here.query.log_watch() is None
            child = await there.sessions.create(_child("c"))
            await child.append([_draft()])
            parent = await here.sessions.create(SessionHeader(id="p", created_at=1))
            await parent.append([_draft(), _catalog("c")])
            async with open_event_stream(here.query, "p", follow_interval=0.02) as stream:
                await _until(stream, items, "c", 0)
                for n in range(1, 4):
                    await child.append([_draft(f"{n}")])
                    await _until(stream, items, "c", n)
                await child.append([_draft()])  # durable before `finish`: delivered too
                stream.finish()
                async for item in stream:
                    items.append(item)
            handle = here_store.open_read("c")
            stored = here_store.read(handle)
            here_store.close(handle)
    assert _seqs(items) == {"p": [0, 1], "c": [0, 1, 2, 3, 4]}
    assert [(i.event.seq, i.event.data) for i in items if i.session_id == "c"] == [(e.seq, e.data) for e in stored]


async def test_a_stream_whose_sessions_all_live_here_holds_no_watch_and_one_that_follows_closes_it(
    tmp_path: Path,
) -> None:
    with trio.fail_after(GUARD):
        async with (
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as here,
            open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as there,
        ):
            parent = await here.sessions.create(SessionHeader(id="p", created_at=1))
            await parent.append([_draft()])
            before = inotify_fds()
            async with open_event_stream(here.query, "p") as stream:
                await stream.receive()
                await trio.testing.wait_all_tasks_blocked()
                assert inotify_fds() == before  # inotify instances are a small per-user budget
                child = await there.sessions.create(_child("c"))
                await child.append([_draft()])
                await parent.append([_catalog("c")])
                items: list[StreamEvent] = []
                await _until(stream, items, "c", 0)
                await child.append([_draft()])
                await _until(stream, items, "c", 1)
                assert inotify_fds() == before + 1  # one per stream, whatever it follows
            assert inotify_fds() == before


@pytest.mark.parametrize("interval", [0, -1, float("nan"), "1", True, None])
async def test_a_follow_interval_that_is_not_a_positive_number_is_refused(tmp_path: Path, interval: Any) -> None:
    async with open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as rt:
        with pytest.raises(ValueError, match="follow_interval must be a positive number"):
            async with open_event_stream(rt.query, "p", follow_interval=interval):
                pass  # never reached: the stream refuses the interval as it opens
