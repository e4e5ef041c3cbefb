"""The scripted model's script (docs/scripts.md): the file format, its loader and its frozen values.

A script is one JSON object:

    {"agents": [{"session"?: id, "label"?: str, "responses": [response, ...]}, ...],
     "summaries"?: [str, ...]}

    response = {"text"?: str,
                "tool_calls"?: [{"id"?: str, "name": str, "arguments": object | str}],
                "delay_ms"?: int >= 0, "hang"?: bool,
                "error"?: {"status": int, "message": str},
                "finish"?: "stop" | "max-tokens",
                "usage"?: {"input_tokens": int >= 0, "output_tokens": int >= 0},
                "wait_for"?: {"steered": true} | {"settled": "<label or id>", "count"?: int >= 1}
                             | {"waiting": "<session id or label>"}}

The loader is strict because a script is untrusted input written by hand: unknown keys, missing
keys, wrong JSON types (no `true` or `1.0` where an integer belongs), duplicate object keys and
`NaN`/`Infinity` are refused with a `ScriptError` naming the JSON path of the problem
(`$.agents[1].responses[0].tool_calls[0].name`). The shape is declared once, as msgspec Structs
that forbid unknown fields (script_json.py; msgspec's validation errors give the path); the rules
a type cannot say are checked here on the converted values. Decisions docs/scripts.md leaves open:

- `agents` is required and non-empty; an entry names a `session` or a `label`, never both (it
  would be unclear which one binds), and two entries may not name the same `session` (the second
  could never answer). An entry may have no responses (its session's first call is exhausted).
- `hang: true` cannot be combined with `text`, `tool_calls`, `error`, `finish` or `usage`, and
  `error` cannot be combined with `text`, `tool_calls`, `finish` or `usage`: neither ever streams.
- Tool-call `arguments` is required; an object is kept as its compact JSON text in script order
  (`ObjectArguments`), a string is kept verbatim (so malformed JSON can be scripted). Explicit
  tool-call ids must be unique within a response.

Templates: any string of a response (text, tool-call id, name, arguments string, keys and string
values of an arguments object at any depth, error message, `wait_for.settled`) may contain
`{{from_request:REGEX}}`. The regex runs to the first `}}` (so it cannot itself contain `}}`); it
must compile and have at least one capture group, checked here at load. `expand_templates` and
`render_arguments` substitute them given a resolver; the scripted model supplies the resolver.
Summaries are plain text (no templates).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Literal

import attrs
from msgspec import UNSET

from ..foundation.errors import ScriptError, ScriptUnreadable
from ..models.base import Usage
from .script_json import (
    EntryShape,
    ErrorShape,
    ResponseShape,
    ScriptShape,
    ToolCallShape,
    UsageShape,
    WaitForShape,
    decode_document,
    fail,
    index_path,
    key_path,
)

__all__ = [
    "Arguments",
    "ObjectArguments",
    "Script",
    "ScriptEntry",
    "ScriptedError",
    "ScriptedResponse",
    "ScriptedToolCall",
    "WaitFor",
    "WaitForSettled",
    "WaitForSteered",
    "WaitForWaiting",
    "expand_templates",
    "load_script",
    "render_arguments",
]

ScriptedFinish = Literal["stop", "max-tokens"]
_FINISHES: tuple[ScriptedFinish, ...] = ("stop", "max-tokens")

# Non-greedy: a template ends at the first "}}" after its prefix.
_TEMPLATE = re.compile(r"\{\{from_request:(.*?)\}\}", re.DOTALL)
_TEMPLATE_PREFIX = "{{from_request:"


# --- values -----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ObjectArguments:
    """Tool-call `arguments` scripted as a JSON object, kept as its compact JSON text
    (`separators=(",", ":")`, `ensure_ascii=False`, keys in script order)."""

    json: str


Arguments = str | ObjectArguments


@attrs.frozen(kw_only=True)
class ScriptedToolCall:
    name: str
    arguments: Arguments
    # None: the model assigns `call_<n>_<i>` per request.
    id: str | None = None


@attrs.frozen(kw_only=True)
class ScriptedError:
    status: int
    message: str


@attrs.frozen(kw_only=True)
class WaitForSteered:
    """Hold the response until the session's inbox has received a message."""


@attrs.frozen(kw_only=True)
class WaitForSettled:
    """Hold the response until the named child's `count`-th `subagent/settled` is durable
    (settlements an earlier process recorded in the log count too)."""

    child: str
    count: int = 1


@attrs.frozen(kw_only=True)
class WaitForWaiting:
    """Hold the response until the named session (id or label) is itself held on a `wait_for`:
    how a script orders a child after its parent has reached a known point."""

    session: str


WaitFor = WaitForSteered | WaitForSettled | WaitForWaiting


