"""Real processes killed with SIGKILL lose no acknowledged event (SPEC 3.3, SPEC 6).

A child process (the script below, written into `tmp_path`) opens a `FileLogStore` on a real
root and appends batches in a loop, printing the next seq after every acknowledged append. The
parent reads a varied number of acknowledgements — waiting on the pipe, never on a clock — and
kills the child with SIGKILL, wherever it is. Then the parent checks, in a new store: the flock
died with the child (`open_write` succeeds), every acknowledged event is there byte for byte, the
file holds nothing but the header and complete records, and appending continues at the next seq.
Between rounds the parent leaves a torn tail (an incomplete line or frame, NUL padding), as a
power cut can, and the next child must cut it and continue from the same seq.

Events are a pure function of their seq (`event` in the child script, loaded by the parent too),
so the parent knows the exact bytes of every event the child may have written.
"""

from __future__ import annotations

import os
import random
import runpy
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import zstandard
from log_lines import header, header_line, log_file, zstd_frames
from subagents.storage import (
    AlreadyOwned,
    Batch,
    Event,
    FileLogStore,
)
from subagents.storage._codec import encode_event
from subagents.storage.forms import Compression

FORMS: tuple[Compression, ...] = ("none", "zstd")
MAX_APPENDS_PER_CHILD = 200  # then the child waits to be killed: the log stays small
SILENCE_LIMIT = 60.0  # seconds a child may stay silent before the test gives up on it

CHILD_SCRIPT = '''
import sys

from subagents.storage import Batch, FileLogStore, SessionHeader, make_event

CREATED_AT = 1_789_000_000_000


def event(seq):
    text = "event %d " % seq + "abcdefghij"[seq % 10] * (seq * 37 % 600)
    return make_event(seq, "compaction/summary", CREATED_AT + seq, {"text": text})


def batches(first, call):
    """1-3 batches of 1-4 events, varying with the call number."""
    out = []
    seq = first
    for b in range(1 + call % 3):
        n = 1 + (call + b) % 4
        out.append(Batch(seq, [event(s) for s in range(seq, seq + n)]))
        seq += n
    return out


def main(root, sid, compression, mode, max_appends):
    store = FileLogStore(root, compression=compression)
    if mode == "create":
        handle = store.create(SessionHeader(id=sid, created_at=CREATED_AT))
    else:
        handle = store.open_write(sid)
    out = sys.stdout
    out.write("%s %d\\n" % ("ready" if mode == "hold" else "open", handle.next_seq))
    out.flush()
    if mode != "hold":
        for call in range(int(max_appends)):
            nxt = store.append(handle, batches(handle.next_seq, call))
            out.write("ack %d\\n" % nxt)
            out.flush()
    sys.stdin.read()  # hold the handle (and its lock) until killed


if __name__ == "__main__":
    main(*sys.argv[1:])
'''


