"""A sans-IO decoder for Server-Sent Events (the WHATWG `text/event-stream` format).

Theory of operation: bytes go in with `feed`, complete events come out; `close` flushes at the
end of the body. Lines end in CRLF, LF or CR (a CR at the end of one piece may pair with an LF at
the start of the next, so a lone trailing CR is held back). A line starting with `:` is a comment
(servers send `: keep-alive`); `field: value` lines set a field (one leading space of the value is
dropped); a blank line dispatches the pending event if it has data. Only `data` (joined with
newlines) and `event` matter here; `id`, `retry` and unknown fields are ignored.

A line whose field name is not a plausible token (`{"error": ...}`, `<html>`, `Bad Gateway`) means
the body is not an event stream at all: `SSEError` is raised, so the caller can tell "this is not
SSE" from "an event's data is malformed". So is a line longer than `max_line` bytes, or one that is
not UTF-8. No IO, no clock, no trio.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs

__all__ = ["SSEDecoder", "SSEError", "SSEEvent"]

_FIELD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
_BOM = "\ufeff"


class SSEError(ValueError):
    """The bytes are not a well-formed event stream (the message quotes a short excerpt)."""


@attrs.frozen
class SSEEvent:
    data: str
    event: str = "message"


class SSEDecoder:
    """Incremental SSE decoder: `feed(bytes) -> [SSEEvent]`, then `close() -> [SSEEvent]`.

    `redact` is applied to a quoted line before it is cut to an excerpt (so a secret crossing the
    cut is not left half-shown)."""

    def __init__(self, *, max_line: int = 16 * 1024 * 1024, redact: Callable[[str], str] = str) -> None:
        self._max_line = max_line
        self._redact = redact
        self._buffer = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._first_line = True
        self._closed = False

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Decode another piece of the body; returns the events it completed, in order."""
        if self._closed:
            raise RuntimeError("SSEDecoder.feed after close")
        self._buffer += data
        events: list[SSEEvent] = []
        start = 0
        buffer = self._buffer
        while True:
            cr = buffer.find(b"\r", start)
            lf = buffer.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                if cr + 1 == len(buffer):
                    break  # a CRLF may be split across pieces: wait for the next byte
                end, after = cr, cr + 2 if buffer[cr + 1] == 0x0A else cr + 1
            else:
                end, after = lf, lf + 1
            self._line(bytes(buffer[start:end]), events)
            start = after
        del buffer[:start]
        if len(buffer) > self._max_line:
            raise SSEError(f"event-stream line longer than {self._max_line} bytes")
        return events

    def close(self) -> list[SSEEvent]:
        """The body ended: decode a final unterminated line and dispatch a pending event."""
        if self._closed:
            return []
        self._closed = True
        events: list[SSEEvent] = []
        if self._buffer:
            tail = bytes(self._buffer).rstrip(b"\r")
            self._buffer.clear()
            self._line(tail, events)
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SSEError(f"event-stream line is not UTF-8: {self._excerpt(raw.decode('utf-8', 'replace'))}") from None
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(_BOM)
        if not line:
            if self._data:
                events.append(SSEEvent(data="\n".join(self._data), event=self._event or "message"))
            self._data = []
            self._event = ""
            return
        if line.startswith(":"):
            return
        field, colon, value = line.partition(":")
        if not _FIELD.match(field):
            raise SSEError(f"not an event-stream line: {self._excerpt(line)}")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value

    def _excerpt(self, text: str) -> str:
        return _excerpt(self._redact(text))


def _excerpt(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
