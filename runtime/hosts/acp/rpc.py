"""JSON-RPC 2.0 framing for ACP: one JSON object per line, both ways (msgspec).

Pure: a line in, a `Message` (or a ready error reply) out; values in, encoded lines out. The
dispatcher decides what a method means; this module only decides what is well-formed.
"""

from __future__ import annotations

import attrs
import msgspec

from ...foundation.json_values import JsonValue

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "RESOURCE_NOT_FOUND",
    "Incoming",
    "error_line",
    "notification_line",
    "parse_line",
    "result_line",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002  # ACP's code for an unknown session

Id = int | str


@attrs.frozen
class Incoming:
    """A well-formed request (`id` set), notification (`id` None) or response (`is_response`)."""

    method: str | None
    params: JsonValue
    id: Id | None
    is_response: bool = False
    result: JsonValue = None  # a response's
    error: JsonValue = None  # a response's error object


_encoder = msgspec.json.Encoder()


def parse_line(line: bytes) -> Incoming | bytes:
    """The message on `line`, or the error line to answer it with (a garbage line gets
    -32700 with a null id, a JSON value that is no request -32600)."""
    try:
        value = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return error_line(None, PARSE_ERROR, "Parse error")
    if not isinstance(value, dict):
        return error_line(None, INVALID_REQUEST, "Invalid Request: not a JSON-RPC object")
    raw_id = value.get("id")
    # bool is an int to Python, not an id to JSON-RPC.
    id_ok = raw_id is None or (isinstance(raw_id, (int, str)) and not isinstance(raw_id, bool))
    msg_id: Id | None = raw_id if id_ok else None
    if value.get("jsonrpc") != "2.0" or not id_ok:
        return error_line(msg_id, INVALID_REQUEST, "Invalid Request: jsonrpc must be 2.0 with an int or string id")
    method = value.get("method")
    if method is None and "id" in value and ("result" in value or "error" in value):
        return Incoming(
            method=None, params=None, id=msg_id, is_response=True, result=value.get("result"), error=value.get("error")
        )
    if not isinstance(method, str):
        return error_line(msg_id, INVALID_REQUEST, "Invalid Request: method must be a string")
    params = value.get("params")
    if params is not None and not isinstance(params, (dict, list)):
        return error_line(msg_id, INVALID_PARAMS, "Invalid params: must be an object")
    return Incoming(method=method, params=params, id=msg_id if "id" in value else None)


def result_line(msg_id: Id, result: JsonValue) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "id": msg_id, "result": result}) + b"\n"


def error_line(msg_id: Id | None, code: int, message: str, data: JsonValue = None) -> bytes:
    error: dict[str, JsonValue] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _encoder.encode({"jsonrpc": "2.0", "id": msg_id, "error": error}) + b"\n"


def request_line(msg_id: Id, method: str, params: JsonValue) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}) + b"\n"


def notification_line(method: str, params: JsonValue) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "method": method, "params": params}) + b"\n"
