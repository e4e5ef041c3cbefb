"""Paths confined to a workspace root (SPEC §8, "Workspace tools").

A path the model gives is walked from the root one component at a time with `openat`-style
calls (`dir_fd`, `O_NOFOLLOW`): `..` may go back up only as far as the root, an absolute path
must lie under the root, and a symlink met on the way is expanded and walked on the same terms
— one that leads out of the root is refused. What a tool then opens, it opens relative to the
folder the walk ended in, with `O_NOFOLLOW`, so a link swapped in after the walk is not followed
either. Everything here is synchronous (tools call it from worker threads) and raises
`ToolFailure` with a code the model can read; nothing is touched before a path is accepted.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from ..foundation.errors import ToolFailure

__all__ = ["Location", "Workspace", "refused"]

_MAX_LINKS = 40  # symlinks one walk expands at most (the kernel's own limit)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def refused(message: str, code: str = "PATH_OUTSIDE_WORKSPACE") -> ToolFailure:
    return ToolFailure(message, code=code, name="WorkspaceError")


@attrs.frozen
class Location:
    """Where a walk ended: the open folder `dir_fd` (valid inside the `Workspace.locate` block)
    and the last component's `name` in it ("" for the folder itself); `shown` is the path
    relative to the root, for results."""

    dir_fd: int
    name: str
    shown: str


@attrs.frozen
class Workspace:
    """The folder the workspace tools act in."""

    root: str = attrs.field(converter=os.path.realpath)

    def relative(self, path: str) -> str:
        """`path` as the model gave it, made relative to the root; refused if absolute elsewhere."""
        if not isinstance(path, str) or "\x00" in path:
            raise refused(f"not a usable path: {path!r}", "INVALID_PATH")
        if not os.path.isabs(path):
            return path
        normal = os.path.normpath(path)
        if normal == self.root:
            return "."
        if normal.startswith(self.root.rstrip("/") + "/"):
            return normal[len(self.root.rstrip("/")) + 1 :]
        raise refused(f"{path} is outside the workspace {self.root}")

    @contextmanager
    def locate(self, path: str, *, make_parents: bool = False) -> Iterator[Location]:
        """Walk `path`; yield where it ends. The last component need not exist (its folder must,
        unless `make_parents`); when it is a symlink it is expanded like the others."""
        held: list[int] = []
        try:
            yield self._walk(self.relative(path), held, make_parents)
        finally:
            for fd in held:
                os.close(fd)

    def _walk(self, path: str, held: list[int], make_parents: bool) -> Location:
        try:
            root_fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise refused(
                f"the workspace {self.root} cannot be opened: {exc.strerror}", "WORKSPACE_UNAVAILABLE"
            ) from None
        held.append(root_fd)
        stack: list[tuple[str, int]] = []  # the folders walked into below the root
        todo = deque(_parts(path))
        links = 0
        while todo:
            part = todo.popleft()
            here = stack[-1][1] if stack else root_fd
            if part == "..":
                if not stack:
                    raise refused(f"{path} leads out of the workspace (by '..')")
                stack.pop()
                continue
            if not todo:  # the last component: expand a symlink, otherwise stop here
                target = _link_target(part, here)
                if target is None:
                    return Location(here, part, _shown(stack, part))
            else:
                fd, target = _enter(part, here, stack, make_parents)
                if fd is not None:
                    held.append(fd)
                    stack.append((part, fd))
                    continue
                assert target is not None
            links += 1
            if links > _MAX_LINKS:
                raise refused(f"{path}: too many symlinks", "PATH_ERROR")
            if os.path.isabs(target):
                try:
                    inside = self.relative(target)
                except ToolFailure:
                    raise refused(f"{path} leads out of the workspace (a symlink to {target})") from None
                stack.clear()
                todo.extendleft(reversed(_parts(inside)))
            else:
                todo.extendleft(reversed(_parts(target)))
        if not stack:
            return Location(root_fd, "", ".")
        name, _ = stack.pop()
        return Location(stack[-1][1] if stack else root_fd, name, _shown(stack, name))


def _enter(part: str, here: int, stack: list[tuple[str, int]], make_parents: bool) -> tuple[int | None, str | None]:
    """Open the folder `part` in `here` without following a link: (its fd, None), or (None, the
    target) when `part` is a symlink."""
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=here), None
    except FileNotFoundError:
        if not make_parents:
            raise refused(f"{_shown(stack, part)}: no such folder", "NOT_FOUND") from None
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise refused(f"{_shown(stack, part)}: {exc.strerror}", "PATH_ERROR") from None
        target = _link_target(part, here)
        if target is None:
            raise refused(f"{_shown(stack, part)} is not a folder", "NOT_A_FOLDER") from None
        return None, target
    try:
        os.mkdir(part, dir_fd=here)
        return os.open(part, _DIR_FLAGS, dir_fd=here), None
    except OSError as exc:
        raise refused(f"{_shown(stack, part)}: {exc.strerror}", "PATH_ERROR") from None


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _shown(stack: list[tuple[str, int]], name: str) -> str:
    return "/".join([*(n for n, _ in stack), name])


def _link_target(name: str, dir_fd: int) -> str | None:
    """The symlink `name`'s target, or None when it is not a symlink (or does not exist)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise refused(f"{name}: {exc.strerror}", "PATH_ERROR") from None
    if not stat.S_ISLNK(st.st_mode):
        return None
    return os.readlink(name, dir_fd=dir_fd)
