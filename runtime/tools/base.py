"""The tool framework below the agent loop (docs/design.md, "The agent loop and
models"; README, "Model-facing tools").

A tool has a name, a description, JSON-schema parameters and an async `run(args, ctx)` that
returns text (or text blocks). The framework parses the model's raw argument string, validates
it against the schema, runs the tool and renders the outcome to content blocks. Every failure
the model could cause or should hear about — unknown tool, malformed JSON, wrong types, a tool
raising — becomes an error result `Error: <message>` with `error: {name, code}`, so the model can
read it and the turn goes on. `trio.Cancelled` is never caught.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import attrs
from subagents.actors import Abort
from subagents.storage import TOOL_OUTCOME_UNKNOWN_TEXT, CatalogedChild, SubagentsError

from ..foundation.json_values import JsonObject as Json
from ..foundation.json_values import JsonValue
from ..models.base import ToolSpec
from ..models.messages import text_blocks

__all__ = [
    "FunctionTool",
    "Reconciled",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolSet",
    "check_schema",
    "in_doubt_outcome",
    "validate_arguments",
]

ToolOutput = str | Sequence[Mapping[str, JsonValue]]


@attrs.frozen(kw_only=True)
class ToolContext:
    session_id: str
    call_id: str
    turn: int
    step: int
    abort: Abort  # the turn's: set when the turn is cancelled (phase one: docs/design.md, "Cancellation")
    agent: Any = None  # the calling agent, for tools that act on the runtime
    prepared: Any = None  # what the tool's `prepare` returned (drawn in model order)


@attrs.frozen
class PreparedCall:
    """A call checked and prepared in model order, ready to run concurrently with its group."""

    tool: Any
    args: Json
    state: Any = None
    outcome: ToolOutcome | None = None  # set when the call already failed


class Tool(Protocol):
    """A tool. It may also define `async prepare(args, ctx)`: the loop calls it for each call of
    a step in model order before the calls run concurrently (ids and times are drawn there, so
    they follow the model's order, not completion order); its value arrives as `ctx.prepared`.
    A prepared value with an `announced` `trio.Event` holds the step's results until it is set:
    the tool sets it once it has written its own events to the caller's log (or never will),
    so those events sit before every result of the group, in model order."""

    # Read-only: a tool is a frozen value (its class may keep these as plain attributes).
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def parameters(self) -> Mapping[str, JsonValue]: ...
    @property
    def parallel_safe(self) -> bool: ...

    # Optional `server_validated = True`: the arguments are checked by the tool's server, not
    # against `parameters` here (MCP tools), so any JSON object schema is accepted.
    # Optional `idempotent = True`: running a call twice has the effect of running it once, so
    # a call a crash cut after it started runs again when its turn is continued; any other is
    # in doubt then (docs/format.md, "Continued turns").
    # Optional `reconcile(args, child, unkeyed) -> Reconciled`: a tool that records what it
    # started (`subagent`, by its catalog) says what became of a call a crash cut.

    async def run(self, args: Json, ctx: ToolContext) -> ToolOutput: ...


@attrs.frozen(kw_only=True)
class FunctionTool:
    """A tool made from an async function `fn(args, ctx)`."""

    name: str
    description: str
    parameters: Mapping[str, JsonValue] = attrs.field(factory=lambda: {"type": "object", "properties": {}})
    fn: Callable[[Json, ToolContext], Awaitable[ToolOutput]]
    parallel_safe: bool = True
    idempotent: bool = False

    async def run(self, args: Json, ctx: ToolContext) -> ToolOutput:
        return await self.fn(args, ctx)


@attrs.frozen
class ToolOutcome:
    content: list[Json]
    is_error: bool = False
    error: Json | None = None  # {name, code} on failure

    @classmethod
    def failure(cls, message: str, *, name: str, code: str) -> ToolOutcome:
        return cls(text_blocks(f"Error: {message}"), True, {"name": name, "code": code})


def in_doubt_outcome(text: str = TOOL_OUTCOME_UNKNOWN_TEXT) -> ToolOutcome:
    """The result of a call a crash cut after it started that is not run again (the closer's text)."""
    return ToolOutcome(text_blocks(text), True, {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"})


@attrs.frozen
class Reconciled:
    """What becomes of a call a crash cut after it started: `outcome` None runs it (again);
    otherwise `outcome` is its result, recorded `in_doubt` when it says so."""

    outcome: ToolOutcome | None = None
    in_doubt: bool = False


class ToolSet:
    """The tools one agent may call, by name, in registration order."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if not isinstance(tool.name, str) or not tool.name:
            raise ValueError(f"a tool needs a non-empty name, got {tool.name!r}")
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        if _server_validated(tool):
            if not isinstance(tool.parameters, Mapping) or tool.parameters.get("type") != "object":
                raise ValueError(f"tool {tool.name!r} parameters: the schema must be an object schema")
        else:
            check_schema(tool.parameters, f"tool {tool.name!r} parameters")
        self._tools[tool.name] = tool

    def replace(self, tool: Tool) -> None:
        """Swap the tool registered under the same name (scenarios wrap one to steer a run)."""
        if tool.name not in self._tools:
            raise KeyError(tool.name)
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def for_agent_type(self, agent_type: str | None) -> ToolSet:
        """These tools as an agent of `agent_type` is offered them: a tool whose description
        depends on its caller's type (`for_agent_type(agent_type)`: `run_command`'s box) is
        swapped for that caller's; the same set when none changes."""
        chosen: list[Tool] = []
        for tool in self._tools.values():
            special = getattr(tool, "for_agent_type", None)
            chosen.append(special(agent_type) if special is not None else tool)
        if all(new is old for new, old in zip(chosen, self._tools.values(), strict=True)):
            return self
        return ToolSet(chosen)

    def specs(self) -> list[ToolSpec]:
        return [ToolSpec(t.name, t.description, t.parameters) for t in self._tools.values()]

    def parallel_safe(self, name: str) -> bool:
        tool = self._tools.get(name)
        return tool is None or bool(tool.parallel_safe)  # an unknown tool fails at once: harmless

    def idempotent(self, name: str) -> bool:
        """Whether running a call of `name` twice does what running it once does."""
        tool = self._tools.get(name)
        return tool is not None and getattr(tool, "idempotent", False) is True

    async def reconcile(self, name: str, raw_arguments: str, child: CatalogedChild | None, unkeyed: bool) -> Reconciled:
        """A started call that a crash cut before its result (docs/format.md, "Continued
        turns"): the tool's own `reconcile` decides; else an idempotent tool runs again and any
        other is in doubt. `child` is the open turn's catalogued child of this call, if any;
        `unkeyed`: that turn catalogued a child without naming its call (an older log)."""
        tool = self._tools.get(name)
        if tool is None:
            return Reconciled()  # it fails at once as it did: "unknown tool"
        reconcile = getattr(tool, "reconcile", None)
        if reconcile is not None:
            try:
                args = _parse(raw_arguments)
            except _ArgumentsError:
                return Reconciled()  # it failed before it could do anything: it fails again
            result: Reconciled = reconcile(args, child, unkeyed)
            return result
        if self.idempotent(name):
            return Reconciled()
        return Reconciled(in_doubt_outcome(), in_doubt=True)

    async def execute(self, name: str, raw_arguments: str, ctx: ToolContext) -> ToolOutcome:
        return await self.run(await self.prepare(name, raw_arguments, ctx), ctx)

    async def prepare(self, name: str, raw_arguments: str, ctx: ToolContext) -> PreparedCall:
        tool = self._tools.get(name)
        if tool is None:
            return PreparedCall(
                None,
                {},
                outcome=ToolOutcome.failure(f'unknown tool "{name}"', name="ToolNotFoundError", code="UNKNOWN_TOOL"),
            )
        try:
            args = _parse(raw_arguments)
            if not _server_validated(tool):
                validate_arguments(args, tool.parameters)
        except _ArgumentsError as exc:
            return PreparedCall(
                tool,
                {},
                outcome=ToolOutcome.failure(
                    f'invalid arguments for tool "{name}": {exc}', name="ToolArgumentsError", code="INVALID_ARGUMENTS"
                ),
            )
        prepare = getattr(tool, "prepare", None)
        if prepare is None:
            return PreparedCall(tool, args)
        try:
            return PreparedCall(tool, args, await prepare(args, ctx))
        except Exception as exc:  # a tool's failure is an `Error:` result (Cancelled is not caught)
            return PreparedCall(tool, args, outcome=_failed(exc))

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolOutcome:
        if call.outcome is not None:
            return call.outcome
        try:
            if call.state is not None:
                ctx = attrs.evolve(ctx, prepared=call.state)
            return ToolOutcome(_render(call.tool.name, await call.tool.run(call.args, ctx)))
        except Exception as exc:  # a tool's failure is an `Error:` result (Cancelled is not caught)
            return _failed(exc)


def _server_validated(tool: Tool) -> bool:
    """A tool whose arguments another program validates (an MCP server's: its schemas use far
    more of JSON schema than the subset here) gets its schema passed to the model unchecked."""
    return getattr(tool, "server_validated", False) is True


def _failed(exc: Exception) -> ToolOutcome:
    # An error of this runtime's tree (a tool's `ToolFailure`, the subagent service, a session
    # query, storage, a model) records its pinned `{name, code}`; anything else is a tool's own
    # bug or IO error. Either way the model hears about it and the turn goes on.
    if isinstance(exc, SubagentsError):
        record = exc.record()
        return ToolOutcome.failure(exc.message or type(exc).__name__, name=record["name"], code=record["code"])
    return ToolOutcome.failure(str(exc) or type(exc).__name__, name=type(exc).__name__, code="TOOL_FAILED")


def _render(name: str, output: ToolOutput) -> list[Json]:
    if isinstance(output, str):
        return text_blocks(output)
    if not isinstance(output, (list, tuple)) or not all(isinstance(b, Mapping) for b in output):
        raise TypeError(f"tool {name!r} returned {type(output).__name__}, not text or text blocks")
    blocks = [dict(b) for b in output]
    for block in blocks:
        if block.get("type") != "text" or not isinstance(block.get("text"), str) or len(block) != 2:
            raise TypeError(f"tool {name!r} returned a block that is not a text block: {block!r}")
    return blocks


class _ArgumentsError(ValueError):
    pass


def _parse(raw: str) -> Json:
    if not isinstance(raw, str):
        raise _ArgumentsError("arguments must be a JSON string")
    text = raw.strip() or "{}"  # some models send "" for a tool without parameters
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise _ArgumentsError(f"malformed JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _ArgumentsError(f"expected a JSON object, got {_kind(value)}")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


# --- a small JSON-schema subset: enough for tool parameters, strict where it matters ---------

_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "enum",
        "items",
        "description",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "default",
        "title",
    }
)
_TYPES = frozenset({"object", "string", "integer", "number", "boolean", "array", "null"})


def check_schema(schema: Mapping[str, JsonValue], where: str) -> None:
    """Refuse a parameters schema the validator would not honour (a typo must not pass silently)."""
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ValueError(f"{where}: the schema must be an object schema ({{'type': 'object', ...}})")
    _check_node(schema, where)


def _check_node(schema: JsonValue, where: str) -> None:
    if not isinstance(schema, Mapping):
        raise ValueError(f"{where}: a schema must be an object")
    unknown = set(schema) - _KEYWORDS
    if unknown:
        raise ValueError(f"{where}: unsupported schema keywords {sorted(unknown)}")
    types = schema.get("type")
    if types is not None:
        listed = [types] if isinstance(types, str) else types
        if not isinstance(listed, list) or not listed or not all(isinstance(t, str) and t in _TYPES for t in listed):
            raise ValueError(f"{where}: type must be one of {sorted(_TYPES)} or a list of them, got {types!r}")
    props = schema.get("properties", {})
    if not isinstance(props, Mapping):
        raise ValueError(f"{where}: properties must be an object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
        raise ValueError(f"{where}: required must be a list of names")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValueError(f"{where}: enum must be a list")
    if not isinstance(schema.get("additionalProperties", True), bool):
        raise ValueError(f"{where}: additionalProperties must be true or false")
    for bound in ("minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"):
        value = schema.get(bound, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: {bound} must be a number")
    for key, sub in props.items():
        _check_node(sub, f"{where}.{key}")
    if "items" in schema:
        _check_node(schema["items"], f"{where}[]")


def validate_arguments(value: JsonValue, schema: Mapping[str, JsonValue], path: str = "$") -> None:
    """Raise a readable error naming the JSON path of the first mismatch."""
    types = schema.get("type")
    if types is not None:
        allowed = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, t) for t in allowed):
            raise _ArgumentsError(f"{path} must be {' or '.join(allowed)}, got {_kind(value)}")
    if "enum" in schema and not any(_json_equal(value, choice) for choice in schema["enum"]):
        raise _ArgumentsError(f"{path} must be one of {json.dumps(schema['enum'])}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required") or ():
            if key not in value:
                raise _ArgumentsError(f"{path}.{key} is required")
        for key, item in value.items():
            if key in props:
                validate_arguments(item, props[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                raise _ArgumentsError(f"{path}.{key} is not a known parameter")
    elif isinstance(value, list):
        if "items" in schema:
            for i, item in enumerate(value):
                validate_arguments(item, schema["items"], f"{path}[{i}]")
        _bounds(len(value), schema, "minItems", "maxItems", path, "items")
    elif isinstance(value, str):
        _bounds(len(value), schema, "minLength", "maxLength", path, "characters")
    elif _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise _ArgumentsError(f"{path} must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise _ArgumentsError(f"{path} must be <= {schema['maximum']}")


def _json_equal(a: JsonValue, b: JsonValue) -> bool:
    """Equality as JSON sees it: `true` is not `1`, and containers compare item by item."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b)


def _bounds(n: int, schema: Mapping[str, JsonValue], lo: str, hi: str, path: str, unit: str) -> None:
    if lo in schema and n < schema[lo]:
        raise _ArgumentsError(f"{path} must have at least {schema[lo]} {unit}")
    if hi in schema and n > schema[hi]:
        raise _ArgumentsError(f"{path} must have at most {schema[hi]} {unit}")


def _is(value: JsonValue, t: str) -> bool:
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if t == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer() and math.isfinite(value))
    if t == "number":
        return isinstance(value, (int, float)) and math.isfinite(value)
    return False


def _kind(value: JsonValue) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "integer", float: "number"}.get(
        type(value), type(value).__name__
    )
