"""The operator commands: `send`, `interrupt`, `stop` and `tail` (SPEC §9; README, "The CLI").

They reach a session wherever it is. One live in another process (its log's lock is held) is
reached through its mailbox (the store's: rows of the PostgreSQL store, which every host reaches;
files under `--root` with the file store): the command returns once the envelope is durable, and the host's
owner task records it (runtime/agent/mailbox_owner.py). A session nobody runs:

- `send` queues the message in its mailbox all the same: no model runs here. It is recorded,
  and answered, by the next host that resumes the session (`run --session ID`, `chat --session
  ID`, or a parent's `send_message` to a child): it is steered into that host's running turn, or
  starts one. (A `run` that ends before its owner drained it leaves it queued.)
- `interrupt` and `stop` have nothing to stop: they say so and exit 0 (like `interrupt_agent`'s
  `not-running`), leaving nothing behind that could stop a later turn.

`tail` prints a session's durable events as JSON lines (the `run --stream` form); with
`--follow` it keeps printing events as they are written, by any process, looking at the log
again every `FOLLOW_POLL` seconds, until Ctrl-C. Exit status: 0 done, 1 the store failed or the
log is damaged, 2 bad input (an invalid id, not a root, no such session) or a store that cannot
be reached or does not answer in time (its timeouts: storage/pg_timeouts.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio
from subagents.storage import (
    EnvelopeKind,
    LogInfo,
    LogStore,
    SessionNotFound,
    StorageError,
    StoreUnreachable,
)

from ...event_stream import StreamEvent
from ...foundation.errors import CommandFailed, UsageError
from ...store_select import open_log_store, open_mailbox

__all__ = [
    "FOLLOW_POLL",
    "OPERATOR_COMMANDS",
    "add_operator_commands",
    "operator_command",
    "runs_elsewhere",
    "tail_command",
]

FOLLOW_POLL = 0.2  # seconds between looks at a followed log
OPERATOR_COMMANDS = ("send", "interrupt", "stop")


def add_operator_commands(commands: Any, root: argparse.ArgumentParser, model_options: argparse.ArgumentParser) -> None:
    """The parsers of `send`, `interrupt`, `stop` and `tail`."""
    send = commands.add_parser(
        "send",
        parents=[root, model_options],
        help="send a message to a session: live in another process, through its mailbox; not running, "
        "resumed here and answered (as `run --session`), or only queued with --queue",
    )
    send.add_argument("session_id", metavar="ID", help="the session to message")
    send.add_argument("text", metavar="TEXT", help="the message")
    send.add_argument(
        "--queue",
        action="store_true",
        help="a session nobody runs: only queue the message for the next host that resumes it (no model runs here)",
    )
    for name, what in (
        ("interrupt", "stop the current turn of a session live in another process (it ends aborted)"),
        ("stop", "end a session's current turn (aborted) and settle it if it is a background child"),
    ):
        command = commands.add_parser(name, parents=[root], help=what)
        command.add_argument("session_id", metavar="ID", help="the session")
    tail = commands.add_parser(
        "tail", parents=[root], help="print a session's durable events as JSON lines (read-only)"
    )
    tail.add_argument("session_id", metavar="ID", help="the session")
    tail.add_argument(
        "-f", "--follow", action="store_true", help="keep printing events as any process writes them (until Ctrl-C)"
    )


def runs_elsewhere(store_spec: str, session_id: str) -> bool:
    """Whether another process holds the session (`UsageError` if there is none); `store_spec`
    is a root folder or a store URL (runtime/store_select.py)."""
    with _open_store(store_spec) as store:
        return _stat(store, session_id)[1]


@contextmanager
def _open_store(store_spec: str) -> Iterator[LogStore]:
    """The store at `store_spec`, closed on leaving; a store error inside becomes the CLI's:
    `UsageError` (exit 2) for one that does not answer in time, `CommandFailed` (exit 1) else."""
    store = open_log_store(store_spec, create_schema=False)
    try:
        yield store
    except StoreUnreachable as exc:  # no answer in time: as a refused connection
        raise UsageError(str(exc)) from None
    except StorageError as exc:
        raise CommandFailed(str(exc)) from None
    finally:
        store.close_store()


def _stat(store: LogStore, session_id: str) -> tuple[LogInfo, bool]:
    """The session's stat and whether another process holds it; `UsageError` if none."""
    try:
        info = store.stat(session_id)
    except SessionNotFound:
        info = None
    if info is None:
        raise UsageError(f'session "{session_id}" not found')
    return info, session_id in store.held_elsewhere([session_id])


async def operator_command(args: argparse.Namespace) -> int:
    """`send`, `interrupt` or `stop`: through the mailbox of a session live elsewhere (see the
    module docstring for one nobody runs)."""
    # Here, not at the top: the mailbox owner's module loads the agent loop, which `tail` (a
    # read-only command parsed by the same CLI) must not pay for at start-up.
    from ...agent.mailbox_owner import new_envelope

    kind: EnvelopeKind = "message" if args.command == "send" else args.command
    sid = args.session_id
    with _open_store(_store_spec(args)) as store:
        info, held = await trio.to_thread.run_sync(_stat, store, sid)
        if info.damage is not None:
            raise CommandFailed(f'session "{sid}" is damaged ({info.damage}): nothing delivered')
        if not held and kind != "message":
            print(f"session {sid} is not running: nothing to {args.command}")
            return 0
        mailbox = open_mailbox(store, args.root)
        await trio.to_thread.run_sync(mailbox.sync_clock)  # the clock the envelope is stamped on
        envelope = new_envelope(mailbox, kind, {"text": args.text} if kind == "message" else {})
        await trio.to_thread.run_sync(mailbox.deliver, sid, envelope)
    where = (
        "live in another process, which records it" if held else "not running: the next host that resumes it records it"
    )
    print(f"{args.command} {envelope.delivery_id} delivered to session {sid} ({where})")
    return 0


async def tail_command(args: argparse.Namespace, *, write: Any) -> int:
    """`tail [-f]`: the session's events as JSON lines, through `write(bytes)`."""
    sid = args.session_id
    with _open_store(_store_spec(args)) as store:
        await trio.to_thread.run_sync(_stat, store, sid)
        cursor = 0
        while True:
            events, k = await trio.to_thread.run_sync(_read_from, store, sid, cursor)
            if events:
                write(b"".join(StreamEvent(sid, e, k).json_bytes() + b"\n" for e in events))
                cursor = events[-1].seq + 1
            if not args.follow:
                return 0
            await trio.sleep(FOLLOW_POLL)  # another process's appends raise nothing here to wait on


def _store_spec(args: argparse.Namespace) -> str:
    """The store the command names: `--store` (a URL) if given, else `--root`."""
    return getattr(args, "store", None) or args.root


def _read_from(store: LogStore, session_id: str, start: int) -> tuple[list[Any], int]:
    handle = store.open_read(session_id)
    try:
        return store.read(handle, start), handle.inherited_event_count  # type: ignore[arg-type]  # `start` is an Offset (an int) by the caller
    finally:
        store.close(handle)
