"""The web console's data (issue 31, the data gaps): usage, agent type and model on the roots
page and in the tree rows, the overview's stalled list store-wide, the feed routes' prefix form
(a session id ending in `/events`), the session page's paging with usage per turn and in-doubt
results, and a tree feed that starts its followers at each log's end. Through httpx's ASGI
transport on Trio, as tests/runtime/test_web.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from descriptors import descriptor
from events import assistant_event, turn_end_event, turn_start_event
from flag_events import call_data, result_data
from subagents.runtime.hosts.web.app import build_app
from subagents.runtime.read_side import open_read_side
from subagents.storage import Event, make_event
from web_console import (
    T0,
    app_client,
    append_log,
    asgi_client,
    console_settings,
    garble_tail,
    next_data,
    served,
    session_header,
    table_row,
    write_log,
    write_to,
)

PRICES = '[prices."openai:gpt-x"]\ninput = 1.0\noutput = 2.0\n'


def _model(seq: int, spec: str) -> Event:
    return make_event(seq, "session/model", T0 + seq, {"model": spec})


def _a_turn(first: int, turn: int, usage: tuple[int, int], model: str | None = None) -> list[Event]:
    events = [] if model is None else [_model(first, model)]
    seq = first + len(events)
    return [
        *events,
        turn_start_event(seq, T0 + seq, turn=turn),
        assistant_event(seq + 1, T0 + seq + 1, turn=turn, text=f"answer {turn}", usage=usage),
        turn_end_event(seq + 2, T0 + seq + 2, turn=turn),
    ]


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`lead` (agent type `planner`, model openai:gpt-x, 100 in / 20 out) with a child `kid`
    (`researcher`, another model, 50 / 5) and a grandchild `grand` (7 / 1); a second root `solo`
    with no subagent. Prices for openai:gpt-x only, in the project's subagents.toml."""
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "no-user-config"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "subagents.toml").write_text(PRICES)
    monkeypatch.chdir(project)
    store = tmp_path / "store"
    catalog = {"version": 1, "child_id": "kid", "child_created_at": T0, "mode": "continuable", "label": "the kid"}
    write_log(
        store,
        session_header("lead", preset="planner"),
        [*_a_turn(0, 1, (100, 20), "openai:gpt-x"), make_event(4, "subagent/catalog", T0 + 4, catalog)],
    )
    kid_catalog = {**catalog, "child_id": "grand", "label": "the grandchild"}
    write_log(
        store,
        session_header("kid", "lead", preset="researcher"),
        [
            make_event(0, "subagent/descriptor", T0, descriptor("the kid")),
            *_a_turn(1, 1, (50, 5), "anthropic:claude-x"),
            make_event(5, "subagent/catalog", T0 + 5, kid_catalog),
        ],
    )
    write_log(
        store,
        session_header("grand", "kid", depth=2),
        [make_event(0, "subagent/descriptor", T0, descriptor("the grandchild")), *_a_turn(1, 1, (7, 1))],
    )
    write_log(store, session_header("solo"), _a_turn(0, 1, (1, 1), "openai:gpt-x"))
    return store


def _row(body: str, sid: str) -> str:
    """The table row of `sid` on a page."""
    return table_row(body, f'<a href="/session/{sid}">{sid}</a>')


# --- item 1: usage, agent type and model ---


async def test_roots_page_shows_usage_agent_type_and_model(tree: Path) -> None:
    async with asgi_client(tree) as client:
        body = (await client.get("/tree")).text
    lead = _row(body, "lead")
    assert "<th>Type</th><th>Model</th><th>Usage</th><th>With its subagents</th><th>Below</th>" in body
    assert "<td>planner</td><td>openai:gpt-x</td>" in lead
    # Its own usage, priced (1 and 2 per million tokens): 100 * 1e-6 + 20 * 2e-6.
    assert '<td class="usage">100 in, 20 out tokens (1 model call), cost $0.0001</td>' in lead
    # With kid and grand (their rows written when the index was built): a model without a price
    # makes the tree's cost unknown.
    assert '<td class="usage">157 in, 26 out tokens (3 model calls), cost unknown</td>' in lead
    assert '<a href="/tree/lead">2 below</a>' in lead
    solo = _row(body, "solo")
    assert "<td>-</td><td>openai:gpt-x</td>" in solo  # no agent type recorded
    assert '<td class="usage">-</td>' in solo  # no subagents: no tree sum


