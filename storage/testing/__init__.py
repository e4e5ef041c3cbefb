"""Test doubles for the storage layer: never imported by `actors/` or `runtime/` production code.

`CrashFs` is an in-memory `Fs` that can crash and inject faults, `MemoryLogStore` the file store
over it (the store for `autojump_clock` tests), `MemoryMailbox` the file mailbox over it, `MemoryPlacements` a placement queue in memory, and
`FaultyLogStore` wraps any `LogStore` to inject failures, delays and hangs per operation.
"""

from .crashfs import CrashFs as CrashFs
from .faulty_store import FaultyLogStore as FaultyLogStore
from .memory_mailbox import MemoryMailbox as MemoryMailbox
from .memory_placements import MemoryPlacements as MemoryPlacements
from .memory_store import MemoryLogStore as MemoryLogStore

__all__ = [
    "CrashFs",
    "FaultyLogStore",
    "MemoryLogStore",
    "MemoryMailbox",
    "MemoryPlacements",
]
