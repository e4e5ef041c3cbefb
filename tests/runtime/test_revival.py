"""A resumed parent takes up its children whose turns a dead process cut (issue 27 item 1;
runtime/delegation/revival.py): each continuable child its catalog names whose last turn is open
is resumed under it — its turn continued — and settles, so the parent's wait for its tree waits
for it and the parent hears of it once. A child stopped for good, or a runtime whose policy is
`close`, leaves it as it is. Logs written by hand: a parent whose turn started a child, and the
child cut in its model call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from descriptors import descriptor
from log_lines import encode_header, header, json_line, new_log_file, read_all
from subagents.runtime import AgentConfig, CountingIds, ScenarioClock, ScriptedModel, load_script, open_runtime
from subagents.storage import FileLogStore

Json = dict[str, Any]
T0 = 1_789_000_000_000
GUARD = 60


def _message(role: str, text: str, source: Json) -> Json:
    return {"id": f"m-{role}-{text}", "role": role, "content": [{"type": "text", "text": text}], "source": source}


def _write(root: Path, sid: str, head: Any, events: list[tuple[str, Json, Json]]) -> None:
    lines = [json_line(seq, t, d, time=T0 + seq, **env) for seq, (t, d, env) in enumerate(events)]
    new_log_file(root, sid, "none").write_bytes(encode_header(head) + b"".join(lines))


def _cut_family(root: Path, *, stopped: bool = False) -> None:
    user = {"kind": "user"}
    _write(
        root,
        "p",
        header("p", T0),
        [
            ("turn/start", {"turn": 1}, {}),
            ("step/start", {"turn": 1, "step": 1}, {}),
            ("user/message", {"turn": 1, "step": 1, "message": _message("user", "go", user)}, {"surface_op": "append"}),
            (
                "subagent/catalog",
                {"version": 1, "child_id": "c", "child_created_at": T0 + 3, "mode": "continuable", "label": "w"},
                {},
            ),
            (
                "assistant/message",
                {
                    "turn": 1,
                    "step": 1,
                    "finish": "stop",
                    "message": _message("assistant", "started", {"kind": "model"}),
                },
                {"surface_op": "append"},
            ),
            ("step/end", {"turn": 1, "step": 1}, {}),
            ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}, {}),
        ],
    )
    child = [
        ("subagent/descriptor", descriptor("w"), {}),
        ("turn/start", {"turn": 1}, {}),
        ("step/start", {"turn": 1, "step": 1}, {}),
        ("user/message", {"turn": 1, "step": 1, "message": _message("user", "work", user)}, {"surface_op": "append"}),
    ]
    if stopped:
        child.append(("session/stopped", {"by": "operator", "tree": False}, {}))
    _write(root, "c", header("c", T0 + 3, origin="subagent", parent_session="p", delegation_depth=1), child)


def _events(root: Path, sid: str) -> list[tuple[str, Json]]:
    store = FileLogStore(str(root), compression="none", use_index=False)
    return [(e.type, json.loads(bytes(e.data))) for e in read_all(store, sid)]


async def _resume_parent(root: Path, **config: Any) -> None:
    script = load_script(
        json.dumps(
            {
                "agents": [
                    {"session": "p", "responses": [{"text": "NOTED"}]},
                    {"label": "w", "responses": [{"text": "DONE"}]},
                ]
            }
        )
    )
    async with open_runtime(
        root,
        model=ScriptedModel(script),
        clock=ScenarioClock(start=T0 + 100),
        id_factory=CountingIds("x"),
        compression="none",
        agent_config=AgentConfig(**config),
    ) as rt:
        with trio.fail_after(GUARD):
            parent = await rt.agents.resume("p")
            await rt.subagents.wait_tree_idle(parent)


async def test_a_resumed_parent_takes_up_its_cut_child_which_finishes_and_is_heard_once(tmp_path: Path) -> None:
    _cut_family(tmp_path)
    await _resume_parent(tmp_path)
    child = _events(tmp_path, "c")
    types = [t for t, _ in child]
    assert types[4:] == ["turn/continue", "assistant/message", "step/end", "turn/end"]
    assert child[-1][1]["reason"] == {"kind": "completed"}
    parent = _events(tmp_path, "p")
    settled = [d for t, d in parent if t == "subagent/settled"]
    assert [(d["child_id"], d["reason_kind"], d.get("closing_text")) for d in settled] == [("c", "completed", "DONE")]
    notices = [d for t, d in parent if t == "user/message" and d["message"]["source"]["kind"] == "subagent-settled"]
    assert len(notices) == 1


async def test_a_child_stopped_for_good_is_not_taken_up(tmp_path: Path) -> None:
    _cut_family(tmp_path, stopped=True)
    before = _events(tmp_path, "c")
    await _resume_parent(tmp_path)
    assert _events(tmp_path, "c") == before
    assert [t for t, _ in _events(tmp_path, "p")].count("subagent/settled") == 0


async def test_under_the_close_policy_nothing_is_taken_up_by_itself(tmp_path: Path) -> None:
    _cut_family(tmp_path)
    before = _events(tmp_path, "c")
    await _resume_parent(tmp_path, on_interrupted_turn="close")
    assert _events(tmp_path, "c") == before