async def test_roots_page_reads_no_descendant_log(tree: Path) -> None:
    """A descendant no checkpoint row answers for (the index lost its rows) is counted as not
    read, with a link to the tree page that reads it — the roots page reads no descendant's log."""
    import sqlite3

    from subagents.storage.index import INDEX_NAME

    async with asgi_client(tree) as client:
        await client.get("/tree")  # the index, with its rows
    with sqlite3.connect(tree / INDEX_NAME) as db:
        db.execute("DELETE FROM checkpoints WHERE session_id IN ('kid', 'grand')")
    async with asgi_client(tree) as client:
        lead = _row((await client.get("/tree")).text, "lead")
        assert "100 in, 20 out tokens (1 model call), cost unknown" in lead  # lead alone: partial
        assert '(+2 not read yet: <a href="/tree/lead">its tree</a> reads them)' in lead
        await client.get("/tree/lead")  # its listing observes kid and grand, and writes their rows back
        lead = _row((await client.get("/tree")).text, "lead")
    assert "157 in, 26 out tokens (3 model calls), cost unknown" in lead and "not read yet" not in lead


async def test_tree_rows_show_agent_type_and_model(tree: Path) -> None:
    async with asgi_client(tree) as client:
        body = (await client.get("/tree/lead")).text
    assert "<th>Label</th><th>Type</th><th>Model</th><th>Usage</th><th>With its subagents</th>" in body
    kid = _row(body, "kid")
    assert "<td>the kid</td><td>researcher</td><td>anthropic:claude-x</td>" in kid
    assert "<td>50 in, 5 out tokens (1 model call), cost unknown</td>" in kid  # no price for its model
    grand = _row(body, "grand")
    # grand's calls ran before any `session/model`: no model recorded, and so no price.
    assert (
        "<td>the grandchild</td><td>-</td><td>-</td><td>7 in, 1 out tokens (1 model call), cost unknown</td>" in grand
    )
    assert "Its own usage: 100 in, 20 out tokens (1 model call), cost $0.0001." in body


async def test_a_bad_price_table_is_named_and_costs_left_out(tree: Path) -> None:
    Path("subagents.toml").write_text('[prices."openai:gpt-x"]\ninput = "free"\noutput = 1\n')
    async with asgi_client(tree) as client:
        body = (await client.get("/tree")).text
        sub = (await client.get("/tree/lead")).text
    for page in (body, sub):
        assert '<p class="diagnostic">Costs not shown: ' in page and "must be a number" in page
        assert "cost $" not in page and "cost unknown" not in page


# --- item 2: the stalled list, store-wide ---


async def test_overview_lists_orphaned_children_of_every_parent(tmp_path: Path) -> None:
    """Twelve roots nobody runs, each with a child whose last turn has no end (its runner died
    mid-turn): all twelve are `orphaned` on the overview — not the children of 10 parents — from
    their stored timing rows; a closed child and a child of an open root are not listed."""
    for i in range(12):
        write_log(tmp_path, session_header(f"p{i:02d}"), _a_turn(0, 1, (1, 1)))
        write_log(
            tmp_path,
            session_header(f"p{i:02d}-c", f"p{i:02d}"),
            [make_event(0, "subagent/descriptor", T0, descriptor(f"child {i}")), turn_start_event(1, T0 + 1)],
        )
    write_log(
        tmp_path,
        session_header("p00-done", "p00"),
        [make_event(0, "subagent/descriptor", T0, descriptor("done")), *_a_turn(1, 1, (1, 1))],
    )
    async with asgi_client(tmp_path) as client:
        body = (await client.get("/")).text
    stalled = body.split("<h2>Stalled</h2>")[1].split("<h2>")[0]
    for i in range(12):
        assert (
            f'<a href="/session/p{i:02d}-c">p{i:02d}-c</a></td><td>p{i:02d}</td><td>orphaned</td><td>-</td>' in stalled
        )
        assert f"<td>child {i}</td>" in stalled  # its label, from its identity row
    assert stalled.count("<tr><td>") == 12 and "p00-done" not in stalled


