"""The event stream (SPEC §8): every durable event of a session and its descendants, in seq
order per session, delivered once each and only once durable — children that start while it
runs included, nothing lost when it subscribes late from seq 0 or its consumer is slow.

Real files (plain logs, read back to compare) and the real Trio clock; the scripted model orders
the agents with `wait_for`; `trio.fail_after` only guards against hangs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing
from log_lines import plain_records
from scripts import BACKGROUND_CHILD
from subagents.actors import DurableFeed
from subagents.runtime import StreamEvent, open_event_stream, open_runtime
from subagents.runtime.foundation.clock import ScenarioClock
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.hosts.run_output import stream_usage
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.storage import Batch, Event, FileLogStore, Offset, WriteHandle, make_event

GUARD = 20.0

SCRIPT = BACKGROUND_CHILD


def model() -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps(SCRIPT)))


def disk_records(root: Path, session_id: str) -> list[dict[str, Any]]:
    _header, *events = plain_records(root, session_id)
    return events


def by_session(items: Sequence[StreamEvent]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        record = item.to_json()
        assert record.pop("session_id") == item.session_id
        out.setdefault(item.session_id, []).append(record)
    return out


def assert_whole_tree(root: Path, items: Sequence[StreamEvent], parent: str) -> None:
    """Every event of the parent and of its one child, once, in seq order, equal to the log."""
    got = by_session(items)
    assert set(got) == {parent, "child-1"}
    for session_id, records in got.items():
        assert records == disk_records(root, session_id), session_id


async def collect(stream: Any, into: list[StreamEvent]) -> None:
    async for item in stream:
        into.append(item)


async def test_a_live_run_streams_every_durable_event_of_the_tree_in_order(tmp_path: Path) -> None:
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with open_runtime(
            tmp_path, model=model(), clock=ScenarioClock(), id_factory=CountingIds("child"), compression="none"
        ) as rt:
            agent = await rt.agents.create(session_id="parent")
            async with open_event_stream(rt.query, "parent") as stream:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(collect, stream, items)
                    await agent.send("go")
                    result = await rt.subagents.wait_tree_idle(agent)
                    stream.finish()
    assert result is not None and result.text == "NOTED"
    assert_whole_tree(tmp_path, items, "parent")
    # The child started while the stream ran: its catalog comes before its first streamed event.
    order = [(i.session_id, i.event.type) for i in items]
    assert order.index(("parent", "subagent/catalog")) < order.index(("child-1", "turn/start"))
    usage = stream_usage(items)
    assert (usage.input_tokens, usage.output_tokens, usage.calls, usage.reported) == (65, 10, 4, 4)
    # The JSON record is the log line plus the session id, first.
    first = items[0].json_bytes()
    assert first.startswith(b'{"session_id":"parent","seq":0,')


async def test_a_late_subscriber_from_seq_0_misses_nothing(tmp_path: Path) -> None:
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with open_runtime(
            tmp_path, model=model(), clock=ScenarioClock(), id_factory=CountingIds("child"), compression="none"
        ) as rt:
            agent = await rt.agents.create(session_id="parent")
            await agent.send("go")
            await rt.subagents.wait_tree_idle(agent)
            # Everything is written (the child's Activation is gone): the stream reads it all.
            async with open_event_stream(rt.query, "parent") as stream:
                stream.finish()
                await collect(stream, items)
    assert_whole_tree(tmp_path, items, "parent")


async def test_without_descendants_the_root_alone_and_no_child_log_is_read(tmp_path: Path) -> None:
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with open_runtime(
            tmp_path, model=model(), clock=ScenarioClock(), id_factory=CountingIds("child"), compression="none"
        ) as rt:
            agent = await rt.agents.create(session_id="parent")
            await agent.send("go")
            await rt.subagents.wait_tree_idle(agent)
            reads: list[str] = []
            real_read = rt.log_store.open_read

            def counting_open_read(session_id: str) -> Any:
                reads.append(session_id)
                return real_read(session_id)

            rt.log_store.open_read = counting_open_read  # type: ignore[method-assign]  # counts the stream's log reads
            async with open_event_stream(rt.query, "parent", descendants=False) as stream:
                stream.finish()
                await collect(stream, items)
    assert {item.session_id for item in items} == {"parent"}
    assert by_session(items)["parent"] == disk_records(tmp_path, "parent")
    assert "child-1" not in reads


async def test_a_slow_consumer_with_tiny_buffers_still_gets_everything_once(tmp_path: Path) -> None:
    # A feed buffer of one event overflows at once: the pump re-reads lagged sessions from the
    # log; the consumer reads nothing until the run is over (the runtime never waits for it).
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with open_runtime(
            tmp_path, model=model(), clock=ScenarioClock(), id_factory=CountingIds("child"), compression="none"
        ) as rt:
            agent = await rt.agents.create(session_id="parent")
            async with open_event_stream(rt.query, "parent", buffer=1, feed_capacity=1) as stream:
                await agent.send("go")
                await rt.subagents.wait_tree_idle(agent)
                stream.finish()
                await collect(stream, items)
    assert_whole_tree(tmp_path, items, "parent")


async def test_from_a_later_seq_only_what_comes_next_and_existing_children_only_when_they_act(
    tmp_path: Path,
) -> None:
    items: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with open_runtime(
            tmp_path, model=model(), clock=ScenarioClock(), id_factory=CountingIds("child"), compression="none"
        ) as rt:
            agent = await rt.agents.create(session_id="parent")
            await agent.send("go")
            await rt.subagents.wait_tree_idle(agent)
            start = agent.session.durable_next
            async with open_event_stream(rt.query, "parent", from_seq=start) as stream:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(collect, stream, items)
                    # The old child is history: appending to its log (as a resume would) is news.
                    child = await rt.sessions.open("child-1")
                    await child.append([_draft()])
                    await agent.session.append([_draft()])
                    stream.finish()
    got = by_session(items)
    assert [r["seq"] for r in got["parent"]] == [start]
    child_events = disk_records(tmp_path, "child-1")
    assert got["child-1"] == child_events[-1:]


def _draft() -> Any:
    from subagents.actors import EventDraft

    return EventDraft(type="compaction/summary", data={"text": "x"})


class _SlowFsyncStore(FileLogStore):
    """A file store whose appends, once armed, write their bytes and then hold — with the handle
    not yet advanced — until released: a write whose fsync has not finished."""

    def __init__(self, root: Path) -> None:
        super().__init__(str(root), compression="none")
        self.armed = False
        self.holding = threading.Event()
        self.release = threading.Event()

    def append(self, handle: WriteHandle, batches: Sequence[Batch]) -> Offset:
        before = handle.next_seq
        nxt = super().append(handle, batches)
        if self.armed:
            handle.next_seq = before  # the bytes are in the file; "its fsync" is not done
            self.holding.set()
            self.release.wait(GUARD)
            handle.next_seq = nxt
        return nxt


async def test_an_event_is_never_streamed_before_it_is_durable(tmp_path: Path) -> None:
    store = _SlowFsyncStore(tmp_path)
    early: list[StreamEvent] = []
    late: list[StreamEvent] = []
    with trio.fail_after(GUARD):
        async with open_runtime(tmp_path, log_store=store, model=model(), clock=ScenarioClock()) as rt:
            ref = await rt.sessions.create(_header("s"))
            await ref.append([_draft()])
            async with open_event_stream(rt.query, "s") as live:
                assert (await live.receive()).event.seq == 0
                store.armed = True
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ref.append, [_draft()])
                    await trio.to_thread.run_sync(store.holding.wait, GUARD)
                    # Seq 1 is in the file but not durable: neither the live stream nor a new
                    # one that reads the log from seq 0 may show it.
                    async with open_event_stream(rt.query, "s") as fresh:
                        early.append(await fresh.receive())
                        await trio.testing.wait_all_tasks_blocked()
                        early.extend(_ready(fresh))
                    early.extend(_ready(live))
                    store.armed = False
                    store.release.set()
                late.append(await live.receive())
    assert [(i.session_id, i.event.seq) for i in early] == [("s", 0)]
    assert [(i.session_id, i.event.seq) for i in late] == [("s", 1)]


def _ready(stream: Any) -> list[StreamEvent]:
    """What the stream has delivered and nobody has received yet."""
    out = []
    while True:
        try:
            out.append(stream.receive_nowait())
        except trio.WouldBlock:
            return out


def _header(session_id: str) -> Any:
    from subagents.storage import SessionHeader

    return SessionHeader(id=session_id, created_at=1)


def test_a_full_feed_buffer_drops_the_push_and_marks_the_session_lagged() -> None:
    feed = DurableFeed()
    events = [make_event(i, "compaction/summary", 1, {"text": "x"}) for i in range(3)]
    assert all(type(e) is Event for e in events)
    with feed.subscribe(2) as sub:
        feed.publish("a", 0, events[:2])
        feed.publish("b", 0, events[:1])  # would be the third event: dropped
        feed.publish("a", 0, [])  # nothing durable: nothing pushed
        batches, lagged = sub.take()
        assert [(b.session_id, len(b.events)) for b in batches] == [("a", 2)]
        assert lagged == {"b"}
        assert sub.take() == ([], set())
    feed.publish("a", 0, events)  # no subscriber: nothing kept


async def test_a_fork_child_with_and_without_its_inherited_prefix(tmp_path: Path) -> None:
    from subagents.actors import EventDraft
    from subagents.storage import SessionHeader

    def catalog(child: str) -> Any:
        data = {"version": 1, "child_id": child, "child_created_at": 2, "mode": "continuable", "label": "f"}
        return EventDraft(type="subagent/catalog", data=data)

    async def collect_all(rt: Any, root: str = "p", **options: Any) -> dict[str, list[int]]:
        items: list[StreamEvent] = []
        async with open_event_stream(rt.query, root, **options) as stream:
            stream.finish()
            await collect(stream, items)
        return {sid: [r["seq"] for r in records] for sid, records in by_session(items).items()}

    with trio.fail_after(GUARD):
        async with open_runtime(tmp_path, clock=ScenarioClock(), compression="none") as rt:
            parent = await rt.sessions.create(SessionHeader(id="p", created_at=1))
            # The parent's own catalog of an older child: a fork inherits it, but it is not the
            # fork's child — the stream must not follow it from the fork.
            await parent.append([_draft(), catalog("old"), _draft()])
            old = await rt.sessions.create(
                SessionHeader(id="old", created_at=2, parent_session="p", origin="subagent", delegation_depth=1)
            )
            await old.append([_draft()])
            fork = await rt.sessions.fork(
                parent,
                Offset(3),
                SessionHeader(
                    id="f", created_at=2, parent_session="p", origin="subagent", delegation_depth=1, is_seeded=True
                ),
            )
            await fork.append([_draft()])
            await parent.append([catalog("f")])
            whole = await collect_all(rt)
            own = await collect_all(rt, inherited=False)
            from_fork = await collect_all(rt, "f")
    assert whole == {"p": [0, 1, 2, 3], "old": [0], "f": [0, 1, 2, 3, 4]}
    assert own == {"p": [0, 1, 2, 3], "old": [0], "f": [3, 4]}  # from the end-seed marker
    # The catalog the fork inherited names its parent's child, not its own.
    assert from_fork == {"f": [0, 1, 2, 3, 4]}


def test_stream_usage_counts_own_replies_only() -> None:
    def reply(seq: int, tokens: int) -> Event:
        message = {"id": f"m{seq}", "role": "assistant", "content": [], "source": {"kind": "model"}}
        data = {"turn": 1, "step": 1, "message": message, "finish": "stop"}
        data["usage"] = {"input_tokens": tokens, "output_tokens": 1}
        return make_event(seq, "assistant/message", 1, data, surface_op="append")

    items = [
        StreamEvent("parent", reply(0, 10)),
        StreamEvent("fork", reply(0, 10), 2),  # the fork's copy of the parent's reply
        StreamEvent("fork", reply(3, 7), 2),
    ]
    usage = stream_usage(items)
    assert (usage.input_tokens, usage.output_tokens, usage.calls) == (17, 2, 2)
