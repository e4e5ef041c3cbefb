"""Which lock files some writer holds now, found without touching the locks.

A reader must never probe a session's lock by taking it, not even `LOCK_SH | LOCK_NB`: a
writer that tries `LOCK_EX | LOCK_NB` at that instant would be refused with a spurious
`AlreadyOwned`. Linux lists every held lock in `/proc/locks` instead, one line each:

    1: FLOCK  ADVISORY  WRITE 5373 fe:00:2148449 0 EOF
    2: -> FLOCK  ADVISORY  WRITE 5391 fe:00:2148449 0 EOF      (a waiter: holds nothing)

where `fe:00` is the device's major:minor in hex and `2148449` the inode in decimal. One read
of that table and one `lstat` per lock file answer for a whole listing. The answer is advice
for display (a session shown as live), never a claim: a writer may take or drop a lock the
moment after. Where the table is missing (not Linux, a restricted `/proc`) nothing is held;
on file systems whose `stat` reports another device than the lock table (btrfs subvolumes,
some overlays) a held lock can go unseen the same way, never the other way round.
"""

from __future__ import annotations

import os
import stat as stat_mod
from collections.abc import Mapping

__all__ = ["PROC_LOCKS", "held_flocks", "held_paths", "parse_flocks"]

PROC_LOCKS = "/proc/locks"

LockKey = tuple[int, int, int]  # (device major, device minor, inode)


def parse_flocks(table: str) -> set[LockKey]:
    """The files `table` (the text of `/proc/locks`) shows an `flock` held on; waiters and
    other lock kinds are skipped, and so is any line that does not parse."""
    held: set[LockKey] = set()
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # `->` marks a waiter; POSIX/OFDLCK/LEASE are not ours
            continue
        try:
            major, minor, inode = fields[5].split(":")
            held.add((int(major, 16), int(minor, 16), int(inode)))
        except ValueError:
            continue
    return held


def held_flocks(path: str = PROC_LOCKS) -> set[LockKey] | None:
    """The held `flock`s of the whole system, or None where the table cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as table:
            return parse_flocks(table.read())
    except OSError:
        return None


def held_paths(paths: Mapping[str, str], *, table: str = PROC_LOCKS) -> set[str]:
    """The keys of `paths` (key -> lock file path) whose file some writer holds an `flock` on
    now, in this process or another. A missing file, a link or anything but a regular file is
    not held; an unreadable table means nothing is."""
    if not paths:
        return set()
    held = held_flocks(table)
    if not held:
        return set()
    out = set()
    for key, path in paths.items():
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat_mod.S_ISREG(st.st_mode) and (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in held:
            out.add(key)
    return out