# --- item 3: the feeds' prefix paths (a session id may end in `/events`) ---


@pytest.fixture
def ambiguous(tmp_path: Path) -> Path:
    """`a`, `a/events` (an id the first feed path took for the feed of `a`) and `d`, damaged."""
    write_log(tmp_path, session_header("a"), _a_turn(0, 1, (1, 1)))
    write_log(
        tmp_path,
        session_header("a/events"),
        [turn_start_event(0, T0), assistant_event(1, T0 + 1, text="I am a/events")],
    )
    write_log(tmp_path, session_header("d"), [turn_start_event(0, T0)])
    garble_tail(tmp_path, "d", 1)
    return tmp_path


async def test_a_session_id_ending_in_events_is_its_page(ambiguous: Path) -> None:
    async with asgi_client(ambiguous) as client:
        page = await client.get("/session/a/events")
        tree = await client.get("/tree/a/events")
        plain = await client.get("/session/a%2Fevents")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<h1>Session a/events</h1>" in page.text and "assistant: I am a/events" in page.text
    assert 'data-session="a/events"' in page.text
    assert tree.status_code == 200 and "Tree of" in tree.text and ">a/events</a></h1>" in tree.text
    assert plain.status_code == 200 and "<h1>Session a/events</h1>" in plain.text


async def test_the_feeds_answer_under_their_prefix(ambiguous: Path) -> None:
    async with asgi_client(ambiguous) as client:
        fed = await client.get("/events/session/d")
        old = await client.get("/session/d/events")  # no session `d/events`: the feed of `d`, as before
        assert (await client.get("/events/session/nobody")).status_code == 404
        assert (await client.get("/events/tree/nobody")).status_code == 404
        assert (await client.get("/events/session/a%01b")).status_code == 404
        live = (await client.get("/static/live.js")).text
        tree = (await client.get("/static/tree.js")).text
    for response in (fed, old):
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.text.splitlines()[:2] == ["event: problem", 'data: {"problem": "the log is damaged (corrupt)"}']
    assert '"/events/session/" + encodeURIComponent(' in live
    assert '"/events/tree/" + encodeURIComponent(' in tree


async def test_the_feed_of_a_session_id_ending_in_events_over_a_real_server(ambiguous: Path) -> None:
    """Hypercorn on a loopback port: `/events/session/a%2Fevents` streams `a/events`'s events."""
    async with served(ambiguous) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            async with client.stream("GET", "/events/session/a%2Fevents?after=1") as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                got = await next_data(response.aiter_lines())
    assert got == {"seq": 1, "type": "assistant/message", "lines": ["assistant: I am a/events"]}


# --- item 4: the session page pages its log; usage per turn, in-doubt results; the tree feed ---


def _turns(count: int) -> list[Event]:
    """`count` turns of three events each (seq 3k is turn k+1's start), turn n using (n, 1)."""
    events: list[Event] = []
    for turn in range(1, count + 1):
        events += _a_turn(len(events), turn, (turn, 1))
    return events


async def test_a_long_session_page_shows_its_last_events_with_earlier_links(tmp_path: Path) -> None:
    write_log(tmp_path, session_header("long"), _turns(150))  # 450 events
    async with asgi_client(tmp_path) as client:
        latest = (await client.get("/session/long")).text
        middle = (await client.get("/session/long?before=250")).text
        first = (await client.get("/session/long?before=50")).text
        bad = await client.get("/session/long?before=x")
    assert "Events 250 to 449 of 450." in latest
    assert 'href="/session/long?before=250">earlier</a>' in latest and ">later</a>" not in latest
    assert latest.count('<li class="entry') == 200 + 1  # its events and the (empty) usage entry
    assert '<span class="seq">249</span>' not in latest and '<span class="seq">449</span>' in latest
    assert 'id="transcript"' in latest and 'data-after="450"' in latest and "/static/live.js" in latest
    # Seq 250 is turn 84's reply: its end shows no usage (the window has part of it), turn 85's does.
    turn_end_84 = latest.split("── end of turn 84: completed")[1].split("</pre>")[0]
    assert "usage" not in turn_end_84
    assert "── end of turn 85: completed\n   usage: 85 in, 1 out tokens (1 model call)" in latest
    usage = latest.split("<h2>Usage per turn</h2>")[1]
    assert "<tr><td>85</td><td>85 in, 1 out tokens (1 model call)</td></tr>" in usage and "<td>84</td>" not in usage
    # An earlier window: no live following (its events are not the last ones).
    assert "Events 50 to 249 of 450." in middle
    # Seq 249 is turn 84's start: the window has none of its calls, and turn 83 (from 246) whole.
    window_usage = middle.split("<h2>Usage per turn</h2>")[1]
    assert "<td>83</td>" in window_usage and "<td>84</td>" not in window_usage and "<td>17</td>" not in window_usage
    assert "<td>18</td>" in window_usage  # seq 51 is turn 18's start
    assert 'href="/session/long?before=50">earlier</a>' in middle
    assert 'href="/session/long?before=450">later</a> <a href="/session/long">latest</a>' in middle
    assert "/static/live.js" not in middle and 'id="transcript-window"' in middle
    assert "Events 0 to 49 of 450." in first and ">earlier</a>" not in first
    # Seq 49 is turn 17's reply, its end outside the window: its usage is not shown.
    assert "<td>16</td>" in first.split("<h2>Usage per turn</h2>")[1] and "<td>17</td>" not in first
    assert bad.status_code == 400 and "before must be a whole number" in bad.text


