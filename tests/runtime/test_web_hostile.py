"""The web console under hostile log text (issue 31, item 3; review rweb): markup in an agent
type, a model name, a child's label, a tool call's name and arguments, a tool result and a
damaged child's problem shows as text on every page, never as markup; a request naming two
`Host` headers is refused. Through httpx's ASGI transport on Trio, as tests/runtime/test_web.py."""

from __future__ import annotations

from pathlib import Path

from descriptors import descriptor
from events import assistant_event, turn_end_event, turn_start_event
from subagents.storage import Event, make_event
from web_console import T0, asgi_client, garble_tail, session_header, write_log

MARK = "<img src=x onerror=alert(1)>"
SHOWN = "&lt;img src=x onerror=alert(1)&gt;"


def _tool_turn(first: int) -> list[Event]:
    call = {
        "type": "tool-call",
        "id": "c1",
        "name": f"run{MARK}",
        "arguments": '{"cmd": "' + MARK.replace('"', '\\"') + '"}',
    }
    asked = {
        "turn": 1,
        "step": 1,
        "message": {"id": "a-c1", "role": "assistant", "content": [call], "source": {"kind": "model"}},
        "finish": "tool-calls",
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    block = {"type": "tool-result", "call_id": "c1", "content": [{"type": "text", "text": MARK}], "is_error": False}
    result = {
        "turn": 1,
        "step": 1,
        "message": {"id": "r-c1", "role": "user", "content": [block], "source": {"kind": "tool", "call_id": "c1"}},
    }
    return [
        make_event(first, "session/model", T0 + first, {"model": f"openai:{MARK}"}),
        turn_start_event(first + 1, T0 + first + 1),
        make_event(first + 2, "assistant/message", T0 + first + 2, asked, surface_op="append"),
        make_event(first + 3, "tool/result", T0 + first + 3, result, surface_op="append"),
        assistant_event(first + 4, T0 + first + 4, text=MARK, usage=(1, 1), step=2),
        turn_end_event(first + 5, T0 + first + 5),
    ]


def _write_hostile(root: Path) -> None:
    catalog = {"version": 1, "child_id": "kid", "child_created_at": T0, "mode": "continuable", "label": MARK}
    write_log(
        root,
        session_header("lead", preset=f"planner{MARK}"),
        [*_tool_turn(0), make_event(6, "subagent/catalog", T0 + 6, catalog)],
    )
    kid_head = session_header("kid", "lead", preset=f"researcher{MARK}")
    write_log(root, kid_head, [make_event(0, "subagent/descriptor", T0, descriptor(MARK)), *_tool_turn(1)])
    bad = {**catalog, "child_id": "bad"}
    write_log(root, session_header("bad", "kid"), [make_event(0, "subagent/descriptor", T0, descriptor(MARK))])
    write_log(root, session_header("kid2", "lead"), [make_event(0, "subagent/catalog", T0, bad)])
    garble_tail(root, "bad", 1)


async def test_hostile_log_text_is_text_on_every_page(tmp_path: Path) -> None:
    _write_hostile(tmp_path)
    async with asgi_client(tmp_path) as client:
        for path in ("/", "/tree", "/tree/lead", "/tree/kid", "/session/lead", "/session/kid", "/session/bad"):
            response = await client.get(path)
            assert response.status_code == 200, path
            assert "<img" not in response.text, path
        # The hostile texts reach the pages (escaped), so the check above looked at them.
        assert SHOWN in (await client.get("/session/lead")).text
        assert SHOWN in (await client.get("/tree/lead")).text
        assert SHOWN in (await client.get("/tree")).text


async def test_two_host_headers_are_refused(tmp_path: Path) -> None:
    _write_hostile(tmp_path)
    async with asgi_client(tmp_path) as client:
        for hosts in (("evil.example", "127.0.0.1:8765"), ("127.0.0.1:8765", "evil.example")):
            headers = [("host", hosts[0]), ("host", hosts[1])]
            response = await client.get("/", headers=headers)
            assert response.status_code == 400, hosts
