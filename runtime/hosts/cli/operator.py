"""The operator commands: `send`, `interrupt`, `stop` and `tail` (SPEC §9; README, "The CLI").

They reach a session wherever it is. One live in another process (its log's lock is held) is
reached through its mailbox (the store's: rows of the PostgreSQL store, which every host reaches;
files under `--root` with the file store): the command returns once the envelope is durable, and the host's
owner task records it (runtime/agent/mailbox_owner.py). A session nobody runs:

- `send` resumes it here and runs the turn, as `run --session ID TEXT` does; with `--queue` it
  only queues the message in its mailbox: no model runs here. A queued message is recorded, and
  answered, by the next host that resumes the session (`run --session ID`, `chat --session ID`,
  or a parent's `send_message` to a child): it is steered into that host's running turn, or
  starts one. (A `run` that ends before its owner drained it leaves it queued.)
- A `send` that loses the race for the session (another `send` or host opened it between this
  one's look and its own open: `AlreadyOwned`) is not a usage error: it goes through the
  mailbox, as to a session live elsewhere, and waits until its delivery is recorded (acked) —
  or, if the holder let the session go first, resumes it here so that its owner records it
  (and the turn answers it). So concurrent `send`s each exit 0 and each message is recorded
  once.
- `interrupt` and `stop` have nothing to stop: they say so and exit 0 (like `interrupt_agent`'s
  `not-running`), leaving nothing behind that could stop a later turn.

Every command reads through the session query of a read side (runtime/read_side.py): its stat
(with the lock probe, through the index's one slot) and `tail`'s log reads; only the envelope's
delivery writes, to the mailbox.

`tail` prints a session's durable events as JSON lines (the `run --stream` form); with
`--follow` it keeps printing events as they are written, by any process, until Ctrl-C: a stat
of the log every `FOLLOW_POLL` seconds, or at once when inotify says it changed (a folder on a
local file system), and a read of only what it grew by (runtime/log_follow.py). Exit status: 0 done, 1 the store failed or the
log is damaged, 2 bad input (an invalid id, not a root, no such session) or a store that cannot
be reached or does not answer in time (its timeouts: storage/pg_timeouts.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio
from subagents.storage import (
    AlreadyOwned,
    Envelope,
    EnvelopeKind,
    LogInfo,
    LogWatch,
    Mailbox,
    SessionNotFound,
    StorageError,
    StoreUnreachable,
)

from ...event_stream import StreamEvent
from ...foundation.errors import CommandFailed, UsageError
from ...log_follow import Mark, wait_for_change
from ...query import SessionQuery
from ...read_side import ReadSide, open_read_side
from ...store_select import open_mailbox
from .common import (
    Interrupt,
    Parser,
    check_session_arg,
    command_setup,
    one_line,
    print_stdout,
    raise_open_file_limit,
    read_only_store,
    until_interrupted,
    write_stdout,
)

if TYPE_CHECKING:
    from .common import Commands

__all__ = [
    "FOLLOW_POLL",
    "OPERATOR_COMMANDS",
    "add_operator_commands",
    "operator_command",
    "operator_main",
    "runs_elsewhere",
    "tail_command",
]

FOLLOW_POLL = 0.2  # seconds between looks at a followed log
RACE_POLL = 0.2  # seconds between looks at a race-lost send's delivery (recorded, or its holder gone)
OPERATOR_COMMANDS = ("send", "interrupt", "stop")


def add_operator_commands(commands: Commands, root: Parser, model_options: Parser) -> None:
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
        if name == "stop":  # issue 27: stop a whole tree, durably (runtime/hosts/cli/stop_tree.py)
            command.add_argument(
                "--tree",
                action="store_true",
                help="stop the session and every descendant wherever they run, for good: nothing "
                "resumes them until an explicit `send`",
            )
    tail = commands.add_parser(
        "tail", parents=[root], help="print a session's durable events as JSON lines (read-only)"
    )
    tail.add_argument("session_id", metavar="ID", help="the session")
    tail.add_argument(
        "-f", "--follow", action="store_true", help="keep printing events as any process writes them (until Ctrl-C)"
    )


async def runs_elsewhere(args: argparse.Namespace) -> bool:
    """Whether another process holds the session `args` names (`UsageError` if there is none)."""
    async with _opened(args) as side:
        return (await _stat(side.query, args.session_id))[1]


@asynccontextmanager
async def _opened(args: argparse.Namespace) -> AsyncIterator[ReadSide]:
    """The read side of the store the command names (`--store`, else `--root`), closed on
    leaving; a store error inside becomes the CLI's: `UsageError` (exit 2) for one that does
    not answer in time, `CommandFailed` (exit 1) else."""
    async with open_read_side(args.root, store=getattr(args, "store", None)) as side:
        try:
            yield side
        except StoreUnreachable as exc:  # no answer in time: as a refused connection
            raise UsageError(str(exc)) from None
        except StorageError as exc:
            raise CommandFailed(str(exc)) from None


async def _stat(query: SessionQuery, session_id: str) -> tuple[LogInfo, bool]:
    """The session's stat and whether another process holds it; `UsageError` if none."""
    try:
        info, held = await query.stat(session_id)
    except SessionNotFound:
        info, held = None, False
    if info is None:
        raise UsageError(f'session "{session_id}" not found')
    return info, held


