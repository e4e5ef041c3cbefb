"""The bubblewrap command line around one command (pure: paths in, argv out; README "Sandbox").

The box: the whole file system read-only (`--ro-bind / /`), a fresh `/dev` and `/proc`, a private
`/tmp`, every namespace unshared (`--unshare-all`: no network unless the policy allows it, a PID
namespace whose processes all die with the command), `--die-with-parent` (killing bwrap kills the
box), `--new-session` (no terminal to push keystrokes into) and `--cap-drop ALL` (run by root,
bwrap would keep every capability inside, enough to unmount what hides a secret). Secrets are
covered: a hidden folder by an empty read-only tmpfs, a hidden file by `/dev/null`. The workspace
and the `writable` folders are bound read-write.

Mounts apply in order and a later one covers an earlier one, so they are sorted by depth: a
folder's mount comes before the mounts of what lies inside it. That keeps a workspace under
`/tmp` or under a hidden folder (the runtime's root, in tests) visible and writable, and a hidden
folder inside the workspace (its `.subagents` root) hidden. On the same path a `writable` bind
wins over hiding; a workspace there is refused (`--root .` would hand commands the store). A
hidden folder is made read-only last, after the mount points inside it exist.

`find_program` looks a command's program up as `execvp` will inside, before the box is made: a
program that is missing, or hidden there (under a hidden folder, or in the outside `/tmp`), is an
`OSError` the caller reports as not started, rather than bwrap's own message and exit code 1.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from typing import Literal

from .policy import HIDDEN_HOME_PATHS, HIDDEN_SOCKET_FOLDERS, PolicyRefused, SandboxPolicy

__all__ = ["bwrap_argv", "box_mounts", "find_program", "hidden_paths"]

_Kind = Literal["tmp", "hide", "reveal", "bind"]
_ORDER: dict[_Kind, int] = {"tmp": 0, "hide": 1, "reveal": 2, "bind": 3}

# /run holds the sockets of local daemons (docker, dbus, an ssh agent): a Unix socket is reached
# through the file system, whatever the network namespace, so it is hidden. With the network
# allowed, the resolver's folder there comes back (`/etc/resolv.conf` may link into it).
_RUN = "/run"
_RESOLVER = "/run/systemd/resolve"


def hidden_paths(policy: SandboxPolicy, *, hidden: Sequence[str], home: str | None, base: str) -> list[str]:
    """Every path a command must not read, absolute: `hidden` (the runtime's own: its root, the
    user's config folder, the sockets its environment names), daemons' socket folders, the usual
    secrets under `home`, the policy's `readable_hidden`."""
    paths = [*hidden, *HIDDEN_SOCKET_FOLDERS, *policy.readable_hidden]
    if home:
        paths += [os.path.join(home, name) for name in HIDDEN_HOME_PATHS]
    return [_absolute(p, home, base) for p in paths]


def bwrap_argv(
    bwrap: str,
    command: Sequence[str],
    *,
    policy: SandboxPolicy,
    workspace: str,
    cwd: str,
    hidden: Sequence[str],
    home: str | None,
    exists: Callable[[str], str | None] = lambda p: _kind_of(p),
) -> list[str]:
    """The argv running `command` (an argv) in the box, in `cwd`, with `workspace` writable.
    `exists(path)` says "dir", "file" or None (missing paths are neither hidden nor bound)."""
    mounts = box_mounts(policy, workspace=workspace, hidden=hidden, home=home)
    argv = [bwrap, "--die-with-parent", "--unshare-all"]
    if policy.network:
        argv.append("--share-net")
    # Run by root, bwrap keeps every capability inside unless told: the command could unmount
    # what hides a secret, or remount `/` writable over the host's disk.
    argv += ["--new-session", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    read_only: list[str] = []
    for path, kind in mounts:
        what = exists(path)
        if kind == "tmp":
            argv += ["--tmpfs", path]
        elif what is None:
            continue
        elif kind == "hide" and what == "dir":
            argv += ["--tmpfs", path]
            read_only.append(path)
        elif kind == "hide":
            argv += ["--ro-bind", "/dev/null", path]
        elif kind == "reveal":
            argv += ["--ro-bind", path, path]
        else:
            argv += ["--bind", path, path]
    for path in read_only:
        argv += ["--remount-ro", path]
    argv += ["--chdir", cwd, "--", *command]
    return argv


def box_mounts(
    policy: SandboxPolicy, *, workspace: str, hidden: Sequence[str], home: str | None
) -> list[tuple[str, _Kind]]:
    """The box's mounts over its read-only `/`, in the order they apply (a later one covers an
    earlier one on the same path or above it). Raises `PolicyRefused` for a `type_writable`
    path at or under a hidden one (or `/tmp`), for a workspace that is a hidden path, and for a
    writable path that goes through a symlink inside the workspace or another writable folder
    (`_bound`)."""
    mounts: list[tuple[str, _Kind]] = [("/tmp", "tmp"), (_RUN, "hide")]
    if policy.network:
        mounts.append((_RESOLVER, "reveal"))
    for path in hidden_paths(policy, hidden=hidden, home=home, base=workspace):
        mounts.append((path, "hide"))
    covered = [path for path, kind in mounts if kind in ("tmp", "hide")]
    real_workspace = _absolute(workspace, home, workspace)
    if any(path == real_workspace for path, kind in mounts if kind == "hide"):  # `--root .`, say
        raise PolicyRefused(
            f"the workspace {real_workspace} is hidden in the sandbox (the store's root, or a secret):"
            " bound writable, its commands would read and rewrite it; choose another workspace"
        )
    folders = [_lexical(p, home, workspace) for p in (workspace, *policy.writable, *policy.type_writable)]
    for path in (workspace, *policy.writable):
        mounts.append((_bound(path, home, workspace, folders), "bind"))
    for written in policy.type_writable:
        path = _bound(written, home, workspace, folders)
        over = next((c for c in covered if path == c or path.startswith(c.rstrip("/") + "/")), None)
        if over is not None:  # an agent type adds writable folders, never uncovers hidden ones
            raise PolicyRefused(f"the agent type's sandbox_writable {written!r} is at or under the hidden {over}")
        if path == "/":  # its bind would cover the box's own /dev and /proc with the host's
            raise PolicyRefused(f"the agent type's sandbox_writable {written!r} is the whole file system")
        mounts.append((path, "bind"))
    # One mount per path and kind: /var/run is /run where it links there.
    mounts = sorted(dict.fromkeys(mounts), key=lambda m: (_depth(m[0]), _ORDER[m[1]]))
    return mounts


def find_program(name: str, *, cwd: str, search_path: str | None, mounts: Sequence[tuple[str, _Kind]]) -> str:
    """Where `execvp(name)` finds the program inside the box (a name with a `/` is taken from
    `cwd`, else each folder of `search_path` in turn; None: the default PATH). Raises OSError
    (ENOENT, or EACCES for a file that is not executable) when it will find none."""
    if "/" in name:
        candidates = [os.path.join(cwd, name)]
    else:
        folders = (search_path if search_path is not None else os.defpath).split(os.pathsep)
        candidates = [os.path.join(cwd, folder or ".", name) for folder in folders]
    hidden_at: str | None = None
    denied = False
    for candidate in candidates:
        if not os.path.isfile(candidate):
            continue
        if not _visible(os.path.realpath(candidate), mounts):
            hidden_at = hidden_at or candidate
        elif os.access(candidate, os.X_OK):
            return candidate
        else:
            denied = True
    if denied:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), name)
    said = os.strerror(errno.ENOENT)
    if hidden_at is not None:
        said += f" ({hidden_at} is hidden in the sandbox)"
    raise OSError(errno.ENOENT, said, name)


