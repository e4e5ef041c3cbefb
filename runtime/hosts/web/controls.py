"""The operator's controls (send, interrupt, stop) as the console runs them: an envelope
delivered to the session's mailbox, the path of the CLI's `send --queue`, `interrupt` and `stop`
(runtime/hosts/cli/operator.py). The console runs no model: a session live in another process
records the envelope there; one nobody runs keeps a message queued for the next host that
resumes it, and has nothing to interrupt or stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import trio
from subagents.storage import SessionNotFound

from ...store_select import open_mailbox

if TYPE_CHECKING:
    from ...read_side import ReadSide

__all__ = ["Control", "ControlRefused", "deliver"]

Control = Literal["send", "interrupt", "stop", "stop-tree"]


class ControlRefused(Exception):
    """Nothing was delivered, and why (`status`: the HTTP status the page gets)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


async def deliver(
    side: ReadSide, root: str, session_id: str, control: Control, text: str = "", *, store: str | None = None
) -> str:
    """Deliver `control` to the session; the outcome as one sentence. `stop-tree` is
    `subagents stop ID --tree` (runtime/hosts/cli/stop_tree.py) on the store at `store`/`root`."""
    # Here, not at the top: the mailbox owner's module loads the agent loop.
    from ...agent.mailbox_owner import new_envelope

    try:
        info, held = await side.query.stat(session_id)
    except SessionNotFound:
        info, held = None, False
    if info is None:
        raise ControlRefused(f'session "{session_id}" not found', 404)
    if info.damage is not None:
        raise ControlRefused(f'session "{session_id}" is damaged ({info.damage}): nothing delivered', 409)
    if control == "send" and not text.strip():
        raise ControlRefused("an empty message: nothing delivered", 400)
    if control == "stop-tree":
        return await _stop_tree(root, store, session_id)
    if not held and control != "send":
        return f"session {session_id} is not running: nothing to {control}"
    mailbox = open_mailbox(side.log_store, root)
    await trio.to_thread.run_sync(mailbox.sync_clock)  # the clock the envelope is stamped on
    kind = "message" if control == "send" else control
    envelope = new_envelope(mailbox, kind, {"text": text} if control == "send" else {})
    await trio.to_thread.run_sync(mailbox.deliver, session_id, envelope)
    where = (
        "live in another process, which records it" if held else "not running: the next host that resumes it records it"
    )
    return f"{control} {envelope.delivery_id} delivered to session {session_id} ({where})"


async def _stop_tree(root: str, store: str | None, session_id: str) -> str:
    """The session and every descendant stopped for good, as `stop --tree` does: a runtime
    without a model on the same store (it starts no agent) writes the markers of the sessions
    nobody runs and sends a `stop` to those another process runs."""
    from ...app import open_runtime  # the runtime's weight, only for this control
    from ..cli.stop_tree import stopped_line

    async with open_runtime(root, store=store) as runtime:
        done = await runtime.subagents.stop_tree(session_id, by="operator")
    stopped = done.stopped
    already = sum(1 for _sid, outcome in done.sessions if outcome == "already")
    line = stopped_line(session_id, [d for d in done.descendants if d in stopped], already)
    if done.unconfirmed:
        line += f"; delivered, but not yet recorded by the host that runs {', '.join(done.unconfirmed)}"
    return line
