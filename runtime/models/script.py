"""The scripted model's script (SPEC 5.6): the file format, its loader and its frozen values.

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
(`$.agents[1].responses[0].tool_calls[0].name`). Decisions the SPEC leaves open:

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
from typing import Literal, NoReturn

import attrs

from subagents.runtime.models.base import Usage

__all__ = [
    "Arguments",
    "ObjectArguments",
    "Script",
    "ScriptEntry",
    "ScriptError",
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
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ScriptError(ValueError):
    """A script that cannot be loaded. `path` is the JSON path of the problem (`$` for the whole
    document), `problem` says what is wrong there, `source` names the file when there is one.
    `code` is `MODEL_SCRIPT_INVALID`, or `MODEL_SCRIPT_UNREADABLE` when the file cannot be read."""

    def __init__(
        self,
        path: str,
        problem: str,
        *,
        source: str | None = None,
        code: str = "MODEL_SCRIPT_INVALID",
    ) -> None:
        where = f"invalid script {source}" if source else "invalid script"
        super().__init__(f"{where} at {path}: {problem}")
        self.path = path
        self.problem = problem
        self.source = source
        self.code = code


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
            return _script(_decode(data))
        except ScriptError as exc:
            if source is None:
                raise
            raise ScriptError(exc.path, exc.problem, source=source, code=exc.code) from None


def load_script(source: str | os.PathLike[str] | bytes) -> Script:
    """Load a script from a file path, or from JSON text given directly.

    `bytes` and a `str` whose first non-blank character is `{` are JSON text; any other `str`
    and any `os.PathLike` name a file. Raises `ScriptError` (`MODEL_SCRIPT_UNREADABLE` when the
    file cannot be read).
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
        raise ScriptError(
            "$", f"cannot read the file: {exc.strerror or exc}", source=name, code="MODEL_SCRIPT_UNREADABLE"
        ) from None
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
        return {
            expand_templates(key, resolve): _expand_json(item, resolve) for key, item in value.items()
        }
    return value