def _visible(path: str, mounts: Sequence[tuple[str, _Kind]]) -> bool:
    """Whether `path` (real) shows inside: the last mount over it decides (none: the read-only `/`)."""
    kind: _Kind | None = None
    for mount, what in mounts:
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            kind = what
    return kind not in ("tmp", "hide")


def _absolute(path: str, home: str | None, base: str) -> str:
    # Symlinks resolved: a mount lands on the real folder, and two spellings sort as one.
    return os.path.realpath(_lexical(path, home, base))


def _lexical(path: str, home: str | None, base: str) -> str:
    if home and (path == "~" or path.startswith("~/")):
        path = home + path[1:]
    return os.path.normpath(os.path.join(base, path))


def _bound(written: str, home: str | None, base: str, folders: Sequence[str]) -> str:
    """The real path of the writable `written`. Raises `PolicyRefused` when its part inside
    another folder the box writes (`folders`: the workspace, the writable ones) goes through a
    symlink: a command could have pointed it anywhere (HOME, the store's root, `/`)."""
    lexical = _lexical(written, home, base)
    real = os.path.realpath(lexical)
    for folder in folders:
        if lexical != folder and lexical.startswith(folder.rstrip("/") + "/"):
            if real != os.path.join(os.path.realpath(folder), lexical[len(folder.rstrip("/")) + 1 :]):
                raise PolicyRefused(
                    f"the writable {lexical} goes through a symlink inside the writable {folder}"
                    f" (to {real}): a command may have made it; make it a real folder"
                )
    return real


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def _kind_of(path: str) -> str | None:
    if os.path.isdir(path):
        return "dir"
    return "file" if os.path.lexists(path) else None
