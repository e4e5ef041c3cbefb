"""The web console's live parts (issue 31): the corpus pulse behind the live overview and roots
pages and the store banner (`/live`), and a log damaged while its feed runs.

Real files, a real Hypercorn server on a loopback port for the streams, the real clock with a
short pulse interval: the tests wait on what a stream says; `trio.fail_after` only guards
against hangs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from events import turn_end_event, turn_start_event
from pg_server import EmbeddedServer
from subagents.runtime.hosts.web.pulse import CorpusPulse, LiveRoute, Pulse
from subagents.runtime.read_side import open_read_side
from web_console import (
    T0,
    append_log,
    asgi_client,
    garble_tail,
    next_event,
    served,
    session_header,
    write_lead_and_kid,
    write_log,
    write_to,
)

HANG = 30  # seconds: only a hang reaches it


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """`lead` (its catalog names `kid`) and `kid`, under `store/` (so the test can move it)."""
    folder = tmp_path / "store"
    write_lead_and_kid(folder)
    return folder


# --- the pulse ---


async def test_the_pulse_looks_once_for_every_follower_and_names_what_changed(root: Path) -> None:
    """A baseline look, then fifty appends and a new session before the next look: two followers
    get the same generation, from one more look, naming both sessions."""
    async with open_read_side(str(root)) as side:
        pulse = CorpusPulse(side, interval=0.05)
        first = await pulse.after(-1)
        assert (first.generation, first.problem, pulse.looks) == (0, None, 1)
        events = [turn_end_event(2, T0 + 2)] + [turn_start_event(seq, T0 + seq, turn=seq) for seq in range(3, 52)]
        await trio.to_thread.run_sync(append_log, root, "lead", events)
        await trio.to_thread.run_sync(write_log, root, session_header("late"), [turn_start_event(0, T0)])
        got: list[Pulse] = []
        with trio.fail_after(HANG):
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(lambda: _collect(pulse, 0, got))
        assert pulse.looks == 2
        assert len(got) == 2 and got[0] == got[1]
        assert (got[0].generation, sorted(got[0].changed), got[0].count) == (1, ["late", "lead"], 2)


async def _collect(pulse: CorpusPulse, generation: int, into: list[Pulse]) -> None:
    into.append(await pulse.after(generation))


async def test_the_pulse_says_when_the_store_is_gone_and_when_it_is_back(root: Path) -> None:
    async with open_read_side(str(root)) as side:
        pulse = CorpusPulse(side, interval=0.05)
        await pulse.after(-1)
        away = root.with_name("away")
        root.rename(away)
        with trio.fail_after(HANG):
            gone = await pulse.after(0)
        assert gone.generation == 1 and gone.problem is not None
        away.rename(root)
        with trio.fail_after(HANG):
            back = await pulse.after(1)
        assert (back.generation, back.problem) == (2, None)


async def test_a_store_gone_from_the_first_look_is_news_when_it_comes(root: Path) -> None:
    async with open_read_side(str(root)) as side:
        await side.query.list_sessions()  # the side opened while the store was there
        away = root.with_name("away")
        root.rename(away)
        pulse = CorpusPulse(side, interval=0.05)
        with trio.fail_after(HANG):
            gone = await pulse.after(-1)
            assert gone.generation == 1 and gone.problem is not None
            away.rename(root)
            back = await pulse.after(1)
        assert (back.generation, back.problem, back.changed) == (2, None, ())


async def test_a_live_client_that_goes_away_ends_its_stream(root: Path) -> None:
    """The stream ends as soon as its client is gone: it waits for no look, and makes none."""
    async with open_read_side(str(root)) as side:
        pulse = CorpusPulse(side, interval=3600)  # a look after the first would take an hour
        sent: list[bytes] = []
        gone = trio.Event()

        async def receive() -> dict[str, object]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            body = message.get("body", b"")
            assert isinstance(body, bytes)
            sent.append(body)
            if body.startswith(b"event: store"):
                gone.set()

        with trio.fail_after(HANG):
            await LiveRoute(pulse)({"type": "http"}, receive, send)
        assert pulse.looks == 1
        assert sent[-1] == b'event: store\ndata: {"up": true, "problem": null}\n\n'


async def test_the_pulse_interval_must_be_positive(root: Path) -> None:
    async with open_read_side(str(root)) as side:
        with pytest.raises(ValueError, match="positive"):
            CorpusPulse(side, interval=0)


# --- over a real server ---


async def test_live_tells_of_changes_and_of_the_store_going_and_coming_back(root: Path) -> None:
    """`/live`: the store's state first, then a generation naming the session another writer
    appended to; the store moved away is `event: store` up false, moved back up true, and a
    generation follows (the page fetches itself again)."""
    async with served(root, live_interval=0.05) as url, httpx.AsyncClient(base_url=url, timeout=HANG) as client:
        async with client.stream("GET", "/live") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["content-security-policy"].startswith("default-src 'none'")
            lines = response.aiter_lines()
            with trio.fail_after(HANG):
                assert await next_event(lines) == ("store", {"up": True, "problem": None})
                await trio.to_thread.run_sync(append_log, root, "kid", [turn_start_event(1, T0 + 5)])
                name, data = await next_event(lines)
                assert (name, data["changed"], data["count"]) == ("message", ["kid"], 1)
                away = root.with_name("away")
                root.rename(away)
                name, data = await next_event(lines)
                assert name == "store" and data["up"] is False and data["problem"]
                away.rename(root)
                assert await next_event(lines) == ("store", {"up": True, "problem": None})
                name, data = await next_event(lines)
                assert name == "message" and data["changed"] == []


async def test_every_page_carries_the_banner_and_the_pulse_script(root: Path) -> None:
    async with asgi_client(root) as client:
        for path in ("/", "/tree", "/tree/lead", "/session/lead", "/session/nobody", "/login"):
            body = (await client.get(path)).text
            assert '<p id="store-banner" class="banner" role="alert" hidden></p>' in body, path
            assert '<script src="/static/pulse.js"></script>' in body, path
        script = await client.get("/static/pulse.js")
        assert script.status_code == 200 and 'new EventSource("/live")' in script.text
        root.rename(root.with_name("away"))
        gone = await client.get("/")
        assert gone.status_code == 503 and 'id="store-unavailable"' in gone.text  # reloads once back


async def test_live_state_answers_once_from_a_fresh_look(root: Path, mock_clock: trio.testing.MockClock) -> None:
    """`/live/state` (what a page with its own feed polls instead of holding `/live` open): the
    store's state from a look at most one interval old, no stream; the store moved away is up
    false with the problem, moved back up true. The clock is moved by hand past the interval
    (Trio's mock clock, still: the real file IO does not wait on it)."""
    async with asgi_client(root) as client:
        up = await client.get("/live/state")
        assert up.status_code == 200 and up.json() == {"up": True, "problem": None}
        assert up.headers["content-type"] == "application/json"
        assert up.headers["cache-control"] == "no-store"
        assert up.headers["content-security-policy"].startswith("default-src 'none'")
        away = root.with_name("away")
        root.rename(away)
        assert (await client.get("/live/state")).json()["up"] is True  # within the interval: no new look
        mock_clock.jump(1.0)
        gone = (await client.get("/live/state")).json()
        assert gone["up"] is False and gone["problem"]
        away.rename(root)
        mock_clock.jump(1.0)
        assert (await client.get("/live/state")).json() == {"up": True, "problem": None}
        script = (await client.get("/static/pulse.js")).text
        assert 'fetch("/live/state"' in script and "if (fed) poll();" in script


# --- a log damaged under its feed ---


async def test_a_log_damaged_under_the_session_feed_is_said_and_the_feed_ends(root: Path) -> None:
    async with served(root, live_interval=0.05) as url, httpx.AsyncClient(base_url=url, timeout=HANG) as client:
        async with client.stream("GET", "/events/session/lead?after=2") as response:
            lines = response.aiter_lines()
            with trio.fail_after(HANG):
                assert await anext(lines) == ": open"
                await trio.to_thread.run_sync(append_log, root, "lead", [turn_end_event(2, T0 + 2)])
                name, data = await next_event(lines)
                assert (name, data["seq"], data["type"]) == ("message", 2, "turn/end")
                await trio.to_thread.run_sync(garble_tail, root, "lead", 9)
                name, data = await next_event(lines)
                assert name == "problem" and data["damaged"] is True
                assert str(data["problem"]).startswith("the log is damaged: session 'lead' is corrupt at seq 3")
                assert [line async for line in lines if line] == []  # and the feed ends


async def test_a_descendant_damaged_under_the_tree_feed_is_a_damaged_event(root: Path) -> None:
    """The tree feed goes on for the others: a `damaged` item for `kid` (the tree page reloads
    and shows its diagnostic row), then `lead`'s next event."""
    async with served(root, live_interval=0.05) as url, httpx.AsyncClient(base_url=url, timeout=HANG) as client:
        async with client.stream("GET", "/events/tree/lead") as response:
            lines = response.aiter_lines()
            with trio.fail_after(HANG):
                assert await anext(lines) == ": open"
                await trio.to_thread.run_sync(append_log, root, "kid", [turn_start_event(1, T0 + 5)])
                assert await next_event(lines) == ("message", {"session_id": "kid", "seq": 1, "type": "turn/start"})
                await trio.to_thread.run_sync(garble_tail, root, "kid", 9)
                name, data = await next_event(lines)
                assert (name, data["session_id"], data["type"]) == ("message", "kid", "damaged")
                assert data["problem"]
                await trio.to_thread.run_sync(append_log, root, "lead", [turn_end_event(2, T0 + 6)])
                assert await next_event(lines) == ("message", {"session_id": "lead", "seq": 2, "type": "turn/end"})
        rows = (await client.get("/tree/lead")).text
        assert 'class="diagnostic"' in rows and "kid" in rows


@pytest.mark.pg
async def test_the_pulse_comes_back_after_a_postgresql_restart(pg_url: str, pg_server: EmbeddedServer) -> None:
    """The server restarted under the console (every connection cut): the pulse's next looks
    answer again — a look that failed meanwhile is a `problem` generation, and the one after it
    is back — and a session created after the restart is named."""
    from subagents.runtime.store_select import open_log_store

    store = open_log_store(pg_url, create_schema=True)
    try:
        write_to(store, session_header("before"), [turn_start_event(0, T0)])
        async with open_read_side(".", store=pg_url) as side:
            pulse = CorpusPulse(side, interval=0.05)
            seen = await pulse.after(-1)
            await trio.to_thread.run_sync(pg_server.restart)
            await trio.to_thread.run_sync(write_to, store, session_header("after"), [turn_start_event(0, T0)])
            with trio.fail_after(HANG):
                while not (seen.problem is None and "after" in seen.changed):
                    seen = await pulse.after(seen.generation)
    finally:
        store.close_store()


async def test_the_console_reads_the_store_once_before_it_says_it_is_ready(root: Path) -> None:
    """`subagents web` lists the corpus before it prints its URL: the first listing of a store
    reads the index whole and sets the change watches, so the first page a person opens costs
    what every later one does. Seen here as the index the listing builds: there before any
    request."""
    import sqlite3

    from subagents.storage.index import INDEX_NAME

    (root / INDEX_NAME).unlink(missing_ok=True)
    async with served(root):
        with sqlite3.connect(root / INDEX_NAME) as db:
            listed = sorted(sid for (sid,) in db.execute("SELECT id FROM sessions"))
    assert listed == ["kid", "lead"]
