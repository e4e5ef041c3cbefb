"""Tool permissions (SPEC §8): per tool `allow | ask | deny`; `ask` goes to the host's approver.

A `Permissions` policy names a decision per tool (exact names, or globs such as `mcp__*`), with a
default for the rest. `guard_tools` wraps every tool whose decision is not `allow`: a `deny` tool
fails each call with an error result, an `ask` tool asks the host's `Approver` once per call (after
its `tool/call` is durable, so a client has seen the call it is asked about). The approver answers
allow (this call), always (every later call of this tool in this runtime) or deny, with a reason
the model reads. Without an approver `ask` is a denial that says nobody could be asked. Waiting
for an answer is part of the tool call: a cancelled turn stops it like any tool.

A tool may judge a call under another name than its own: one with `permission_names` (every name
it uses) and `permission_name(args, ctx)` (the one of this call). `run_command` with its sandbox on
does: a call asking to leave the box is `run_command_unsandboxed`, `ask` by default, while a
boxed call is `run_command`, `allow` by default (`SANDBOXED_PERMISSIONS`, README "Sandbox").
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ..foundation.errors import ToolFailure
from ..foundation.json_values import JsonValue

if TYPE_CHECKING:
    # Annotations only: `subagents config` shows the default rules without loading the tools.
    from .base import Tool, ToolContext, ToolOutput

__all__ = [
    "DEFAULT_PERMISSIONS",
    "SANDBOXED_PERMISSIONS",
    "Approver",
    "Decision",
    "PermissionAnswer",
    "PermissionRequest",
    "Permissions",
    "Remembered",
    "default_permissions",
    "guard_tools",
]

Decision = Literal["allow", "ask", "deny"]
DECISIONS: tuple[Decision, ...] = ("allow", "ask", "deny")


@attrs.frozen
class Permissions:
    """A decision per tool name or glob (the first exact name wins, then the longest matching
    glob), and `default` for the tools no rule names."""

    rules: Mapping[str, Decision] = attrs.field(factory=dict[str, Decision], converter=dict[str, Decision])
    default: Decision = "allow"

    def __attrs_post_init__(self) -> None:
        for name, decision in [*self.rules.items(), ("default", self.default)]:
            if decision not in DECISIONS:
                raise ValueError(f"permission for {name!r} must be allow, ask or deny, got {decision!r}")

    def decision(self, tool: str) -> Decision:
        if tool in self.rules:
            return self.rules[tool]
        globs = [g for g in self.rules if any(c in g for c in "*?[") and fnmatch.fnmatchcase(tool, g)]
        if globs:
            return self.rules[max(globs, key=len)]
        return self.default

    def with_rules(self, rules: Mapping[str, Decision]) -> Permissions:
        return Permissions({**self.rules, **rules}, self.default)


# Read tools run freely; what writes, runs or reaches another server asks first.
DEFAULT_PERMISSIONS = Permissions(
    {"write_file": "ask", "edit_file": "ask", "run_command": "ask", "mcp__*": "ask"},
    default="allow",
)
# With the sandbox on, a command runs inside the box without asking (so unattended agents can
# build and test); leaving the box asks, and `run` (headless) refuses it.
SANDBOXED_PERMISSIONS = Permissions(
    {
        "write_file": "ask",
        "edit_file": "ask",
        "run_command": "allow",
        "run_command_unsandboxed": "ask",
        "mcp__*": "ask",
    },
    default="allow",
)


def default_permissions(sandboxed: bool) -> Permissions:
    """The default rules: `SANDBOXED_PERMISSIONS` when the sandbox is on, else `DEFAULT_PERMISSIONS`."""
    return SANDBOXED_PERMISSIONS if sandboxed else DEFAULT_PERMISSIONS


@attrs.frozen(kw_only=True)
class PermissionRequest:
    """One call waiting for the host's answer."""

    session_id: str
    call_id: str
    tool: str
    arguments: Mapping[str, JsonValue]
    title: str  # one line: the tool and its arguments, cut

    @classmethod
    def of(cls, tool: str, args: Mapping[str, JsonValue], ctx: ToolContext) -> PermissionRequest:
        shown = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
        if len(shown) > 200:
            shown = shown[:199] + "…"
        return cls(session_id=ctx.session_id, call_id=ctx.call_id, tool=tool, arguments=args, title=f"{tool}({shown})")


@attrs.frozen
class PermissionAnswer:
    outcome: Literal["allow", "always", "deny"]
    reason: str | None = None  # said in the error result of a denial


Approver = Callable[[PermissionRequest], Awaitable[PermissionAnswer]]


@attrs.define
class Remembered:
    """The tools a person allowed `always`, for one runtime (shared by every agent's tools)."""

    tools: set[str] = attrs.field(factory=set)


@attrs.define
class _Guarded:
    """A tool behind its permission; everything else (`prepare` included) is the tool's own."""

    tool: Any
    permissions: Permissions
    approver: Approver | None
    remembered: Remembered

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.tool, name)

    @property
    def name(self) -> str:
        return str(self.tool.name)

    def for_agent_type(self, agent_type: str | None) -> _Guarded:
        """The tool as offered to an agent of `agent_type` (tools/base.py), still guarded."""
        special = getattr(self.tool, "for_agent_type", None)
        chosen = special(agent_type) if special is not None else self.tool
        return self if chosen is self.tool else attrs.evolve(self, tool=chosen)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        judged = _judged_name(self.tool, args, ctx)
        decision = self.permissions.decision(judged)
        if decision == "deny":
            raise ToolFailure(
                f"{judged} is not allowed here (its permission is deny)",
                code="PERMISSION_DENIED",
                name="PermissionDenied",
            )
        if decision == "ask" and judged not in self.remembered.tools:
            if self.approver is None:
                raise ToolFailure(
                    f"{judged} needs permission and there is no one to ask here: denied",
                    code="PERMISSION_DENIED",
                    name="PermissionDenied",
                )
            answer = await self.approver(PermissionRequest.of(judged, args, ctx))
            if answer.outcome == "deny":
                raise ToolFailure(
                    answer.reason or f"permission to run {judged} was denied",
                    code="PERMISSION_DENIED",
                    name="PermissionDenied",
                )
            if answer.outcome == "always":
                self.remembered.tools.add(judged)
        result: ToolOutput = await self.tool.run(args, ctx)
        return result


def guard_tools(
    tools: Iterable[Tool], permissions: Permissions, approver: Approver | None, remembered: Remembered
) -> list[Tool]:
    """`tools`, each one whose decision is not `allow` behind its permission."""
    out: list[Any] = []  # a `_Guarded` is a Tool by delegation
    for tool in tools:
        names: tuple[str, ...] = getattr(tool, "permission_names", (tool.name,))
        free = all(permissions.decision(name) == "allow" for name in names)
        out.append(tool if free else _Guarded(tool, permissions, approver, remembered))
    return out


def _judged_name(tool: Any, args: dict[str, Any], ctx: ToolContext) -> str:
    """The name this call's permission is looked up by: the tool's own unless it says otherwise."""
    choose = getattr(tool, "permission_name", None)
    return str(choose(args, ctx)) if choose is not None else str(tool.name)
