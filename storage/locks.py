"""Which lock files a writer in another process holds now, found without touching the locks.

A reader must never probe a session's lock by taking it, not even `LOCK_SH | LOCK_NB`: a
writer that tries `LOCK_EX | LOCK_NB` at that instant would be refused with a spurious
`AlreadyOwned`. Linux lists every held lock in `/proc/locks` instead, one line each:

    1: FLOCK  ADVISORY  WRITE 5373 fe:00:2148449 0 EOF
    2: -> FLOCK  ADVISORY  WRITE 5391 fe:00:2148449 0 EOF      (a waiter: holds nothing)

with the holder's pid, the device's major:minor in hex and the inode in decimal. One read of
that table answers for a whole listing. Locks of this very process are left out (its live
sessions are known as live already). When no other process holds an `flock` on the root's
device, that is the answer and nothing else is looked at; otherwise each lock file is
`stat`ed (a few µs each; the caller may keep the inodes, since a lock file is never deleted)
and matched by inode, and a match is confirmed by a fresh `stat`.

The answer is advice for display (a session shown as live), never a claim: a writer may take
or drop a lock the moment after. Where the table is missing (not Linux, a restricted `/proc`)
nothing is held; on file systems whose `stat` reports another device than the lock table
(btrfs subvolumes, some overlays) a held lock goes unseen the same way — never the other way
round.
"""

from __future__ import annotations

import os
import stat as stat_mod
from collections.abc import Sequence

__all__ = [
    "PROC_LOCKS",
    "flock_holders",
    "held_flocks",
    "held_paths",
    "holder_paths",
    "parse_flock_holders",
    "parse_flocks",
]

PROC_LOCKS = "/proc/locks"

LockKey = tuple[int, int, int]  # (device major, device minor, inode)


def parse_flock_holders(table: str, *, exclude_pid: int | None = None) -> dict[LockKey, int]:
    """The files `table` (the text of `/proc/locks`) shows an `flock` held on, each with its
    holder's pid, but for those held by `exclude_pid`; waiters, other lock kinds and lines that
    do not parse are skipped."""
    held: dict[LockKey, int] = {}
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # `->` marks a waiter; POSIX/OFDLCK/LEASE are not ours
            continue
        try:
            pid = int(fields[4])
            if exclude_pid is not None and pid == exclude_pid:
                continue
            major, minor, inode = fields[5].split(":")
            held[(int(major, 16), int(minor, 16), int(inode))] = pid
        except ValueError:
            continue  # a line of another shape (a lock kind this table may add): not a held flock
    return held


def parse_flocks(table: str, *, exclude_pid: int | None = None) -> set[LockKey]:
    """The files `table` shows an `flock` held on (`parse_flock_holders` without the pids)."""
    return set(parse_flock_holders(table, exclude_pid=exclude_pid))


def flock_holders(path: str = PROC_LOCKS, *, exclude_pid: int | None = None) -> dict[LockKey, int] | None:
    """The held `flock`s of the whole system (but `exclude_pid`'s) with their holders' pids, or
    None where the table cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as table:
            return parse_flock_holders(table.read(), exclude_pid=exclude_pid)
    except OSError:
        return None  # no /proc/locks (not Linux, or hidden): the caller reports nothing as held


def held_flocks(path: str = PROC_LOCKS, *, exclude_pid: int | None = None) -> set[LockKey] | None:
    """The held `flock`s of the whole system (but `exclude_pid`'s), or None where the table
    cannot be read."""
    found = flock_holders(path, exclude_pid=exclude_pid)
    return None if found is None else set(found)


def held_paths(
    root: str, paths: Sequence[str], *, inodes: dict[str, int] | None = None, table: str = PROC_LOCKS
) -> set[str]:
    """The `paths` (relative to `root`) of regular files another process holds an `flock`
    on now (`holder_paths` without the pids)."""
    return set(holder_paths(root, paths, inodes=inodes, table=table))


def holder_paths(
    root: str, paths: Sequence[str], *, inodes: dict[str, int] | None = None, table: str = PROC_LOCKS
) -> dict[str, int]:
    """The `paths` (relative to `root`) of regular files another process holds an `flock`
    on now, each with the holder's pid. Paths that do not exist, links and other files are not
    held; an unreadable table or root means nothing is. `inodes` (path -> inode, kept by the
    caller between calls) spares a `stat` per path once known: lock files are never deleted."""
    if not paths:
        return {}
    held = flock_holders(table, exclude_pid=os.getpid())
    if not held:
        return {}
    try:
        dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return {}  # an unreadable root: nothing in it can be seen as held
    try:
        device = os.fstat(dfd).st_dev
        on_root = {
            ino: pid
            for (major, minor, ino), pid in held.items()
            if (major, minor) == (os.major(device), os.minor(device))
        }
        if not on_root:
            return {}  # the usual case: no other process holds a lock on this device
        known = inodes if inodes is not None else {}
        out: dict[str, int] = {}
        for path in paths:
            ino = known.get(path)
            if ino is not None and ino not in on_root:
                continue  # the usual case once known: a dict lookup, no stat
            try:
                st = os.stat(path, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                known.pop(path, None)
                continue  # no lock file (never published, or gone): not held
            if st.st_dev != device or not stat_mod.S_ISREG(st.st_mode):
                known.pop(path, None)
                continue
            known[path] = st.st_ino  # a fresh stat: also what confirms a cached match
            if st.st_ino in on_root:
                out[path] = on_root[st.st_ino]
        return out
    finally:
        os.close(dfd)
