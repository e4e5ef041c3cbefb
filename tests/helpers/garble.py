"""Damaging a file the way fuzz tests do: junk bytes written over it at drawn offsets."""

from __future__ import annotations

from pathlib import Path


def garble(path: Path, garbles: list[tuple[int, bytes]]) -> None:
    """Write each `junk` over `path` at `offset` (wrapped into the file's length), in place."""
    data = bytearray(path.read_bytes())
    for offset, junk in garbles:
        at = offset % max(1, len(data))
        data[at : at + len(junk)] = junk
    path.write_bytes(bytes(data))