async def test_a_short_session_page_shows_usage_per_turn_and_in_doubt_results(tmp_path: Path) -> None:
    events = [
        *_turns(2),
        turn_start_event(6, T0 + 6, turn=3),
        make_event(7, "assistant/message", T0 + 7, call_data("c1", 3), surface_op="append"),
        make_event(8, "tool/result", T0 + 8, result_data("c1", 3), surface_op="append"),
        turn_end_event(9, T0 + 9, turn=3),
    ]
    write_log(tmp_path, session_header("short", preset="planner"), events)
    async with asgi_client(tmp_path) as client:
        body = (await client.get("/session/short")).text
    assert "Events 0 to" not in body and ">earlier</a>" not in body  # one page: no pager
    assert "<dt>Type</dt><dd>planner</dd>" in body
    usage = body.split("<h2>Usage per turn</h2>")[1]
    assert "<tr><td>1</td><td>1 in, 1 out tokens (1 model call)</td></tr>" in usage
    assert "<tr><td>2</td><td>2 in, 1 out tokens (1 model call)</td></tr>" in usage
    assert (
        '<li class="entry in-doubt" data-type="tool/result"><span class="seq">8</span> <pre>  ← in doubt: ?</pre>'
        in body
    )
    assert body.count("in-doubt") == 1


