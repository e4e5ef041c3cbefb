"""One error tree (runtime/foundation/errors.py, actors/errors.py, storage/errors.py): every class under
the root `SubagentsError` has its own fixed, prefixed code, lives in a layer's `errors.py`, is
written out in that module's tree, and nothing in the layers matches a code as a string or sniffs
an exception's module."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import subagents.actors
import subagents.runtime
import subagents.storage
from subagents.actors import errors as actor_errors
from subagents.runtime.foundation import errors as runtime_errors
from subagents.runtime.tools.base import FunctionTool, ToolContext, ToolSet
from subagents.storage import SubagentsError
from subagents.storage import errors as storage_errors

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("storage", "actors", "runtime")

# Which code prefix each branch's classes carry.
PREFIXES = [
    (storage_errors.StorageError, "STORAGE_"),
    (actor_errors.ActorError, "ACTOR_"),
    (runtime_errors.SessionQueryError, "QUERY_"),
    (runtime_errors.SubagentError, "SUBAGENT_"),
    (runtime_errors.ToolFailure, "SUBAGENT_"),
    (runtime_errors.ModelError, "MODEL_"),
    (runtime_errors.ScriptError, "SCRIPT_"),
    (runtime_errors.ScenarioError, "SCRIPT_"),
    (runtime_errors.CliError, "CLI_"),
]


def _import_everything() -> None:
    for package in (subagents.storage, subagents.actors, subagents.runtime):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(info.name)


def _tree() -> list[type[SubagentsError]]:
    _import_everything()
    seen: list[type[SubagentsError]] = []
    todo = list(SubagentsError.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls not in seen and cls.__module__.startswith("subagents."):
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return seen


def test_every_class_has_its_own_fixed_prefixed_code_and_lives_in_an_errors_module() -> None:
    tree = _tree()
    assert len(tree) > 60  # the whole tree, not a part of it
    codes: dict[str, str] = {}
    for cls in tree:
        assert "code" in vars(cls), f"{cls.__qualname__} inherits its code"
        assert cls.__module__ in {m.__name__ for m in (storage_errors, actor_errors, runtime_errors)}, cls
        prefix = next(p for base, p in PREFIXES if issubclass(cls, base))
        assert cls.code.startswith(prefix), (cls.__qualname__, cls.code)
        assert cls.code not in codes, f"{cls.__qualname__} and {codes[cls.code]} share {cls.code}"
        codes[cls.code] = cls.__qualname__


@pytest.mark.parametrize("module", [storage_errors, actor_errors, runtime_errors], ids=lambda m: m.__name__)
def test_each_errors_module_writes_its_branch_out_once(module: object) -> None:
    written = dict(re.findall(r"^\s*(?:[│├└─ ]*)\b([A-Z]\w+)\s+([A-Z][A-Z_]+[A-Z])\b", module.__doc__ or "", re.M))
    classes = {
        name: cls
        for name, cls in vars(module).items()
        if isinstance(cls, type) and issubclass(cls, SubagentsError) and cls.__module__ == module.__name__
    }
    assert classes
    for name, cls in classes.items():
        assert written.get(name) == cls.code, f"{name} ({cls.code}) is not in the tree of {module.__name__}"


def _violations(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "code" for s in sides) and any(
                isinstance(s, ast.Constant)
                and isinstance(s.value, str)
                or isinstance(s, (ast.Name, ast.Tuple, ast.Set))
                for s in sides
            ):
                found.append(f"line {node.lineno}: a code compared")
        if isinstance(node, ast.Attribute) and node.attr == "__module__":
            found.append(f"line {node.lineno}: __module__")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            # a code used as a key to look a behaviour up
            if any(isinstance(a, ast.Attribute) and a.attr == "code" for a in node.args):
                found.append(f"line {node.lineno}: a code looked up")
    return found


def test_no_layer_matches_a_code_or_sniffs_a_module() -> None:
    problems = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            problems += [f"{path.relative_to(ROOT)} {v}" for v in _violations(path.read_text())]
    assert problems == []


@pytest.mark.parametrize(
    "snippet",
    [
        'if exc.code == "SESSION_QUERY_ABORTED":\n    pass\n',
        "if exc.code != NOT_FOUND:\n    pass\n",
        "ours = type(exc).__module__.startswith('subagents.')\n",
        "reason = REASONS.get(exc.code)\n",
    ],
)
def test_the_scan_finds_each_kind_of_match(snippet: str) -> None:
    assert _violations(snippet)


class _Raises:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.name = "boom"
        self.description = "fails"
        self.parameters = {"type": "object", "properties": {}}
        self.parallel_safe = True

    async def run(self, args: dict, ctx: ToolContext) -> str:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "record"),
    [
        (runtime_errors.NotResumable('subagent "x" is unavailable'), ("SubagentError", "NOT_RESUMABLE")),
        (runtime_errors.SubagentCancelled("cancelled"), ("SubagentError", "CANCELLED")),
        (runtime_errors.QueryPersistenceFailed("disk gone"), ("SessionQueryError", "SESSION_QUERY_PERSISTENCE_FAILED")),
        (runtime_errors.NoModel("no model"), ("AgentError", "NO_MODEL")),
        (runtime_errors.OptionsNotReapplied("no route"), ("AgentError", "NOT_RESUMABLE")),
        (storage_errors.CorruptLog("s", "torn", seq=3), ("CorruptLog", "STORAGE_CORRUPT_LOG")),
        (storage_errors.OwnershipLost("s", 3), ("OwnershipLost", "STORAGE_OWNERSHIP_LOST")),
        (runtime_errors.ToolFailure("nope", code="MY_CODE", name="MyError"), ("MyError", "MY_CODE")),
        (runtime_errors.ToolFailure("nope", code="MY_CODE"), ("ToolFailure", "MY_CODE")),
        (OSError("a tool's own IO error"), ("OSError", "TOOL_FAILED")),
    ],
)
async def test_a_failed_tool_records_the_pinned_name_and_code(exc: Exception, record: tuple[str, str]) -> None:
    from subagents.actors import Abort

    tools = ToolSet([_Raises(exc)])
    ctx = ToolContext(session_id="s", call_id="c", turn=1, step=1, abort=Abort())
    call = await tools.prepare("boom", "{}", ctx)
    outcome = await tools.run(call, ctx)
    assert (outcome.error["name"], outcome.error["code"]) == record
    assert outcome.is_error and outcome.content[0]["text"] == f"Error: {exc}"


def test_the_runtime_face_offers_the_branch_bases() -> None:
    for name in (
        "SubagentsError",
        "SubagentError",
        "AgentError",
        "AgentStopped",
        "SessionQueryError",
        "ModelError",
        "ScriptError",
        "ToolFailure",
    ):
        assert getattr(subagents.runtime, name) is getattr(runtime_errors, name)
    assert subagents.storage.SubagentsError is SubagentsError
    assert issubclass(runtime_errors.AgentError, runtime_errors.SubagentError)  # one hierarchy
    assert issubclass(runtime_errors.SessionQueryError, SubagentsError)
    assert FunctionTool  # the tool framework is importable beside the tree


def test_an_error_class_has_one_home() -> None:
    """Only a layer's `errors.py` (and the package faces) export error classes: no other module
    lists one in its `__all__`, so there is one import path per error."""
    _import_everything()
    tree = set(_tree()) | {SubagentsError}
    faces = {"subagents.storage", "subagents.actors", "subagents.runtime"}
    homes = {m.__name__ for m in (storage_errors, actor_errors, runtime_errors)}
    problems = []
    for package in (subagents.storage, subagents.actors, subagents.runtime):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            if info.name in homes | faces:
                continue
            for name in getattr(module, "__all__", ()):
                value = getattr(module, name, None)
                if isinstance(value, type) and value in tree:
                    problems.append(f"{info.name} exports {name}")
    assert problems == []
