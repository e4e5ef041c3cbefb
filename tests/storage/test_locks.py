"""Who holds a session's lock, read from `/proc/locks` without touching the lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from subagents.storage import Batch, FileLogStore, SessionHeader, make_event
from subagents.storage.locks import (
    PROC_LOCKS,
    held_flocks,
    held_paths,
    holder_paths,
    parse_flock_holders,
    parse_flocks,
)

TABLE = """\
1: FLOCK  ADVISORY  WRITE 5373 fe:00:2148449 0 EOF
1: FLOCK  ADVISORY  WRITE 4242 fe:00:31337 0 EOF
1: -> FLOCK  ADVISORY  WRITE 5391 fe:00:77 0 EOF
2: POSIX  ADVISORY  WRITE 812 00:1a:99 0 EOF
3: OFDLCK ADVISORY  READ  -1 00:06:1041 0 EOF
4: FLOCK  ADVISORY  READ 9 103:1f:12 0 EOF
garbage
5: FLOCK  ADVISORY  WRITE 9 zz:00:12 0 EOF
"""


def test_the_lock_table_is_readable_here() -> None:
    """The tests below read the real /proc/locks: on a system without it they fail, never skip
    (the runtime then reports nothing as held, which test_an_unreadable_table_holds_nothing pins)."""
    assert held_flocks() is not None


def test_only_held_flocks_count() -> None:
    # Waiters (`->`), POSIX and OFD locks and unparsable lines are not a held flock.
    assert parse_flocks(TABLE) == {(0xFE, 0, 2148449), (0xFE, 0, 31337), (0x103, 0x1F, 12)}
    assert parse_flocks(TABLE, exclude_pid=4242) == {(0xFE, 0, 2148449), (0x103, 0x1F, 12)}  # our own
    # ... each with its holder's pid (issue 29: who runs a listed session).
    assert parse_flock_holders(TABLE) == {(0xFE, 0, 2148449): 5373, (0xFE, 0, 31337): 4242, (0x103, 0x1F, 12): 9}


def test_an_unreadable_table_holds_nothing(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.write_bytes(b"")
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert held_flocks(str(tmp_path / "no-such-table")) is None
        assert held_paths(str(tmp_path), ["lock"], table=str(tmp_path / "no-such-table")) == set()
    finally:
        os.close(fd)


def test_paths_match_the_table_by_device_and_inode(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "c").symlink_to(tmp_path / "a")
    st_a, st_b = (tmp_path / "a").stat(), (tmp_path / "b").stat()
    major, minor = os.major(st_a.st_dev), os.minor(st_a.st_dev)
    table = tmp_path / "locks"
    table.write_text(
        f"1: FLOCK  ADVISORY  WRITE 1 {major:02x}:{minor:02x}:{st_a.st_ino} 0 EOF\n"
        f"2: FLOCK  ADVISORY  WRITE {os.getpid()} {major:02x}:{minor:02x}:{st_b.st_ino} 0 EOF\n"  # ours
    )
    inodes: dict[str, int] = {}
    paths = ["a", "b", "c", "missing"]
    assert held_paths(str(tmp_path), paths, inodes=inodes, table=str(table)) == {"a"}
    assert inodes == {"a": st_a.st_ino, "b": st_b.st_ino}  # kept: the next call needs no stat
    assert holder_paths(str(tmp_path), paths, inodes=inodes, table=str(table)) == {"a": 1}  # with the pid
    assert held_paths(str(tmp_path), paths, inodes=inodes, table=str(table)) == {"a"}
    inodes["b"] = st_a.st_ino  # a stale inode that happens to be held: a fresh stat decides
    assert held_paths(str(tmp_path), paths, inodes=inodes, table=str(table)) == {"a"}
    assert inodes["b"] == st_b.st_ino
    other_device = tmp_path / "elsewhere"
    other_device.write_text(f"1: FLOCK  ADVISORY  WRITE 1 {major + 1:02x}:{minor:02x}:{st_a.st_ino} 0 EOF\n")
    assert held_paths(str(tmp_path), paths, table=str(other_device)) == set()


def _publish(root: Path, sid: str) -> None:
    store = FileLogStore(str(root))
    handle = store.create(SessionHeader(id=sid, created_at=1))
    store.append(handle, [Batch(0, [make_event(0, "turn/start", 1, {"turn": 1})])])
    store.close(handle)
    store.close_store()


_HOLDER = """
import sys
from subagents.storage import FileLogStore
store = FileLogStore(sys.argv[1])
handle = store.open_write(sys.argv[2])
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_a_lock_held_by_another_process_is_seen_without_taking_it(tmp_path: Path, monkeypatch) -> None:
    assert PROC_LOCKS == "/proc/locks"
    _publish(tmp_path, "busy")
    _publish(tmp_path, "idle")
    store = FileLogStore(str(tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path), "busy"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"

        def no_probe(*_args: object) -> None:
            raise AssertionError("held() must not take a lock to find out")

        mine = store.open_write("idle")  # held by this process: not elsewhere
        with monkeypatch.context() as patched:
            patched.setattr(fcntl, "flock", no_probe)
            for _ in range(2):  # the second time from the inodes it kept
                assert store.held_elsewhere(["busy", "idle", "absent", "bad\x01id"]) == {"busy"}
                assert store.holders(["busy", "idle", "absent"]) == {"busy": f"pid {holder.pid}"}
        store.close(mine)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert store.held_elsewhere(["busy", "idle"]) == set()  # the lock went with the process
    store.close_store()
