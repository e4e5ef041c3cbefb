"""Does bubblewrap work here, and why not: one trial run of `bwrap … true`.

Finding `bwrap` on PATH is not enough: a container or a kernel setting may refuse the namespaces
it needs (`bwrap: No permissions to creat[e] new namespace`), so the probe runs the box's own
options around `true` and keeps bwrap's last line of stderr as the reason when it fails. The
caller keeps the answer (one per runtime: runtime/sandbox/box.py); `subagents config` probes once
to show it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

import attrs

__all__ = ["FIX", "ProbeResult", "find_bwrap", "probe_bwrap"]

FIX = 'install bubblewrap (Debian: apt-get install bubblewrap), or set mode = "off" under [sandbox] in subagents.toml'
_PROBE_TIMEOUT = 10.0  # seconds: a trial run takes milliseconds; a hang is a failure too


@attrs.frozen
class ProbeResult:
    """`works`, the `bwrap` found (None: not on PATH), and `reason` when it does not work."""

    works: bool
    bwrap: str | None = None
    reason: str | None = None

    def describe(self) -> str:
        """One line for `subagents config`."""
        if self.works:
            return f"works ({self.bwrap})"
        return f"does not work here: {self.reason}"


def find_bwrap(env: Mapping[str, str]) -> str | None:
    """`bwrap` on `env`'s PATH (None when absent)."""
    return shutil.which("bwrap", path=env.get("PATH", os.defpath))


def probe_bwrap(env: Mapping[str, str]) -> ProbeResult:
    """Run `bwrap --unshare-all … true` once (blocking: call it in a thread from async code)."""
    bwrap = find_bwrap(env)
    if bwrap is None:
        return ProbeResult(False, None, "bwrap (bubblewrap) is not on PATH")
    argv = [bwrap, "--die-with-parent", "--unshare-all", "--new-session", "--cap-drop", "ALL"]
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--", "true"]
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=_PROBE_TIMEOUT, env=dict(env), check=False
        )
    except subprocess.TimeoutExpired:
        return ProbeResult(False, bwrap, f"{bwrap} did not finish a trial run in {_PROBE_TIMEOUT:g}s")
    except OSError as exc:
        return ProbeResult(False, bwrap, f"{bwrap} cannot start: {exc.strerror or exc}")
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        said = lines[-1] if lines else f"exit code {done.returncode}"
        return ProbeResult(False, bwrap, f"{bwrap} cannot create the sandbox here ({said})")
    return ProbeResult(True, bwrap)
