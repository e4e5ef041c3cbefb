"""Liveness in every listing (issue 29 item 4): each child row carries when its last durable
event was written (`last_event`), who runs it (`runner`), whether its last turn is open, and
`stalled` (it runs, its open turn made no durable progress for `stall_after`) or `orphaned`
(its turn is open and nobody runs it: no lock holder, lease expired) — never `running`.

Computed from what the listing reads anyway (the corpus's store rows, checkpoint rows, live
cells, lock and lease probes): the call counts below prove no log read was added. `stalled`
comes from an injected clock (`now_ms`), never from waiting; on PostgreSQL a lease "expires"
by an UPDATE of its `expires_at`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from descriptors import descriptor
from drafts import descriptor_draft, turn_start
from events import turn_end_event
from log_lines import header, persist_log, read_all
from subagents.actors import open_session_store
from subagents.runtime import SUBAGENT_UNITS, open_runtime
from subagents.runtime.delegation.agents_text import render_agents, state_word
from subagents.runtime.delegation.listing import ChildRow, ListingService
from subagents.runtime.delegation.listing_rows import ELSEWHERE, HERE, turn_is_open, with_stall
from subagents.runtime.query import SessionQuery
from subagents.storage import FileLogStore, LogStore, ProjectionRegistry, make_event
from subagents.storage.testing import FaultyLogStore

STALL = 300_000  # the default stall_after, in ms
GUARD = 15.0


def _row(**changes: Any) -> ChildRow:
    base: dict[str, Any] = {"id": "c", "activity": "inactive", "has_children": False, "mode": "continuable"}
    return ChildRow(**(base | changes))


# --- the pure parts: tables ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "status", "word"),
    [
        (_row(), "ready", "ready"),
        (_row(liveness="orphaned", turn_open=True), "ready", "orphaned"),
        (_row(liveness="orphaned", turn_open=True, mode="one-shot"), "ready", "orphaned"),  # not `done`
        (_row(liveness="orphaned", turn_open=True, stopped=True), "ready", "stopped"),  # stays stopped
        (_row(activity="running", runner=HERE, turn_open=True), "running", "running"),
        (_row(activity="running", runner=HERE, turn_open=True, liveness="stalled"), "running", "stalled"),
        (_row(activity="running", runner=HERE, liveness="stalled"), "idle", "idle"),  # not running a turn
        (_row(stopped=True), "ready", "stopped"),
        (_row(mode="one-shot"), "ready", "done"),
    ],
)
def test_state_words(row: ChildRow, status: str, word: str) -> None:
    assert state_word(row, status) == word


@pytest.mark.parametrize(
    ("changes", "now", "stalled"),
    [
        ({"runner": HERE, "turn_open": True, "last_event": 1_000}, 1_000 + STALL, False),  # exactly stall_after
        ({"runner": HERE, "turn_open": True, "last_event": 1_000}, 1_001 + STALL, True),
        ({"runner": ELSEWHERE, "turn_open": True, "last_event": 1_000}, 1_001 + STALL, True),
        ({"runner": HERE, "turn_open": False, "last_event": 1_000}, 1_001 + STALL, False),  # idle, not stuck
        ({"runner": None, "turn_open": True, "last_event": 1_000, "liveness": "orphaned"}, 9 * STALL, False),
        ({"runner": HERE, "turn_open": True, "last_event": None}, 9 * STALL, False),  # nothing durable yet
        ({"runner": HERE, "turn_open": True, "last_event": 5 * STALL}, 0, False),  # a clock behind the log's
    ],
)
def test_with_stall(changes: dict[str, Any], now: int, stalled: bool) -> None:
    row = _row(**changes)
    marked = with_stall(row, now, STALL)
    assert (marked.liveness == "stalled") is stalled
    assert marked is row or stalled


@pytest.mark.parametrize(
    ("view", "open_"),
    [
        ({"settled_ms": 0}, False),
        ({"settled_ms": 0, "active": {"since": 1, "through": 2}}, True),
        ({"settled_ms": 0, "active": {"since": "1", "through": 2}}, False),  # a tampered row
        ({"settled_ms": 0, "active": None}, False),
        (None, False),
        ([], False),
    ],
)
def test_turn_is_open(view: object, open_: bool) -> None:
    assert turn_is_open(view) is open_


def test_the_liveness_keys_join_the_json_only_when_asked() -> None:
    row = _row(activity="running", runner=HERE, turn_open=True, last_event=7, liveness="stalled")
    spec = {"kind": "child", "id": "c", "activity": "running", "has_children": False, "mode": "continuable"}
    assert row.to_json() == spec  # SPEC 5.4's bytes
    assert row.to_json(liveness=True) == spec | {"last_event": 7, "runner": HERE, "liveness": "stalled"}
    assert _row(last_event=7).to_json(liveness=True) == spec | {"activity": "inactive", "last_event": 7}


def test_list_agents_shows_the_liveness_words() -> None:
    rows = [
        _row(id="a", label="A", activity="running", runner=HERE, turn_open=True, liveness="stalled"),
        _row(id="b", label="B", turn_open=True, liveness="orphaned"),
        _row(id="c", label="C"),
    ]
    status = {"a": "running", "b": "ready", "c": "ready"}
    assert render_agents(rows, False, status.__getitem__) == "a [stalled] — A\nb [orphaned] — B\nc [ready] — C"


# --- listings over real stores ----------------------------------------------------------------


def _write_children(store: LogStore, open_at: int = 2) -> None:
    """p with children `open` (its turn open: its runner died mid-turn; its last event at
    `open_at`) and `ended`."""
    persist_log(store, header("p", 1), [make_event(0, "turn/start", 1, {"turn": 1})])
    for sid, created, ended in (("open", 2, False), ("ended", 3, True)):
        started = open_at if sid == "open" else 2
        events = [
            make_event(0, "subagent/descriptor", 1, descriptor(sid)),
            make_event(1, "turn/start", started, {"turn": 1}),
        ]
        if ended:
            events.append(turn_end_event(2, 3))
        persist_log(store, header(sid, created, parent_session="p", origin="subagent"), events)


def _liveness(rows: Sequence[Any]) -> list[tuple[str, str, str | None, str | None, bool]]:
    return [(r.id, r.activity, r.runner, r.liveness, r.last_event is not None) for r in rows]


async def test_orphaned_cold_children_observed_then_from_their_rows_with_no_added_read(tmp_path: Path) -> None:
    """A child whose turn is open and whose lock nobody holds is orphaned, whether the listing
    observes its log or answers from the checkpoint rows that observation wrote back — and the
    second listing reads no log at all (the liveness comes with the rows it reads anyway)."""
    store = FileLogStore(str(tmp_path))
    _write_children(store)
    expected = [("open", "inactive", None, "orphaned", True), ("ended", "inactive", None, None, True)]
    # Observed (the parent for its catalog and each child: one read each, as before liveness),
    # then the checkpoint rung.
    for reads in (3, 0):
        faulty = FaultyLogStore(store)
        async with open_runtime(tmp_path, log_store=faulty) as runtime:
            rows = await runtime.listing.list_children("p")
        assert _liveness(rows) == expected
        assert (faulty.calls["read"], faulty.calls["open_read"]) == (reads, reads)
        # The time is the log's own (its last event's `time` field), not the clock's nor its
        # file's mtime.
        assert rows[0].last_event == 2 == read_all(store, "open")[-1].time


class _HeldElsewhere(FaultyLogStore):
    """A store on which another process holds the locks of `held` (the lock table says so)."""

    def __init__(self, inner: LogStore, held: set[str]) -> None:
        super().__init__(inner)
        self.held = held

    def held_elsewhere(self, session_ids: Sequence[str]) -> set[str]:
        return set(self.holders(session_ids))

    def holders(self, session_ids: Sequence[str]) -> dict[str, str]:
        return {sid: "pid 4242" for sid in session_ids if sid in self.held}


async def test_a_child_another_process_runs_is_stalled_after_stall_after(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path))
    _write_children(store)
    written = read_all(store, "open")[-1].time  # its last event's time: what the listing shows
    now = [written]
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    # Observed (the parent and both children), then only the held child: as before liveness, a
    # held log's observation is never written back (its writer's rows are the ones kept).
    for reads in (3, 1):
        held = _HeldElsewhere(store, {"open"})
        async with open_session_store(held, registry, now_ms=lambda: 1) as sessions:
            query = SessionQuery(held, sessions, registry)
            service = ListingService(registry=registry, sessions=sessions, query=query, now_ms=lambda: now[0])
            now[0] = written + STALL
            assert _liveness(await service.list_children("p"))[0] == ("open", "running", "pid 4242", None, True)
            now[0] = written + STALL + 1
            found = await service.list_children("p")
            assert _liveness(found)[0] == ("open", "running", "pid 4242", "stalled", True)
            assert state_word(found[0], "running") == "stalled"
            # `stall_after` is the listing's: ten minutes here.
            service.stall_after_ms = 2 * STALL
            assert _liveness(await service.list_children("p"))[0][3] is None
        assert (held.calls["read"], held.calls["open_read"]) == (reads, reads)


async def test_a_live_child_here_is_stalled_by_the_runtime_clock(tmp_path: Path) -> None:
    """A child resident in this process whose turn is open: `running` by `this process`, its
    last event the time its open turn's last event carries (the runtime clock's), then `stalled`
    once the injected clock passes `stall_after` beyond it — no log read (its live cell says all
    of it). Between turns it is never stalled, and its last event is its log's last (the time the runtime
    clock gave it)."""
    store = FileLogStore(str(tmp_path))
    faulty = FaultyLogStore(store)
    now = [1_000]
    with trio.fail_after(GUARD):
        async with open_runtime(tmp_path, log_store=faulty, now_ms=lambda: now[0], stall_after=60) as rt:
            sessions = rt.sessions
            await sessions.create(header("p", 1))
            child = await sessions.create(header("c", 2, parent_session="p", origin="subagent"))
            await child.append([descriptor_draft("Busy")])
            now[0] = 2_000
            await child.append([turn_start(1)])  # written at 2_000 by the runtime clock
            before = faulty.calls["read"], faulty.calls["open_read"]
            now[0] = 2_000 + 60_000
            [row] = await rt.listing.list_children("p")
            assert (row.activity, row.runner, row.turn_open, row.last_event, row.liveness) == (
                "running",
                HERE,
                True,
                2_000,
                None,
            )
            now[0] = 2_000 + 60_001
            [row] = await rt.listing.list_children("p")
            assert (row.activity, row.runner, row.liveness, row.last_event) == ("running", HERE, "stalled", 2_000)
            assert state_word(row, "running") == "stalled"
            await child.append([make_draft_turn_end()])
            [row] = await rt.listing.list_children("p")
            assert (row.turn_open, row.liveness, row.last_event) == (False, None, 2_000 + 60_001)
            assert (faulty.calls["read"], faulty.calls["open_read"]) == before  # no log read
            await sessions.release("c")
            await sessions.release("p")


class _TrioTimeClock:
    """A runtime clock that follows Trio's (virtual, under `autojump_clock`) time: event times
    and the listing's `now` move together as the test's virtual minutes pass."""

    def __init__(self, start_ms: int = 1_789_000_000_000) -> None:
        self.start_ms = start_ms
        self._last = 0

    def now_ms(self) -> int:
        self._last = max(self._last + 1, self.start_ms + int(trio.current_time() * 1000))
        return self._last

    def observe(self, ms: int) -> None:
        self._last = max(self._last, ms)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(max(0.0, seconds))


async def test_a_hanging_child_becomes_stalled_after_five_virtual_minutes(tmp_path: Path, autojump_clock: Any) -> None:
    """End to end over in-memory fakes: a background child whose model call hangs is `running`,
    and `stalled` in `list_agents`'s words once more than five (virtual) minutes pass without a
    durable event; stopped, it is `stopped`, never stalled."""
    import json

    from subagents.runtime import CountingIds, ScriptedModel, load_script
    from subagents.runtime.delegation.tools import agent_status
    from subagents.storage.testing import MemoryLogStore

    agents = [{"label": "kid", "responses": [{"hang": True}]}]
    model = ScriptedModel(load_script(json.dumps({"agents": agents})))
    clock = _TrioTimeClock()
    async with open_runtime(
        tmp_path, model=model, clock=clock, id_factory=CountingIds("s"), log_store=MemoryLogStore()
    ) as rt:
        parent = await rt.agents.create(session_id="parent")
        kid = await rt.subagents.start_continuable(parent, "spawn", "kid", "work")
        while not ((a := rt.agents.get(kid)) is not None and a.status == "running" and a.quiet):
            await trio.testing.wait_all_tasks_blocked()

        async def word() -> str:
            [row] = await rt.listing.list_children("parent")
            assert isinstance(row, ChildRow) and row.runner == HERE
            return state_word(row, agent_status(rt.agents, kid))

        # (Virtual time also jumps while the listing waits on its worker threads — to the next
        # deadline, such as the actor's 30 s checkpoint — so the boundary itself is pinned by
        # the injected-clock tests above, not here.)
        assert await word() == "running"
        await trio.sleep(400)  # far more than 300 s without a durable event
        assert await word() == "stalled"
        await rt.subagents.stop_tree(kid, by="parent")
        await rt.subagents.wait_tree_idle(parent)
        [row] = await rt.listing.list_children("parent")
        assert isinstance(row, ChildRow) and (row.turn_open, row.liveness, row.stopped) == (False, None, True)


def make_draft_turn_end() -> Any:
    from subagents.actors import EventDraft

    return EventDraft(type="turn/end", data={"turn": 1, "reason": {"kind": "completed"}})


@pytest.mark.pg
async def test_on_postgresql_a_held_child_stalls_and_is_orphaned_when_its_lease_expires(
    tmp_path: Path, pg_store_factory: Callable[..., Any], pg_url: str
) -> None:
    import psycopg

    a, b = pg_store_factory(), pg_store_factory()
    clock = itertools.count(1_000)
    with trio.fail_after(GUARD), psycopg.connect(pg_url, autocommit=True) as db:
        async with open_session_store(a, ProjectionRegistry(SUBAGENT_UNITS), now_ms=lambda: next(clock)) as sessions:
            await sessions.create(header("p", 1))
            ref = await sessions.create(header("c", 2, parent_session="p", origin="subagent"))
            await ref.append([descriptor_draft("Busy")])
            await ref.append([turn_start(1)])
            await sessions.release("c")  # checkpoint rows written
            await sessions.release("p")
        (last_time,) = db.execute("SELECT last_time FROM sessions WHERE id = 'c'").fetchone()
        now = [last_time + STALL]
        async with open_runtime(tmp_path, log_store=b, now_ms=lambda: now[0]) as rt:
            [row] = await rt.listing.list_children("p")
            assert (row.activity, row.runner, row.liveness, row.last_event) == ("inactive", None, "orphaned", last_time)
            held = a.open_write("c")  # host A runs the child
            [row] = await rt.listing.list_children("p")
            assert (row.activity, row.runner, row.liveness) == ("running", f"host {a.host_id}", None)
            now[0] += 1
            [row] = await rt.listing.list_children("p")
            assert (row.activity, row.liveness) == ("running", "stalled")
            db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 'c'")
            [row] = await rt.listing.list_children("p")
            assert (row.activity, row.runner, row.liveness) == ("inactive", None, "orphaned")  # never running
            a.close(held)


@pytest.mark.pg
async def test_on_postgresql_sessions_says_stalled_then_orphaned_when_the_lease_expires(
    tmp_path: Path,
    pg_store_factory: Callable[..., Any],
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`sessions` over PostgreSQL: a child whose turn is open is `orphaned` while nobody holds its
    lease, `stalled` (its last event long past) while a host holds it, and `orphaned` again once
    that lease expires — never plainly live."""
    import argparse
    import json

    import psycopg
    from subagents.runtime.hosts.cli.listings import sessions_command

    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "none"))
    monkeypatch.chdir(tmp_path)
    a = pg_store_factory()
    with trio.fail_after(GUARD), psycopg.connect(pg_url, autocommit=True) as db:
        async with open_session_store(a, ProjectionRegistry(SUBAGENT_UNITS), now_ms=lambda: 1_000) as sessions:
            parent = await sessions.create(header("p", 1))
            await parent.append([turn_start(1)])
            ref = await sessions.create(header("c", 2, parent_session="p", origin="subagent"))
            await ref.append([descriptor_draft("Busy")])
            await ref.append([turn_start(1)])
            await sessions.release("c")  # checkpoint rows written
            await sessions.release("p")

        async def shown() -> dict[str, tuple[bool, str | None, str | None]]:
            assert await sessions_command(argparse.Namespace(root=str(tmp_path), store=pg_url, json=True)) == 0
            rows = json.loads(capsys.readouterr().out)
            return {row["id"]: (row["live"], row["runner"], row.get("liveness")) for row in rows}

        assert await shown() == {"c": (False, None, "orphaned"), "p": (False, None, None)}
        held = a.open_write("c")  # host A runs the child (its last event: at 1 s past the epoch)
        assert await shown() == {"c": (True, f"host {a.host_id}", "stalled"), "p": (False, None, None)}
        db.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE session_id = 'c'")
        assert (await shown())["c"] == (False, None, "orphaned")
        a.close(held)


