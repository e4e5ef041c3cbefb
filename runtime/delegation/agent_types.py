"""Agent types: `agents/<name>.md` files a `subagent` call may pick by name (README "Agent types";
SPEC §8).

A file is front matter between `---` lines (`name`, `description`, `model`, `tools`,
`on_interrupted_turn`: `continue` or `close`, see README "When a process dies"; `sandbox`: `on`
or `off`, `sandbox_network`: `true` or `false`, and the path lists `sandbox_writable` and
`sandbox_readable_hidden`, see README "Sandbox") and a body,
the type's system prompt. Front matter is the simple `key: value` form (a value may be quoted;
`tools` is a YAML flow list `[a, b]` or a comma list; an indented line continues the value above).
Types come from the project's
`.subagents/agents/` and the user's `<config dir>/agents/`; the project's wins on the same name. A
file that cannot be used is reported (name and reason) and left out — a bad file never stops a
host. The chosen type becomes the child's `ChildOptions` (model route, persona, tool filter),
which the descriptor records, so a cold resume needs the file no more.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

import attrs

from ..sandbox.policy import SandboxPolicy, check_mode, check_paths
from .descriptor import ToolFilter
from .options import ChildOptions

__all__ = ["AgentType", "AgentTypeProblem", "agent_type_dirs", "describe_types", "load_agent_types", "parse_agent_type"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_KEYS = frozenset(
    {
        "name",
        "description",
        "model",
        "tools",
        "on_interrupted_turn",
        "sandbox",
        "sandbox_network",
        "sandbox_writable",
        "sandbox_readable_hidden",
    }
)
_MAX_FILE = 256 * 1024


@attrs.frozen(kw_only=True)
class AgentType:
    name: str
    description: str
    prompt: str  # the system prompt (the file's body)
    model: str | None = None  # a model spec (`deepseek:MODEL`, `openai:MODEL`, `anthropic:MODEL`, `scripted:PATH`)
    tools: tuple[str, ...] | None = None  # the tools it may use (None: all)
    on_interrupted_turn: str | None = None  # "continue" | "close" (None: the runtime's)
    # Its agents' commands (README "Sandbox"): "on" | "off" and the network (None: the runtime's).
    # Read from the file when a runtime starts, by the type name in a child's header, not recorded
    # in its descriptor.
    # The paths it adds to the runtime's `writable` (never at or under a hidden path) and
    # `readable_hidden`, as written (`~/` from HOME, relative from the workspace).
    sandbox: str | None = None
    sandbox_network: bool | None = None
    sandbox_writable: tuple[str, ...] = ()
    sandbox_readable_hidden: tuple[str, ...] = ()
    path: str = ""

    def sandbox_policy(self, base: SandboxPolicy) -> SandboxPolicy | None:
        """`base` with this type's changes (None when it makes none). Paths only add: a type
        hides more and writes more than the runtime's box, never hides less."""
        if self.sandbox is None and self.sandbox_network is None:
            if not self.sandbox_writable and not self.sandbox_readable_hidden:
                return None
        mode = check_mode(self.sandbox) if self.sandbox is not None else base.mode
        network = self.sandbox_network if self.sandbox_network is not None else base.network
        return attrs.evolve(
            base,
            mode=mode,
            network=network,
            type_writable=(*base.type_writable, *self.sandbox_writable),
            readable_hidden=(*base.readable_hidden, *self.sandbox_readable_hidden),
        )

    def options(self) -> ChildOptions:
        """The child options this type selects (recorded in the child's descriptor)."""
        provider = model = None
        if self.model is not None:
            provider, _, model = self.model.partition(":")
        return ChildOptions(
            agent_provider=provider,
            agent_model=model,
            persona=self.prompt,
            tool_filter=ToolFilter(allow=list(self.tools)) if self.tools is not None else None,
            on_interrupted_turn=self.on_interrupted_turn,
            agent_type=self.name,
        )


@attrs.frozen
class AgentTypeProblem:
    path: str
    reason: str


