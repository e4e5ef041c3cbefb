"""One HTTP/1.1 request read off a Trio stream, for the tests' small model servers."""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio


@attrs.frozen
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def read_request(stream: trio.SocketStream) -> Seen | None:
    """The request line, headers (lower-cased names) and a Content-Length body; None if the
    client goes away first."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = await stream.receive_some(65536)
        if not piece:
            return None
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, target, _version = request_line.split(" ")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        piece = await stream.receive_some(65536)
        if not piece:
            return None
        body += piece
    return Seen(method, target, headers, body)
