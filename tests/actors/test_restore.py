"""Projection checkpoints (SPEC 3.5): written over durable prefixes, restored by `open`.

Real files (the index is `<root>/index.sqlite3`) or a real PostgreSQL (its `checkpoints` table):
the tests whose subject is the checkpoint contract run on both (the `place` fixture; issue 18),
so the real clock (or virtual time moved by hand); nothing sleeps. In memory only: the hung
storage call given up after a bounded wait (`autojump_clock`: virtual time needs in-memory IO;
its subject is the session store's stop, the store only hangs) and the cadence argument checks
(no store involved).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pg_damage
import trio
import trio.testing
from backends import Backend
from clocks import ticking_ms
from drafts import turn_start
from log_lines import encode_header, header, wire
from places import Place
from subagents.actors import EventDraft, open_session_store
from subagents.storage import AlreadyOwned, Batch, FileLogStore, ProjectionRegistry, SessionHeader, make_event


@attrs.define
class Counter:
    """Counts events; its state is plain JSON."""

    key: str = "count"
    state_version: int = 1
    view: Any = staticmethod(lambda state: state)

    def initial(self, header: SessionHeader, inherited_event_count: int) -> int:
        return 0

    def apply(self, state: int, event: Any) -> int:
        return state + 1


@attrs.define
class Turns:
    key: str = "turns"
    state_version: int = 1
    view: Any = staticmethod(lambda state: state)

    def initial(self, header: SessionHeader, inherited_event_count: int) -> int:
        return 0

    def apply(self, state: int, event: Any) -> int:
        return state + 1 if event.type == "turn/end" else state


now_ms = ticking_ms()


def turn(n: int, steps: int) -> list[EventDraft]:
    drafts = [turn_start(n)]
    for s in range(steps):
        drafts += [
            EventDraft(type="step/start", data={"turn": n, "step": s}),
            EventDraft(type="step/end", data={"turn": n, "step": s}),
        ]
    return drafts + [EventDraft(type="turn/end", data={"turn": n, "reason": {"kind": "completed"}})]


def append_behind_the_actors(place: Place, sid: str, count: int) -> None:
    """Events written by another writer that never checkpoints (after a release)."""
    store = place.store()
    handle = store.open_write(sid)
    start = handle.next_seq
    events = [make_event(start + i, "turn/start", 1, {"turn": 100 + i}) for i in range(count)]
    store.append(handle, [Batch(start, events)])
    store.close(handle)


async def test_open_folds_only_the_events_after_the_checkpoint(place: Place) -> None:
    units = [Counter(), Turns()]
    log_store = place.store()
    async with open_session_store(log_store, ProjectionRegistry(units), now_ms=now_ms) as store:
        ref = await store.create(header("s", 1))
        await ref.append(turn(1, 2))  # 6 events, ends a turn: checkpointed
        await store.release("s")  # writes the final checkpoint (seq 5) and frees the lock
    append_behind_the_actors(place, "s", 7)

    log_store = place.store()
    async with open_session_store(log_store, ProjectionRegistry(units), now_ms=now_ms) as store:
        ref = await store.open("s")
        assert store.last_open_folds == 7 * len(units)  # only the events after the checkpoint
        assert await ref.snapshot() == {"count": 13, "turns": 1}


async def test_a_bumped_state_version_discards_its_rows(place: Place) -> None:
    log_store = place.store()
    async with open_session_store(log_store, ProjectionRegistry([Counter(), Turns()]), now_ms=now_ms) as store:
        ref = await store.create(header("s", 1))
        await ref.append(turn(1, 1))  # 4 events
        await ref.append(turn(2, 1))  # 8
    append_behind_the_actors(place, "s", 2)

    bumped = [Counter(state_version=2), Turns()]
    log_store = place.store()
    async with open_session_store(log_store, ProjectionRegistry(bumped), now_ms=now_ms) as store:
        ref = await store.open("s")
        # The bumped unit refolds all 10 events; the other keeps its row and folds the last 2.
        assert store.last_open_folds == 10 + 2
        assert await ref.snapshot() == {"count": 10, "turns": 2}


async def test_a_recreated_id_never_uses_the_old_rows(place: Place) -> None:
    units = [Counter(), Turns()]
    log_store = place.store()
    async with open_session_store(log_store, ProjectionRegistry(units), now_ms=now_ms) as store:
        ref = await store.create(header("s", 1))
        await ref.append(turn(1, 3))  # 8 events, checkpointed
    # The same id again, another lifecycle, written by a writer that never checkpoints. On
    # PostgreSQL a session's rows cannot go while checkpoint rows name it (a foreign key): its
    # header and batch rows are replaced by hand instead, the checkpoint rows left as they were
    # (the store's triggers, which would forget them, held off).
    again = [make_event(i, "turn/start", 1, {"turn": i}) for i in range(3)]
    if place.url is not None:
        new_log = encode_header(header("s", 2)) + b"".join(wire(again))
        pg_damage.rewrite(place.url, "s", lambda _: new_log, keep_checkpoints=True)
    else:
        shutil.rmtree(place.root / "sessions" / "s")
        raw = place.store()
        handle = raw.create(header("s", 2))
        raw.append(handle, [Batch(0, again)])
        raw.close(handle)
    stale = place.store().read_checkpoint("s", header("s", 1), 0)
    assert stale is not None and stale[0]["count"].val == 8  # the old rows are still there

    log_store = place.store()
    async with open_session_store(log_store, ProjectionRegistry(units), now_ms=now_ms) as store:
        ref = await store.open("s")
        assert store.last_open_folds == 3 * len(units)  # folded from the start, rows unused
        assert await ref.snapshot() == {"count": 3, "turns": 0}


@attrs.define
class LastTurn:
    """The number of the last turn started (what an edit of a `turn/start` line changes)."""

    key: str = "last_turn"
    state_version: int = 1
    view: Any = staticmethod(lambda state: state)

    def initial(self, header: SessionHeader, inherited_event_count: int) -> int:
        return 0

    def apply(self, state: int, event: Any) -> int:
        return msgspec.json.decode(event.data)["turn"] if event.type == "turn/start" else state


async def test_a_log_edited_in_place_never_restores_the_old_rows(tmp_path: Path) -> None:
    """A log edited in place after its last checkpoint (the same inode, size and event count,
    as an editor that writes in place leaves it): `open` folds it from the start. Its rows
    cover its old content "whole", and `read_after` at their offset (the end) finds nothing
    to contradict them: only the revision tells (the index forgets them when it rescans)."""
    units = [LastTurn(), Counter()]
    async with open_session_store(
        FileLogStore(str(tmp_path), compression="none"), ProjectionRegistry(units), now_ms=now_ms
    ) as store:
        ref = await store.create(header("s", 1))
        await ref.append(turn(1, 2))  # 6 events, ends a turn: checkpointed
        await store.release("s")
    log = tmp_path / "sessions" / "s" / "session.jsonl"
    lines = log.read_bytes().split(b"\n")
    (start,) = [i for i, line in enumerate(lines) if b'"turn/start"' in line]
    assert lines[start].count(b'"turn":1') == 1
    lines[start] = lines[start].replace(b'"turn":1', b'"turn":7')
    before = log.stat()
    log.write_bytes(b"\n".join(lines))  # in place: the same inode and size
    after = log.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    # (A later mtime, as any edit after the clock's next tick has: the revision changed.)
    os.utime(log, ns=(after.st_atime_ns, max(after.st_mtime_ns, before.st_mtime_ns + 1_000_000)))

    async with open_session_store(
        FileLogStore(str(tmp_path), compression="none"), ProjectionRegistry(units), now_ms=now_ms
    ) as store:
        ref = await store.open("s")
        assert await ref.snapshot() == {"last_turn": 7, "count": 6}
        assert store.last_open_folds == 6 * len(units)  # folded from the start, rows unused


async def test_release_checkpoints_and_frees_the_lock(place: Place) -> None:
    units = [Counter(), Turns()]
    log_store = place.store()
    other = place.store()
    async with open_session_store(log_store, ProjectionRegistry(units), now_ms=now_ms) as store:
        ref = await store.create(header("s", 1))
        await ref.append([turn_start(1)] * 1)  # no turn end
        try:
            other.open_write("s")
        except AlreadyOwned:
            pass
        else:
            raise AssertionError("a second writer opened a live session")
        await ref.append([turn_start(2)])
        await store.release("s")
        handle = other.open_write("s")  # the lock is free
        other.close(handle)
    found = other.read_checkpoint("s", header("s", 1), 0)
    assert found is not None
    rows, offset = found
    assert {key: (row.seq, row.val) for key, row in rows.items()} == {"count": (1, 2), "turns": (1, 0)}
    if place.is_pg:
        assert offset == 2  # the event count the rows cover: where `read_after` continues
    else:
        assert offset == (place.root / "sessions" / "s" / "session.jsonl.zst").stat().st_size


async def test_an_idle_dirty_session_checkpoints_after_the_interval(backend: Backend, mock_clock: Any) -> None:
    # Virtual time moved by hand (never on its own: real IO runs in worker threads), so the
    # same test runs in memory and on PostgreSQL; it waits on the actor, never on time.
    log_store = backend.store

    async def idle_for(seconds: float) -> None:
        mock_clock.jump(seconds)
        await trio.testing.wait_all_tasks_blocked()  # the actor saw the time (and is at work or idle)

    async with open_session_store(log_store, ProjectionRegistry([Counter()]), now_ms=now_ms) as store:
        ref = await store.create(header("s", 1))
        await ref.append([turn_start(1)])  # published: checkpointed
        await ref.append([turn_start(2)])  # dirty, no turn end
        await ref.flush()
        actor = store._actors["s"]
        assert actor.checkpoints == 1
        await idle_for(actor.checkpoint_interval - 1)
        await ref.flush()
        assert actor.checkpoints == 1  # not yet
        await idle_for(2)
        await ref.flush()
        assert actor.checkpoints == 2
        found = log_store.read_checkpoint("s", header("s", 1), 0)
        assert found is not None and found[0]["count"].val == 2
        await idle_for(actor.checkpoint_interval * 3)  # clean: nothing more to write
        await ref.flush()
        assert actor.checkpoints == 2


async def test_a_released_session_reopens_without_reading_its_log(place: Place) -> None:
    from subagents.storage import OsFs
    from subagents.storage.testing import FaultyLogStore

    class CountingFs(OsFs):
        def __init__(self, root: str) -> None:
            super().__init__(root)
            self.read_bytes = 0

        def open(self, path: str, mode: Any) -> Any:
            file = super().open(path, mode)
            fs = self

            class Counted:
                def __getattr__(self, name: str) -> Any:
                    return getattr(file, name)

                def pread(self, offset: int, size: int) -> bytes:
                    data = file.pread(offset, size)
                    if path.endswith(".zst"):
                        fs.read_bytes += len(data)
                    return data

            return Counted()

    units = [Counter(), Turns()]
    async with open_session_store(place.store(), ProjectionRegistry(units), now_ms=now_ms) as store:
        ref = await store.create(header("s", 1))
        for n in range(1, 30):
            await ref.append(turn(n, 3))
        await store.release("s")  # its checkpoint also records the index row: no listing ran

    fs = CountingFs(str(place.root))
    counted = FaultyLogStore(place.store() if place.is_pg else FileLogStore(fs=fs))  # no rules: counts calls
    async with open_session_store(counted, ProjectionRegistry(units), now_ms=now_ms) as store:
        ref = await store.open("s")
        assert store.last_open_folds == 0
        # Neither validated again nor folded: the checkpoint answers (on files with the index
        # row; only the header record and the 32-byte anchor are read to prove the file is the
        # row's log); no batch of events is read.
        assert counted.calls["read"] == 0
        if not place.is_pg:
            size = (place.root / "sessions" / "s" / "session.jsonl.zst").stat().st_size
            assert fs.read_bytes <= 256 < size // 10
        assert await ref.snapshot() == {"count": 29 * 8, "turns": 29}
        assert ref.is_own_seq(29 * 8 - 1) and not ref.is_own_seq(29 * 8)


async def test_after_release_another_process_can_open_the_session_for_writing(place: Place) -> None:
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from subagents.storage import FileLogStore, AlreadyOwned\n"
        "if sys.argv[1].startswith('postgresql:'):\n"
        "    from subagents.storage.pg_store import PostgresLogStore as FileLogStore\n"
        "store = FileLogStore(sys.argv[1])\n"
        "try:\n"
        "    handle = store.open_write('s')\n"
        "except AlreadyOwned:\n"
        "    print('owned')\n"
        "else:\n"
        "    print('opened', handle.next_seq)\n"
    )

    def other_process() -> str:
        where = place.url or str(place.root)
        done = subprocess.run([sys.executable, "-c", script, where], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    async with open_session_store(place.store(), ProjectionRegistry([Counter()]), now_ms=now_ms) as store:
        ref = await store.create(header("s", 1))
        await ref.append(turn(1, 1))
        assert await trio.to_thread.run_sync(other_process) == "owned"
        await store.release("s")
        assert await trio.to_thread.run_sync(other_process) == "opened 4"


async def test_leaving_the_store_gives_up_on_a_hung_storage_call(autojump_clock: Any) -> None:
    # Stop = cancel after a bounded wait: a hung append is abandoned (its request fails, never
    # acknowledged) and the block still ends. Virtual time makes the bound pass at once.
    from subagents.actors import ActorStopped
    from subagents.storage.testing import FaultyLogStore, MemoryLogStore

    faulty = FaultyLogStore(MemoryLogStore())
    outcome: list[BaseException] = []
    try:
        async with trio.open_nursery() as outer:
            async with open_session_store(faulty, ProjectionRegistry([Counter()]), now_ms=now_ms) as store:
                ref = await store.create(header("s", 1))
                await ref.append([turn_start(1)])
                await ref.flush()
                faulty.hang("append")

                async def hung_append() -> None:
                    try:
                        await ref.append([turn_start(2)])
                    except ActorStopped as exc:
                        outcome.append(exc)

                outer.start_soon(hung_append)
                await trio.testing.wait_all_tasks_blocked()
    finally:
        faulty.release()  # let the abandoned worker thread finish
    assert len(outcome) == 1 and "did not answer" in str(outcome[0])


async def test_checkpoints_come_every_n_events_and_at_each_turn_end_alone(place: Place) -> None:
    """SPEC 4: after publication, every `checkpoint_every` events, and at every turn end — each
    on its own (no release, no timer)."""
    async with open_session_store(
        place.store(compression="none"),
        ProjectionRegistry([Counter()]),
        now_ms=now_ms,
        checkpoint_every=5,
        checkpoint_interval=None,
    ) as store:
        ref = await store.create(header("s", 1))
        actor = store._actors["s"]
        # Checkpoints follow the acks; a flush is served after the checkpoint an append led to.
        await ref.append([turn_start(1)])  # publication
        await ref.flush()
        assert actor.checkpoints == 1
        written = []
        for i in range(12):
            await ref.append([EventDraft(type="step/start", data={"turn": 1, "step": i})])
            await ref.flush()
            written.append(actor.checkpoints)
        assert written == [1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3]  # after the 5th and 10th event
        await ref.append([EventDraft(type="turn/end", data={"turn": 1, "reason": {"kind": "completed"}})])
        await ref.flush()
        assert actor.checkpoints == 4  # a turn end, 3 events after the last one
        await ref.append([turn_start(2)])
        await ref.flush()
        assert actor.checkpoints == 4
        found = place.store(compression="none").read_checkpoint("s", header("s", 1), 0)
        assert found is not None and found[0]["count"].seq == 13  # the turn end's checkpoint


async def test_a_checkpoint_whose_offset_does_not_hold_the_next_record_is_not_trusted(place: Place) -> None:
    """SPEC 3.5: restore checks that the record at `log_offset` has seq `seq + 1` (or is the
    end); anything else folds the log from the start — with the same result. (On PostgreSQL
    `log_offset` is the event count the rows cover; the rows are moved by hand, pg_damage.)"""
    import sqlite3

    def offsets() -> set[int]:
        if place.url is not None:
            return {row[4] for row in pg_damage.checkpoint_rows(place.url)}
        with sqlite3.connect(place.root / "index.sqlite3") as con:
            return {offset for (offset,) in con.execute("select log_offset from checkpoints")}

    def move(offset: int) -> None:
        if place.url is not None:
            pg_damage.set_checkpoint_offsets(place.url, offset)
            return
        with sqlite3.connect(place.root / "index.sqlite3") as con:
            con.execute("update checkpoints set log_offset=?", (offset,))

    async with open_session_store(
        place.store(compression="none"), ProjectionRegistry([Counter()]), now_ms=now_ms
    ) as store:
        ref = await store.create(header("s", 1))
        for n in range(1, 4):
            await ref.append(turn(n, 2))
        await ref.append([turn_start(4)])
        await store.release("s")
    (good,) = offsets()
    for offset, folds_from_start in ((good, False), (5, True), (good - 7, True), (good + 3, True)):
        move(offset)
        async with open_session_store(
            place.store(compression="none"), ProjectionRegistry([Counter()]), now_ms=now_ms
        ) as store:
            ref = await store.open("s")
            total = await ref.flush()
            assert await ref.snapshot() == {"count": total}, offset
            assert (store.last_open_folds == total) is folds_from_start, (offset, store.last_open_folds)
            await store.release("s")


async def test_the_checkpoint_cadence_is_checked() -> None:
    import pytest
    from subagents.storage.testing import MemoryLogStore

    for bad in (
        {"checkpoint_every": 0},
        {"checkpoint_interval": 0},
        {"checkpoint_interval": -1.0},
        {"checkpoint_every": "3"},
        {"checkpoint_every": 2.0},
        {"checkpoint_every": True},
        {"checkpoint_interval": float("nan")},
        {"checkpoint_interval": float("inf")},
        {"checkpoint_interval": "30"},
    ):
        with pytest.raises(ValueError, match="checkpoint_every must be an int >= 1"):
            async with open_session_store(MemoryLogStore(), ProjectionRegistry([Counter()]), now_ms=now_ms, **bad):
                raise AssertionError("accepted")
