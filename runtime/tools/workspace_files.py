"""The file side of the workspace tools, synchronous (tools run it in worker threads): read, write
and edit one file, list one folder, walk a tree for `glob` and `grep`. Every path goes through
`Workspace.locate` (workspace_paths.py); every refusal is a `ToolFailure` with a code.

Writes are atomic: a temporary file in the same folder, fsynced, renamed over the target, the
folder fsynced (a crash leaves the old file or the new one, never half of one); an existing
file keeps its permission bits.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator

from .workspace_paths import Location, Workspace, refused

__all__ = [
    "SKIPPED_FOLDERS",
    "edit_text",
    "glob_regex",
    "list_folder",
    "read_text",
    "searchable_text",
    "walk_files",
    "write_text",
]

SKIPPED_FOLDERS = frozenset({".git", ".subagents"})  # never walked by glob and grep
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_BINARY_PROBE = 8192


def _open_file(loc: Location, flags: int, mode: int = 0o666) -> int:
    if not loc.name:
        raise refused(f"{loc.shown} is a folder", "NOT_A_FILE")
    try:
        return os.open(loc.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=loc.dir_fd)
    except FileNotFoundError:
        raise refused(f"{loc.shown}: no such file", "NOT_FOUND") from None
    except IsADirectoryError:
        raise refused(f"{loc.shown} is a folder", "NOT_A_FILE") from None
    except OSError as exc:
        raise refused(f"{loc.shown}: {exc.strerror}", "PATH_ERROR") from None


def _open_folder(loc: Location) -> int:
    if not loc.name:
        return os.dup(loc.dir_fd)
    try:
        return os.open(loc.name, _DIR_FLAGS, dir_fd=loc.dir_fd)
    except FileNotFoundError:
        raise refused(f"{loc.shown}: no such folder", "NOT_FOUND") from None
    except NotADirectoryError:
        raise refused(f"{loc.shown} is not a folder", "NOT_A_FOLDER") from None
    except OSError as exc:
        raise refused(f"{loc.shown}: {exc.strerror}", "PATH_ERROR") from None


def _read_regular(fd: int, shown: str, cap: int) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise refused(f"{shown} is not a regular file", "NOT_A_FILE")
    if st.st_size > cap:
        raise refused(f"{shown} is {st.st_size:,} bytes, over the {cap:,}-byte cap", "FILE_TOO_LARGE")
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(data: bytes, shown: str) -> str:
    if b"\x00" in data[:_BINARY_PROBE]:
        raise refused(f"{shown} looks binary (it holds NUL bytes)", "BINARY_FILE")
    return data.decode("utf-8", errors="replace")


def read_text(ws: Workspace, path: str, *, cap: int) -> tuple[str, str]:
    """The file's text (at most `cap` bytes of file) and its path relative to the root."""
    with ws.locate(path) as loc:
        fd = _open_file(loc, os.O_RDONLY)
        try:
            return _decode(_read_regular(fd, loc.shown, cap), loc.shown), loc.shown
        finally:
            os.close(fd)


def write_text(ws: Workspace, path: str, text: str) -> tuple[int, str, bool]:
    """Write `text` (UTF-8) to the file at `path`, its folders made as needed; (bytes written,
    the path relative to the root, whether it existed)."""
    data = text.encode("utf-8")
    with ws.locate(path, make_parents=True) as loc:
        return len(data), loc.shown, _replace(loc, data)


def edit_text(ws: Workspace, path: str, old: str, new: str, *, replace_all: bool, cap: int) -> tuple[int, str]:
    """Replace `old` by `new` in the file: exactly one match unless `replace_all`; (the number
    replaced, the path relative to the root)."""
    if old == "":
        raise refused("old_string is empty", "EDIT_NO_MATCH")
    if old == new:
        raise refused("old_string and new_string are the same", "EDIT_NO_CHANGE")
    with ws.locate(path) as loc:
        fd = _open_file(loc, os.O_RDONLY)
        try:
            text = _decode(_read_regular(fd, loc.shown, cap), loc.shown)
        finally:
            os.close(fd)
        count = text.count(old)
        if count == 0:
            raise refused(f"old_string was not found in {loc.shown}", "EDIT_NO_MATCH")
        if count > 1 and not replace_all:
            raise refused(
                f"old_string occurs {count} times in {loc.shown}: give more context to make it unique, "
                "or set replace_all",
                "EDIT_AMBIGUOUS",
            )
        _replace(loc, text.replace(old, new).encode("utf-8"))
        return count, loc.shown


