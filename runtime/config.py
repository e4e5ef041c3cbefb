"""Configuration: `subagents.toml` (README "Configuration"; SPEC §8).

Two files, read with `tomllib`: the project's (`./subagents.toml`) and the user's
(`<user config dir>/subagents.toml`, platformdirs: `~/.config/subagents/` on Linux, or
`$SUBAGENTS_CONFIG_DIR`). Precedence: a CLI flag > the project file > the user file > the
default; tables (`permissions`, `budget`, `mcp_servers`) merge entry by entry under the same
rule. Every key is checked here, once, with a message naming the file and the key (a typo is an
error, not a silent default); `Config.sources` says where each value came from, for
`subagents config`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from .foundation.config_files import CONFIG_FILE, config_files, read_config_file, user_config_dir
from .foundation.errors import ConfigInvalid
from .foundation.pricing import Price, PriceTable, parse_price
from .models.defaults import DEFAULT_MODEL
from .sandbox.policy import SandboxPolicy, check_mode, check_paths, check_writable
from .telemetry.settings import check_endpoint
from .tools.mcp_spec import McpServerSpec

__all__ = ["PROJECT_FILE", "Config", "load_config", "user_config_dir", "with_budget_flags"]

PROJECT_FILE = CONFIG_FILE
_DECISIONS = ("allow", "ask", "deny")


@attrs.frozen(kw_only=True)
class Config:
    """The effective configuration and, per dotted key, where its value came from."""

    model: str = DEFAULT_MODEL
    base_url: str | None = None
    stall_timeout: float | None = None
    system_prompt: str | None = None
    max_depth: int = 1
    max_active_subagents: int = 8
    max_steps: int = 64
    # What resuming a session whose last turn a crash left open does (docs/format.md,
    # "Continued turns"): continue that turn, or close it as interrupted.
    on_interrupted_turn: str = "continue"
    compaction_threshold: int | None = None
    workspace: str = "."
    workspace_tools: bool = True
    disabled_tools: tuple[str, ...] = ()
    permissions: Mapping[str, str] = attrs.field(factory=dict)
    default_permission: str | None = None
    budget: Mapping[str, float] = attrs.field(factory=dict)  # max_turns, max_tokens, deadline_seconds
    mcp_servers: Mapping[str, McpServerSpec] = attrs.field(factory=dict)
    prices: PriceTable = attrs.field(factory=PriceTable)  # `[prices]`: per model, per million tokens
    lease_ttl: float = 15.0  # a PostgreSQL store's leases (SPEC §9)
    lease_renew_interval: float | None = None  # None: a third of the ttl
    forget_hosts_after: float = 86400.0  # a serving host deletes the rows of hosts gone this long
    # Seconds a running child may go without a durable event before listings call it `stalled`
    # (issue 29; read-only listings read it with runtime/delegation/listing_stall.py).
    stall_after: float = 300.0
    # [telemetry] (README "Traces (OpenTelemetry)"; telemetry/settings.py adds the OTEL_* variables)
    telemetry_enabled: bool = False
    telemetry_endpoint: str | None = None  # an OTLP/HTTP base URL; None: the default collector's
    telemetry_capture_content: bool = False
    # [sandbox] (README "Sandbox"): bubblewrap around run_command and the servers marked sandbox
    sandbox_mode: str = "on"
    sandbox_network: bool = False
    sandbox_writable: tuple[str, ...] = ()
    sandbox_readable_hidden: tuple[str, ...] = ()
    sources: Mapping[str, str] = attrs.field(factory=dict)
    files: tuple[str, ...] = ()  # the files read, lowest precedence first

    def sandbox_policy(self) -> SandboxPolicy:
        return SandboxPolicy(
            mode=check_mode(self.sandbox_mode),
            network=self.sandbox_network,
            writable=self.sandbox_writable,
            readable_hidden=self.sandbox_readable_hidden,
        )

    def rows(self) -> list[tuple[str, object, str]]:
        """(key, value, source) for every key, in a stable order, for `subagents config`."""
        out: list[tuple[str, object, str]] = []
        for key in _SCALARS:
            out.append((key, getattr(self, _FIELD.get(key, key)), self.sources.get(key, "default")))
        from .tools.permissions import default_permissions

        defaults = default_permissions(self.sandbox_mode == "on")
        for name, decision in sorted({**defaults.rules, **self.permissions}.items()):
            out.append((f"permissions.{name}", decision, self.sources.get(f"permissions.{name}", "default")))
        default = self.default_permission or defaults.default
        out.append(("permissions.default", default, self.sources.get("permissions.default", "default")))
        for key, value in sorted(self.budget.items()):
            out.append((f"budget.{key}", value, self.sources[f"budget.{key}"]))
        for model, price in sorted(self.prices.prices.items()):
            shown_price = f"input {price.input}, output {price.output}, cache_read {price.cache_read}, cache_write {price.cache_write}"
            out.append((f'prices."{model}"', shown_price, self.sources[f"prices.{model}"]))
        for name, server in sorted(self.mcp_servers.items()):
            shown = server.url if server.url is not None else " ".join([server.command or "", *server.args])
            out.append((f"mcp_servers.{name}", shown, self.sources[f"mcp_servers.{name}"]))
        return out


_Table = dict[str, object]  # a TOML document or table, as read
_V = TypeVar("_V")  # what a check makes of a value


# ---- the keys -----------------------------------------------------------------------------------


def _string(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {_shown(value)}")
    return value


def _integer(low: int) -> Callable[[object], int]:
    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"must be an integer >= {low}, got {_shown(value)}")
        return value

    return check


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a number of seconds > 0, got {_shown(value)}")
    return float(value)


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {_shown(value)}")
    return value


def _interrupted_turn_policy(value: object) -> str:
    if value not in ("continue", "close"):
        raise ValueError(f'must be "continue" or "close", got {_shown(value)}')
    return str(value)


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"must be a list of tool names, got {_shown(value)}")
    return tuple(value)


# Top-level key (or `tools.KEY`) → its check; a field of `Config` of the same name unless _FIELD says.
_SCALARS: dict[str, Callable[[object], object]] = {
    "model": _string,
    "base_url": _string,
    "stall_timeout": _seconds,
    "system_prompt": _string,
    "max_depth": _integer(0),
    "max_active_subagents": _integer(1),
    "max_steps": _integer(1),
    "on_interrupted_turn": _interrupted_turn_policy,
    "compaction_threshold": _integer(1),
    "workspace": _string,
    "tools.workspace": _boolean,
    "tools.disabled": _names,
    "store.lease_ttl": _seconds,
    "store.lease_renew_interval": _seconds,
    "store.forget_hosts_after": _seconds,
    "stall_after": _seconds,
    # [telemetry]
    "telemetry.enabled": _boolean,
    "telemetry.endpoint": check_endpoint,
    "telemetry.capture_content": _boolean,
    # [sandbox]
    "sandbox.mode": check_mode,
    "sandbox.network": _boolean,
    "sandbox.writable": check_writable,
    "sandbox.readable_hidden": check_paths,
}
_FIELD = {
    "tools.workspace": "workspace_tools",
    "tools.disabled": "disabled_tools",
    "store.lease_ttl": "lease_ttl",
    "store.lease_renew_interval": "lease_renew_interval",
    "store.forget_hosts_after": "forget_hosts_after",
    # [telemetry]
    "telemetry.enabled": "telemetry_enabled",
    "telemetry.endpoint": "telemetry_endpoint",
    "telemetry.capture_content": "telemetry_capture_content",
    # [sandbox]
    "sandbox.mode": "sandbox_mode",
    "sandbox.network": "sandbox_network",
    "sandbox.writable": "sandbox_writable",
    "sandbox.readable_hidden": "sandbox_readable_hidden",
}


def _cost(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"must be a number >= 0 (the prices' currency), got {_shown(value)}")
    return float(value)


_BUDGET: dict[str, Callable[[object], object]] = {
    "max_turns": _integer(1),
    "max_tokens": _integer(1),
    "deadline_seconds": _seconds,
    "max_cost": _cost,
    "max_descendants": _integer(0),
}
_TABLES = ("tools", "permissions", "budget", "mcp_servers", "store", "telemetry", "prices", "sandbox")


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


# ---- loading ------------------------------------------------------------------------------------


def load_config(
    project_dir: str = ".", *, flags: Mapping[str, object] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """The effective configuration: `flags` (dotted keys, None meaning not given) over the
    project's file over the user's over the defaults. Raises `ConfigInvalid`."""
    layers: list[tuple[str, _Table]] = []
    files = []
    for path in config_files(project_dir, env):
        document = read_config_file(path)
        if document is not None:
            layers.append((path, document))
            files.append(path)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    permissions: dict[str, str] = {}
    budget: dict[str, Any] = {}
    servers: dict[str, McpServerSpec] = {}
    prices: dict[str, Price] = {}
    for path, document in layers:
        where = f"{path}"
        for key, value in _flatten(document, where).items():
            section, _, rest = key.partition(".")
            if section == "permissions":
                decision = _checked(where, key, value, _decision)
                if rest == "default":
                    values["default_permission"] = decision
                else:
                    permissions[rest] = decision
                sources[key] = where
            elif section == "budget":
                if rest not in _BUDGET:
                    raise ConfigInvalid(
                        f"{where}: unknown key {key} (known: {', '.join(f'budget.{k}' for k in _BUDGET)})"
                    )
                budget[rest] = _checked(where, key, value, _BUDGET[rest])
                sources[key] = where
            elif section == "prices":  # `[prices."MODEL"]`: runtime/pricing.py
                prices[rest] = _checked(where, f'prices."{rest}"', value, parse_price)
                sources[key] = where
            elif section == "mcp_servers":
                servers[rest] = _server(where, rest, value, os.path.dirname(path))
                sources[key] = where
            elif key in _SCALARS:
                values[_FIELD.get(key, key)] = _checked(where, key, value, _SCALARS[key])
                sources[key] = where
            else:
                raise ConfigInvalid(f"{where}: unknown key {key}")
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in _SCALARS:
            raise ValueError(f"no flag sets {key}")  # a programming error, not input
        values[_FIELD.get(key, key)] = _checked(f"--{key.replace('_', '-')}", key, value, _SCALARS[key])
        sources[key] = f"flag --{key.replace('_', '-')}"
    return Config(
        **values,
        permissions=permissions,
        budget=budget,
        mcp_servers=servers,
        prices=PriceTable(prices),
        sources=sources,
        files=tuple(files),
    )


_BUDGET_FLAGS = {"max_tokens": "--budget-tokens", "max_cost": "--budget-cost", "max_turns": "--budget-turns"}


def with_budget_flags(config: Config, flags: Mapping[str, str | None]) -> Config:
    """`config` with the `--budget-*` flags given (text, as argparse keeps it) over its
    `[budget]`. Raises `ConfigInvalid` naming the flag."""
    budget: dict[str, Any] = dict(config.budget)
    sources = dict(config.sources)
    for key, text in flags.items():
        if text is None:
            continue
        flag = _BUDGET_FLAGS[key]
        try:
            value: object = float(text) if key == "max_cost" else int(text)
        except ValueError:
            raise ConfigInvalid(f"{flag} must be a number, got {text!r}") from None
        try:
            budget[key] = _BUDGET[key](value)
        except ValueError as exc:
            raise ConfigInvalid(f"{flag} {exc}") from None
        sources[f"budget.{key}"] = f"flag {flag}"
    return attrs.evolve(config, budget=budget, sources=sources)


def _flatten(document: _Table, where: str) -> dict[str, object]:
    """`tools.workspace`, `permissions.NAME`, `budget.KEY`, `mcp_servers.NAME` → value."""
    flat: dict[str, object] = {}
    for key, value in document.items():
        if key in _TABLES:
            if not isinstance(value, dict):
                raise ConfigInvalid(f"{where}: {key} must be a table ([{key}]), got {_shown(value)}")
            for sub, item in value.items():
                flat[f"{key}.{sub}"] = item
        else:
            flat[key] = value
    return flat


def _checked(where: str, key: str, value: object, check: Callable[[object], _V]) -> _V:
    try:
        return check(value)
    except ValueError as exc:
        raise ConfigInvalid(f"{where}: {key} {exc}") from None


def _decision(value: object) -> str:
    if value not in _DECISIONS:
        raise ValueError(f"must be allow, ask or deny, got {_shown(value)}")
    return str(value)


_SERVER_KEYS = frozenset(
    {"command", "args", "env", "cwd", "url", "headers", "startup_timeout", "call_timeout", "sandbox"}
)


def _server(where: str, name: str, value: object, folder: str) -> McpServerSpec:
    """One `[mcp_servers.NAME]` table as the spec the runtime starts; a relative `cwd` is taken
    from the folder of the file that names it."""
    key = f"mcp_servers.{name}"
    if not isinstance(value, dict):
        raise ConfigInvalid(f"{where}: {key} must be a table, got {_shown(value)}")
    unknown = sorted(set(value) - _SERVER_KEYS)
    if unknown:
        raise ConfigInvalid(f"{where}: unknown key {key}.{unknown[0]}")
    if ("command" in value) == ("url" in value):
        raise ConfigInvalid(f"{where}: {key} needs either command (stdio) or url (streamable HTTP)")
    for sub in ("env", "headers"):
        table = value.get(sub, {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise ConfigInvalid(f"{where}: {key}.{sub} must be a table of strings")
    args = value.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigInvalid(f"{where}: {key}.args must be a list of strings")
    fields: dict[str, Any] = {"name": name, "args": tuple(args), "headers": dict(value.get("headers", {}))}
    if value.get("env"):
        fields["env"] = dict(value["env"])
    for sub in ("command", "url", "cwd"):
        if sub in value:
            fields[sub] = _checked(where, f"{key}.{sub}", value[sub], _string)
    if "cwd" in fields:
        fields["cwd"] = os.path.join(folder, fields["cwd"])
    for sub in ("startup_timeout", "call_timeout"):
        if sub in value:
            fields[sub] = _checked(where, f"{key}.{sub}", value[sub], _seconds)
    if "sandbox" in value:
        fields["sandbox"] = _checked(where, f"{key}.sandbox", value["sandbox"], _boolean)
    try:
        return McpServerSpec(**fields)
    except ValueError as exc:
        raise ConfigInvalid(f"{where}: {key}: {exc}") from None
