"""`subagents stop ID --tree`: stop a session and every descendant, wherever each runs, for
good (runtime/delegation/stopping.py; README, "Stopping a tree").

The command opens a runtime on the store without a model (it starts no agent): sessions another
process or host runs get a `stop` envelope, and their owner there records the marker; sessions
nobody runs get the marker written here (open, append, release). It returns once every marker
is durable — or says which it could not confirm (exit 1). Exit 2: no such session.
"""

from __future__ import annotations

import argparse

from subagents.storage import StorageError, StoreUnreachable

from ...foundation.errors import CommandFailed, UsageError

__all__ = ["stop_tree_command", "stopped_line"]


def stopped_line(target: str, descendants: list[str], already: int = 0) -> str:
    """What the command prints: how many sessions were stopped, which, and how many of them
    were stopped already (nothing was written to those)."""
    total = 1 + len(descendants)
    noun = "session" if total == 1 else "sessions"
    tail = f" ({already} of them stopped already)" if already else ""
    if not descendants:
        return f"stopped {total} {noun}: {target}{tail}"
    return f"stopped {total} {noun}: {target} and its descendants {', '.join(descendants)}{tail}"


async def stop_tree_command(args: argparse.Namespace) -> int:
    """Stop `args.session_id`'s tree; print `stopped_line`."""
    from ...app import open_runtime  # the runtime's weight, only for this command

    sid = args.session_id
    try:
        async with open_runtime(args.root, store=getattr(args, "store", None)) as runtime:
            info, _held = await runtime.query.stat(sid)
            if info is None:
                raise UsageError(f'session "{sid}" not found')
            if info.damage is not None:
                raise CommandFailed(f'session "{sid}" is damaged ({info.damage}): nothing stopped')
            done = await runtime.subagents.stop_tree(sid, by="operator")
    except StoreUnreachable as exc:
        raise UsageError(str(exc)) from None
    except StorageError as exc:
        raise CommandFailed(str(exc)) from None
    stopped = done.stopped
    already = sum(1 for _sid, outcome in done.sessions if outcome == "already")
    print(stopped_line(sid, [d for d in done.descendants if d in stopped], already))
    if done.unconfirmed:
        raise CommandFailed(f"stop delivered, but not yet recorded by the host that runs {', '.join(done.unconfirmed)}")
    return 0
