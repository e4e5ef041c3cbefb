"""The script document's JSON shape (runtime/testing/script_format.py): read strictly, checked
against msgspec Structs, every problem a `ScriptError` at its JSON path in the loader's words.

The text is read by the standard library first (duplicate keys, `NaN`/`Infinity` and numbers too
large for a float are refused), then converted to the Structs (`strict`: no `true` or `1.0`
where an integer belongs; unknown keys refused). What a Struct cannot say is checked by the
loader on the converted values.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

import msgspec
from msgspec import UNSET, UnsetType

from ..foundation.errors import ScriptError

__all__ = [
    "EntryShape",
    "ErrorShape",
    "ResponseShape",
    "ScriptShape",
    "ToolCallShape",
    "UsageShape",
    "WaitForShape",
    "decode_document",
    "fail",
    "index_path",
    "key_path",
]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --- the shape (msgspec) ----------------------------------------------------------------------
#
# The document's shape is checked by msgspec against these Structs (`strict`: no `true` or `1.0`
# where an integer belongs; unknown keys refused). Optional keys default to UNSET, not to a value,
# because whether a key is *present* matters (`hang` and `error` exclude other keys). What the
# Structs cannot say — bounds, non-empty strings, exclusions, templates, duplicates — is checked
# after, in `_script`, on the converted values.


class ToolCallShape(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: str | UnsetType = UNSET
    name: str
    arguments: dict[str, Any] | str


class ErrorShape(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    status: int
    message: str


class UsageShape(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    input_tokens: int
    output_tokens: int


class WaitForShape(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    steered: bool | UnsetType = UNSET
    settled: str | UnsetType = UNSET
    waiting: str | UnsetType = UNSET
    count: int | UnsetType = UNSET


class ResponseShape(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    text: str | UnsetType = UNSET
    tool_calls: list[ToolCallShape] | UnsetType = UNSET
    delay_ms: int | UnsetType = UNSET
    hang: bool | UnsetType = UNSET
    error: ErrorShape | UnsetType = UNSET
    # Any: checked by hand, so every wrong value hears the two choices (msgspec's Literal
    # message names none, and its type message none either).
    finish: Any = UNSET
    usage: UsageShape | UnsetType = UNSET
    wait_for: WaitForShape | UnsetType = UNSET


class EntryShape(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    session: str | UnsetType = UNSET
    label: str | UnsetType = UNSET
    responses: list[ResponseShape]


class ScriptShape(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    agents: list[EntryShape]
    summaries: list[str] | UnsetType = UNSET


# Where each Struct sits, by its path with the indices left out (to name the allowed keys).
_SHAPES: dict[str, type[msgspec.Struct]] = {
    "$": ScriptShape,
    "$.agents": EntryShape,
    "$.agents.responses": ResponseShape,
    "$.agents.responses.tool_calls": ToolCallShape,
    "$.agents.responses.error": ErrorShape,
    "$.agents.responses.usage": UsageShape,
    "$.agents.responses.wait_for": WaitForShape,
}
# msgspec's type names, in the loader's words (the same as JSON's).
_EXPECTED = {
    "int": "an integer",
    "str": "a string",
    "bool": "a boolean",
    "array": "an array",
    "object": "an object",
    "str | object": "an object or a string",
}
_GOT = {
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "float": "number",
    "null": "null",
    "array": "array",
    "object": "object",
}
_TYPE_ERROR = re.compile(r"Expected `([^`]+)`, got `([^`]+)`\Z")
_FIELD_ERROR = re.compile(r"Object (contains unknown|missing required) field `([^`]*)`\Z")
_AT = re.compile(r"(.*) - at `(\$[^`]*)`\Z", re.DOTALL)


def _shape_error(exc: msgspec.ValidationError) -> ScriptError:
    """A msgspec validation error as a `ScriptError` at its JSON path, in the loader's words."""
    text = str(exc)
    found = _AT.match(text)
    message, path = (found.group(1), found.group(2)) if found else (text, "$")
    typed = _TYPE_ERROR.match(message)
    if typed and typed.group(1) in _EXPECTED and typed.group(2) in _GOT:
        return ScriptError(path, f"must be {_EXPECTED[typed.group(1)]}, got {_GOT[typed.group(2)]}")
    field = _FIELD_ERROR.match(message)
    if field is None:
        return ScriptError(path, message)
    at = key_path(path, field.group(2))
    if field.group(1) == "missing required":
        return ScriptError(at, "missing required key")
    shape = _SHAPES.get(re.sub(r"\[\d+\]", "", path))
    allowed = f" (allowed: {', '.join(shape.__struct_fields__)})" if shape is not None else ""
    return ScriptError(at, f"unknown key{allowed}")


def fail(path: str, problem: str) -> NoReturn:
    """Refuse the script: `ScriptError` at `path`."""
    raise ScriptError(path, problem)


def key_path(path: str, key: str) -> str:
    """The JSON path of `key` in the object at `path`."""
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def index_path(path: str, i: int) -> str:
    """The JSON path of item `i` of the array at `path`."""
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


def decode_document(data: bytes | str) -> ScriptShape:
    """The document's shape, or `ScriptError` at the path of its first problem."""
    # The text is read by the standard library first: msgspec keeps the last of duplicate keys
    # and would take a number too large for a float as infinity, and a hand-written script
    # deserves to hear about both.
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail("$", f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    try:
        document = json.loads(
            data,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        fail("$", f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")
    except ValueError as exc:
        fail("$", f"not JSON: {exc}")
    try:
        return msgspec.convert(document, ScriptShape, strict=True)
    except msgspec.ValidationError as exc:
        raise _shape_error(exc) from None
