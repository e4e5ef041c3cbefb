"""What the budget-tree tests share: a scripted model of agents, a `subagent` call, a usage
record, and the logs of a folder store read back as (type, data) pairs per session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from log_lines import read_all
from subagents.runtime.testing import ScriptedModel, load_script
from subagents.storage import FileLogStore

Json = dict[str, Any]
Events = list[tuple[str, Json]]


def scripted(agents: list[Json], summaries: list[str] | None = None) -> ScriptedModel:
    return ScriptedModel(load_script(json.dumps({"agents": agents, "summaries": summaries or []})))


def delegate(label: str, **arguments: Any) -> Json:
    return {"name": "subagent", "arguments": {"description": label, "prompt": "work", **arguments}}


def usage(n: int) -> Json:
    return {"input_tokens": n, "output_tokens": 0}


def logs(root: Path) -> dict[str, Events]:
    store = FileLogStore(str(root), compression="none")
    try:
        return {
            info.id: [(e.type, msgspec.json.decode(e.data)) for e in read_all(store, info.id)] for info in store.list()
        }
    finally:
        store.close_store()


def ends(events: Events) -> list[Json]:
    return [d["reason"] for t, d in events if t == "turn/end"]


def label_of(events: Events) -> str | None:
    return next((d.get("label") for t, d in events if t == "subagent/descriptor"), None)