def parse_agent_type(text: str, path: str = "") -> AgentType:
    """One type file's text; raises ValueError naming what is wrong."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise ValueError("it must start with a front matter block (a line ---)")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ValueError("its front matter has no closing ---") from None
    fields: dict[str, str] = {}
    last: str | None = None
    for n, line in enumerate(lines[1:end], start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t" and last is not None:  # an indented line continues the value above
            fields[last] = f"{fields[last]} {line.strip()}"
            continue
        key, colon, value = line.partition(":")
        key = key.strip()
        if not colon or key not in _KEYS:
            raise ValueError(f"line {n}: expected one of {', '.join(sorted(_KEYS))} as `key: value`")
        if key in fields:
            raise ValueError(f"line {n}: {key} is given twice")
        fields[key] = _unquote(value.strip())
        last = key
    for key in ("name", "description"):
        if not fields.get(key):
            raise ValueError(f"its front matter needs {key}")
    if not _NAME.match(fields["name"]):
        raise ValueError(f"name {fields['name']!r} must be letters, digits, _ . - (at most 64)")
    model = fields.get("model") or None
    if model is not None and ":" not in model:
        raise ValueError(
            f"model {model!r} must look like deepseek:MODEL, openai:MODEL, anthropic:MODEL or scripted:PATH"
        )
    policy = fields.get("on_interrupted_turn") or None
    if policy is not None and policy not in ("continue", "close"):
        raise ValueError(f"on_interrupted_turn {policy!r} must be continue or close")
    sandbox = fields.get("sandbox") or None
    if sandbox is not None and sandbox not in ("on", "off"):
        raise ValueError(f"sandbox {sandbox!r} must be on or off")
    network = fields.get("sandbox_network") or None
    if network is not None and network not in ("true", "false"):
        raise ValueError(f"sandbox_network {network!r} must be true or false")
    paths = {key: _paths(key, fields[key]) for key in ("sandbox_writable", "sandbox_readable_hidden") if key in fields}
    prompt = "\n".join(lines[end + 1 :]).strip()
    if not prompt:
        raise ValueError("its body (the system prompt) is empty")
    return AgentType(
        name=fields["name"],
        description=" ".join(fields["description"].split()),
        prompt=prompt,
        model=model,
        tools=_tools(fields["tools"]) if "tools" in fields else None,
        on_interrupted_turn=policy,
        sandbox=sandbox,
        sandbox_network=None if network is None else network == "true",
        sandbox_writable=paths.get("sandbox_writable", ()),
        sandbox_readable_hidden=paths.get("sandbox_readable_hidden", ()),
        path=path,
    )


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _tools(value: str) -> tuple[str, ...]:
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    names = tuple(_unquote(v.strip()) for v in value.split(",") if v.strip())
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9_.*-]+", name):
            raise ValueError(f"tools: {name!r} is not a tool name")
    return names


def _paths(key: str, value: str) -> tuple[str, ...]:
    """A path list (`[a, b]` or `a, b`; an item may be quoted), checked as `[sandbox]`'s are."""
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    paths = [_unquote(v.strip()) for v in value.split(",") if v.strip()]
    try:
        return check_paths(paths)
    except ValueError as exc:
        raise ValueError(f"{key} {exc}") from None


def agent_type_dirs(project_dir: str, user_config_dir: str) -> list[str]:
    """Where types are looked for, the winning folder last."""
    return [os.path.join(user_config_dir, "agents"), os.path.join(project_dir, ".subagents", "agents")]


def load_agent_types(dirs: Iterable[str]) -> tuple[dict[str, AgentType], list[AgentTypeProblem]]:
    """Every usable type in `dirs` (a later folder's type replaces an earlier one of the same
    name), and the files left out with why."""
    types: dict[str, AgentType] = {}
    problems: list[AgentTypeProblem] = []
    for folder in dirs:
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".md"))
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(AgentTypeProblem(folder, f"cannot be listed: {exc.strerror}"))
            continue
        for file_name in names:
            path = os.path.join(folder, file_name)
            try:
                with open(path, "rb") as f:
                    data = f.read(_MAX_FILE + 1)
                if len(data) > _MAX_FILE:
                    raise ValueError(f"it is over {_MAX_FILE // 1024} KiB")
                kind = parse_agent_type(data.decode("utf-8"), path)
                if kind.name != file_name[:-3]:
                    raise ValueError(f"its name {kind.name!r} differs from the file name")
            except UnicodeDecodeError:
                problems.append(AgentTypeProblem(path, "not UTF-8 text"))
                continue
            except (OSError, ValueError) as exc:
                problems.append(AgentTypeProblem(path, getattr(exc, "strerror", None) or str(exc)))
                continue
            types[kind.name] = kind
    return types, problems


def describe_types(types: Mapping[str, AgentType]) -> str:
    """The `agent_type` parameter's description: every type with its description."""
    listed = "; ".join(f"{t.name}: {t.description}" for t in sorted(types.values(), key=lambda t: t.name))
    return f"The kind of subagent to start (optional; default: a general agent like you). Available: {listed}."
