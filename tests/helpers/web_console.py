"""What the web console's tests (tests/runtime/test_web*.py) build alike: session headers and
logs written, appended to and garbled on a folder or through any `LogStore`, the folder index's
checkpoint rows forgotten, the console's app
behind httpx's ASGI transport, and a real console on a loopback port with its URL."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import trio
from descriptors import descriptor
from events import turn_start_event
from starlette.types import ASGIApp
from subagents.runtime.hosts.web.app import WebSettings, build_app
from subagents.runtime.hosts.web.security import Access
from subagents.runtime.hosts.web.serve import allowed_hosts, serve_console
from subagents.runtime.read_side import open_read_side
from subagents.storage import Batch, Event, FileLogStore, LogStore, Offset, SessionHeader, SessionId, make_event
from subagents.storage.index import INDEX_NAME

TOKEN = "a-test-token-of-some-length"
BASE = "http://127.0.0.1:8765"  # what the ASGI client calls itself: no socket behind it
T0 = 1796131041000


def session_header(
    sid: str, parent: str | None = None, preset: str | None = None, depth: int | None = None
) -> SessionHeader:
    """A session made at `T0` in `/w`: a root, or (with `parent`) a subagent at depth 1 unless
    `depth` says otherwise; `preset` is its agent type."""
    return SessionHeader(
        id=SessionId(sid),
        created_at=T0,
        delegation_depth=depth if depth is not None else 0 if parent is None else 1,
        cwd="/w",
        parent_session=None if parent is None else SessionId(parent),
        origin=None if parent is None else "subagent",
        agent_preset=preset,
    )


def write_to(store: LogStore, head: SessionHeader, events: list[Event]) -> None:
    """A new log `head` holding `events` (from seq 0), through an open store."""
    handle = store.create(head)
    try:
        store.append(handle, [Batch(Offset(0), events)])
    finally:
        store.close(handle)


def append_to(store: LogStore, sid: str, events: list[Event]) -> None:
    """`events` (consecutive, from the log's next seq) appended to `sid`, as its writer."""
    handle = store.open_write(sid)
    try:
        store.append(handle, [Batch(Offset(events[0].seq), events)])
    finally:
        store.close(handle)


def write_log(root: Path, head: SessionHeader, events: list[Event]) -> None:
    """`write_to` through a store of its own on the folder `root` (another writer's, closed after)."""
    _on_folder(root, partial(write_to, head=head, events=events))


def append_log(root: Path, sid: str, events: list[Event]) -> None:
    """`append_to` through a store of its own on the folder `root` (another writer's, closed after)."""
    _on_folder(root, partial(append_to, sid=sid, events=events))


def _on_folder(root: Path, step: Callable[[LogStore], None]) -> None:
    store = FileLogStore(str(root), compression="none")
    try:
        step(store)
    finally:
        store.close_store()


def forget_checkpoints(root: Path, unit_key: str | None = None) -> None:
    """The folder's index forgets its checkpoint rows (of `unit_key` only, when given): what they
    held must be read again from the logs."""
    with sqlite3.connect(root / INDEX_NAME) as db:
        if unit_key is None:
            db.execute("DELETE FROM checkpoints")
        else:
            db.execute("DELETE FROM checkpoints WHERE unit_key = ?", (unit_key,))


def garble_tail(root: Path, sid: str, seq: int) -> None:
    """A line that is no record, after the log's last one (a torn or foreign write)."""
    [log] = (root / "sessions" / sid).glob("session.jsonl*")
    with log.open("ab") as out:
        out.write(b'{"seq": %d, "type": garbled\n' % seq)


def write_lead_and_kid(root: Path) -> None:
    """`lead` (a turn begun, its catalog naming `kid`) and `kid` (its descriptor, label "the kid")."""
    catalog = {
        "version": 1,
        "child_id": "kid",
        "child_created_at": T0,
        "mode": "continuable",
        "label": "the kid",
        "call_id": "call_1",
    }
    write_log(
        root, session_header("lead"), [turn_start_event(0, T0), make_event(1, "subagent/catalog", T0 + 1, catalog)]
    )
    write_log(root, session_header("kid", "lead"), [make_event(0, "subagent/descriptor", T0, descriptor("the kid"))])


def console_settings(root: Path, **changes: object) -> WebSettings:
    """The console's settings over `root`: the test token, loopback hosts, `changes` on top."""
    base: dict[str, object] = {
        "root": str(root),
        "access": Access(TOKEN),
        "hosts": allowed_hosts("127.0.0.1"),
    }
    return WebSettings(**{**base, **changes})


@asynccontextmanager
async def app_client(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client calling `app` in this task, through the ASGI transport."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
        yield client


@asynccontextmanager
async def asgi_client(root: Path, **changes: object) -> AsyncIterator[httpx.AsyncClient]:
    """An ASGI client of the console's app over a read side on the folder `root` (`changes` as
    `console_settings`)."""
    async with open_read_side(str(root)) as side, app_client(build_app(side, console_settings(root, **changes))) as c:
        yield c


@asynccontextmanager
async def served(root: Path, *, live_interval: float | None = None) -> AsyncIterator[str]:
    """The console over the folder `root` on a loopback port (Hypercorn's Trio worker), writable,
    with the test token; its one URL once it listens. Stopped on leaving."""
    pulse = {} if live_interval is None else {"live_interval": live_interval}
    urls: list[str] = []
    start = partial(
        serve_console,
        root=str(root),
        store=None,
        host="127.0.0.1",
        port=0,
        access=Access(TOKEN),
        read_only=False,
        stall_after=300.0,
        ready=urls.extend,
        **pulse,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: start(task_status=task_status))
        [url] = urls
        yield url
        nursery.cancel_scope.cancel()


def table_row(body: str, marker: str) -> str:
    """The table row of a page that holds the first `marker` (a link, say)."""
    start = body.index(marker)
    return body[body.rindex("<tr", 0, start) : body.index("</tr>", start)]


async def next_event(lines: AsyncIterator[str]) -> tuple[str, dict[str, object]]:
    """The next server-sent event: its name (`message` when it has none) and its data."""
    name = "message"
    async for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            return name, json.loads(line.removeprefix("data: "))
    raise AssertionError("the stream ended")


async def next_data(lines: AsyncIterator[str]) -> dict[str, object]:
    """The next server-sent event's data, whatever its name."""
    return (await next_event(lines))[1]
