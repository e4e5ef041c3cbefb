"""The pure parts `subagents acp` gained for issue 15: streamed text in order with the durable
events (`LiveText`), the tool kinds, `session/list` paging and titles, and the client's record
of a session. Updates are validated against the SDK's schema types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acp.schema import AgentMessageChunk, ListSessionsResponse, SessionNotification, ToolCallStart
from events import assistant_event, turn_end_event, turn_start_event
from subagents.runtime.foundation.errors import AcpRequestError
from subagents.runtime.hosts.acp.listing import Row, iso_time, page, title_of
from subagents.runtime.hosts.acp.live import LiveText
from subagents.runtime.hosts.acp.record import RECORD_TYPE, ClientRecord, last_record
from subagents.runtime.hosts.acp.updates import TOOL_KINDS, tool_kind, updates_for
from subagents.storage import Event, make_event

SID = "s1"
T = 1_789_000_000_000


def _user(seq: int, text: str, kind: str = "user") -> Event:
    source: dict[str, Any] = {"kind": kind}
    if kind != "user":
        source["sender_session_id"] = "other"
    message = {"id": f"u{seq}", "role": "user", "content": [{"type": "text", "text": text}], "source": source}
    return make_event(seq, "user/message", T, {"turn": 1, "step": 1, "message": message}, surface_op="append")


def _texts(updates: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for update in updates:
        chunk = SessionNotification.model_validate({"sessionId": SID, "update": update}).update
        assert isinstance(chunk, AgentMessageChunk)
        out.append((chunk.content.text, chunk.message_id))
    return out


# --- streamed text ------------------------------------------------------------------------


def test_streamed_text_is_sent_once_its_gate_is_passed() -> None:
    live = LiveText(SID)
    live.start(0, 0)
    live.text(0, "Hel", durable_next=2)  # the turn's start and input were durable: seqs 0, 1
    live.text(0, "lo ", durable_next=2)
    assert live.release() == []  # the client has not had them yet
    assert live.event(turn_start_event(0, T)) == []  # seq 1 is still owed
    released = live.event(_user(1, "hi"))  # live, the person's message is not echoed
    assert _texts(released) == [("Hello ", "reply-1")]
    live.text(0, "world", durable_next=2)
    assert _texts(live.release()) == [("world", "reply-1")]
    # The durable reply: everything was streamed, so nothing more is sent.
    assert live.event(assistant_event(2, T, text="Hello world")) == []
    live.text(1, "next", durable_next=3)  # the next model call's text
    assert _texts(live.release()) == [("next", "reply-2")]
    assert _texts(live.event(assistant_event(3, T, text="next and more"))) == [(" and more", "reply-2")]
    assert live.event(turn_end_event(4, T)) == []


def test_a_reply_nothing_was_streamed_for_is_sent_whole_under_its_durable_id() -> None:
    live = LiveText(SID)
    live.start(0, 0)
    assert _texts(live.event(assistant_event(0, T, text="all at once"))) == [("all at once", "m0")]
    assert live.replies == 1


def test_text_waiting_when_its_record_arrives_is_not_sent_twice() -> None:
    live = LiveText(SID)
    live.start(0, 0)
    live.text(0, "Hel", durable_next=1)  # its gate (seq 0) is not passed yet
    live.text(0, "lo", durable_next=1)
    assert _texts(live.event(turn_start_event(0, T))) == [("Hello", "reply-1")]
    live.text(0, " there", durable_next=1)  # not released before the record came
    assert _texts(live.event(assistant_event(1, T, text="Hello there"))) == [(" there", "reply-1")]
    assert live.release() == []  # the waiting " there" was forgotten: the record sent it


def test_text_of_a_later_call_waits_for_the_earlier_reply() -> None:
    live = LiveText(SID)
    live.start(0, 0)
    live.text(1, "second", durable_next=0)
    assert live.release() == []  # call 0's reply is not sent yet
    assert _texts(live.event(assistant_event(0, T, text="first"))) == [("first", "m0"), ("second", "reply-2")]


def test_before_start_text_is_kept_and_a_reply_already_replayed_is_forgotten() -> None:
    live = LiveText(SID)
    live.text(0, "old", durable_next=0)  # a reply the replay held whole
    live.text(1, "new", durable_next=3)  # a reply still streaming when the replay was read
    assert live.release() == []  # not started
    live.start(3, 1)
    assert _texts(live.release()) == [("new", "reply-2")]


def test_updates_other_than_replies_are_the_mapped_ones() -> None:
    live = LiveText(SID)
    live.start(0, 0)
    call = make_event(0, "tool/call", T, {"turn": 1, "step": 1, "call_id": "c1", "name": "grep", "arguments": "{}"})
    assert live.event(call) == updates_for([call], session_id=SID)
    record = make_event(1, RECORD_TYPE, T, {"anything": 1}, ignorable=True)
    assert live.event(record) == []
    assert live.shown == 2


# --- tool kinds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("read_file", "read"),
        ("list_dir", "read"),
        ("glob", "read"),
        ("grep", "read"),
        ("write_file", "edit"),
        ("edit_file", "edit"),
        ("run_command", "execute"),
        ("subagent", "other"),
        ("subagent_fork", "other"),
        ("list_agents", "other"),
        ("send_message", "other"),
        ("interrupt_agent", "other"),
        ("something_else", "other"),
    ],
)
def test_tool_kinds_follow_the_spec(name: str, kind: str) -> None:
    assert tool_kind(name) == kind
    call = make_event(0, "tool/call", T, {"turn": 1, "step": 1, "call_id": "c", "name": name, "arguments": "{}"})
    (update,) = updates_for([call], session_id=SID)
    parsed = SessionNotification.model_validate({"sessionId": SID, "update": update}).update
    assert isinstance(parsed, ToolCallStart) and parsed.kind == kind


def test_every_tool_the_runtime_offers_has_its_kind() -> None:
    from subagents.runtime.delegation.service import DELEGATION_TOOLS
    from subagents.runtime.tools.workspace_tools import READ_TOOLS, WORKSPACE_TOOL_NAMES

    for name in [*DELEGATION_TOOLS, "list_agents", "send_message", "interrupt_agent"]:
        assert TOOL_KINDS[name] == "other"
    for name in WORKSPACE_TOOL_NAMES:
        assert TOOL_KINDS[name] == ("read" if name in READ_TOOLS else "execute" if name == "run_command" else "edit")


# --- session/list -------------------------------------------------------------------------


def test_pages_follow_the_cursor_newest_first_without_repeats() -> None:
    rows = [Row(T + i % 3, f"s{i:02}", "/w") for i in range(7)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        chosen, cursor = page(rows, cursor, size=3)
        pages += 1
        seen += [r.session_id for r in chosen]
        response = ListSessionsResponse.model_validate(
            {"sessions": [{"sessionId": r.session_id, "cwd": r.cwd} for r in chosen], "nextCursor": cursor}
        )
        assert response.next_cursor == cursor
        if cursor is None:
            break
    assert pages == 3
    expected = [r.session_id for r in sorted(rows, key=lambda r: (-r.created_at, r.session_id))]
    assert seen == expected
    # A session created after the first page was read does not shift the later pages.
    first, cursor = page(rows, None, size=3)
    later, _ = page([*rows, Row(T + 99, "newest", "/w")], cursor, size=3)
    assert later == page(rows, cursor, size=3)[0]


@pytest.mark.parametrize("cursor", ["", "not base64!", "bm90IGpzb24", "WzEsMiwzXQ==", "WyJ4IiwiYSJd", "é"])
def test_a_cursor_this_agent_did_not_give_is_invalid_params(cursor: str) -> None:
    with pytest.raises(AcpRequestError) as caught:
        page([Row(T, "a", "/w")], cursor)
    assert caught.value.rpc_code == -32602


def test_the_title_is_the_first_text_from_the_person_on_one_line() -> None:
    notice = _user(0, "Subagent x settled", kind="subagent-settled")
    long = "fix   the\nbuild " + "x" * 100
    events = [notice, _user(1, long), _user(2, "later")]
    title = title_of(events, SID)
    assert title is not None and title.startswith("fix the build x") and len(title) == 80 and title.endswith("…")
    assert title_of([notice], SID) is None
    assert iso_time(0) == "1970-01-01T00:00:00.000Z"


# --- the client's record ------------------------------------------------------------------


def test_the_record_keeps_names_not_secret_values_and_the_last_one_holds() -> None:
    servers = [
        {"name": "fs", "command": "/bin/mcp", "args": [], "env": [{"name": "TOKEN", "value": "s3cret"}]},
        {
            "type": "http",
            "name": "web",
            "url": "https://x",
            "headers": [{"name": "Authorization", "value": "Bearer z"}],
        },
    ]
    record = ClientRecord.of("/w", servers, {"fs": {"readTextFile": True}, "terminal": False})
    draft = record.draft()
    assert draft.type == RECORD_TYPE and draft.ignorable
    assert "s3cret" not in json.dumps(draft.data) and "Bearer" not in json.dumps(draft.data)
    assert draft.data["mcp_servers"][0]["env"] == [{"name": "TOKEN"}]
    first = make_event(0, draft.type, T, draft.data, ignorable=True)
    other = ClientRecord.of("/v", [], {})
    second = make_event(1, RECORD_TYPE, T, other.draft().data, ignorable=True)
    damaged = make_event(2, RECORD_TYPE, T, {"version": 1, "cwd": 5}, ignorable=True)
    assert last_record([first]) == record
    assert last_record([first, second, damaged]) == other  # a damaged record is skipped
    assert last_record([first], inherited_event_count=1) is None  # a fork's inherited copy
    assert last_record([]) is None