class Child:
    """A child running the script, read line by line from its stdout pipe."""

    def __init__(self, script: Path, root: Path, sid: str, compression: str, mode: str) -> None:
        argv = [sys.executable, str(script), str(root), sid, compression, mode, str(MAX_APPENDS_PER_CHILD)]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
        )
        self._buf = b""

    def line(self) -> str:
        """The next line; waits on the pipe (select), never on a clock."""
        assert self.proc.stdout is not None
        while b"\n" not in self._buf:
            ready, _, _ = select.select([self.proc.stdout], [], [], SILENCE_LIMIT)
            assert ready, f"the child stayed silent for {SILENCE_LIMIT} s"
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                self.proc.wait()
                assert self.proc.stderr is not None
                stderr = self.proc.stderr.read().decode()
                raise AssertionError(f"the child exited ({self.proc.returncode}): {stderr}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def kill(self) -> list[str]:
        """SIGKILL, reap, and return the complete lines it printed that were not read yet."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        rest = self._buf + self.proc.stdout.read()
        stderr = self.proc.stderr.read().decode()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            pipe.close()
        # It died of the signal, not of an error of its own.
        assert self.proc.returncode == -signal.SIGKILL and not stderr, (self.proc.returncode, stderr)
        return rest.decode().splitlines()[: rest.count(b"\n")]


def acks_in(lines: list[str]) -> list[int]:
    acks = []
    for line in lines:
        word, _, value = line.partition(" ")
        assert word == "ack", line
        acks.append(int(value))
    return acks


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD_SCRIPT)
    return path


@attrs.frozen
class ChildApi:
    """`event` and `batches` from the child script itself: one definition of the bytes."""

    event: Callable[[int], Event]
    batches: Callable[[int, int], list[Batch]]


@pytest.fixture
def api(script: Path) -> ChildApi:
    namespace = runpy.run_path(str(script), run_name="child_api")
    return ChildApi(event=namespace["event"], batches=namespace["batches"])


def plain_form(data: bytes, compression: Compression) -> bytes:
    """The log as plain lines; for zstd decoded independently of the store, every frame whole
    and checksum-verified, so a torn last frame fails."""
    if compression == "none":
        return data
    return b"".join(zstd_frames(data))


def assert_log_holds(root: Path, sid: str, compression: Compression, count: int, api: ChildApi) -> None:
    """The file is exactly the header and events 0..count-1: nothing torn, nothing else."""
    data = log_file(root, sid, compression).read_bytes()
    expected = header_line(sid) + b"".join(encode_event(api.event(seq)) for seq in range(count))
    assert plain_form(data, compression) == expected
    if compression == "none":
        assert data.endswith(b"\n")


def torn_tail(kind: str, compression: Compression, next_line: bytes) -> bytes:
    """What a power cut inside the next append could leave after the last complete record."""
    if kind == "nul padding":
        return b"\0" * 37
    record = next_line
    if compression == "zstd":
        record = zstandard.ZstdCompressor(write_checksum=True).compress(next_line)
        if kind == "torn frame holding a complete line":
            return record[:-4]  # only the checksum is missing: the line is recovered and re-framed
    incomplete = record[: len(record) // 2]  # for zstd, inside the only block: nothing is recovered
    return incomplete + b"\0" * 11 if kind == "incomplete record, then nul padding" else incomplete


TAIL_KINDS = ["none", "incomplete record", "nul padding", "incomplete record, then nul padding"]
ZSTD_TAIL_KINDS = [*TAIL_KINDS, "torn frame holding a complete line"]


@pytest.mark.slow
@pytest.mark.parametrize("compression", FORMS)
def test_sigkill_rounds_lose_no_acknowledged_event(
    compression: Compression, tmp_path: Path, script: Path, api: ChildApi
) -> None:
    rng = random.Random(f"sigkill-{compression}")
    root = tmp_path / "root"
    root.mkdir()
    sid = "killed-many-times"
    count = 0  # events the parent knows are in the log
    rounds = 30
    for round_no in range(rounds):
        child = Child(script, root, sid, compression, "create" if round_no == 0 else "open")
        word, _, first = child.line().partition(" ")
        # The child starts exactly where the parent left off: a torn tail was cut, no seq reused.
        assert (word, int(first)) == ("open", count), f"round {round_no}"
        wanted = rng.choice([0, 1, 1, 2, 3, 5, 8]) if round_no else rng.choice([1, 2, 3])
        acks = acks_in([child.line() for _ in range(wanted)])
        acks += acks_in(child.kill())
        assert acks == sorted(set(acks)) and all(a > count for a in acks), acks
        acked = acks[-1] if acks else count

        store = FileLogStore(str(root), compression=compression)
        handle = store.open_write(sid)  # the flock died with the child
        try:
            count = handle.next_seq
            assert count >= acked, f"round {round_no}: acknowledged up to {acked}, the log holds {count}"
            assert_log_holds(root, sid, compression, count, api)
            assert [encode_event(e) for e in store.read(handle)] == [
                encode_event(api.event(seq)) for seq in range(count)
            ]
            more = api.batches(count, round_no)
            count = store.append(handle, more)
            assert count == more[-1].expected_seq + len(more[-1].events)
        finally:
            store.close(handle)
        assert_log_holds(root, sid, compression, count, api)

        kinds = ZSTD_TAIL_KINDS if compression == "zstd" else TAIL_KINDS
        kind = kinds[round_no % len(kinds)]
        if kind != "none":
            with open(log_file(root, sid, compression), "ab") as f:
                f.write(torn_tail(kind, compression, encode_event(api.event(count))))
            if kind == "torn frame holding a complete line":
                count += 1  # readers return the recovered line; the next writer keeps it
    assert count > rounds


@pytest.mark.slow
@pytest.mark.parametrize("compression", FORMS)
def test_a_session_killed_while_being_published_is_absent_or_whole(
    compression: Compression, tmp_path: Path, script: Path, api: ChildApi
) -> None:
    """Killed right after `create`, anywhere in its first appends: the session is either not
    there (and `create` works again: only a lock or a publish temp file is left) or whole."""
    root = tmp_path / "root"
    root.mkdir()
    for round_no in range(6):
        sid = f"published-{round_no}"
        child = Child(script, root, sid, compression, "create")
        assert child.line() == "open 0"
        acks = acks_in([child.line() for _ in range(round_no % 2)])
        acks += acks_in(child.kill())
        store = FileLogStore(str(root), compression=compression)
        if store.stat(sid) is None:
            assert not acks, f"acknowledged up to {acks[-1]}, but {sid!r} is not published"
            assert [info.id for info in store.list()] == [f"published-{r}" for r in range(round_no)]
            handle = store.create(header(sid))
        else:
            handle = store.open_write(sid)
        try:
            count = handle.next_seq
            assert count >= (acks[-1] if acks else 0)
            if count:
                assert_log_holds(root, sid, compression, count, api)
            count = store.append(handle, api.batches(count, round_no))
        finally:
            store.close(handle)
        assert_log_holds(root, sid, compression, count, api)


@pytest.mark.parametrize("compression", FORMS)
def test_a_second_process_is_refused_while_the_first_holds_the_session(
    compression: Compression, tmp_path: Path, script: Path, api: ChildApi
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    sid = "held"
    store = FileLogStore(str(root), compression=compression)
    handle = store.create(header(sid))
    count = store.append(handle, api.batches(0, 1))
    store.close(handle)

    child = Child(script, root, sid, compression, "hold")
    assert child.line() == f"ready {count}"  # it holds the write handle, and with it the flock
    with pytest.raises(AlreadyOwned):
        store.open_write(sid)
    with pytest.raises(AlreadyOwned):
        store.create(header(sid))
    assert child.kill() == []

    handle = store.open_write(sid)
    try:
        assert handle.next_seq == count
        count = store.append(handle, api.batches(count, 2))
    finally:
        store.close(handle)
    assert_log_holds(root, sid, compression, count, api)
