"""The params of the ACP methods this agent serves, as msgspec structs (protocol version 1, the
field names of the `agent-client-protocol` schema). Unknown fields (`_meta`, later additions)
are ignored; a missing or mistyped field is a -32602."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from ...foundation.errors import AcpRequestError
from ...foundation.json_values import JsonValue
from .rpc import INVALID_PARAMS

__all__ = [
    "CancelParams",
    "CloseParams",
    "InitializeParams",
    "ListParams",
    "LoadParams",
    "NewParams",
    "PromptParams",
    "convert_params",
    "prompt_text",
]


class _Params(msgspec.Struct, rename="camel", kw_only=True):
    pass


class InitializeParams(_Params):
    protocol_version: int
    client_capabilities: dict[str, JsonValue] = {}
    client_info: dict[str, JsonValue] | None = None


class NewParams(_Params):
    cwd: str
    mcp_servers: list[dict[str, JsonValue]] = []


class LoadParams(_Params):
    session_id: str
    cwd: str
    mcp_servers: list[dict[str, JsonValue]] = []


class PromptParams(_Params):
    session_id: str
    prompt: list[dict[str, JsonValue]]


class CancelParams(_Params):
    session_id: str


class CloseParams(_Params):
    session_id: str


class ListParams(_Params):
    cwd: str | None = None
    cursor: str | None = None


T = TypeVar("T")


def convert_params(params: JsonValue, kind: type[T]) -> T:
    """`params` as `kind`, or an `AcpRequestError` (-32602) naming what is wrong."""
    try:
        return msgspec.convert({} if params is None else params, kind)
    except msgspec.ValidationError as exc:
        raise AcpRequestError(INVALID_PARAMS, f"Invalid params: {exc}") from None


def prompt_text(blocks: list[dict[str, JsonValue]]) -> str:
    """The text of a prompt's content blocks: text as is, a resource link as its URI, embedded
    text resources as their text. Images and audio are refused (not advertised)."""
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "resource_link" and isinstance(block.get("uri"), str):
            parts.append(block["uri"])
        elif kind == "resource" and isinstance(block.get("resource"), dict) and "text" in block["resource"]:
            parts.append(str(block["resource"]["text"]))
        else:
            raise AcpRequestError(INVALID_PARAMS, f"Invalid params: unsupported prompt content block {kind!r}")
    if not parts:
        raise AcpRequestError(INVALID_PARAMS, "Invalid params: the prompt has no text")
    return "\n".join(parts)
