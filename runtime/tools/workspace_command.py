"""`run_command`'s process: one command in its own process group, stdout and stderr merged, the
output kept up to a cap (its head and its tail, the middle counted), a timeout that kills the
whole group, and a kill on cancellation too (a cancelled turn leaves no process behind).
A sandboxed command is the same process with bubblewrap in front (runtime/sandbox/): killing
its group kills bwrap, and `--die-with-parent` with its PID namespace takes the box's every
process along.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import attrs
import trio

__all__ = ["CommandOutcome", "run_command"]


@attrs.frozen
class CommandOutcome:
    exit_code: int | None  # None when the timeout killed it
    output: str  # head, `… N bytes cut …`, tail
    timed_out: bool


async def run_command(
    command: str | Sequence[str], *, cwd: str, time_limit: float, cap: int, env: Mapping[str, str] | None = None
) -> CommandOutcome:
    """Run `command` (a shell string through /bin/sh, or an argv) in `cwd`, with `env` (None:
    ours). Raises `OSError` when it cannot start (no such program)."""
    shell = isinstance(command, str)
    process = await trio.lowlevel.open_process(
        command if shell else list(command),
        shell=shell,
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: the timeout kills what it started too
    )
    kept = _Kept(cap)
    finished = False
    try:
        assert process.stdout is not None
        with trio.move_on_after(time_limit):
            while data := await process.stdout.receive_some(1 << 16):
                kept.add(data)
            await process.wait()
            finished = True
    finally:
        if not finished:  # timed out or cancelled: the group goes, what it started included
            _kill_group(process.pid)
        with trio.CancelScope(shield=True):  # reaped even when the turn is cancelled
            await process.wait()
            assert process.stdout is not None  # opened with stdout=PIPE
            await process.stdout.aclose()
    return CommandOutcome(process.returncode if finished else None, kept.text(), not finished)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it is gone already


class _Kept:
    """The first and last `cap // 2` bytes of a stream, and how many bytes fell between."""

    def __init__(self, cap: int) -> None:
        self.half = max(1, cap // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.cut = 0

    def add(self, data: bytes | bytearray) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.half:
            self.cut += len(self.tail) - self.half
            del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if self.cut:
            return f"{head}\n… {self.cut:,} bytes cut …\n{tail}"
        return head + tail
