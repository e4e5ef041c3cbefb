"""The file mailbox across real processes: concurrent senders, a sender killed mid-stream, and the
owner's inotify wake-up on a delivery made by another process."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from subagents.storage import FileMailbox

SID = "child-1"
SAFETY = 120  # seconds: only so a broken build fails instead of hanging; nothing waits on time

SENDER = textwrap.dedent(
    """
    import sys, time
    from subagents.storage import Envelope, FileMailbox
    root, sid, sender, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    mailbox = FileMailbox(root)
    if len(sys.argv) > 5:
        sys.stdin.readline()  # deliver only once told to
    for n in range(count):
        env = Envelope.new(mailbox.ids, time.time_ns() // 1_000_000, "message", {"n": n}, sender=sender)
        mailbox.deliver(sid, env)
        print(env.delivery_id, flush=True)  # printed only once deliver returned: acknowledged
    """
)


def sender(root: Path, name: str, count: int, *, on_cue: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SENDER, str(root), SID, name, str(count), *(["cue"] if on_cue else [])],
        stdin=subprocess.PIPE if on_cue else None,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # starts several Python processes
def test_senders_in_several_processes_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    procs = {f"p{k}": sender(tmp_path, f"p{k}", 40) for k in range(3)}
    acknowledged = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=SAFETY)
        assert proc.returncode == 0
        acknowledged[name] = out.split()
    drained = FileMailbox(str(tmp_path)).drain_report(SID)
    assert drained.rejected == []
    ids = [e.delivery_id for e in drained.envelopes]
    assert sorted(ids) == ids and len(set(ids)) == len(ids) == 120
    for name, own in acknowledged.items():
        assert [e.delivery_id for e in drained.envelopes if e.sender == name] == own  # each in its order
        assert [e.body["n"] for e in drained.envelopes if e.sender == name] == list(range(40))


@pytest.mark.slow  # starts a Python process and SIGKILLs it
def test_a_sender_killed_mid_stream_loses_no_acknowledged_delivery(tmp_path: Path) -> None:
    proc = sender(tmp_path, "victim", 100_000)
    assert proc.stdout is not None
    acknowledged = [proc.stdout.readline().strip() for _ in range(25)]
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=SAFETY)
    acknowledged += [line for line in rest.split("\n") if len(line) == 26]  # a torn last line was never acked
    report = FileMailbox(str(tmp_path)).drain_report(SID)
    assert report.rejected == []  # a delivery cut before its link left at most a temp file, ignored
    drained = [e.delivery_id for e in report.envelopes]
    assert drained[: len(acknowledged)] == acknowledged
    assert len(drained) - len(acknowledged) <= 1  # at most the delivery that was linked but not yet printed


@pytest.mark.slow  # starts a Python process
def test_the_owner_is_woken_by_a_delivery_from_another_process(tmp_path: Path) -> None:
    owner = FileMailbox(str(tmp_path))
    with owner.watch(SID) as watch:
        assert watch.inotify
        proc = sender(tmp_path, "other", 1, on_cue=True)
        watch.clear()
        assert owner.drain(SID) == []
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()  # from here on, the other process delivers
        # The owner's loop (storage/mailbox_watch.py): wait, clear, drain. A wake-up may come early
        # (the sender's temp file is created first); the link always raises one more.
        while True:
            readable, _, _ = select.select([watch.fileno()], [], [], SAFETY)
            assert readable, "no wake-up"
            watch.clear()
            drained = owner.drain(SID)
            if drained:
                break
        out, _ = proc.communicate(timeout=SAFETY)
        assert [e.delivery_id for e in drained] == out.split()
