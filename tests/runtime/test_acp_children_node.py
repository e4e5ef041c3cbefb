"""`subagents acp` driven by a Node client built on the official ACP TypeScript SDK
(`@agentclientprotocol/sdk`, its unstable v1 entry: the schema with subagent sessions). The
client (tests/helpers/acp_node/client.mjs) opts in with `clientCapabilities.subagents`,
validates every message the agent sends against the SDK's zod schema, cancels one child by its
session id, loads the session again in a second agent process, and writes a JSON transcript that
this test reads.

The module's fixture installs the SDK with `npm ci` from the committed lock file; when npm cannot
install it the test fails with npm's own words (never a skip). Waits are on messages; the
timeouts are only hang guards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_process import CLI, clean_env, write_script

pytestmark = pytest.mark.slow

NODE_DIR = Path(__file__).parent.parent / "helpers" / "acp_node"
TIMEOUT = 120  # real seconds: a hang guard only

# The root starts Alpha and Beta; Alpha starts Gamma. Beta makes one tool call and then works
# until it is stopped: the client cancels it by its session id. Each `wait_for` holds a reply
# until a child settled, so every notice lands in the prompt's own turn (docs/scripts.md).
SCRIPT = {
    "agents": [
        {
            "responses": [
                {
                    "tool_calls": [
                        {
                            "name": "subagent",
                            "arguments": {
                                "description": "Alpha",
                                "prompt": "Start a helper that counts, then report ALPHA_OK.\nMore detail here.",
                            },
                        },
                        {
                            "name": "subagent",
                            "arguments": {"description": "Beta", "prompt": "Work until you are stopped."},
                        },
                    ],
                    "usage": {"input_tokens": 100, "output_tokens": 20},
                },
                {"wait_for": {"settled": "Beta"}, "text": "Beta was stopped."},
                {"wait_for": {"settled": "Alpha"}, "text": "ALL_DONE: Alpha answered."},
                {"text": "ALL_DONE: nothing more."},
            ]
        },
        {
            "label": "Alpha",
            "responses": [
                {
                    "tool_calls": [
                        {"name": "subagent", "arguments": {"description": "Gamma", "prompt": "Count to three."}}
                    ]
                },
                {"wait_for": {"settled": "Gamma"}, "text": "ALPHA_OK"},
                {"text": "ALPHA_OK, and Gamma said {{from_request:Its closing message:\\n(.*)}}"},
            ],
        },
        {"label": "Beta", "responses": [{"tool_calls": [{"name": "list_agents", "arguments": {}}]}, {"hang": True}]},
        {
            "label": "Gamma",
            "responses": [
                {"tool_calls": [{"name": "list_agents", "arguments": {}}]},
                {"text": "one two three", "usage": {"input_tokens": 12, "output_tokens": 3}},
            ],
        },
    ]
}


@pytest.fixture(scope="module")
def node_client() -> list[str]:
    """`node client.mjs`, with the SDK installed by `npm ci` (from tests/helpers/acp_node's lock)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm must be on PATH to run the TypeScript SDK client (Node 20 or later)")
    done = subprocess.run(
        [npm, "ci", "--prefer-offline", "--no-audit", "--no-fund"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.fail(f"npm ci in {NODE_DIR} failed (exit {done.returncode}):\n{done.stderr}{done.stdout}")
    return [node, str(NODE_DIR / "client.mjs")]


def _updates(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(m["params"]["sessionId"], m["params"]["update"]) for m in messages if m.get("method") == "session/update"]


def _announced_before_use(messages: list[dict[str, Any]], child: str) -> bool:
    """`child`'s announcement comes before any other message that names it."""
    for message in messages:
        update = (message.get("params") or {}).get("update") or {}
        if update.get("sessionUpdate") == "subagent_update" and update.get("sessionId") == child:
            return "title" in update  # its first mention: the announcement itself
        if child in json.dumps(message):
            return False
    return False


def _about(updates: list[tuple[str, dict[str, Any]]], child: str) -> list[tuple[str, dict[str, Any]]]:
    """`child`'s own updates and the `subagent_update`s that describe it, in order (how they
    interleave with other sessions' differs between a live run and a replay)."""
    return [
        (s, u)
        for s, u in updates
        if (u["sessionUpdate"] == "subagent_update" and u["sessionId"] == child)
        or (s == child and u["sessionUpdate"] != "subagent_update")
    ]


def test_the_typescript_sdk_sees_two_children_a_grandchild_a_cancel_and_a_replay(
    tmp_path: Path, node_client: list[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "subagents.toml").write_text("max_depth = 2\n")  # Alpha may start Gamma
    model = write_script(tmp_path / "script.json", SCRIPT)
    config = {
        "agent": [*CLI, "acp", "--root", str(tmp_path / "root"), "--model", model],
        "cwd": str(work),
        "prompt": "Start two helpers.",
        "cancel_title": "Beta",
        "children": 3,
        "done_text": "ALL_DONE",
        "transcript": str(tmp_path / "transcript.json"),
        "stderr": str(tmp_path / "agent-stderr"),
        "timeout_ms": (TIMEOUT - 10) * 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = subprocess.run(
        [*node_client, str(tmp_path / "config.json")], env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    transcript = json.loads((tmp_path / "transcript.json").read_text())
    assert (done.returncode, transcript["error"], transcript["invalid"]) == (0, None, []), done.stderr
    assert done.stderr == "" and (tmp_path / "agent-stderr").read_text() == ""
    live, load = transcript["phases"]
    assert live["exit"] == load["exit"] == {"code": 0, "signal": None}
    root = transcript["sessionId"]

    incoming = [m["message"] for m in live["messages"] if m["dir"] == "in"]
    updates = _updates(incoming)
    announced = {u["sessionId"]: (s, u) for s, u in updates if u["sessionUpdate"] == "subagent_update" and "title" in u}
    by_title = {u["title"]: child for child, (_s, u) in announced.items()}
    alpha, beta, gamma = by_title["Alpha"], by_title["Beta"], by_title["Gamma"]
    assert len(announced) == 3 and len({root, alpha, beta, gamma}) == 4
    # Each child announced on its own parent, before anything bears its id.
    assert {child: parent for child, (parent, _u) in announced.items()} == {alpha: root, beta: root, gamma: alpha}
    all_messages = [m["message"] for m in live["messages"]]
    for child in (alpha, beta, gamma):
        assert _announced_before_use(all_messages, child), child
        assert announced[child][1]["capabilities"] == {"cancel": {}}
        assert announced[child][1]["state"] == {"state": "running"}
    assert announced[alpha][1]["description"] == "Start a helper that counts, then report ALPHA_OK."
    assert announced[gamma][1]["description"] == "Count to three."
    # The `subagent` tool call that started each child is linked to it.
    for child, (parent, update) in announced.items():
        call_id = update["_meta"]["trio-subagents"]["toolCallId"]
        (started,) = [
            u for s, u in updates if s == parent and u["sessionUpdate"] == "tool_call" and u["toolCallId"] == call_id
        ]
        assert started["rawInput"]["description"] == update["title"]
        links = [
            u
            for s, u in updates
            if s == parent and u.get("_meta", {}).get("trio-subagents", {}).get("childSessionId") == child
        ]
        assert [u["toolCallId"] for u in links] == [call_id]

    # The cancel of Beta by its session id stopped its turn; the others ended theirs.
    assert live["cancelled"] == beta
    assert {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": beta}} in all_messages
    states = {
        child: [u["state"] for _s, u in updates if u["sessionUpdate"] == "subagent_update" and u["sessionId"] == child]
        for child in (alpha, beta, gamma)
    }
    assert states[beta] == [{"state": "running"}, {"state": "idle", "stopReason": "cancelled"}]
    assert states[alpha] == [{"state": "running"}, {"state": "idle", "stopReason": "end_turn"}]
    assert states[gamma] == [
        {"state": "running"},
        {"state": "idle", "stopReason": "end_turn", "usage": {"totalTokens": 15, "inputTokens": 12, "outputTokens": 3}},
    ]
    meta = live["promptResponse"].pop("_meta")["trio-subagents"]
    assert live["promptResponse"] == {
        "stopReason": "end_turn",
        "usage": {"totalTokens": 120, "inputTokens": 100, "outputTokens": 20},
    }
    # The whole tree's usage (issue 30 item 2), where the schema has no place for it.
    assert meta["tree"]["sessions"] == 4 and meta["tree"]["input_tokens"] >= 100

    # The children's own sessions: their task from their parent, their tool calls and text, and
    # the notices of their own children; the root hears from both of its children.
    gamma_kinds = [u["sessionUpdate"] for s, u in updates if s == gamma]
    assert gamma_kinds == ["session_message", "tool_call", "tool_call_update", "agent_message_chunk"]
    (task,) = [u for s, u in updates if s == gamma and u["sessionUpdate"] == "session_message"]
    assert (task["senderSessionId"], task["recipientSessionId"]) == (alpha, gamma)
    assert task["content"][0]["text"] == "Count to three."
    texts = [u["content"]["text"] for s, u in updates if s == alpha and u["sessionUpdate"] == "agent_message_chunk"]
    assert texts == ["ALPHA_OK", "ALPHA_OK, and Gamma said one two three"]
    senders = {  # (which of the root's children settles first is a race)
        s: sorted(u.get("senderSessionId") for t, u in updates if t == s and u["sessionUpdate"] == "session_message")
        for s in (root, alpha, beta)
    }
    assert senders == {root: sorted([beta, alpha]), alpha: sorted([root, gamma]), beta: [root]}

    # `session/load` in a new process replays the announcements and the children's histories
    # (the same updates the live run sent for them) before its answer.
    loaded = [m["message"] for m in load["messages"] if m["dir"] == "in"]
    assert loaded[-1] == {"jsonrpc": "2.0", "id": 1, "result": {}}
    replayed = _updates(loaded)
    for child in (alpha, beta, gamma):
        assert _announced_before_use([m["message"] for m in load["messages"]], child), child
        assert _about(replayed, child) == _about(updates, child), child