def _dump(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --- parsing ----------------------------------------------------------------------------------


def _fail(path: str, problem: str) -> NoReturn:
    raise ScriptError(path, problem)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _key(path: str, key: str) -> str:
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {json.dumps(key, ensure_ascii=False)} in an object")
        out[key] = value
    return out


def _decode(data: bytes | str) -> object:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            _fail("$", f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    try:
        return json.loads(
            data,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        _fail("$", f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")
    except ValueError as exc:
        _fail("$", f"not JSON: {exc}")


def _object(
    value: object, path: str, *, allowed: tuple[str, ...], required: tuple[str, ...] = ()
) -> dict[str, object]:
    if type(value) is not dict:
        _fail(path, f"must be an object, got {_kind(value)}")
    for key in value:
        if key not in allowed:
            _fail(_key(path, key), f"unknown key (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            _fail(_key(path, key), "missing required key")
    return value


def _list(value: object, path: str) -> list[object]:
    if type(value) is not list:
        _fail(path, f"must be an array, got {_kind(value)}")
    return value


def _str(value: object, path: str, *, nonempty: bool = False) -> str:
    if type(value) is not str:
        _fail(path, f"must be a string, got {_kind(value)}")
    if nonempty and not value:
        _fail(path, "must be a non-empty string")
    return value


def _int(value: object, path: str, *, minimum: int | None = None) -> int:
    if type(value) is not int:
        _fail(path, f"must be an integer, got {_kind(value)}")
    if minimum is not None and value < minimum:
        _fail(path, f"must be >= {minimum}, got {value}")
    return value


def _bool(value: object, path: str) -> bool:
    if type(value) is not bool:
        _fail(path, f"must be a boolean, got {_kind(value)}")
    return value


def _templated(value: object, path: str, *, nonempty: bool = False) -> str:
    text = _str(value, path, nonempty=nonempty)
    _check_templates(text, path)
    return text


def _check_templates(text: str, path: str) -> None:
    for match in _TEMPLATE.finditer(text):
        source = match.group(1)
        try:
            pattern = re.compile(source)
        except re.error as exc:
            _fail(path, f"invalid regex {source!r} in {{{{from_request:...}}}}: {exc}")
        if pattern.groups < 1:
            _fail(path, f"regex {source!r} in {{{{from_request:...}}}} has no capture group")


def _check_json_templates(value: object, path: str) -> None:
    if isinstance(value, str):
        _check_templates(value, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json_templates(item, _index(path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_templates(key, _key(path, key))
            _check_json_templates(item, _key(path, key))


def _script(data: object) -> Script:
    obj = _object(data, "$", allowed=("agents", "summaries"), required=("agents",))
    agents_path = "$.agents"
    agents = _list(obj["agents"], agents_path)
    if not agents:
        _fail(agents_path, "must hold at least one entry")
    entries = []
    sessions: dict[str, int] = {}
    for i, value in enumerate(agents):
        entry = _entry(value, _index(agents_path, i))
        if entry.session is not None:
            if entry.session in sessions:
                _fail(
                    _key(_index(agents_path, i), "session"),
                    f'session "{entry.session}" already has an entry at $.agents[{sessions[entry.session]}]',
                )
            sessions[entry.session] = i
        entries.append(entry)
    summaries: tuple[str, ...] = ()
    if "summaries" in obj:
        items = _list(obj["summaries"], "$.summaries")
        summaries = tuple(_str(item, _index("$.summaries", i)) for i, item in enumerate(items))
    return Script(agents=tuple(entries), summaries=summaries)


def _entry(value: object, path: str) -> ScriptEntry:
    obj = _object(value, path, allowed=("session", "label", "responses"), required=("responses",))
    if "session" in obj and "label" in obj:
        _fail(_key(path, "label"), "an entry names a session or a label, not both")
    session = _str(obj["session"], _key(path, "session"), nonempty=True) if "session" in obj else None
    label = _str(obj["label"], _key(path, "label"), nonempty=True) if "label" in obj else None
    responses_path = _key(path, "responses")
    items = _list(obj["responses"], responses_path)
    responses = tuple(_response(item, _index(responses_path, i)) for i, item in enumerate(items))
    return ScriptEntry(session=session, label=label, responses=responses)


_RESPONSE_KEYS = ("text", "tool_calls", "delay_ms", "hang", "error", "finish", "usage", "wait_for")
# key that excludes others → the keys it excludes
_EXCLUSIVE = (
    ("hang", ("text", "tool_calls", "error", "finish", "usage")),
    ("error", ("text", "tool_calls", "finish", "usage")),
)


def _response(value: object, path: str) -> ScriptedResponse:
    obj = _object(value, path, allowed=_RESPONSE_KEYS)
    hang = _bool(obj["hang"], _key(path, "hang")) if "hang" in obj else False
    for key, excluded in _EXCLUSIVE:
        if key in obj and (key != "hang" or hang):
            for other in excluded:
                if other in obj:
                    what = "hang: true" if key == "hang" else key
                    _fail(_key(path, other), f"cannot be combined with {what}")
    text = _templated(obj["text"], _key(path, "text")) if "text" in obj else ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    if "tool_calls" in obj:
        calls_path = _key(path, "tool_calls")
        items = _list(obj["tool_calls"], calls_path)
        tool_calls = tuple(_tool_call(item, _index(calls_path, i)) for i, item in enumerate(items))
        seen: set[str] = set()
        for i, call in enumerate(tool_calls):
            if call.id is not None:
                if call.id in seen:
                    _fail(_key(_index(calls_path, i), "id"), f'duplicate tool-call id "{call.id}"')
                seen.add(call.id)
    delay_ms = _int(obj["delay_ms"], _key(path, "delay_ms"), minimum=0) if "delay_ms" in obj else 0
    finish: ScriptedFinish | None = None
    if "finish" in obj:
        raw = obj["finish"]
        if type(raw) is not str or raw not in _FINISHES:
            _fail(_key(path, "finish"), f'must be "stop" or "max-tokens", got {json.dumps(raw)}')
        finish = raw  # type: ignore[assignment]  # checked against _FINISHES
    return ScriptedResponse(
        text=text,
        tool_calls=tool_calls,
        delay_ms=delay_ms,
        hang=hang,
        error=_error(obj["error"], _key(path, "error")) if "error" in obj else None,
        finish=finish,
        usage=_usage(obj["usage"], _key(path, "usage")) if "usage" in obj else None,
        wait_for=_wait_for(obj["wait_for"], _key(path, "wait_for")) if "wait_for" in obj else None,
    )


def _tool_call(value: object, path: str) -> ScriptedToolCall:
    obj = _object(value, path, allowed=("id", "name", "arguments"), required=("name", "arguments"))
    name = _templated(obj["name"], _key(path, "name"), nonempty=True)
    call_id = _templated(obj["id"], _key(path, "id"), nonempty=True) if "id" in obj else None
    raw = obj["arguments"]
    arguments_path = _key(path, "arguments")
    arguments: Arguments
    if type(raw) is str:
        _check_templates(raw, arguments_path)
        arguments = raw
    elif type(raw) is dict:
        _check_json_templates(raw, arguments_path)
        arguments = ObjectArguments(json=_dump(raw))
    else:
        _fail(arguments_path, f"must be an object or a string, got {_kind(raw)}")
    return ScriptedToolCall(id=call_id, name=name, arguments=arguments)


def _error(value: object, path: str) -> ScriptedError:
    obj = _object(value, path, allowed=("status", "message"), required=("status", "message"))
    return ScriptedError(
        status=_int(obj["status"], _key(path, "status")),
        message=_templated(obj["message"], _key(path, "message"), nonempty=True),
    )


def _usage(value: object, path: str) -> Usage:
    keys = ("input_tokens", "output_tokens")
    obj = _object(value, path, allowed=keys, required=keys)
    return Usage(
        input_tokens=_int(obj["input_tokens"], _key(path, "input_tokens"), minimum=0),
        output_tokens=_int(obj["output_tokens"], _key(path, "output_tokens"), minimum=0),
    )


def _wait_for(value: object, path: str) -> WaitFor:
    obj = _object(value, path, allowed=("steered", "settled", "waiting", "count"))
    forms = [key for key in ("steered", "settled", "waiting") if key in obj]
    if len(forms) != 1:
        _fail(path, 'must hold exactly one of "steered", "settled" or "waiting"')
    if "count" in obj and forms != ["settled"]:
        _fail(_key(path, "count"), 'only goes with "settled"')
    if "waiting" in obj:
        return WaitForWaiting(session=_templated(obj["waiting"], _key(path, "waiting"), nonempty=True))
    if "steered" in obj:
        steered_path = _key(path, "steered")
        if _bool(obj["steered"], steered_path) is not True:
            _fail(steered_path, "must be true")
        return WaitForSteered()
    count = _int(obj["count"], _key(path, "count"), minimum=1) if "count" in obj else 1
    return WaitForSettled(child=_templated(obj["settled"], _key(path, "settled"), nonempty=True), count=count)
