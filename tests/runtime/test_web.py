"""The web console (`subagents web`, issue 31): every route and error through httpx's ASGI
transport on Trio, the security rules (token, CSRF, origin, host, read-only, headers, escaping),
the command's refusals, and the live feed over a real Hypercorn server on a loopback port (the
browser test is tests/runtime/test_web_browser.py, the live pages test_web_live.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import attrs
import httpx
import pytest
import trio
from descriptors import descriptor
from events import assistant_event, seed_marker, turn_end_event, turn_start_event
from subagents.runtime.foundation.errors import UsageError
from subagents.runtime.hosts.cli import main
from subagents.runtime.hosts.web.app import build_app
from subagents.runtime.hosts.web.security import (
    AUTH_COOKIE,
    CONTENT_SECURITY_POLICY,
    Access,
    is_loopback,
    read_token_file,
)
from subagents.runtime.read_side import open_read_side
from subagents.storage import Batch, Event, FileLogStore, Offset, make_event
from web_console import (
    T0,
    TOKEN,
    app_client,
    append_log,
    asgi_client,
    console_settings,
    garble_tail,
    next_data,
    served,
    session_header,
    write_lead_and_kid,
    write_to,
)

SCRIPT = '<script>alert("pwned")</script>'


def _user(seq: int, text: str) -> Event:
    data = {
        "turn": 1,
        "step": 1,
        "message": {
            "id": f"u{seq}",
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"},
        },
    }
    return make_event(seq, "user/message", T0 + seq, data, surface_op="append")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """`boss` (a root whose user message holds a script tag) with one child `helper` (its label
    holds markup), and `broken`, a root whose log has a garbled line after its header."""
    store = FileLogStore(str(tmp_path), compression="none")
    try:
        write_to(
            store,
            session_header("boss"),
            [
                turn_start_event(0, T0),
                _user(1, f"hello {SCRIPT}"),
                assistant_event(2, T0 + 2, text="hi <b>x</b>", usage=(120, 30)),
                turn_end_event(3, T0 + 3),
            ],
        )
        write_to(
            store,
            session_header("helper", "boss"),
            [make_event(0, "subagent/descriptor", T0, descriptor("the <i>helper</i>"))],
        )
        write_to(store, session_header("broken"), [turn_start_event(0, T0)])
    finally:
        store.close_store()
    garble_tail(tmp_path, "broken", 1)
    return tmp_path


@pytest.fixture
async def client(root: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(root) as c:
        yield c


async def _signed_in(client: httpx.AsyncClient) -> None:
    response = await client.post("/login", data={"token": TOKEN})
    assert response.status_code == 303
    assert client.cookies[AUTH_COOKIE] == Access(TOKEN).cookie_value  # an HMAC, never the token


# --- pages ---


async def test_overview_counts_states_and_lists_recent_sessions(client: httpx.AsyncClient) -> None:
    response = await client.get("/")
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"
    body = response.text
    assert "<p>3 sessions, 2 roots.</p>" in body
    assert "<tr><td>damaged</td><td>1</td></tr>" in body
    assert "<tr><td>persisted</td><td>2</td></tr>" in body
    for sid in ("boss", "helper", "broken"):
        assert f'<a href="/session/{sid}">{sid}</a>' in body
    assert "2026-12-01T13:17:21.003Z" in body  # boss's last event, in UTC ISO-8601
    assert "No running child has been quiet" in body


async def test_tree_pages_roots_with_their_descendant_counts(client: httpx.AsyncClient) -> None:
    body = (await client.get("/tree")).text
    assert "2 roots; page 1 of 1." in body
    assert '<a href="/tree/boss">1 below</a>' in body
    assert 'class="diagnostic"' in body and "damaged: corrupt" in body  # broken, as a diagnostic row
    assert "/session/helper" not in body  # a child is not a root
    assert (await client.get("/tree?page=99")).status_code == 200  # clamped to the last page
    bad = await client.get("/tree?page=abc")
    assert bad.status_code == 400 and "page must be a whole number" in bad.text


async def test_subtree_lists_children_escaped(client: httpx.AsyncClient) -> None:
    body = (await client.get("/tree/boss")).text
    assert '<a href="/session/helper">helper</a>' in body
    assert "the &lt;i&gt;helper&lt;/i&gt;" in body and "<i>helper</i>" not in body
    assert ">ready<" in body and ">continuable<" in body
    # Usage: boss's own model call; its tree (boss and helper, which made none) the same.
    assert (
        "<p>Its own usage: 120 in, 30 out tokens (1 model call). With its subagents: 120 in, 30 out tokens (1 model call).</p>"
        in body
    )
    assert "<td>not reported (0 model calls)</td><td>-</td>" in body  # helper's own, and no subtree
    missing = await client.get("/tree/nobody")
    assert missing.status_code == 404 and "session &#34;nobody&#34; not found" in missing.text


async def test_session_page_renders_the_transcript_as_text(client: httpx.AsyncClient) -> None:
    response = await client.get("/session/boss")
    assert response.status_code == 200
    body = response.text
    assert SCRIPT not in body and "<b>x</b>" not in body
    assert "user: hello &lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;" in body
    assert "assistant: hi &lt;b&gt;x&lt;/b&gt;" in body
    assert "── end of turn 1: completed" in body
    assert 'data-after="4"' in body  # where the live feed starts
    # The page's own scripts, and no inline one: its feed's and the store banner's (every page's).
    assert body.count("<script") == 2
    assert '<script src="/static/live.js"></script>' in body and '<script src="/static/pulse.js"></script>' in body


@pytest.mark.parametrize(
    "path", ["/session/nobody", "/session/a%01b", "/session/" + "x" * 300, "/nowhere", "/tree/a%7Fb"]
)
async def test_unknown_or_invalid_ids_are_404_pages(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert "<h1>Not found</h1>" in response.text
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


async def test_damaged_log_page_says_where(client: httpx.AsyncClient) -> None:
    response = await client.get("/session/broken")
    assert response.status_code == 200
    assert "Its log cannot be read:" in response.text
    assert "seq 1" in response.text or "offset" in response.text


async def test_static_files_are_served_with_the_headers(client: httpx.AsyncClient) -> None:
    response = await client.get("/static/live.js")
    assert response.status_code == 200 and "textContent" in response.text
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


# --- sign-in and controls ---


async def test_login_with_a_wrong_token_is_refused(client: httpx.AsyncClient) -> None:
    assert "Access token" in (await client.get("/login")).text
    response = await client.post("/login", data={"token": "not-it"})
    assert response.status_code == 403 and "not this console's token" in response.text
    assert AUTH_COOKIE not in client.cookies


async def test_controls_shown_only_when_signed_in(client: httpx.AsyncClient) -> None:
    assert 'action="/session/boss/send"' not in (await client.get("/session/boss")).text
    await _signed_in(client)
    body = (await client.get("/session/boss")).text
    assert 'action="/session/boss/send"' in body
    assert f'name="csrf" value="{Access(TOKEN).csrf_value}"' in body


async def test_control_without_sign_in_is_refused(client: httpx.AsyncClient, root: Path) -> None:
    response = await client.post("/session/boss/send", data={"text": "hi", "csrf": Access(TOKEN).csrf_value})
    assert response.status_code == 403 and "sign in" in response.text
    assert not (root / "sessions" / "boss" / "mailbox").exists()


async def test_control_with_a_bad_csrf_value_is_refused(client: httpx.AsyncClient, root: Path) -> None:
    await _signed_in(client)
    for form in (
        {"text": "hi"},
        {"text": "hi", "csrf": "forged"},
        {"text": "hi", "csrf": Access("another-token-entirely").csrf_value},
    ):
        response = await client.post("/session/boss/send", data=form)
        assert response.status_code == 403 and "CSRF check failed" in response.text
    assert not (root / "sessions" / "boss" / "mailbox").exists()


@pytest.mark.parametrize(
    "header", [{"origin": "http://evil.example"}, {"origin": "null"}, {"referer": "http://evil.example/page"}]
)
async def test_control_from_another_origin_is_refused(
    client: httpx.AsyncClient, root: Path, header: dict[str, str]
) -> None:
    await _signed_in(client)
    form = {"text": "hi", "csrf": Access(TOKEN).csrf_value}
    response = await client.post("/session/boss/send", data=form, headers=header)
    assert response.status_code == 403 and "CSRF check failed" in response.text
    assert not (root / "sessions" / "boss" / "mailbox").exists()


async def test_read_only_console_refuses_every_control(root: Path) -> None:
    async with asgi_client(root, read_only=True) as client:
        await _signed_in(client)
        assert 'action="/session/boss/send"' not in (await client.get("/session/boss")).text
        for action in ("send", "interrupt", "stop"):
            response = await client.post(
                f"/session/boss/{action}", data={"text": "hi", "csrf": Access(TOKEN).csrf_value}
            )
            assert response.status_code == 403 and "read-only" in response.text
    assert not (root / "sessions" / "boss" / "mailbox").exists()


async def test_send_queues_the_message_in_the_mailbox(client: httpx.AsyncClient, root: Path) -> None:
    await _signed_in(client)
    text = f"please {SCRIPT}"
    response = await client.post("/session/boss/send", data={"text": text, "csrf": Access(TOKEN).csrf_value})
    assert response.status_code == 200
    assert "not running: the next host that resumes it records it" in response.text
    [envelope] = (root / "sessions" / "boss" / "mailbox").glob("*.json")
    document = json.loads(envelope.read_text())
    assert (document["kind"], document["body"]) == ("message", {"text": text})
    assert document["delivery_id"] in response.text


async def test_interrupt_and_stop_of_a_session_nobody_runs_deliver_nothing(
    client: httpx.AsyncClient, root: Path
) -> None:
    await _signed_in(client)
    for action in ("interrupt", "stop"):
        response = await client.post(f"/session/boss/{action}", data={"csrf": Access(TOKEN).csrf_value})
        assert response.status_code == 200
        assert f"session boss is not running: nothing to {action}" in response.text
    assert not (root / "sessions" / "boss" / "mailbox").exists()


@pytest.mark.parametrize(
    ("path", "form", "status", "said"),
    [
        ("/session/nobody/send", {"text": "hi"}, 404, "not found"),
        ("/session/broken/send", {"text": "hi"}, 409, "is damaged"),
        ("/session/boss/send", {"text": "  "}, 400, "empty message"),
        ("/session/boss/explode", {}, 404, "Not found"),
        ("/session/a%01b/send", {"text": "hi"}, 404, "not a valid session id"),
    ],
)
async def test_bad_controls_are_refused_with_a_page(
    client: httpx.AsyncClient, path: str, form: dict[str, str], status: int, said: str
) -> None:
    await _signed_in(client)
    response = await client.post(path, data={**form, "csrf": Access(TOKEN).csrf_value})
    assert response.status_code == status
    assert said in response.text


async def test_a_form_too_large_is_refused(client: httpx.AsyncClient) -> None:
    await _signed_in(client)
    response = await client.post("/session/boss/send", data={"text": "x" * 70_000, "csrf": Access(TOKEN).csrf_value})
    assert response.status_code == 413


async def test_a_foreign_host_header_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.get("/", headers={"host": "rebound.example:8765"})
    assert response.status_code == 421


async def test_private_reads_ask_for_sign_in_first(root: Path) -> None:
    async with asgi_client(root, private_reads=True, hosts=frozenset()) as client:
        response = await client.get("/session/boss")
        assert (response.status_code, response.headers["location"]) == (303, "/login")
        assert (await client.get("/static/style.css")).status_code == 200
        await _signed_in(client)
        assert (await client.get("/session/boss")).status_code == 200


# --- the command's rules ---


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_token_file_rules(tmp_path: Path) -> None:
    good = tmp_path / "token"
    good.write_text(f"{TOKEN}\nignored\n")
    assert read_token_file(str(good)) == TOKEN
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(UsageError, match="at least 16 characters"):
        read_token_file(str(short))
    with pytest.raises(UsageError, match="cannot be read"):
        read_token_file(str(tmp_path / "missing"))


def test_non_loopback_bind_without_a_token_is_refused(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["web", "--root", str(root), "--host", "0.0.0.0"]) == 2
    assert "not a loopback address: give the access token with --token-file" in capsys.readouterr().err


def test_web_on_a_folder_that_is_no_root_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["web", "--root", str(tmp_path / "nothing")]) == 2
    assert "not a subagents root" in capsys.readouterr().err


# --- a real server: the live feed ---


async def test_live_feed_streams_new_events_over_a_real_server(root: Path) -> None:
    """Hypercorn's Trio worker on a loopback port: the session's events after `after` arrive as
    server-sent events, then an event another writer appends arrives too."""
    async with served(root) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            page = await client.get("/session/boss")
            assert page.status_code == 200 and page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            async with client.stream("GET", "/session/boss/events?after=2") as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                lines = response.aiter_lines()
                got = [await next_data(lines), await next_data(lines)]
                assert [(g["seq"], g["type"]) for g in got] == [(2, "assistant/message"), (3, "turn/end")]
                assert got[0]["lines"] == ["assistant: hi <b>x</b>"]  # raw text: the page sets it as textContent
                await trio.to_thread.run_sync(append_log, root, "boss", [turn_start_event(4, T0 + 4, turn=2)])
                new = await next_data(lines)
                assert (new["seq"], new["type"], new["lines"]) == (4, "turn/start", ["── turn 2"])
            # A damaged log: one `problem` event naming the damage, and the end.
            async with client.stream("GET", "/session/broken/events?after=0") as response:
                told = [line async for line in response.aiter_lines() if line]
            assert told == ["event: problem", 'data: {"problem": "the log is damaged (corrupt)"}']
            missing = await client.get("/session/nobody/events")
            assert missing.status_code == 404


def test_token_values_differ_by_purpose() -> None:
    access = Access(TOKEN)
    assert len({access.token, access.cookie_value, access.csrf_value}) == 3
    assert access.token_matches(TOKEN) and not access.token_matches(TOKEN + "x")
    assert not access.cookie_matches(None) and not access.csrf_matches(access.cookie_value)
    assert quote(access.csrf_value) == access.csrf_value  # safe in a form field as it is


_HOLDER = """
import sys
from subagents.storage import Batch, FileLogStore, Offset, make_event
store = FileLogStore(sys.argv[1], compression="none")
handle = store.open_write("helper")
store.append(handle, [Batch(Offset(1), [make_event(1, "turn/start", int(sys.argv[2]), {"turn": 1})])])
print("holding", flush=True)
sys.stdin.read()  # until the test closes our stdin
store.close(handle)
store.close_store()
"""


@pytest.mark.slow  # another process holds the child's log
async def test_overview_shows_a_stalled_child_held_elsewhere(root: Path) -> None:
    """`helper`'s log held by a writer in another process (live elsewhere), its turn open and its
    last event a day old: the overview counts it live elsewhere and lists it as stalled, and
    the tree calls it stalled."""
    import subprocess
    import sys

    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", _HOLDER, str(root), str(T0 + 1)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        said = b""
        while not said.endswith(b"\n"):
            chunk = await holder.stdout.receive_some()
            assert chunk, f"the holder ended: {said!r}"
            said += chunk
        assert said == b"holding\n"
        async with asgi_client(root) as client:
            body = (await client.get("/")).text
            tree = (await client.get("/tree/boss")).text
        await holder.stdin.aclose()
        assert await holder.wait() == 0
    finally:
        holder.kill()
    assert "<tr><td>live elsewhere</td><td>1</td></tr>" in body
    stalled = body.split("<h2>Stalled</h2>")[1].split("<h2>")[0]
    assert f'<a href="/session/helper">helper</a></td><td>boss</td><td>stalled</td><td>pid {holder.pid}</td>' in stalled
    assert ">stalled<" in tree


def test_a_port_in_use_is_a_usage_error(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["web", "--root", str(root), "--port", str(port)]) == 2
    assert f"cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.pg
async def test_overview_on_postgresql_lists_the_hosts(pg_url: str) -> None:
    """On a PostgreSQL store the overview has the hosts table (`subagents hosts`'s rows): a
    host that announced itself with capacity 3, alive, holding nothing; a folder has none."""
    from subagents.runtime.store_select import open_log_store

    store = open_log_store(pg_url, create_schema=True)
    try:
        leased = store.leased
        assert leased is not None
        placements = leased.placements()
        await trio.to_thread.run_sync(placements.serve, 3)
        async with open_read_side(".", store=pg_url) as side:
            async with app_client(build_app(side, console_settings(Path(".")))) as client:
                body = (await client.get("/")).text
                assert "0 roots; page 1 of 1." in (await client.get("/tree")).text
                assert (await client.get("/session/nobody")).status_code == 404
    finally:
        store.close_store()
    hosts = body.split("<h2>Hosts</h2>")[1].split("<h2>")[0]
    assert f"<tr><td>{placements.host_id}</td>" in hosts
    assert "<td>3</td><td>0</td>" in hosts and "<td>alive</td>" in hosts


async def test_overview_on_a_folder_has_no_hosts_table(client: httpx.AsyncClient) -> None:
    assert "<h2>Hosts</h2>" not in (await client.get("/")).text


@pytest.mark.slow  # the command in its own process
async def test_the_command_serves_prints_its_token_and_stops_on_ctrl_c(root: Path, tmp_path: Path) -> None:
    """`subagents web --port 0`: it prints where it serves and the token; the token signs in;
    Ctrl-C ends it with status 130. With `--token-file` and `--read-only` no token is printed."""
    import signal
    import subprocess

    from cli_process import CLI, clean_env

    async def started(*extra: str) -> tuple[trio.Process, list[str]]:
        proc = await trio.lowlevel.open_process(
            [*CLI, "web", "--root", str(root), "--port", "0", *extra],
            stdout=subprocess.PIPE,
            env=clean_env(),
            cwd=tmp_path,
        )
        assert proc.stdout is not None
        said = b""
        want = 1 if extra else 2
        while said.count(b"\n") < want:
            chunk = await proc.stdout.receive_some()
            assert chunk, f"it ended: {said!r}"
            said += chunk
        return proc, said.decode().splitlines()

    proc, lines = await started()
    try:
        assert lines[0].startswith(f"subagents web: serving {root} at http://127.0.0.1:")
        url = lines[0].rsplit(" at ", 1)[1]
        assert lines[1].startswith("access token: ")
        token = lines[1].removeprefix("access token: ")
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/")).status_code == 200
            assert (await client.post("/login", data={"token": token})).status_code == 303
        proc.send_signal(signal.SIGINT)
        assert await proc.wait() == 130
    finally:
        proc.kill()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc, lines = await started("--token-file", str(token_file), "--read-only")
    try:
        assert lines[0].endswith("(read-only)")
        proc.send_signal(signal.SIGINT)
        assert await proc.wait() == 130
        assert proc.stdout is not None
        rest = b""
        while chunk := await proc.stdout.receive_some():
            rest += chunk
        assert TOKEN.encode() not in rest
    finally:
        proc.kill()


async def test_a_store_that_disappears_is_a_503_page_and_recovers(root: Path, tmp_path: Path) -> None:
    async with asgi_client(root) as client:
        assert (await client.get("/")).status_code == 200
        away = tmp_path.with_name(tmp_path.name + "-away")  # the store is tmp_path itself
        root.rename(away)
        for path in ("/", "/tree", "/tree/boss"):
            response = await client.get(path)
            assert response.status_code == 503, path
            assert "<h1>Store unavailable</h1>" in response.text
        away.rename(root)
        for path in ("/", "/tree", "/tree/boss", "/session/boss"):
            assert (await client.get(path)).status_code == 200, path


@pytest.mark.parametrize("sid", ["x<img src=y onerror=alert(1)>\"'&", "a/b c?#%x<img>"])
async def test_a_hostile_session_id_is_escaped_everywhere(tmp_path: Path, sid: str) -> None:
    store = FileLogStore(str(tmp_path), compression="none")
    try:
        write_to(store, session_header(sid), [turn_start_event(0, T0), turn_end_event(1, T0 + 1)])
    finally:
        store.close_store()
    async with asgi_client(tmp_path) as client:
        await _signed_in(client)
        link = quote(sid, safe="/")
        shown = sid.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;")
        shown = shown.replace("'", "&#39;")
        for path in ("/", "/tree", f"/session/{link}", f"/tree/{link}"):
            response = await client.get(path)
            assert response.status_code == 200, path
            assert "<img" not in response.text, path
            assert shown in response.text, path
        assert f'href="/session/{link}"' in (await client.get("/")).text
        page = (await client.get(f"/session/{link}")).text
        assert f'action="/session/{link}/stop"' in page
        stopped = await client.post(f"/session/{link}/stop", data={"csrf": Access(TOKEN).csrf_value})
        assert stopped.status_code == 200 and "is not running: nothing to stop" in stopped.text


async def test_a_forks_inherited_prefix_is_marked(tmp_path: Path) -> None:
    store = FileLogStore(str(tmp_path), compression="none")
    try:
        write_to(store, session_header("origin"), [turn_start_event(0, T0), turn_end_event(1, T0 + 1)])
        head = attrs.evolve(session_header("fork"), is_seeded=True, parent_session="origin")
        handle = store.create(head, inherited_event_count=Offset(2))
        try:
            inherited = [turn_start_event(0, T0), turn_end_event(1, T0 + 1), seed_marker(2, T0 + 2)]
            store.append(handle, [Batch(Offset(0), inherited)])
            store.append(handle, [Batch(Offset(3), [turn_start_event(3, T0 + 3, turn=2)])])
        finally:
            store.close(handle)
    finally:
        store.close_store()
    async with asgi_client(tmp_path) as client:
        body = (await client.get("/session/fork")).text
    assert "--- inherited from origin (events 0..1) ---" in body
    assert '<li class="entry inherited" data-type="turn/start"><span class="seq">0</span>' in body
    assert '<li class="entry inherited" data-type="turn/end"><span class="seq">1</span>' in body
    assert '<li class="entry" data-type="turn/start"><span class="seq">3</span> <pre>── turn 2</pre>' in body


async def test_stop_tree_stops_the_session_and_its_descendants(client: httpx.AsyncClient) -> None:
    """`stop --tree` from the page: boss and helper, nobody runs them, get their stop markers
    here; the tree then shows helper stopped, and a second stop says both were stopped already."""
    await _signed_in(client)
    assert 'action="/session/boss/stop-tree"' in (await client.get("/session/boss")).text
    response = await client.post("/session/boss/stop-tree", data={"csrf": Access(TOKEN).csrf_value})
    assert response.status_code == 200
    assert "stopped 2 sessions: boss and its descendants helper" in response.text
    assert ">stopped<" in (await client.get("/tree/boss")).text
    again = await client.post("/session/boss/stop-tree", data={"csrf": Access(TOKEN).csrf_value})
    assert "(2 of them stopped already)" in again.text
    refused = await client.post("/session/boss/stop-tree", data={"csrf": "forged"})
    assert refused.status_code == 403


async def test_the_tree_feed_tells_of_events_anywhere_in_the_tree(tmp_path: Path) -> None:
    """`/tree/lead/events` over a real server: nothing from history, then an event another
    writer appends to the existing child `kid` (known from lead's catalog), then one of lead's."""
    write_lead_and_kid(tmp_path)
    async with served(tmp_path) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            page = (await client.get("/tree/lead")).text
            assert 'data-root="lead"' in page and '<script src="/static/tree.js"></script>' in page
            async with client.stream("GET", "/tree/lead/events") as response:
                lines = response.aiter_lines()
                assert await anext(lines) == ": open"
                await trio.to_thread.run_sync(append_log, tmp_path, "kid", [turn_start_event(1, T0 + 5)])
                assert await next_data(lines) == {"session_id": "kid", "seq": 1, "type": "turn/start"}
                await trio.to_thread.run_sync(append_log, tmp_path, "lead", [turn_end_event(2, T0 + 6)])
                assert await next_data(lines) == {"session_id": "lead", "seq": 2, "type": "turn/end"}
            assert (await client.get("/tree/nobody/events")).status_code == 404
