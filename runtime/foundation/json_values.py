"""Names for JSON at the runtime's edges: what a model, a tool call, an MCP server, an ACP client
or a log payload hands over, decoded but not yet structured.

`JsonValue` is `Any` rather than a recursive union on purpose: the code that reads such a value
either narrows it first (`isinstance`, as every check of untrusted input here does) or indexes a
shape its schema already vouched for (a payload the storage codec validated). The names say
where that is the case; nothing else in the runtime should need `Any`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["JsonObject", "JsonValue"]

JsonValue = Any  # None, bool, int, float, str, list of JSON values, or a JsonObject
JsonObject = dict[str, JsonValue]  # a decoded JSON object: tool arguments, a payload, a protocol message
