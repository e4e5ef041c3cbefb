"""An MCP tool result as the text a model reads: text blocks as they are, every other kind of
content (image, audio, resource, link) summarized in one line, `structuredContent` as JSON when
the server sent nothing else, and the whole cut to a cap that says what it cut. Works on the
result's JSON form (`model_dump`), so it needs nothing from `mcp` itself."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence

from ..foundation.json_values import JsonValue

__all__ = ["render_content"]


def render_content(content: Sequence[Mapping[str, JsonValue]], structured: JsonValue, cap: int) -> str:
    """The result's content as one text, at most `cap` characters (and a note when cut)."""
    parts = [_block(block) for block in content]
    if not parts and structured is not None:
        parts = [json.dumps(structured, ensure_ascii=False)]
    text = "\n".join(parts) if parts else "(the tool returned no content)"
    if len(text) > cap:
        text = f"{text[:cap]}\n[cut: the result had {len(text)} characters, {cap} kept]"
    return text


def _block(block: Mapping[str, JsonValue]) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        return f"[{kind}: {block.get('mimeType') or 'unknown type'}, {_size(block.get('data'))}]"
    if kind == "resource_link":
        name = block.get("title") or block.get("name") or ""
        return f"[resource link: {name} <{block.get('uri')}>]".replace(":  <", ": <")
    if kind == "resource":
        resource = block.get("resource")
        if not isinstance(resource, Mapping):
            return "[resource]"
        uri = resource.get("uri")
        if isinstance(resource.get("text"), str):
            return f"[resource <{uri}>]\n{resource['text']}"
        return f"[resource <{uri}>: {resource.get('mimeType') or 'binary'}, {_size(resource.get('blob'))}]"
    return f"[{kind or 'unknown'} content]"


def _size(data: JsonValue) -> str:
    if not isinstance(data, str):
        return "no data"
    try:
        return f"{len(base64.b64decode(data, validate=True))} bytes"
    except (binascii.Error, ValueError):
        return f"{len(data)} characters of data"
