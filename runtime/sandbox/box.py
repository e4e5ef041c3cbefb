"""One runtime's sandbox: its policy, what it hides, and its probe, run once and kept.

`open_runtime(sandbox=SandboxPolicy(...))` makes one `Sandbox` and hands it to `run_command` and
to the stdio MCP servers marked `sandbox = true`. The probe runs on first use (not at start: a
runtime that never runs a command never pays for it) and its answer is kept for the runtime's
life, in this object rather than a module global. `wrap` gives the argv and environment of one
command in the box.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping, Sequence

import trio

from .argv import box_mounts, bwrap_argv, find_program
from .environment import credential_files, scrubbed_env, socket_paths
from .policy import SandboxPolicy
from .probe import FIX, ProbeResult, probe_bwrap

__all__ = ["Sandbox", "SandboxUnavailable"]


class SandboxUnavailable(Exception):
    """The sandbox is on but bubblewrap cannot run here; the message says why and the fix."""


class Sandbox:
    """`policy`, the paths hidden besides the policy's (`hidden`: the runtime's root, the user's
    config folder), and `env`: the environment commands start from (secrets removed) and where
    `bwrap` is looked for (None: this process's, read when a command starts). `by_type`: the
    policy of the agents of an agent type that sets its own (README "Agent types")."""

    def __init__(
        self,
        policy: SandboxPolicy,
        *,
        hidden: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        by_type: Mapping[str, SandboxPolicy] | None = None,
    ) -> None:
        self.policy = policy
        # From the folder the runtime starts in (`--root ./.subagents`), not from the workspace
        # the box reads relative paths from: the store's root may lie outside the workspace.
        self.hidden = tuple(os.path.abspath(path) for path in hidden)
        self.by_type = dict(by_type or {})
        self._env = env
        self._probe: ProbeResult | None = None
        self._probing = trio.Lock()

    @property
    def on(self) -> bool:
        """Whether commands are boxed by default (an agent type may say otherwise)."""
        return self.policy.on

    @property
    def ever_on(self) -> bool:
        """Whether any agent's commands may be boxed (the runtime's, or an agent type's)."""
        return self.policy.on or any(p.on for p in self.by_type.values())

    def policy_for(self, agent_type: str | None) -> SandboxPolicy:
        """The policy of an agent of `agent_type` (None, or a type that sets none: the runtime's)."""
        return self.by_type.get(agent_type, self.policy) if agent_type is not None else self.policy

    def environment(self) -> Mapping[str, str]:
        return self._env if self._env is not None else os.environ

    async def probe(self) -> ProbeResult:
        """Whether bubblewrap works here (probed once; later calls answer from memory)."""
        async with self._probing:
            if self._probe is None:
                env = dict(self.environment())
                self._probe = await trio.to_thread.run_sync(probe_bwrap, env)
            return self._probe

    async def wrap(
        self, command: Sequence[str], *, workspace: str, cwd: str, policy: SandboxPolicy | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """The argv and environment running `command` in the box (of `policy`, default the
        runtime's). Raises `SandboxUnavailable`, and OSError when the program is not found or is
        hidden inside (as starting it unboxed would)."""
        probed = await self.probe()
        if not probed.works or probed.bwrap is None:
            raise SandboxUnavailable(f"the sandbox is on but {probed.reason}: {FIX}")
        bwrap = probed.bwrap
        env = scrubbed_env(self.environment())
        # Without HOME (a service's environment) the secrets are still in the account's home.
        home = env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
        chosen = policy or self.policy
        # The sockets and credential files our environment names are hidden (their variables may be gone).
        hidden = (*self.hidden, *socket_paths(self.environment()), *credential_files(self.environment()))

        def build() -> list[str]:
            mounts = box_mounts(chosen, workspace=workspace, hidden=hidden, home=home)
            find_program(command[0], cwd=cwd, search_path=env.get("PATH"), mounts=mounts)
            return bwrap_argv(bwrap, command, policy=chosen, workspace=workspace, cwd=cwd, hidden=hidden, home=home)

        return await trio.to_thread.run_sync(build), env