@attrs.frozen(kw_only=True)
class ScriptedResponse:
    text: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    delay_ms: int = 0
    hang: bool = False
    error: ScriptedError | None = None
    # None: "tool-calls" when the response has tool calls, else "stop".
    finish: ScriptedFinish | None = None
    usage: Usage | None = None
    wait_for: WaitFor | None = None


@attrs.frozen(kw_only=True)
class ScriptEntry:
    """The responses of one agent, bound by `session` id, by `label`, or (neither) by first call."""

    session: str | None = None
    label: str | None = None
    responses: tuple[ScriptedResponse, ...]


@attrs.frozen(kw_only=True)
class Script:
    agents: tuple[ScriptEntry, ...]
    summaries: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str | None = None) -> Script:
        """Parse and validate a script document (UTF-8 bytes or text).

        `source` (a file name) is only used in error messages. Raises `ScriptError`.
        """
        try:
            return _script(decode_document(data))
        except ScriptError as exc:
            if source is None:
                raise
            raise type(exc)(exc.path, exc.problem, source=source) from None


def load_script(source: str | os.PathLike[str] | bytes) -> Script:
    """Load a script from a file path, or from JSON text given directly.

    `bytes` and a `str` whose first non-blank character is `{` are JSON text; any other `str`
    and any `os.PathLike` name a file. Raises `ScriptError` (`ScriptUnreadable` when the file
    cannot be read).
    """
    if isinstance(source, bytes):
        return Script.from_json(source)
    if isinstance(source, str) and source.lstrip().startswith("{"):
        return Script.from_json(source)
    name = os.fsdecode(source)
    try:
        with open(name, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ScriptUnreadable("$", f"cannot read the file: {exc.strerror or exc}", source=name) from None
    return Script.from_json(data, source=name)


# --- templates --------------------------------------------------------------------------------


def expand_templates(text: str, resolve: Callable[[str], str]) -> str:
    """`text` with every `{{from_request:REGEX}}` replaced by `resolve(REGEX)`."""
    if _TEMPLATE_PREFIX not in text:
        return text
    return _TEMPLATE.sub(lambda match: resolve(match.group(1)), text)


def render_arguments(arguments: Arguments, resolve: Callable[[str], str]) -> str:
    """The raw JSON string a tool call streams: a string expanded verbatim, an object with its
    keys and string values expanded at every depth, then dumped compactly."""
    if isinstance(arguments, str):
        return expand_templates(arguments, resolve)
    if _TEMPLATE_PREFIX not in arguments.json:
        return arguments.json
    return _dump(_expand_json(json.loads(arguments.json), resolve))


def _expand_json(value: object, resolve: Callable[[str], str]) -> object:
    if isinstance(value, str):
        return expand_templates(value, resolve)
    if isinstance(value, list):
        return [_expand_json(item, resolve) for item in value]
    if isinstance(value, dict):
        return {expand_templates(key, resolve): _expand_json(item, resolve) for key, item in value.items()}
    return value


def _dump(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _nonempty(value: str, path: str) -> str:
    if not value:
        fail(path, "must be a non-empty string")
    return value


def _minimum(value: int, path: str, minimum: int) -> int:
    if value < minimum:
        fail(path, f"must be >= {minimum}, got {value}")
    return value


def _templated(value: str, path: str, *, nonempty: bool = False) -> str:
    if nonempty:
        _nonempty(value, path)
    _check_templates(value, path)
    return value


def _check_templates(text: str, path: str) -> None:
    for match in _TEMPLATE.finditer(text):
        source = match.group(1)
        try:
            pattern = re.compile(source)
        except re.error as exc:
            fail(path, f"invalid regex {source!r} in {{{{from_request:...}}}}: {exc}")
        if pattern.groups < 1:
            fail(path, f"regex {source!r} in {{{{from_request:...}}}} has no capture group")


def _check_json_templates(value: object, path: str) -> None:
    if isinstance(value, str):
        _check_templates(value, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_templates(item, index_path(path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_templates(key, key_path(path, key))
            _check_json_templates(item, key_path(path, key))


def _script(shape: ScriptShape) -> Script:
    agents_path = "$.agents"
    if not shape.agents:
        fail(agents_path, "must hold at least one entry")
    entries = []
    sessions: dict[str, int] = {}
    for i, value in enumerate(shape.agents):
        entry = _entry(value, index_path(agents_path, i))
        if entry.session is not None:
            if entry.session in sessions:
                fail(
                    key_path(index_path(agents_path, i), "session"),
                    f'session "{entry.session}" already has an entry at $.agents[{sessions[entry.session]}]',
                )
            sessions[entry.session] = i
        entries.append(entry)
    summaries = () if shape.summaries is UNSET else tuple(shape.summaries)
    return Script(agents=tuple(entries), summaries=summaries)


def _entry(shape: EntryShape, path: str) -> ScriptEntry:
    if shape.session is not UNSET and shape.label is not UNSET:
        fail(key_path(path, "label"), "an entry names a session or a label, not both")
    session = None if shape.session is UNSET else _nonempty(shape.session, key_path(path, "session"))
    label = None if shape.label is UNSET else _nonempty(shape.label, key_path(path, "label"))
    responses_path = key_path(path, "responses")
    responses = tuple(_response(item, index_path(responses_path, i)) for i, item in enumerate(shape.responses))
    return ScriptEntry(session=session, label=label, responses=responses)


# key that excludes others → the keys it excludes
_EXCLUSIVE = (
    ("hang", ("text", "tool_calls", "error", "finish", "usage")),
    ("error", ("text", "tool_calls", "finish", "usage")),
)


def _response(shape: ResponseShape, path: str) -> ScriptedResponse:
    hang = shape.hang is True
    for key, excluded in _EXCLUSIVE:
        if getattr(shape, key) is not UNSET and (key != "hang" or hang):
            for other in excluded:
                if getattr(shape, other) is not UNSET:
                    what = "hang: true" if key == "hang" else key
                    fail(key_path(path, other), f"cannot be combined with {what}")
    text = "" if shape.text is UNSET else _templated(shape.text, key_path(path, "text"))
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    if shape.tool_calls is not UNSET:
        calls_path = key_path(path, "tool_calls")
        tool_calls = tuple(_tool_call(item, index_path(calls_path, i)) for i, item in enumerate(shape.tool_calls))
        seen: set[str] = set()
        for i, call in enumerate(tool_calls):
            if call.id is not None:
                if call.id in seen:
                    fail(key_path(index_path(calls_path, i), "id"), f'duplicate tool-call id "{call.id}"')
                seen.add(call.id)
    delay_ms = 0 if shape.delay_ms is UNSET else _minimum(shape.delay_ms, key_path(path, "delay_ms"), 0)
    finish: ScriptedFinish | None = None
    if shape.finish is not UNSET:
        if type(shape.finish) is not str or shape.finish not in _FINISHES:
            fail(key_path(path, "finish"), f'must be "stop" or "max-tokens", got {json.dumps(shape.finish)}')
        finish = shape.finish
    return ScriptedResponse(
        text=text,
        tool_calls=tool_calls,
        delay_ms=delay_ms,
        hang=hang,
        error=None if shape.error is UNSET else _error(shape.error, key_path(path, "error")),
        finish=finish,
        usage=None if shape.usage is UNSET else _usage(shape.usage, key_path(path, "usage")),
        wait_for=None if shape.wait_for is UNSET else _wait_for(shape.wait_for, key_path(path, "wait_for")),
    )


def _tool_call(shape: ToolCallShape, path: str) -> ScriptedToolCall:
    name = _templated(shape.name, key_path(path, "name"), nonempty=True)
    call_id = None if shape.id is UNSET else _templated(shape.id, key_path(path, "id"), nonempty=True)
    arguments_path = key_path(path, "arguments")
    arguments: Arguments
    if isinstance(shape.arguments, str):
        _check_templates(shape.arguments, arguments_path)
        arguments = shape.arguments
    else:
        _check_json_templates(shape.arguments, arguments_path)
        arguments = ObjectArguments(json=_dump(shape.arguments))
    return ScriptedToolCall(id=call_id, name=name, arguments=arguments)


def _error(shape: ErrorShape, path: str) -> ScriptedError:
    return ScriptedError(
        status=shape.status, message=_templated(shape.message, key_path(path, "message"), nonempty=True)
    )


def _usage(shape: UsageShape, path: str) -> Usage:
    return Usage(
        input_tokens=_minimum(shape.input_tokens, key_path(path, "input_tokens"), 0),
        output_tokens=_minimum(shape.output_tokens, key_path(path, "output_tokens"), 0),
    )


def _wait_for(shape: WaitForShape, path: str) -> WaitFor:
    forms = [key for key in ("steered", "settled", "waiting") if getattr(shape, key) is not UNSET]
    if len(forms) != 1:
        fail(path, 'must hold exactly one of "steered", "settled" or "waiting"')
    if shape.count is not UNSET and forms != ["settled"]:
        fail(key_path(path, "count"), 'only goes with "settled"')
    if shape.waiting is not UNSET:
        return WaitForWaiting(session=_templated(shape.waiting, key_path(path, "waiting"), nonempty=True))
    if shape.steered is not UNSET:
        if shape.steered is not True:
            fail(key_path(path, "steered"), "must be true")
        return WaitForSteered()
    assert shape.settled is not UNSET  # the one form left
    count = 1 if shape.count is UNSET else _minimum(shape.count, key_path(path, "count"), 1)
    return WaitForSettled(child=_templated(shape.settled, key_path(path, "settled"), nonempty=True), count=count)
