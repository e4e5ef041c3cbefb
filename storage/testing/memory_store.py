"""`MemoryLogStore`: the file store over an in-memory `CrashFs`.

The same code as the real store runs against memory, so the fake cannot drift from the real
thing; it never touches the disk (CrashFs is thread-safe, since actors call stores from worker
threads), which makes it the store for `autojump_clock` tests, and `crash()` simulates a power
cut.
"""

from __future__ import annotations

from ..file_store import Compression, FileLogStore
from .crashfs import CrashFs

__all__ = ["MemoryLogStore"]


class MemoryLogStore(FileLogStore):
    def __init__(self, *, fs: CrashFs | None = None, compression: Compression = "zstd") -> None:
        self.crash_fs = fs if fs is not None else CrashFs()
        super().__init__(fs=self.crash_fs, compression=compression)

    def crash(self) -> None:
        """Lose everything not fsynced; every handle this store gave out is dead."""
        self.crash_fs.crash()
        self._root_durable = False
