"""What a CLI host (`run`, `chat`, `acp`) opens its runtime with, from the configuration
(config.py) and the agent types (agent_types.py): the model, limits, the workspace tools and
their permissions, the types the `subagent` tool offers, and the factory for a child whose type
names another model. Each host adds its own approver (chat: the person; acp: the client; run:
nobody, so `ask` is a denial that says so).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs

from ..agent.compaction import CompactionPolicy
from ..agent.loop import AgentConfig
from ..config import PROJECT_FILE, Config, user_config_dir
from ..delegation.agent_types import AgentType, AgentTypeProblem, agent_type_dirs, load_agent_types
from ..delegation.options import ChildOptions
from ..foundation.budgets import Budget
from ..foundation.errors import ConfigInvalid, ModelSpecError
from ..models.base import AnyModel
from ..models.specs import build_model, parse_model_spec
from ..sandbox.policy import SandboxPolicy
from ..telemetry.settings import TelemetrySettings, require_extra, resolve_telemetry
from ..testing.scripted_model import DEFAULT_STALL_TIMEOUT
from ..tools.permissions import Decision, PermissionAnswer, PermissionRequest, Permissions, default_permissions

if TYPE_CHECKING:
    from ..app import Runtime

__all__ = ["HostSetup", "headless_approver", "host_setup", "mcp_failures"]


def mcp_failures(runtime: Runtime) -> list[str]:
    """A line per configured MCP server that did not start (its tools are not offered): every
    host says so where the person looks (chat's view, `run`'s stderr)."""
    if runtime.mcp is None:
        return []
    return [
        f"MCP server {status.name!r} is unavailable: {status.error}"
        for status in runtime.mcp.status()
        if status.state != "ready"
    ]


async def headless_approver(request: PermissionRequest) -> PermissionAnswer:
    """`run`'s answer to `ask`: nobody can be asked, and the result says how to allow it."""
    return PermissionAnswer(
        "deny",
        f"{request.tool} needs permission and `subagents run` cannot ask (it is headless): denied. "
        f'To let it run unattended, set `{request.tool} = "allow"` under [permissions] in subagents.toml.',
    )


@attrs.frozen(kw_only=True)
class HostSetup:
    config: Config
    agent_types: Mapping[str, AgentType]
    problems: tuple[AgentTypeProblem, ...]  # type files left out (the host warns once)
    workspace: str | None  # the workspace tools' root, None when they are off
    permissions: Permissions
    env: Mapping[str, str]
    model: AnyModel  # the root's
    telemetry: TelemetrySettings | None = None  # tracing: [telemetry] and the OTEL_* variables
    sandbox: SandboxPolicy | None = None  # [sandbox], the user's config folder hidden too

    def model_factory(self, spec: str, base_url: str | None) -> AnyModel:
        """The model a resumed subagent's log recorded, with this host's keys (`ModelSpecError`
        when it has none for that provider); without a recorded base URL, the one this host's
        configuration gives a model of the same provider."""
        if base_url is None and spec.partition(":")[0] == self.config.model.partition(":")[0]:
            base_url = self.config.base_url
        return _build(self.config, spec, base_url, self.env)

    def child_model(self, options: ChildOptions) -> AnyModel:
        """The model of a child whose type names one: the root's base URL goes only to a model
        of the same provider."""
        spec = f"{options.agent_provider}:{options.agent_model or ''}"
        same = spec.partition(":")[0] == self.config.model.partition(":")[0]
        return _build(self.config, spec, self.config.base_url if same else None, self.env)

    def runtime_options(self) -> dict[str, Any]:
        """Keyword arguments for `open_runtime` (without the model and the approver)."""
        config = self.config
        compaction = CompactionPolicy(max_chars=config.compaction_threshold) if config.compaction_threshold else None
        return {
            "max_depth": config.max_depth,
            "max_active_subagents": config.max_active_subagents,
            "agent_config": AgentConfig(
                system_prompt=config.system_prompt, max_steps=config.max_steps, compaction=compaction
            ),
            "workspace": self.workspace,
            "permissions": self.permissions,
            "agent_types": self.agent_types,
            "child_model": self.child_model,
            "model_factory": self.model_factory,
            "disabled_tools": config.disabled_tools,
            "budget": _budget(config.budget),
            "prices": config.prices,
            "mcp_servers": list(self.config.mcp_servers.values()),
            "store_options": {"lease_ttl": config.lease_ttl, "lease_renew_interval": config.lease_renew_interval},
            "on_interrupted_turn": config.on_interrupted_turn,
            "stall_after": config.stall_after,
            "telemetry": self.telemetry,
            "sandbox": self.sandbox,
        }