async def operator_command(args: argparse.Namespace) -> int:
    """`send`, `interrupt` or `stop`: through the mailbox of a session live elsewhere (see the
    module docstring for one nobody runs)."""
    # Here, not at the top: the mailbox owner's module loads the agent loop, which `tail` (a
    # read-only command parsed by the same CLI) must not pay for at start-up.
    from ...agent.mailbox_owner import new_envelope

    kind: EnvelopeKind = "message" if args.command == "send" else args.command
    sid = args.session_id
    async with _opened(args) as side:
        info, held = await _stat(side.query, sid)
        if info.damage is not None:
            raise CommandFailed(f'session "{sid}" is damaged ({info.damage}): nothing delivered')
        if not held and kind != "message":
            print(f"session {sid} is not running: nothing to {args.command}")
            return 0
        # A live session between turns: the interrupt or stop finds nothing running (told
        # here, since its holder acts on it later, out of sight).
        idle = held and kind != "message" and not await _turn_open(side.query, sid)
        mailbox = open_mailbox(side.log_store, args.root)
        await trio.to_thread.run_sync(mailbox.sync_clock)  # the clock the envelope is stamped on
        envelope = new_envelope(mailbox, kind, {"text": args.text} if kind == "message" else {})
        await trio.to_thread.run_sync(mailbox.deliver, sid, envelope)
    where = (
        "live in another process, which records it" if held else "not running: the next host that resumes it records it"
    )
    print(f"{args.command} {envelope.delivery_id} delivered to session {sid} ({where})")
    if idle:
        effect = "it stops between turns" if kind == "stop" else "no turn was open to interrupt"
        print(f"session {sid} was idle: nothing was running ({effect})")
    return 0


async def _turn_open(query: SessionQuery, sid: str) -> bool:
    """Whether the log's last turn is open (for a session held elsewhere: it is running); a
    log that cannot be read counts as open, so nothing is claimed about it."""
    try:
        _k, events = await query.read_from(sid, 0)
    except StorageError:
        return True
    for event in reversed(events):
        if event.type == "turn/end":
            return False
        if event.type == "turn/start":
            return True
    return False


async def tail_command(args: argparse.Namespace, *, write: Callable[[bytes], None]) -> int:
    """`tail [-f]`: the session's events as JSON lines, through `write(bytes)`."""
    sid = args.session_id
    async with _opened(args) as side:
        query = side.query
        await _stat(query, sid)
        cursor, mark = 0, None
        watch = query.log_watch() if args.follow else None
        try:
            while True:
                k, events = await query.read_from(sid, cursor, after=mark)
                if events:
                    write(b"".join(StreamEvent(sid, e, k).json_bytes() + b"\n" for e in events))
                    cursor = events[-1].seq + 1
                if not args.follow:
                    return 0
                mark = await _until_grown(query, sid, cursor, mark, watch)
        finally:
            if watch is not None:
                watch.close()


async def _until_grown(
    query: SessionQuery, sid: str, cursor: int, mark: Mark | None, watch: LogWatch | None
) -> Mark | None:
    """Until the log holds more than `cursor` events (or is damaged: the read says how):
    a stat each `FOLLOW_POLL` seconds, or as soon as the watch says the log changed. Returns
    the boundary to read from (runtime/log_follow.py): only the bytes past it are read."""
    while True:
        if watch is not None:
            watch.follow([sid])
        info, _held = await _stat(query, sid)
        if info.event_count > cursor or info.damage is not None:
            return mark
        mark = (int(info.revision.size), int(info.event_count))
        await wait_for_change(trio.current_time() + FOLLOW_POLL, watch, trio.Event())


