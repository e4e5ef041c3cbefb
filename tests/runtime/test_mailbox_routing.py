"""Routing through the mailbox (issue 17 item 2; runtime/delegation/service.py, settlement.py):
`send_message` and `interrupt_agent` to a child another host holds go to its mailbox, and that
host's owner records them; a settlement whose parent another host holds goes to the parent's
mailbox and is recorded there once, with its notice.

Two runtimes ("hosts") on one in-memory disk (`MemoryLogStore`s and `MemoryMailbox`es on one
`CrashFs`, whose lock table counts every holder), under `autojump_clock`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clocks import until_virtual
from drafts import descriptor_draft
from log_lines import memory_events
from mailboxes import rel_mailbox
from memory_hosts import memory_host
from subagents.actors import Activation
from subagents.runtime.foundation.errors import Unauthorized
from subagents.storage.testing import CrashFs, MemoryMailbox

Json = dict[str, Any]


def _pending(fs: CrashFs, sid: str) -> list[str]:
    try:
        return [n for n in fs.listdir(rel_mailbox(sid)) if n.endswith(".json")]
    except FileNotFoundError:
        return []


async def test_messages_interrupts_and_settlements_cross_hosts_through_mailboxes(
    tmp_path: Path, autojump_clock: Any
) -> None:
    fs = CrashFs()
    mine = MemoryMailbox(fs=fs)
    theirs = mine.sibling()
    kid_script = [{"wait_for": {"steered": True}, "text": "heard"}, {"hang": True}]
    async with (
        # (the holds here are released by deliveries; `until_virtual` is the hang guard)
        memory_host(tmp_path, fs, mine, {"responses": [{"text": "NOTED"}]}, ids="c") as here,
        memory_host(tmp_path, fs, theirs, {"responses": kid_script}, ids="c") as there,
    ):
        boss = await here.agents.create(session_id="boss")
        stranger = await here.agents.create(session_id="stranger")
        # The other host runs the child "kid" of "boss" (as if it had resumed it).
        kid = await there.agents.create(
            session_id="kid",
            parent_session="boss",
            origin="subagent",
            delegation_depth=1,
            first=[descriptor_draft("kid")],
        )
        await kid.send("work")

        await here.subagents.send_message(boss, "kid", "hello from the other host")
        await until_virtual(lambda: bool(kid.recorded_deliveries) and not _pending(fs, "kid"))
        with pytest.raises(Unauthorized):
            await here.subagents.send_message(stranger, "kid", "not yours")

        assert await here.subagents.interrupt("kid", by=boss) == "requested"
        await until_virtual(lambda: kid.status == "idle" and not _pending(fs, "kid"))

        # It settles over there; the parent is live here: the notice crosses by mailbox.
        await there.subagents.settlement.settle(Activation("kid", "boss", "boss"), kid)
        await until_virtual(lambda: not _pending(fs, "boss") and bool(boss.recorded_deliveries))
        await boss.wait_idle()

    kid_events = memory_events(fs, "kid")
    (message,) = [d for t, d in kid_events if t == "user/message" and "delivery_id" in d]
    assert message["message"]["content"][1] == {"type": "text", "text": "hello from the other host"}
    assert message["message"]["source"] == {"kind": "agent-message", "sender_session_id": "boss"}
    assert [d["reason"] for t, d in kid_events if t == "turn/end"] == [{"kind": "aborted", "cause": "parent"}]

    boss_events = memory_events(fs, "boss")
    (settled,) = [d for t, d in boss_events if t == "subagent/settled"]
    assert settled["child_id"] == "kid" and settled["reason_kind"] == "aborted"
    assert settled["delivery_id"] in boss.recorded_deliveries
    (notice,) = [d for t, d in boss_events if t == "user/message"]
    assert notice["message"]["source"] == {"kind": "subagent-settled", "sender_session_id": "kid"}
    assert [d["reason"]["kind"] for t, d in boss_events if t == "turn/end"] == ["completed"]