def host_setup(
    flags: Mapping[str, Any],
    *,
    project_dir: str = ".",
    env: Mapping[str, str] | None = None,
    budget_flags: Mapping[str, str | None] | None = None,
) -> HostSetup:
    """Load the configuration (flags on top; `budget_flags`, `--budget-*` as given, over
    `[budget]`) and the agent types. Raises `ConfigInvalid` (a usage error) for a bad file, flag
    or model spec."""
    from ..config import load_config, with_budget_flags

    env = os.environ if env is None else env
    config = with_budget_flags(load_config(project_dir, flags=flags, env=env), budget_flags or {})
    type_dirs = agent_type_dirs(project_dir, user_config_dir(env))
    types, problems = load_agent_types(type_dirs)
    workspace = None
    if config.workspace_tools:
        workspace = os.path.abspath(os.path.join(project_dir, config.workspace))
        if not os.path.isdir(workspace):
            raise ConfigInvalid(
                f"workspace {config.workspace!r} is not a folder ({config.sources.get('workspace', 'default')})"
            )
    # The decisions were checked when the file was read.
    policy = config.sandbox_policy()
    # Commands never see our configuration: the user's, and the project's (in the workspace,
    # where a command that rewrote it, or an agent type, would leave the box at the next start).
    own = (user_config_dir(env), os.path.join(project_dir, PROJECT_FILE), *type_dirs)
    policy = attrs.evolve(policy, readable_hidden=(*policy.readable_hidden, *map(os.path.abspath, own)))
    permissions = default_permissions(policy.on).with_rules(cast("Mapping[str, Decision]", config.permissions))
    if config.default_permission is not None:
        permissions = Permissions(permissions.rules, cast("Decision", config.default_permission))
    try:
        # A bad spec (or a missing key) is refused before anything opens.
        model = _build(config, config.model, config.base_url, env)
    except ModelSpecError as exc:
        raise ConfigInvalid(str(exc)) from None
    telemetry = resolve_telemetry(
        enabled=config.telemetry_enabled,
        endpoint=config.telemetry_endpoint,
        capture_content=config.telemetry_capture_content,
        env=env,
    )
    if telemetry is not None:
        require_extra(telemetry)
    return HostSetup(
        telemetry=telemetry,
        sandbox=policy,
        config=config,
        agent_types=types,
        problems=tuple(problems),
        workspace=workspace,
        permissions=permissions,
        env=env,
        model=model,
    )


def _budget(table: Mapping[str, float]) -> Budget | None:
    """`[budget]` as the root's `Budget` (none when the table is empty)."""
    if not table:
        return None
    turns, tokens, seconds = table.get("max_turns"), table.get("max_tokens"), table.get("deadline_seconds")
    descendants = table.get("max_descendants")
    return Budget(
        max_turns=None if turns is None else int(turns),
        max_tokens=None if tokens is None else int(tokens),
        seconds=seconds,
        max_cost=table.get("max_cost"),
        max_descendants=None if descendants is None else int(descendants),
    )


def _build(config: Config, spec: str, base_url: str | None, env: Mapping[str, str]) -> AnyModel:
    stall = config.stall_timeout if config.stall_timeout is not None else DEFAULT_STALL_TIMEOUT
    return build_model(parse_model_spec(spec, base_url=base_url, env=env), stall_timeout=stall)
