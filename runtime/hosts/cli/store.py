"""`--store` and the store commands: `store init`, `export` and `import` (README, "The CLI").

`select_store` checks a command's `--store` before anything runs; the copying itself is
runtime/hosts/cli/transfer.py.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from subagents.storage import LogStore, StorageError, redact_url

from ...foundation.errors import UsageError
from .common import read_only_root

if TYPE_CHECKING:
    from .common import Commands

__all__ = ["add_store_commands", "select_store", "transfer_command"]


def add_store_commands(commands: Commands) -> None:
    """`store init`, `export` and `import` (runtime/hosts/cli/transfer.py)."""
    store = commands.add_parser("store", help="manage a PostgreSQL store")
    store.add_argument("action", choices=("init",), metavar="ACTION", help="init: create or migrate the schema")
    store.add_argument("url", metavar="URL", help="postgresql://...")
    export = commands.add_parser("export", help="copy every session of a PostgreSQL store into format-1 files")
    export.add_argument("--store", metavar="URL", required=True, help="the PostgreSQL store to read")
    export.add_argument("--to", metavar="DIR", required=True, help="the folder to write (a file store root)")
    export.add_argument("--compression", choices=("zstd", "none"), default="zstd", help="the form of the files")
    export.add_argument("--into-existing", action="store_true", help="write into a non-empty folder too")
    imp = commands.add_parser("import", help="copy every session of a file store into a PostgreSQL store")
    imp.add_argument("source", metavar="DIR", help="the file store root to read")
    imp.add_argument("--store", metavar="URL", required=True, help="the PostgreSQL store to write")


def select_store(args: argparse.Namespace) -> None:
    """`--store`, checked before anything runs: a folder stands for `--root` (and `args.store`
    becomes None); a PostgreSQL URL is connected to once (its schema created or checked), so a
    malformed URL, a refused connection or a newer schema is a usage error before any work."""
    spec = getattr(args, "store", None)
    if spec is None or args.command in ("store", "export", "import"):
        return
    if not _is_pg(spec):
        args.root, args.store = spec, None
        return
    # Only the commands that may create sessions create (or migrate) the schema; the others
    # say that the store is not initialized and write nothing.
    _open_pg(spec, create_schema=args.command in _CREATES_SCHEMA).close_store()


def _is_pg(spec: str) -> bool:
    from ...store_select import is_pg_url

    try:
        return is_pg_url(spec)
    except StorageError as exc:
        raise UsageError(str(exc)) from None


_CREATES_SCHEMA = ("run", "chat", "acp", "demo", "serve")  # and `store init`, `import` (transfer_command)


def _open_pg(url: str, *, create_schema: bool = True) -> LogStore:
    """The PostgreSQL store at `url`, or `UsageError` in one line (exit status 2)."""
    from ...store_select import open_log_store

    if not _is_pg(url):
        raise UsageError(f"not a PostgreSQL URL (postgresql://...): {redact_url(url)}")
    try:
        return open_log_store(url, create_schema=create_schema)
    except StorageError as exc:
        raise UsageError(str(exc)) from None


def transfer_command(args: argparse.Namespace) -> int:
    """`store init`, `export`, `import`: one line per session copied, then a summary."""
    from subagents.storage import FileLogStore

    from ...store_select import store_label
    from .transfer import copy_sessions, empty_folder

    if args.command == "export" and not empty_folder(args.to) and not args.into_existing:
        raise UsageError(f"the target folder is not empty (--into-existing to write into it): {args.to}")
    if args.command == "import":
        read_only_root(args.source)
    pg = _open_pg(args.url if args.command == "store" else args.store, create_schema=args.command != "export")
    try:
        if args.command == "store":
            count = len(pg.list())
            print(f"store init: {store_label(pg)}: schema ready ({count} sessions)")
            return 0
        if args.command == "export":
            os.makedirs(args.to, exist_ok=True)
        files = FileLogStore(
            args.to if args.command == "export" else args.source, compression=getattr(args, "compression", "zstd")
        )
        try:
            source, target = (pg, files) if args.command == "export" else (files, pg)
            copied = copy_sessions(source, target)
        finally:
            files.close_store()
    finally:
        pg.close_store()
    for one in copied:
        print(f"{args.command}: {one.session_id} ({one.events} events)")
    where = f"to {args.to}" if args.command == "export" else f"into {store_label(pg)}"
    print(f"{args.command}: {len(copied)} sessions, {sum(c.events for c in copied)} events {where}")
    return 0
