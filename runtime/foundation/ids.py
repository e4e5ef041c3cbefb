"""Session id factories (docs/design.md, "Determinism for tests and demos"): random for real
runs, flat `<prefix>-<n>` for scenarios.

A factory only proposes ids; whoever creates a session skips a proposal that already names a
live or persisted session, so a deterministic factory restarted in a new process never reuses an
id that is on disk.
"""

from __future__ import annotations

import uuid
from typing import Protocol

__all__ = ["CountingIds", "IdFactory", "RandomIds"]


class IdFactory(Protocol):
    def __call__(self) -> str: ...


class RandomIds:
    __slots__ = ()

    def __call__(self) -> str:
        return str(uuid.uuid4())


class CountingIds:
    """`<prefix>-1`, `<prefix>-2`, … — never nested, whatever the parent is."""

    __slots__ = ("_n", "prefix")

    def __init__(self, prefix: str = "session") -> None:
        self.prefix = prefix
        self._n = 0

    def __call__(self) -> str:
        self._n += 1
        return f"{self.prefix}-{self._n}"