# --- stall_after in subagents.toml ----------------------------------------------------------------


def _config(tmp_path: Path, user: str | None, project: str | None) -> tuple[str, dict[str, str]]:
    (tmp_path / "user").mkdir()
    (tmp_path / "project").mkdir()
    if user is not None:
        (tmp_path / "user" / "subagents.toml").write_text(user)
    if project is not None:
        (tmp_path / "project" / "subagents.toml").write_text(project)
    return str(tmp_path / "project"), {"SUBAGENTS_CONFIG_DIR": str(tmp_path / "user")}


@pytest.mark.parametrize(
    ("user", "project", "expected"),
    [
        (None, None, 300.0),
        ("stall_after = 60", None, 60.0),
        ("stall_after = 60", "stall_after = 90.5", 90.5),
        ("stall_after = 60", "model = 'openai:x'", 60.0),  # the project sets another key
    ],
)
def test_stall_after_from_subagents_toml(
    tmp_path: Path, user: str | None, project: str | None, expected: float
) -> None:
    from subagents.runtime.config import load_config
    from subagents.runtime.delegation.listing_stall import configured_stall_after

    folder, env = _config(tmp_path, user, project)
    # The read-only listings' reader and the hosts' configuration agree.
    assert configured_stall_after(folder, env=env) == expected == load_config(folder, env=env).stall_after


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stall_after = 0", "stall_after must be a number of seconds > 0, got 0"),
        ("stall_after = -5", "stall_after must be a number of seconds > 0, got -5"),
        ("stall_after = true", "stall_after must be a number of seconds > 0, got True"),
        ("stall_after = nan", "stall_after must be a number of seconds > 0, got nan"),
        ("stall_after = '5m'", "stall_after must be a number of seconds > 0, got '5m'"),
        ("stall_after = [1]", "stall_after must be a number of seconds > 0, got a list"),
        ("stall_after = ", "not valid TOML"),
    ],
)
def test_a_bad_stall_after_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    from subagents.runtime.delegation.listing_stall import configured_stall_after
    from subagents.runtime.foundation.errors import ConfigInvalid

    folder, env = _config(tmp_path, None, text)
    with pytest.raises(ConfigInvalid) as caught:
        configured_stall_after(folder, env=env)
    assert str(caught.value).startswith(str(Path(folder) / "subagents.toml") + ": ")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_children_command_uses_stall_after_and_refuses_a_bad_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`children` reads `stall_after` from subagents.toml: a held child silent for longer is
    `stalled`; a bad value is exit 2 with one line, and nothing is listed."""
    import time

    from subagents.runtime.hosts.cli import main

    root = tmp_path / "root"
    store = FileLogStore(str(root))
    _write_children(store, open_at=int(time.time() * 1000) - 120_000)  # its last event two minutes ago
    store.close_store()
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "no-user-config"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(FileLogStore, "holders", lambda self, ids: {s: "pid 4242" for s in ids if s == "open"})
    for setting, word in (("stall_after = 600", "running"), ("stall_after = 60", "stalled")):
        (tmp_path / "subagents.toml").write_text(setting)
        assert main(["agents", "p", "--root", str(root)]) == 0
        assert capsys.readouterr().out == f"open [{word}] — open\nended [ready] — ended\n"
    (tmp_path / "subagents.toml").write_text("stall_after = 'soon'")
    assert main(["children", "p", "--root", str(root)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "stall_after must be a number of seconds > 0" in err


def test_the_user_file_is_where_platformdirs_puts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without $SUBAGENTS_CONFIG_DIR, the read-only listings find the user's file where
    `subagents config` does (platformdirs), without importing platformdirs on Linux."""
    import platformdirs
    from subagents.runtime.delegation.listing_stall import configured_stall_after

    monkeypatch.delenv("SUBAGENTS_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "subagents").mkdir(parents=True)
    (tmp_path / "xdg" / "subagents" / "subagents.toml").write_text("stall_after = 42")
    (tmp_path / "project").mkdir()
    assert platformdirs.user_config_dir("subagents", appauthor=False) == str(tmp_path / "xdg" / "subagents")
    assert configured_stall_after(str(tmp_path / "project")) == 42.0


# --- `sessions` ----------------------------------------------------------------------------------


async def _write_running_children(root: Path, last_event: int) -> None:
    """p with children `open` (a turn open since `last_event`), `ended` (its turn ended) and
    `lagging` (its turn open in rows that lag its log: the events after them may end it),
    written by a runtime whose release left their checkpoint rows."""
    async with open_runtime(root, now_ms=lambda: last_event) as rt:
        sessions = rt.sessions
        parent = await sessions.create(header("p", 1))
        await parent.append([turn_start(1)])  # a root's open turn: no timing unit tells it
        for sid, created in (("open", 2), ("ended", 3), ("lagging", 4)):
            child = await sessions.create(header(sid, created, parent_session="p", origin="subagent"))
            await child.append([descriptor_draft(sid)])
            await child.append([turn_start(1)])
            if sid == "ended":
                await child.append([make_draft_turn_end()])
            await sessions.release(sid)
        await sessions.release("p")
    # Events the rows do not cover (as if its runner died between two checkpoints).
    store = FileLogStore(str(root))
    persist_more(store, "lagging", [make_event(2, "x/note", last_event, {"n": 1}, ignorable=True)])
    store.close_store()


def persist_more(store: LogStore, sid: str, events: list[Any]) -> None:
    from subagents.storage import Batch, Offset

    handle = store.open_write(sid)
    try:
        store.append(handle, [Batch(Offset(events[0].seq), events)])
    finally:
        store.close(handle)


def test_sessions_shows_orphaned_and_stalled_children_with_no_log_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sessions` (table and JSON) says `orphaned` of a child whose turn is open and whose lock
    nobody holds, and `stalled` of one another process runs whose last event is older than
    `stall_after` — from one checkpoint-row query, reading no log; an idle child, a root, and a
    child whose rows lag its log (unknown without a read) say nothing more."""
    import json
    import time

    from subagents.runtime.hosts.cli import main

    root = tmp_path / "root"
    trio.run(_write_running_children, root, int(time.time() * 1000) - 120_000)  # two minutes ago
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "no-user-config"))
    monkeypatch.chdir(tmp_path)
    calls: dict[str, int] = {"read": 0, "open_read": 0, "read_checkpoint_rows": 0}
    for name in calls:
        original = getattr(FileLogStore, name)

        def counted(self: FileLogStore, *args: Any, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(FileLogStore, name, counted)

    def states(held: set[str]) -> dict[str, str]:
        monkeypatch.setattr(FileLogStore, "holders", lambda self, ids: {s: "pid 4242" for s in ids if s in held})
        assert main(["sessions", "--root", str(root)]) == 0
        lines = capsys.readouterr().out.splitlines()
        at = lines[0].index("STATE")
        return {line.split()[0]: line[at:].split("  ")[0] for line in lines[1:]}

    (tmp_path / "subagents.toml").write_text("stall_after = 60")
    assert states(set()) == {
        "lagging": "persisted",
        "ended": "persisted",
        "open": "orphaned",
        "p": "persisted",
    }
    assert calls == {"read": 0, "open_read": 0, "read_checkpoint_rows": 1}
    assert states({"open", "ended", "lagging"}) == {
        "lagging": "stalled (pid 4242)",  # a runner's rows answer, lagging or not
        "ended": "live (pid 4242)",  # idle: never stalled
        "open": "stalled (pid 4242)",
        "p": "persisted",
    }
    (tmp_path / "subagents.toml").write_text("stall_after = 600")
    assert states({"open"})["open"] == "live (pid 4242)"
    # The JSON has `liveness` only when set.
    (tmp_path / "subagents.toml").write_text("stall_after = 60")
    monkeypatch.setattr(FileLogStore, "holders", lambda self, ids: {s: "pid 4242" for s in ids if s == "lagging"})
    assert main(["sessions", "--root", str(root), "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert {sid: row.get("liveness") for sid, row in rows.items()} == {
        "lagging": "stalled",
        "ended": None,
        "open": "orphaned",
        "p": None,
    }
    assert "liveness" not in rows["p"] and (rows["open"]["live"], rows["lagging"]["runner"]) == (False, "pid 4242")
    # A bad stall_after is the one-line error `children` gives, and nothing is listed.
    (tmp_path / "subagents.toml").write_text("stall_after = 0")
    assert main(["sessions", "--root", str(root)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "stall_after must be a number of seconds > 0" in err


def test_sessions_without_children_reads_no_checkpoint_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from subagents.runtime.hosts.cli import main

    root = tmp_path / "root"
    store = FileLogStore(str(root))
    persist_log(store, header("p", 1), [make_event(0, "turn/start", 1, {"turn": 1})])
    store.close_store()
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "no-user-config"))
    monkeypatch.chdir(tmp_path)
    queried: list[object] = []
    monkeypatch.setattr(FileLogStore, "read_checkpoint_rows", lambda self, *args: queried.append(args) or {})
    assert main(["sessions", "--root", str(root)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[6] == "persisted" and queried == []
