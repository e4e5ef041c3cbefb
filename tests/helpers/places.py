"""Where a runtime-level test keeps its sessions: a folder (the file store) or a PostgreSQL
database (issue 18: the same tests, the store a parameter; the `place` fixture in conftest).

`store()` opens a log store on it (the file store's own options apply to files only, except
`compression`, which on PostgreSQL picks every batch's form), `open_runtime(...)` opens a runtime
on it (`store=<url>` on PostgreSQL, the folder holding the runtime's other files either way),
`cli()` the arguments naming it on the command line. `rewrite`, `overwrite`, `delete` and `copy`
damage one session the way an editor would: its log's plain bytes edited (a file replaced or
written in place, or its rows: tests/helpers/pg_damage.py), its log gone, its folder (its rows)
copied under another id.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pg_damage
import pytest
from subagents.storage import FileLogStore, LogStore

__all__ = ["Place", "open_place"]


class Place:
    """See the module docstring. `url` is None for files."""

    def __init__(self, kind: str, root: Path, url: str | None = None, make: Callable[..., LogStore] | None = None):
        self.kind = kind
        self.root = root
        self.url = url
        self._make = make
        self._opened: list[LogStore] = []

    @property
    def is_pg(self) -> bool:
        return self.url is not None

    def store(self, **file_options: Any) -> LogStore:
        """A log store on this place (closed when the test ends). On PostgreSQL `compression`
        picks the batch form: "zstd" every batch a zstd frame, "none" none, unset the store's
        own threshold; the other file options have no PostgreSQL meaning."""
        if self._make is not None:
            compression = file_options.get("compression")
            if compression is None:
                store = self._make()
            else:
                store = self._make(compress_above=0 if compression == "zstd" else 1 << 62)
            if file_options.get("use_index") is False:
                return _WithoutCheckpointRung(store)  # type: ignore[return-value]  # the LogStore it wraps
            return store
        store = FileLogStore(str(self.root), **file_options)
        self._opened.append(store)
        return store

    def runtime_options(self) -> dict[str, Any]:
        return {"store": self.url} if self.url is not None else {}

    def open_runtime(self, **options: Any) -> AbstractAsyncContextManager[Any]:
        from subagents.runtime import open_runtime

        if self.url is not None and "log_store" not in options:
            options = {"store": self.url, **options}
        return open_runtime(self.root, **options)

    def cli(self) -> list[str]:
        """The command-line arguments naming this place."""
        args = ["--root", str(self.root)]
        return args + ["--store", self.url] if self.url is not None else args

    # --- damage ---

    def log_file(self, sid: str) -> Path:
        """The plain log file of `sid` (files only; these tests' ids encode to themselves)."""
        return self.root / "sessions" / sid / "session.jsonl"

    def rewrite(self, sid: str, edit: Callable[[bytes], bytes]) -> None:
        """Replace the session's log by an edited copy of its plain bytes."""
        if self.url is not None:
            pg_damage.rewrite(self.url, sid, edit)
            return
        path = self.log_file(sid)
        tmp = path.with_name("edited.tmp")
        tmp.write_bytes(edit(path.read_bytes()))
        os.replace(tmp, path)  # a new inode: the index rescans it

    def overwrite(self, sid: str, edit: Callable[[bytes], bytes]) -> None:
        """Like `rewrite`, but a file is written in place (the same inode, as a user's editor
        or a crash might leave it)."""
        if self.url is not None:
            pg_damage.rewrite(self.url, sid, edit)
            return
        path = self.log_file(sid)
        path.write_bytes(edit(path.read_bytes()))

    def delete(self, sid: str) -> None:
        """The session's log gone (its folder and lock stay; on PostgreSQL every row of it)."""
        if self.url is not None:
            pg_damage.delete_session(self.url, sid)
        else:
            self.log_file(sid).unlink()

    def copy(self, sid: str, copy: str) -> None:
        """The session copied under another id; its line 1 still names `sid`."""
        if self.url is not None:
            pg_damage.copy_session(self.url, sid, copy)
        else:
            shutil.copytree(self.log_file(sid).parent, self.log_file(copy).parent)

    def close(self) -> None:
        for store in self._opened:
            store.close_store()


def open_place(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> Iterator[Place]:
    """The `place` of `kind` ("file" or "pg"), closed after the test: the `place` fixture's body,
    for a module whose own `place` fixture takes its kind from its own parametrization."""
    root = tmp_path / "root"
    root.mkdir()
    if kind == "file":
        found = Place("file", root)
    else:
        found = Place("pg", root, request.getfixturevalue("pg_url"), request.getfixturevalue("pg_store_factory"))
    yield found
    found.close()


class _WithoutCheckpointRung:
    """A PostgreSQL store as a file store without its index (`use_index=False`) is: no checkpoint
    rows are read, and none are written back by listings — every cold child is observed. The
    rest is the store's own."""

    def __init__(self, store: LogStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        return None

    def read_checkpoint_rows(self, *args: Any, **kwargs: Any) -> None:
        return None

    def write_observed_checkpoints(self, observed: Any) -> int:
        return 0
