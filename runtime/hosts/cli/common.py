"""What the `subagents` commands share: usage errors in one line, the checks every command makes
of its arguments before a runtime opens, Ctrl-C for a command, stdout that may go away, the
table and time formats of the listings, and the open file limit.

Nothing here imports the runtime's hosts or its agent loop: read-only commands load it too
(tests/runtime/test_startup_imports.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NoReturn, TypeAlias

import trio
from subagents.storage import InvalidSessionId, StorageError, check_session_id

from ...foundation.errors import UsageError
from ...models.defaults import DEFAULT_STALL_TIMEOUT, parse_stall_timeout
from ..run_output import drop_stdout

if TYPE_CHECKING:
    from ..setup import HostSetup

__all__ = [
    "STALL_HELP",
    "STORE_HELP",
    "Interrupt",
    "Parser",
    "cell_text",
    "check_session_arg",
    "command_setup",
    "iso_time",
    "one_line",
    "print_stdout",
    "raise_open_file_limit",
    "read_only_root",
    "read_only_store",
    "stall_timeout",
    "table_lines",
    "until_interrupted",
    "version",
    "writable_root",
    "write_stdout",
]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit status 2), like every other
    piece of bad input; subcommand parsers are made of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"subagents: {one_line(message)} (see '{self.prog} --help')\n")


if TYPE_CHECKING:
    # What `add_subparsers` hands back, each command group adding its parsers to it (argparse
    # has no public name for the type, so the alias exists for the checker only).
    Commands: TypeAlias = argparse._SubParsersAction[Parser]


def one_line(text: str) -> str:
    return " ".join(text.split())


def version() -> str:
    # Imported here: importlib.metadata loads email, zipfile and csv, which no other command needs.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trio-subagents")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


STALL_HELP = f"fail a scripted wait_for after this many seconds without progress (default: {DEFAULT_STALL_TIMEOUT:g})"


def stall_timeout(args: argparse.Namespace) -> float:
    if args.stall_timeout is None:
        return DEFAULT_STALL_TIMEOUT
    try:
        return parse_stall_timeout(args.stall_timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


STORE_HELP = (
    "the store: postgresql://... for PostgreSQL (the logs and the mailbox), or a folder (the same as --root FOLDER)"
)


def writable_root(path: str) -> None:
    """A root `run` and `demo` may create or use: absent, or a folder whose sessions/ (if any)
    is a folder. Anything else is refused before a runtime opens on it."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"the root is not a folder: {path}")
    sessions = os.path.join(path, "sessions")
    if os.path.lexists(sessions) and (os.path.islink(sessions) or not os.path.isdir(sessions)):
        raise UsageError(f"not a subagents root (its sessions is not a folder): {path}")


def read_only_store(args: argparse.Namespace) -> None:
    """A read-only command's store exists: a PostgreSQL store was checked by `select_store`;
    a folder must be a root."""
    if args.store is None:
        read_only_root(args.root)


def read_only_root(path: str) -> str:
    if not os.path.isdir(os.path.join(path, "sessions")):
        raise UsageError(f"not a subagents root: {path}")
    return path


class Interrupt:
    """Ctrl-C for a command. The command marks scopes with the Ctrl-C that cancels them
    (`cancels(on=1)`: the first; `on=2`: the second); the Nth Ctrl-C cancels every open scope
    marked N or lower, and a scope entered after it is cancelled at once. A Ctrl-C no open
    scope waits for (a command that marked none, or a third one in `run`) cancels the whole
    command at once. Scopes, not the whole command: the runtime around them then closes
    normally and drains."""

    def __init__(self, everything: trio.CancelScope) -> None:
        self.hits = 0
        self._everything = everything
        self._scopes: list[tuple[int, trio.CancelScope]] = []

    @property
    def hit(self) -> bool:
        """Ctrl-C came at least once."""
        return self.hits > 0

    @contextmanager
    def cancels(self, on: int = 1) -> Iterator[trio.CancelScope]:
        with trio.CancelScope() as scope:
            entry = (on, scope)
            self._scopes.append(entry)
            if self.hits >= on:
                scope.cancel()
            try:
                yield scope
            finally:
                self._scopes.remove(entry)

    def fire(self) -> None:
        self.hits += 1
        if not any(on >= self.hits for on, _ in self._scopes):
            self._everything.cancel()
        for on, scope in self._scopes:
            if on <= self.hits:
                scope.cancel()


async def until_interrupted(fn: Callable[..., Awaitable[int]], *args: object) -> int:
    """Run `fn(*args, interrupt=...)`; Ctrl-C makes the status 130. SIGINT is taken as a
    signal here, so no KeyboardInterrupt lands in some agent's task."""
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        status = 130
        refused: UsageError | None = None
        async with trio.open_nursery() as nursery:
            interrupt = Interrupt(nursery.cancel_scope)

            async def on_interrupt() -> None:
                async for _ in signals:
                    interrupt.fire()

            async def body() -> None:
                nonlocal status, refused
                try:
                    status = await fn(*args, interrupt=interrupt)
                except UsageError as exc:
                    refused = exc  # raised below, bare: main() prints it as one line (exit 2)
                except StorageError as exc:
                    print(f"subagents: {one_line(str(exc))}", file=sys.stderr)  # the store failed under the run
                    status = 1
                nursery.cancel_scope.cancel()

            nursery.start_soon(on_interrupt)
            nursery.start_soon(body)
        if refused is not None:
            raise refused
        return 130 if interrupt.hit else status


def write_stdout(data: bytes) -> None:
    """Write `data` to stdout; a reader that went away (`run | head`) is not an error of the
    run's: stdout is pointed at /dev/null and the run's own exit status stands."""
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        drop_stdout(sys.stdout.buffer)


def print_stdout(text: str) -> None:
    """`print(text)` to stdout, flushed; a reader that went away is handled as above."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        drop_stdout(sys.stdout.buffer)


def iso_time(ms: int | None) -> str:
    """Milliseconds since the epoch as ISO 8601 in UTC (`2026-12-01T13:17:21.123Z`)."""
    if ms is None:
        return "-"
    try:
        second = datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    except (OverflowError, OSError, ValueError):  # outside what a calendar date can say
        return str(ms)
    return f"{second}.{ms % 1000:03d}Z"


def cell_text(value: object) -> str:
    return "-" if value is None else one_line(str(value))


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, a header line first."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def raise_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # keep the soft limit: listings still work, just with fewer files open at once


def check_session_arg(session_id: str) -> None:
    try:
        check_session_id(session_id)
    except InvalidSessionId as exc:
        raise UsageError(exc.message) from None


def command_setup(args: argparse.Namespace) -> HostSetup:
    """The configuration a host command (`run`, `chat`, `acp`) runs with: subagents.toml under
    its flags; a bad file, flag or model spec is a usage error. Agent type files that cannot be
    used are named on stderr once."""
    from ..setup import host_setup

    flags = {
        "model": args.model,
        "base_url": args.base_url,
        "stall_timeout": None if args.stall_timeout is None else stall_timeout(args),
        "workspace": args.workspace,
    }
    budget_flags = {
        "max_tokens": getattr(args, "budget_tokens", None),
        "max_cost": getattr(args, "budget_cost", None),
        "max_turns": getattr(args, "budget_turns", None),
    }
    setup = host_setup(flags, budget_flags=budget_flags)
    for problem in setup.problems:
        print(f"subagents: agent type {problem.path} left out: {one_line(problem.reason)}", file=sys.stderr)
    return setup
