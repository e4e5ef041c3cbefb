"""Keyless scenarios: a directory that runs the runtime with a scripted model and pins the result.

A scenario directory holds:

    scenario.json        {"description"?, "steps": [...], "compression"?, "max_depth"?,
                          "max_active_subagents"?, "id_prefix"?, "system_prompt"?,
                          "on_interrupted_turn"?: "continue" | "close"}
    script.json          the scripted model (docs/scripts.md)
    seed/<id>.jsonl      optional hand-written logs (plain form) placed in the store first
    expected/output.json the outputs of the steps          ┐ goldens, written by
    expected/sessions/<encoded id>.jsonl  normalized logs  ┘ `scenario update`

Steps run in order on one store, one scripted model and one `ScenarioClock`:
`{"op": "prompt", "session": ID, "text": ..., "cancel_on_tool"?: NAME}` creates or resumes the
session, sends the text, and waits until it and every descendant are idle (with
`cancel_on_tool`, the turn is cancelled as that tool is dispatched); `{"op": "restart"}`
closes the runtime and opens it again on the same store; `{"op": "children" | "agents",
"session": ID, "descendants"?: bool}` records a listing. Logs are normalized in one place
(`normalize_log`): times and creation times are masked, everything else — ids from the flat id
factory included — is compared as written.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import zstandard
from subagents.storage import FileLogStore, encode_session_id

from ..agent.loop import AgentConfig
from ..app import Runtime, open_runtime
from ..delegation.tools import agent_status, render_agents
from ..foundation.clock import ScenarioClock
from ..foundation.errors import ScenarioError, ScriptError
from ..foundation.ids import CountingIds
from .script_format import load_script
from .scripted_model import DEFAULT_STALL_TIMEOUT, ScriptedModel

__all__ = ["check_scenario", "normalize_log", "run_scenario", "scenario_dirs", "update_scenario"]

Json = dict[str, Any]
_MASK = "<time>"
_TOP_KEYS = {
    "description",
    "steps",
    "compression",
    "max_depth",
    "max_active_subagents",
    "id_prefix",
    "system_prompt",
    "on_interrupted_turn",
}
_STEP_KEYS = {
    "prompt": ({"op", "session", "text"}, {"cancel_on_tool"}),
    "restart": ({"op"}, set()),
    "children": ({"op", "session"}, {"descendants"}),
    "agents": ({"op", "session"}, {"descendants"}),
}


@attrs.frozen
class ScenarioResult:
    outputs: list[Json]
    logs: dict[str, str]  # session id → normalized log text


def scenario_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """`path` itself if it is a scenario, else every scenario directly below it (sorted)."""
    root = Path(path)
    if (root / "scenario.json").is_file():
        return [root]
    if not root.is_dir():
        raise ScenarioError(f"no scenario at {root}")
    found = sorted(p for p in root.iterdir() if (p / "scenario.json").is_file())
    if not found:
        raise ScenarioError(f"no scenario at {root} (a scenario folder holds scenario.json)")
    return found


def _load(directory: Path, stall_timeout: float | None) -> tuple[Json, ScriptedModel]:
    try:
        spec = json.loads((directory / "scenario.json").read_text())
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"{directory}/scenario.json: {exc}") from None
    _validate(spec, directory)
    try:
        model = ScriptedModel(load_script(str(directory / "script.json")), stall_timeout=stall_timeout)
    except ScriptError as exc:
        raise ScenarioError(str(exc)) from None
    return spec, model


def _validate(spec: Any, directory: Path) -> None:
    where = f"{directory}/scenario.json"
    if not isinstance(spec, dict):
        raise ScenarioError(f"{where}: $ must be an object")
    unknown = set(spec) - _TOP_KEYS
    if unknown:
        raise ScenarioError(f"{where}: $.{sorted(unknown)[0]} is not a known key")
    if not isinstance(spec.get("steps"), list) or not spec["steps"]:
        raise ScenarioError(f"{where}: $.steps must be a non-empty list")
    for i, step in enumerate(spec["steps"]):
        path = f"$.steps[{i}]"
        if not isinstance(step, dict) or step.get("op") not in _STEP_KEYS:
            raise ScenarioError(f"{where}: {path}.op must be one of {sorted(_STEP_KEYS)}")
        required, optional = _STEP_KEYS[step["op"]]
        missing = required - set(step)
        extra = set(step) - required - optional
        if missing or extra:
            key = sorted(missing or extra)[0]
            raise ScenarioError(f"{where}: {path}.{key} is {'missing' if missing else 'not a known key'}")
        for key in ("session", "text", "cancel_on_tool"):
            if key in step and not isinstance(step[key], str):
                raise ScenarioError(f"{where}: {path}.{key} must be a string")
        if "descendants" in step and not isinstance(step["descendants"], bool):
            raise ScenarioError(f"{where}: {path}.descendants must be true or false")
    if spec.get("compression", "none") not in ("none", "zstd"):
        raise ScenarioError(f'{where}: $.compression must be "none" or "zstd"')
    if spec.get("on_interrupted_turn", "continue") not in ("continue", "close"):
        raise ScenarioError(f'{where}: $.on_interrupted_turn must be "continue" or "close"')
    for key in ("max_depth", "max_active_subagents"):
        value = spec.get(key, 1)
        if type(value) is not int or value < 0:
            raise ScenarioError(f"{where}: $.{key} must be a non-negative integer")
    for key in ("description", "id_prefix", "system_prompt"):
        if key in spec and not isinstance(spec[key], str):
            raise ScenarioError(f"{where}: $.{key} must be a string")


def _place_seeds(directory: Path, root: Path) -> None:
    seed = directory / "seed"
    if not seed.is_dir():
        return
    for log in sorted(seed.glob("*.jsonl")):
        folder = root / "sessions" / encode_session_id(log.stem)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, folder / "session.jsonl")


class _CancelOn:
    """Wraps one tool: its `prepare` (run as the call is dispatched) cancels the turn first."""

    def __init__(self, tool: Any) -> None:
        self._tool = tool
        self.name = tool.name
        self.description = tool.description
        self.parameters = tool.parameters
        self.parallel_safe = tool.parallel_safe

    async def prepare(self, args: Json, ctx: Any) -> Any:
        ctx.agent.cancel("user")
        prepare = getattr(self._tool, "prepare", None)
        return await prepare(args, ctx) if prepare is not None else None

    async def run(self, args: Json, ctx: Any) -> Any:
        return await self._tool.run(args, ctx)


async def _prompt(runtime: Runtime, step: Json) -> Json:
    sid = step["session"]
    agent = runtime.agents.get(sid)
    if agent is None:
        on_disk, _held = await runtime.query.stat(sid)  # the index's one worker slot
        agent = await (runtime.agents.resume(sid) if on_disk is not None else runtime.agents.create(session_id=sid))
    name = step.get("cancel_on_tool")
    if name is not None:
        tool = agent.tools.get(name)
        if tool is None:
            raise ScenarioError(f"cancel_on_tool: session {sid!r} has no tool {name!r}")
        agent.tools.replace(_CancelOn(tool))
    await agent.send(step["text"])
    result = await runtime.subagents.wait_tree_idle(agent)
    return {
        "op": "prompt",
        "session": sid,
        "output": result.text if result else None,
        "reason": result.reason if result else None,
    }


async def _listing(runtime: Runtime, step: Json) -> Json:
    sid, descendants = step["session"], bool(step.get("descendants", False))
    rows = await (runtime.listing.list_descendants(sid) if descendants else runtime.listing.list_children(sid))
    if step["op"] == "children":
        return {"op": "children", "session": sid, "rows": [row.to_json() for row in rows]}
    text = render_agents(rows, descendants, lambda cid: agent_status(runtime.agents, cid))
    return {"op": "agents", "session": sid, "text": text}


async def run_scenario(
    directory: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
) -> ScenarioResult:
    """Run the scenario in `directory` on a store at `root`. A scripted `wait_for` with no
    progress for `stall_timeout` seconds (Trio's clock) fails its turn (`MODEL_SCRIPT_STALLED`),
    which the step's output records."""
    directory, root = Path(directory), Path(root)
    spec, model = _load(directory, stall_timeout)
    root.mkdir(parents=True, exist_ok=True)
    _place_seeds(directory, root)
    clock = ScenarioClock()
    ids = CountingIds(spec.get("id_prefix", "session"))
    options: Json = dict(
        model=model,
        clock=clock,
        id_factory=ids,
        compression=spec.get("compression", "none"),
        max_depth=spec.get("max_depth", 1),
        max_active_subagents=spec.get("max_active_subagents", 8),
        agent_config=AgentConfig(system_prompt=spec.get("system_prompt")),
        on_interrupted_turn=spec.get("on_interrupted_turn"),
    )
    outputs: list[Json] = []
    steps: list[Json] = spec["steps"]
    i = 0
    while i < len(steps):
        async with open_runtime(root, **options) as runtime:
            while i < len(steps) and steps[i]["op"] != "restart":
                step = steps[i]
                outputs.append(await (_prompt(runtime, step) if step["op"] == "prompt" else _listing(runtime, step)))
                i += 1
        if i < len(steps):
            outputs.append({"op": "restart"})
            i += 1
    return ScenarioResult(outputs, _normalized_logs(root))


def _normalized_logs(root: Path) -> dict[str, str]:
    return {
        info.id: normalize_log(_plain_text(root, info.id)) for info in FileLogStore(str(root), use_index=False).list()
    }


def _plain_text(root: Path, session_id: str) -> str:
    folder = root / "sessions" / encode_session_id(session_id)
    plain = folder / "session.jsonl"
    if plain.exists():
        return plain.read_text()
    with open(folder / "session.jsonl.zst", "rb") as file:  # decompressing yields the plain form
        reader = zstandard.ZstdDecompressor().stream_reader(file, read_across_frames=True)
        return reader.read().decode()


def normalize_log(text: str) -> str:
    """One JSON value per line with every volatile field masked (times of day)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            out.append(line)  # a damaged line (a seeded corrupt log) is compared as it is
            continue
        if not isinstance(record, dict):
            out.append(line)
            continue
        if record.get("type") == "session":
            record["created_at"] = _MASK
        else:
            record["time"] = _MASK
            data = record.get("data")
            if isinstance(data, dict) and "child_created_at" in data:
                data["child_created_at"] = _MASK
        out.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(out) + "\n"


def _render_outputs(outputs: Sequence[Json]) -> str:
    return json.dumps(outputs, ensure_ascii=False, indent=2) + "\n"


async def _run_fresh(directory: Path, stall_timeout: float | None) -> ScenarioResult:
    with tempfile.TemporaryDirectory(prefix="scenario-") as tmp:
        return await run_scenario(directory, tmp, stall_timeout=stall_timeout)


async def update_scenario(
    directory: str | os.PathLike[str], *, stall_timeout: float | None = DEFAULT_STALL_TIMEOUT
) -> list[str]:
    """Run the scenario afresh and write its goldens; the session ids written, sorted."""
    directory = Path(directory)
    result = await _run_fresh(directory, stall_timeout)
    expected = directory / "expected"
    if expected.exists():
        shutil.rmtree(expected)
    (expected / "sessions").mkdir(parents=True)
    (expected / "output.json").write_text(_render_outputs(result.outputs))
    for sid, text in result.logs.items():
        (expected / "sessions" / f"{encode_session_id(sid)}.jsonl").write_text(text)
    return sorted(result.logs)


async def check_scenario(
    directory: str | os.PathLike[str], *, stall_timeout: float | None = DEFAULT_STALL_TIMEOUT
) -> list[str]:
    """The problems found (empty: the scenario matches its goldens), each with a readable diff."""
    directory = Path(directory)
    expected = directory / "expected"
    if not (expected / "output.json").is_file():
        raise ScenarioError(f"{directory}: no goldens (run `subagents scenario update {directory}`)")
    result = await _run_fresh(directory, stall_timeout)
    problems: list[str] = []
    _compare(problems, "expected/output.json", (expected / "output.json").read_text(), _render_outputs(result.outputs))
    goldens = {p.name: p for p in (expected / "sessions").glob("*.jsonl")} if (expected / "sessions").is_dir() else {}
    for sid, text in sorted(result.logs.items()):
        name = f"{encode_session_id(sid)}.jsonl"
        golden = goldens.pop(name, None)
        if golden is None:
            problems.append(f"session {sid!r} has no golden (expected/sessions/{name})")
        else:
            _compare(problems, f"expected/sessions/{name}", golden.read_text(), text)
    for name in sorted(goldens):
        problems.append(f"unused golden expected/sessions/{name}: the run produced no such session")
    return problems


def _compare(problems: list[str], name: str, golden: str, actual: str) -> None:
    if golden != actual:
        diff = difflib.unified_diff(
            golden.splitlines(), actual.splitlines(), f"{name} (golden)", f"{name} (this run)", lineterm="", n=2
        )
        problems.append("\n".join(diff))