def operator_main(args: argparse.Namespace) -> int:
    """`send`, `interrupt`, `stop`, `tail` (runtime/hosts/cli/operator.py)."""
    check_session_arg(args.session_id)
    read_only_store(args)
    if args.command == "tail":
        return trio.run(until_interrupted, _tail, args)
    if args.command == "stop" and args.tree:
        from .stop_tree import stop_tree_command

        return trio.run(stop_tree_command, args)
    if args.command == "send" and not args.queue:
        if not trio.run(runs_elsewhere, args):
            # Nobody runs it: this process resumes it and runs the turn, as `run --session ID
            # TEXT` (a message to a cold target is answered by the sender's process, as inside
            # a runtime).
            from .run import run_command

            setup = command_setup(args)
            raise_open_file_limit()
            try:
                return trio.run(until_interrupted, run_command, _run_args(args, args.text), setup)
            except UsageError as exc:
                # `run` refuses a session another process opened meanwhile ("cannot be taken");
                # the store's `AlreadyOwned` is kept as the refusal's context.
                if not isinstance(exc.__context__, AlreadyOwned):
                    raise
            return trio.run(until_interrupted, _send_race_lost, args)
    return trio.run(operator_command, args)


def _run_args(args: argparse.Namespace, prompt: str | None) -> argparse.Namespace:
    return argparse.Namespace(
        **vars(args), session=args.session_id, prompt=prompt, compression="zstd", json=False, stream=False
    )


async def _send_race_lost(args: argparse.Namespace, *, interrupt: Interrupt) -> int:
    """`send` to a session another process opened while this one tried to: the message goes to
    the session's mailbox; then, until it is recorded (acked), each time the session is free it
    is resumed here (its owner records what the mailbox holds, and the turn answers it) — the
    winner of the race, a `send` or `run` whose tree goes idle at once, may end before its
    owner drained it, and this message must not be left queued for it."""
    from ...agent.mailbox_owner import new_envelope

    sid = args.session_id
    async with _opened(args) as side:
        info, _held = await _stat(side.query, sid)
        if info.damage is not None:
            raise CommandFailed(f'session "{sid}" is damaged ({info.damage}): nothing delivered')
        mailbox = open_mailbox(side.log_store, args.root)
        await trio.to_thread.run_sync(mailbox.sync_clock)  # the clock the envelope is stamped on
        envelope = new_envelope(mailbox, "message", {"text": args.text})
        await trio.to_thread.run_sync(mailbox.deliver, sid, envelope)
        print(f"send {envelope.delivery_id} delivered to session {sid} (opened by another process meanwhile)")
        with interrupt.cancels():  # Ctrl-C: it stays queued for the next host
            while await _queued(mailbox, sid, envelope):
                _info, held = await _stat(side.query, sid)
                if not held:
                    status = await _resume_for_mail(args, interrupt)
                    if status is not None:
                        return status
                await _poll_pause()
    return 130 if interrupt.hit else 0


async def _queued(mailbox: Mailbox, sid: str, envelope: Envelope) -> bool:
    """Whether the envelope is still in the session's mailbox (not recorded yet)."""
    pending = await trio.to_thread.run_sync(mailbox.drain, sid)
    return any(e.delivery_id == envelope.delivery_id for e in pending)


async def _poll_pause() -> None:
    # Another process's ack raises nothing here to wait on: look again a moment later.
    await trio.sleep(RACE_POLL)


async def _resume_for_mail(args: argparse.Namespace, interrupt: Interrupt) -> int | None:
    """Resume the session here with no prompt of its own: its owner's first drain hands it
    what its mailbox holds (this `send`'s message among it), and the run lasts until the tree
    is idle, as `run` does. None when another process opened it first again."""
    from ...app import open_runtime
    from ..setup import headless_approver

    setup = command_setup(args)
    raise_open_file_limit()
    options = {**setup.runtime_options(), "approver": headless_approver}
    async with open_runtime(args.root, model=setup.model, compression="zstd", store=args.store, **options) as runtime:
        try:
            agent = await runtime.agents.resume(args.session_id)
        except AlreadyOwned:
            return None
        owners = runtime.agents.owners
        if owners is not None:
            await owners.first_drain(args.session_id)
        with interrupt.cancels():
            result = await runtime.subagents.wait_tree_idle(agent)
    if interrupt.hit:
        return 130
    if result is not None and result.text:
        print_stdout(result.text)
    return 0 if result is None or result.reason["kind"] == "completed" else 1


async def _tail(args: argparse.Namespace, *, interrupt: Interrupt) -> int:
    try:
        return await tail_command(args, write=write_stdout)
    except CommandFailed as exc:  # a damaged log: one line, exit 1 (inside the interrupt's nursery)
        print(f"subagents: {one_line(str(exc))}", file=sys.stderr)
        return 1