def _replace(loc: Location, data: bytes) -> bool:
    """Atomically put `data` at `loc`; whether a file was there."""
    if not loc.name:
        raise refused(f"{loc.shown} is a folder", "NOT_A_FILE")
    mode = 0o666  # a new file: the umask applies, as for any file the person makes
    existed = False
    try:
        st = os.stat(loc.name, dir_fd=loc.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise refused(f"{loc.shown} is not a regular file", "NOT_A_FILE")
        existed, mode = True, stat.S_IMODE(st.st_mode)
    temp = f".{loc.name}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=loc.dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if existed:
                os.fchmod(fd, mode)  # the umask cut the old file's bits: give them back
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, loc.name, src_dir_fd=loc.dir_fd, dst_dir_fd=loc.dir_fd)
    except BaseException:  # no temp file left behind (re-raised)
        try:
            os.unlink(temp, dir_fd=loc.dir_fd)
        except FileNotFoundError:
            pass
        raise
    os.fsync(loc.dir_fd)
    return existed


def list_folder(ws: Workspace, path: str) -> tuple[list[str], str]:
    """The folder's entries, sorted, folders with a trailing `/` and symlinks with ` -> target`."""
    with ws.locate(path) as loc:
        fd = _open_folder(loc)
        try:
            entries = []
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_symlink():
                        entries.append(f"{entry.name} -> {os.readlink(entry.name, dir_fd=fd)}")
                    elif entry.is_dir(follow_symlinks=False):
                        entries.append(entry.name + "/")
                    else:
                        entries.append(entry.name)
            return sorted(entries), loc.shown
        finally:
            os.close(fd)


def walk_files(ws: Workspace, path: str) -> Iterator[tuple[str, str, str, int]]:
    """Every regular file under `path` (or `path` itself when it is a file) in sorted order,
    symlinks not followed and `SKIPPED_FOLDERS` not entered: (its path relative to the root, its
    path relative to `path`, its name, its folder's fd — valid until the next item)."""
    with ws.locate(path) as loc:
        if loc.name:
            try:
                mode = os.stat(loc.name, dir_fd=loc.dir_fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                raise refused(f"{loc.shown}: no such file or folder", "NOT_FOUND") from None
            if stat.S_ISREG(mode):
                yield loc.shown, loc.name, loc.name, loc.dir_fd
                return
        fd = _open_folder(loc)
        try:
            yield from _walk(fd, "" if loc.shown == "." else loc.shown + "/", "")
        finally:
            os.close(fd)


def _walk(fd: int, prefix: str, inner: str) -> Iterator[tuple[str, str, str, int]]:
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            if entry.name in SKIPPED_FOLDERS:
                continue
            try:
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # unreadable or gone: skipped, as find does
            try:
                yield from _walk(sub, f"{prefix}{entry.name}/", f"{inner}{entry.name}/")
            finally:
                os.close(sub)
        elif entry.is_file(follow_symlinks=False):
            yield f"{prefix}{entry.name}", f"{inner}{entry.name}", entry.name, fd


def searchable_text(name: str, dir_fd: int, cap: int) -> str | None:
    """A walked file's text for `grep`, or None when it is gone, over `cap` bytes or binary."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size > cap:
            return None
        data = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)
    if b"\x00" in data[:_BINARY_PROBE]:
        return None
    return data.decode("utf-8", "replace")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob (`*` and `?` within one path component, `**` across any number, `[...]` classes)
    as a regex over paths relative to where the search starts."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = end + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    try:
        return re.compile("".join(out) + r"\Z")
    except re.error as exc:
        raise refused(f"bad glob pattern {pattern!r}: {exc}", "INVALID_PATTERN") from None