async def test_the_tree_feed_follows_each_session_from_its_listed_end(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree feed's stream starts at each log's end its listing knows: every read is from
    that end on (never seq 0: no history), and what is appended after arrives."""
    import trio
    from subagents.runtime.event_stream import open_event_stream
    from subagents.runtime.hosts.web.feed_start import tree_ends

    async with open_read_side(str(tree)) as side:
        info, _held = await side.query.stat("lead")
        assert info is not None
        ends = await tree_ends(side, "lead", info)
        assert ends is not None and sorted(ends) == ["grand", "kid", "lead"]
        assert ends["kid"][1] == 6 and ends["grand"][1] == 4 and ends["lead"][1] == 5
        reads: list[tuple[str, int, object]] = []
        read_from = side.query.read_from

        async def counted(session_id: str, start: int, *, after: tuple[int, int] | None = None) -> object:
            reads.append((session_id, start, after))
            return await read_from(session_id, start, after=after)

        monkeypatch.setattr(side.query, "read_from", counted)  # a spy on the stream's one read path
        async with open_event_stream(side.query, "lead", from_seq=5, known=ends, follow_interval=0.05) as stream:
            await trio.to_thread.run_sync(append_log, tree, "grand", [turn_start_event(4, T0 + 9, turn=2)])
            got = await stream.receive()
    assert (got.session_id, got.event.seq, got.event.type) == ("grand", 4, "turn/start")
    first = {}
    for sid, start, after in reads:
        first.setdefault(sid, (start, after))
    assert first == {sid: (end, (size, end)) for sid, (size, end) in ends.items()}


async def test_the_stalled_list_observes_at_most_its_bound_and_counts_the_rest() -> None:
    """25 children held elsewhere, quiet for a day, none with a timing row: 20 are observed
    (each says its turn is open: stalled), the other 5 are counted as unchecked, never read."""
    from contextlib import asynccontextmanager as observing
    from types import SimpleNamespace

    from subagents.runtime.hosts.web.stalled import OBSERVED, stalled_sessions
    from subagents.runtime.query import SessionRecord

    observed: list[str] = []

    class Query:
        async def checkpoint_rows(
            self, session_ids: list[str], keys: list[str], **_: object
        ) -> dict[str, list[object]]:
            return {sid: [] for sid in session_ids}

        @observing
        async def observe_session(self, session_id: str) -> AsyncIterator[object]:
            observed.append(session_id)
            yield SimpleNamespace(turn_open=True, observed=None)

        async def write_observed(self, proved: list[object]) -> int:
            raise AssertionError("nothing was proved")

    records = [
        SessionRecord(
            id=f"c{i:02d}",
            header=session_header(f"c{i:02d}", "p"),
            live=False,
            persisted=True,
            damage=None,
            inherited_event_count=0,
            revision=None,
            event_count=3,
            held=True,
            last_time=T0 + i,
        )
        for i in range(25)
    ]
    found = await stalled_sessions(Query(), records, T0 + 86_400_000, 300_000, {"c00": "pid 7"})
    assert OBSERVED == 20 and observed == [f"c{i:02d}" for i in range(20)]
    assert [row.id for row in found.rows] == observed and found.unchecked == 5
    assert {row.liveness for row in found.rows} == {"stalled"}
    assert (found.rows[0].runner, found.rows[1].runner) == ("pid 7", "another process")


async def test_usage_and_paging_on_postgresql(pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """On PostgreSQL: the roots page sums what the rows hold (the descendants first not read,
    then read by the tree page's listing, which writes their rows back), and a 450-event
    session shows its last 200 events."""
    import trio
    from subagents.runtime.store_select import open_log_store

    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "no-user-config"))
    monkeypatch.chdir(tmp_path)
    store = open_log_store(pg_url, create_schema=True)

    try:
        catalog = {"version": 1, "child_id": "pg-kid", "child_created_at": T0, "mode": "continuable", "label": "k"}
        await trio.to_thread.run_sync(
            write_to,
            store,
            session_header("pg-lead"),
            [*_a_turn(0, 1, (100, 20)), make_event(3, "subagent/catalog", T0 + 3, catalog)],
        )
        kid = [make_event(0, "subagent/descriptor", T0, descriptor("k")), *_a_turn(1, 1, (50, 5))]
        await trio.to_thread.run_sync(write_to, store, session_header("pg-kid", "pg-lead"), kid)
        await trio.to_thread.run_sync(write_to, store, session_header("pg-long"), _turns(150))
        async with open_read_side(".", store=pg_url) as side:
            async with app_client(build_app(side, console_settings(tmp_path))) as client:
                first = _row((await client.get("/tree")).text, "pg-lead")
                await client.get("/tree/pg-lead")
                then = _row((await client.get("/tree")).text, "pg-lead")
                long = (await client.get("/session/pg-long")).text
    finally:
        store.close_store()
    assert '<td class="usage">100 in, 20 out tokens (1 model call)</td>' in first
    assert "(+1 not read yet" in first
    assert '<td class="usage">150 in, 25 out tokens (2 model calls)</td>' in then and "not read yet" not in then
    assert "Events 250 to 449 of 450." in long and long.count('<li class="entry') == 201


@pytest.mark.parametrize("unchecked", [0, 5])
def test_the_overview_says_how_many_running_children_it_left_unchecked(unchecked: int) -> None:
    """The count `stalled_sessions` leaves unobserved is on the page, and only when there is one."""
    from subagents.runtime.hosts.web.app import _environment

    view = {
        "hosts": None,
        "total": 0,
        "roots": 0,
        "counts": [],
        "recent": [],
        "stalled": [],
        "unchecked": unchecked,
        "unchecked_resting": 0,
        "stall_after": 300,
    }
    body = _environment().get_template("overview.html").render(read_only=True, authed=False, csrf="", view=view)
    assert ("5 running children not checked" in body) == (unchecked == 5)
    assert ("not checked" in body) == bool(unchecked)
