"""What an ACP client told the agent about a session, recorded in the session's own log so it
survives a restart (for the tools issue: the workspace root, the MCP servers to connect, and
whether the client reads files or runs terminals for the agent).

Format 1 has no header key or vocabulary type for it, and a header key or a known type would
need a new format version; but format 1 lets a writer add an event of any other type marked
`ignorable: true`, which every reader skips (docs/format.md, "Events"). So the record is an
ignorable `acp/session` event: written with the session on `session/new` (in the append that
publishes it), and again by a `session/load` that brings a different one. The last record in
the session's own suffix is the one that holds. Nothing else reads it, so nothing else can be
damaged by it; a record that fails to parse is ignored, never an error.

Values that may be secrets (an MCP server's environment variable values and HTTP header
values) are not written: only their names. A client sends them again with every
`session/new` and `session/load`, and the connection holds them in memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import msgspec
from subagents.actors import EventDraft
from subagents.storage import Event

from ...foundation.json_values import JsonObject as Json
from ...foundation.json_values import JsonValue

__all__ = ["RECORD_TYPE", "ClientRecord", "last_record"]

RECORD_TYPE = "acp/session"


@attrs.frozen
class ClientRecord:
    """The client's view of a session: its `cwd`, its `mcpServers` (secret values left out)
    and the client's `fs`/`terminal` capabilities from `initialize`."""

    cwd: str
    mcp_servers: tuple[Json, ...]
    client_capabilities: Json

    @classmethod
    def of(
        cls, cwd: str, mcp_servers: Sequence[Mapping[str, JsonValue]], client_capabilities: Mapping[str, JsonValue]
    ) -> ClientRecord:
        return cls(cwd, tuple(_without_secrets(s) for s in mcp_servers), dict(client_capabilities))

    def draft(self) -> EventDraft:
        """The ignorable event that records it."""
        data = {
            "version": 1,
            "cwd": self.cwd,
            "mcp_servers": list(self.mcp_servers),
            "client_capabilities": self.client_capabilities,
        }
        return EventDraft(type=RECORD_TYPE, data=data, ignorable=True)


def last_record(events: Sequence[Event], inherited_event_count: int = 0) -> ClientRecord | None:
    """The last well-formed record among `events`' own suffix (a fork's inherited copy of its
    parent's record is not its own), or None."""
    for event in reversed(events):
        if event.seq < inherited_event_count:
            break
        if event.type != RECORD_TYPE:
            continue
        try:
            data = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            continue
        record = _parse(data)
        if record is not None:
            return record
    return None


def _parse(data: JsonValue) -> ClientRecord | None:
    if not isinstance(data, dict) or data.get("version") != 1:
        return None
    cwd, servers, capabilities = data.get("cwd"), data.get("mcp_servers"), data.get("client_capabilities")
    if not isinstance(cwd, str) or not isinstance(servers, list) or not isinstance(capabilities, dict):
        return None
    if not all(isinstance(s, dict) for s in servers):
        return None
    return ClientRecord(cwd, tuple(servers), capabilities)


def _without_secrets(server: Mapping[str, JsonValue]) -> Json:
    """`server` with the values of its `env` and `headers` entries left out (names kept)."""
    out = dict(server)
    for key in ("env", "headers"):
        entries = out.get(key)
        if isinstance(entries, list):
            out[key] = [{"name": e["name"]} if isinstance(e, dict) and "name" in e else {} for e in entries]
    return out
