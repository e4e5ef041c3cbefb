"""The sandbox's pure parts (issue 32; README "Sandbox"): the bwrap argv's mounts in depth order,
the scrubbed environment, `[sandbox]` in `subagents.toml`, and the permission a call is judged
by (a boxed `run_command` is `allow`, leaving the box is `ask`, and `run` refuses it), an agent
type's box and what `run_command` tells each agent of its own (no command runs here)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from mcp_runs import Offering, call
from subagents.actors import Abort
from subagents.runtime import Model, ModelRequest, SandboxPolicy, ScenarioClock, SessionBinding, open_runtime
from subagents.runtime.config import load_config
from subagents.runtime.delegation.agent_types import parse_agent_type
from subagents.runtime.foundation.errors import ConfigInvalid
from subagents.runtime.hosts.setup import headless_approver
from subagents.runtime.sandbox.argv import bwrap_argv
from subagents.runtime.sandbox.box import Sandbox
from subagents.runtime.sandbox.environment import scrubbed_env, socket_paths
from subagents.runtime.sandbox.policy import PolicyRefused
from subagents.runtime.tools.base import ToolContext, ToolSet
from subagents.runtime.tools.permissions import (
    DEFAULT_PERMISSIONS,
    PermissionAnswer,
    PermissionRequest,
    Remembered,
    default_permissions,
    guard_tools,
)
from subagents.runtime.tools.workspace_tools import workspace_tools

DIRS = {"/", "/tmp", "/run", "/srv", "/srv/ws", "/srv/ws/.subagents", "/home/u", "/home/u/.ssh", "/data/root"}
FILES = {"/home/u/.netrc"}


def exists(path: str) -> str | None:
    return "dir" if path in DIRS else "file" if path in FILES else None


def mounts(argv: list[str]) -> list[tuple[str, ...]]:
    """The mount options of an argv after its fixed head, as (option, arguments…)."""
    start = argv.index("/proc") + 1
    out: list[tuple[str, ...]] = []
    i = start
    while argv[i] != "--chdir":
        width = {"--tmpfs": 1, "--remount-ro": 1, "--bind": 2, "--ro-bind": 2}[argv[i]]
        out.append(tuple(argv[i : i + 1 + width]))
        i += 1 + width
    return out


def argv_for(workspace: str, hidden: list[str], policy: SandboxPolicy | None = None) -> list[str]:
    return bwrap_argv(
        "/usr/bin/bwrap",
        ["make", "test"],
        policy=policy or SandboxPolicy(),
        workspace=workspace,
        cwd=workspace,
        hidden=hidden,
        home="/home/u",
        exists=exists,
    )


def test_the_head_and_the_tail_of_the_argv() -> None:
    argv = argv_for("/srv/ws", [])
    assert argv[:14] == [
        "/usr/bin/bwrap",
        "--die-with-parent",
        "--unshare-all",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
    ]
    assert argv[-5:] == ["--chdir", "/srv/ws", "--", "make", "test"]
    assert "--share-net" not in argv
    assert argv_for("/srv/ws", [], SandboxPolicy(network=True))[:4] == [
        "/usr/bin/bwrap",
        "--die-with-parent",
        "--unshare-all",
        "--share-net",
    ]


# (workspace, hidden) -> the mounts, in order: a folder's before what lies inside it.
MOUNT_TABLE: list[tuple[str, list[str], list[tuple[str, ...]]]] = [
    # the usual: the store's root elsewhere, secrets in HOME (a folder: tmpfs; a file: /dev/null)
    (
        "/srv/ws",
        ["/data/root"],
        [
            ("--tmpfs", "/tmp"),
            ("--tmpfs", "/run"),
            ("--tmpfs", "/data/root"),
            ("--bind", "/srv/ws", "/srv/ws"),
            ("--tmpfs", "/home/u/.ssh"),
            ("--ro-bind", "/dev/null", "/home/u/.netrc"),
            ("--remount-ro", "/run"),
            ("--remount-ro", "/data/root"),
            ("--remount-ro", "/home/u/.ssh"),
        ],
    ),
    # the store's root inside the workspace: bound first, then hidden over
    (
        "/srv/ws",
        ["/srv/ws/.subagents"],
        [
            ("--tmpfs", "/tmp"),
            ("--tmpfs", "/run"),
            ("--bind", "/srv/ws", "/srv/ws"),
            ("--tmpfs", "/srv/ws/.subagents"),
            ("--tmpfs", "/home/u/.ssh"),
            ("--ro-bind", "/dev/null", "/home/u/.netrc"),
            ("--remount-ro", "/run"),
            ("--remount-ro", "/srv/ws/.subagents"),
            ("--remount-ro", "/home/u/.ssh"),
        ],
    ),
    # the workspace inside a hidden folder (tests: under the root): hidden first, then bound
    (
        "/srv/ws",
        ["/srv"],
        [
            ("--tmpfs", "/tmp"),
            ("--tmpfs", "/run"),
            ("--tmpfs", "/srv"),
            ("--bind", "/srv/ws", "/srv/ws"),
            ("--tmpfs", "/home/u/.ssh"),
            ("--ro-bind", "/dev/null", "/home/u/.netrc"),
            ("--remount-ro", "/run"),
            ("--remount-ro", "/srv"),
            ("--remount-ro", "/home/u/.ssh"),
        ],
    ),
    # the workspace under /tmp: the private /tmp first, then the workspace
    (
        "/tmp",
        [],
        [
            ("--tmpfs", "/tmp"),
            ("--tmpfs", "/run"),
            ("--bind", "/tmp", "/tmp"),
            ("--tmpfs", "/home/u/.ssh"),
            ("--ro-bind", "/dev/null", "/home/u/.netrc"),
            ("--remount-ro", "/run"),
            ("--remount-ro", "/home/u/.ssh"),
        ],
    ),
]


@pytest.mark.parametrize(("workspace", "hidden", "expected"), MOUNT_TABLE)
def test_mounts_go_in_depth_order(workspace: str, hidden: list[str], expected: list[tuple[str, ...]]) -> None:
    assert mounts(argv_for(workspace, hidden)) == expected


def test_the_same_path_writable_and_hidden_is_writable() -> None:
    got = mounts(argv_for("/srv/ws", ["/data/root"], SandboxPolicy(writable=["/data/root"])))
    assert got.index(("--tmpfs", "/data/root")) < got.index(("--bind", "/data/root", "/data/root"))


def test_a_workspace_at_a_hidden_path_is_refused() -> None:
    # Not written by a person as `writable` is: `--root .` would hand commands the store.
    with pytest.raises(PolicyRefused, match="the workspace /srv/ws is hidden in the sandbox"):
        argv_for("/srv/ws", ["/srv/ws"])


def test_policy_paths_home_relative_and_missing() -> None:
    policy = SandboxPolicy(writable=["~/.cache", "out", "/nowhere"], readable_hidden=["~"])
    DIRS.update({"/home/u/.cache", "/srv/ws/out"})
    try:
        got = mounts(argv_for("/srv/ws", [], policy))
    finally:
        DIRS.difference_update({"/home/u/.cache", "/srv/ws/out"})
    assert ("--bind", "/home/u/.cache", "/home/u/.cache") in got
    assert ("--bind", "/srv/ws/out", "/srv/ws/out") in got  # relative: from the workspace
    assert ("--tmpfs", "/home/u") in got
    assert not any("/nowhere" in m for m in got)  # a missing path is neither bound nor hidden


def test_with_the_network_the_resolver_folder_comes_back() -> None:
    DIRS.add("/run/systemd/resolve")
    try:
        got = mounts(argv_for("/srv/ws", [], SandboxPolicy(network=True)))
    finally:
        DIRS.discard("/run/systemd/resolve")
    assert got.index(("--tmpfs", "/run")) < got.index(("--ro-bind", "/run/systemd/resolve", "/run/systemd/resolve"))


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("PATH", True),
        ("HOME", True),
        ("LANG", True),
        ("VIRTUAL_ENV", True),
        ("CC", True),
        ("PYTHONPATH", True),
        ("OPENAI_API_KEY", False),
        ("ANTHROPIC_API_KEY", False),
        ("DEEPSEEK_API_KEY", False),
        ("GEMINI_APIKEY", False),
        ("GITHUB_TOKEN", False),
        ("AWS_ACCESS_KEY_ID", False),
        ("AWS_SECRET_ACCESS_KEY", False),
        ("MY_CLIENT_SECRET", False),
        ("PGPASSWORD", False),
        ("DATABASE_URL", False),
        ("SUBAGENTS_STORE", False),
        ("SSH_AUTH_SOCK", False),
        ("SIGNING_KEY", False),
    ],
)
def test_the_environment_keeps_what_builds_need_and_no_secrets(name: str, kept: bool) -> None:
    assert (name in scrubbed_env({name: "v"})) is kept


# ---- [sandbox] in subagents.toml ------------------------------------------------------------------


def load(tmp_path: Path, text: str) -> Any:
    (tmp_path / "subagents.toml").write_text(text)
    return load_config(str(tmp_path), env={"SUBAGENTS_CONFIG_DIR": str(tmp_path / "none")})


def test_sandbox_keys_and_their_defaults(tmp_path: Path) -> None:
    default = load(tmp_path, "")
    assert default.sandbox_policy() == SandboxPolicy(mode="on", network=False)
    rows = {key: (value, source) for key, value, source in default.rows()}
    assert rows["sandbox.mode"] == ("on", "default")
    assert rows["permissions.run_command"] == ("allow", "default")
    assert rows["permissions.run_command_unsandboxed"] == ("ask", "default")
    config = load(
        tmp_path,
        '[sandbox]\nmode = "off"\nnetwork = true\nwritable = ["~/.cache"]\nreadable_hidden = ["/srv/keys"]\n'
        "[mcp_servers.fs]\ncommand = 'fs-mcp'\nsandbox = true\n",
    )
    assert config.sandbox_policy() == SandboxPolicy(
        mode="off", network=True, writable=["~/.cache"], readable_hidden=["/srv/keys"]
    )
    assert config.mcp_servers["fs"].sandbox is True
    rows = {key: (value, source) for key, value, source in config.rows()}
    assert rows["sandbox.mode"] == ("off", str(tmp_path / "subagents.toml"))
    assert rows["permissions.run_command"] == ("ask", "default")  # unconfined: ask, as before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[sandbox]\nmode = "maybe"\n', 'sandbox.mode must be "on" or "off", got \'maybe\''),
        ('[sandbox]\nnetwork = "yes"\n', "sandbox.network must be true or false"),
        ('[sandbox]\nwritable = "/tmp"\n', "sandbox.writable must be a list of paths"),
        ('[sandbox]\nwritable = ["/srv", "/"]\n', "sandbox.writable may not hold '/': the root writable is no box"),
        ('[sandbox]\nwritable = ["/./"]\n', "sandbox.writable may not hold '/./'"),
        ("[sandbox]\nreadable_hidden = [1]\n", "sandbox.readable_hidden must be a list of paths"),
        ("[sandbox]\nshell = true\n", "unknown key sandbox.shell"),
        ('sandbox = "on"\n', "sandbox must be a table ([sandbox])"),
        ("[mcp_servers.w]\nurl = 'http://x/mcp'\nsandbox = true\n", "sandbox must be true or false, and belongs"),
        ("[mcp_servers.w]\ncommand = 'x'\nsandbox = 'yes'\n", "mcp_servers.w.sandbox must be true or false"),
    ],
)
def test_bad_sandbox_keys_are_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load(tmp_path, text)
    assert message in str(caught.value)


# ---- the permission of a call ---------------------------------------------------------------------


def ctx() -> ToolContext:
    return ToolContext(session_id="s-1", call_id="call-1", turn=1, step=1, abort=Abort())


class Asked:
    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.requests: list[PermissionRequest] = []

    async def __call__(self, request: PermissionRequest) -> PermissionAnswer:
        self.requests.append(request)
        return PermissionAnswer("allow" if self.answer == "allow" else "deny", "no")


def boxed_tools(tmp_path: Path, approver: Any, mode: str = "on") -> ToolSet:
    # A box that cannot work (no bwrap on its PATH): a boxed call's result says so, which tells
    # the boxed calls from the ones that ran outside.
    sandbox = Sandbox(SandboxPolicy(mode="on" if mode == "on" else "off"), env={"PATH": str(tmp_path / "no-bin")})
    tools = workspace_tools(str(tmp_path), sandbox=sandbox)
    policy = default_permissions(sandbox.on)
    return ToolSet(guard_tools(tools, policy, approver, Remembered()))


async def test_a_boxed_command_is_allowed_and_leaving_the_box_asks(tmp_path: Path) -> None:
    asked = Asked("allow")
    tools = boxed_tools(tmp_path, asked)
    boxed = await tools.execute("run_command", json.dumps({"command": "true"}), ctx())
    assert boxed.error == {"name": "ToolFailure", "code": "SANDBOX_UNAVAILABLE"} and asked.requests == []
    args = {"command": "echo out > outside.txt", "unsandboxed": True, "reason": "needs the docker socket"}
    outside = await tools.execute("run_command", json.dumps(args), ctx())
    assert [r.tool for r in asked.requests] == ["run_command_unsandboxed"]
    assert asked.requests[0].arguments["reason"] == "needs the docker socket"
    assert outside.content[0]["text"] == "exit code: 0 (ran outside the sandbox)"
    assert (tmp_path / "outside.txt").read_text() == "out\n"


async def test_leaving_the_box_needs_a_reason(tmp_path: Path) -> None:
    tools = boxed_tools(tmp_path, Asked("allow"))
    outcome = await tools.execute("run_command", json.dumps({"command": "true", "unsandboxed": True}), ctx())
    assert outcome.error == {"name": "WorkspaceError", "code": "REASON_MISSING"}


async def test_run_refuses_leaving_the_box_headless(tmp_path: Path) -> None:
    tools = boxed_tools(tmp_path, headless_approver)
    args = {"command": "touch ran", "unsandboxed": True, "reason": "because"}
    outcome = await tools.execute("run_command", json.dumps(args), ctx())
    assert outcome.error == {"name": "PermissionDenied", "code": "PERMISSION_DENIED"}
    assert "run_command_unsandboxed needs permission and `subagents run` cannot ask" in outcome.content[0]["text"]
    assert not (tmp_path / "ran").exists()


async def test_with_the_sandbox_off_run_command_asks_as_before(tmp_path: Path) -> None:
    asked = Asked("deny")
    tools = boxed_tools(tmp_path, asked, mode="off")
    outcome = await tools.execute("run_command", json.dumps({"command": "touch ran"}), ctx())
    assert outcome.error == {"name": "PermissionDenied", "code": "PERMISSION_DENIED"}
    assert [r.tool for r in asked.requests] == ["run_command"]
    assert default_permissions(False) is DEFAULT_PERMISSIONS
    assert not os.path.exists(tmp_path / "ran")


def test_the_sockets_an_environment_names() -> None:
    env = {
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
        "DOCKER_HOST": "unix:///home/u/.rd/docker.sock",
        "CONTAINER_HOST": "ssh://core@host/run/podman.sock",  # not a path: nothing here to hide
        "GPG_AGENT_INFO": "/home/u/.gnupg/S.gpg-agent:0:1",
        "DBUS_SESSION_BUS_ADDRESS": "unix:abstract=/tmp/dbus-x,guid=1;unix:path=/home/u/bus,guid=2",
    }
    assert socket_paths(env) == [
        "/run/user/1000",
        "/tmp/ssh-x/agent.1",
        "/home/u/.rd/docker.sock",
        "/home/u/.gnupg/S.gpg-agent",
        "/home/u/bus",  # an abstract address has no path
    ]
    assert socket_paths({}) == []


# ---- per agent type -------------------------------------------------------------------------------


def test_an_agent_type_may_set_its_sandbox() -> None:
    text = "---\nname: wild\ndescription: d\nsandbox: off\nsandbox_network: true\n---\nGo."
    kind = parse_agent_type(text)
    assert (kind.sandbox, kind.sandbox_network) == ("off", True)
    base = SandboxPolicy(writable=["/cache"])
    assert kind.sandbox_policy(base) == SandboxPolicy(mode="off", network=True, writable=["/cache"])
    plain = parse_agent_type("---\nname: plain\ndescription: d\n---\nGo.")
    assert plain.sandbox_policy(base) is None  # the runtime's, unchanged
    for line, message in [
        ("sandbox: maybe", "sandbox 'maybe' must be on or off"),
        ("sandbox_network: 1", "true or false"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_agent_type(f"---\nname: x\ndescription: d\n{line}\n---\nGo.")


def test_an_agent_type_adds_writable_and_hidden_paths() -> None:
    text = (
        "---\nname: builder\ndescription: d\nsandbox_writable: [~/.cache/pip, 'out dir']\n"
        "sandbox_readable_hidden: ~/work/credentials.json, secrets\n---\nBuild."
    )
    kind = parse_agent_type(text)
    assert kind.sandbox_writable == ("~/.cache/pip", "out dir")
    assert kind.sandbox_readable_hidden == ("~/work/credentials.json", "secrets")
    base = SandboxPolicy(writable=["/cache"], readable_hidden=["/etc/private"])
    merged = kind.sandbox_policy(base)
    assert merged == SandboxPolicy(
        writable=["/cache"],  # the runtime's, which may uncover a hidden path (the person's choice)
        type_writable=["~/.cache/pip", "out dir"],  # the type's, which may not
        readable_hidden=["/etc/private", "~/work/credentials.json", "secrets"],  # only ever more
    )
    assert "also writable: /cache, ~/.cache/pip, out dir" in merged.summary()
    for line, message in [
        ("sandbox_writable: ['']", "sandbox_writable must be a list of paths"),
        ('sandbox_readable_hidden: [a, ""]', "sandbox_readable_hidden must be a list of paths"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_agent_type(f"---\nname: x\ndescription: d\n{line}\n---\nGo.")


@pytest.mark.parametrize(
    "written",
    [
        "~/.ssh",
        "~/.ssh/keys",
        "/home/u/.netrc",
        "/data/root",
        "/data/root/logs",
        "/run/user/1000",
        "/tmp/x",
        "~/.config/subagents",
    ],
)
def test_an_agent_type_never_makes_a_hidden_path_writable(written: str) -> None:
    with pytest.raises(PolicyRefused, match="is at or under the hidden"):
        argv_for("/srv/ws", ["/data/root"], SandboxPolicy(type_writable=[written]))


def test_an_agent_type_never_makes_the_whole_file_system_writable() -> None:
    with pytest.raises(PolicyRefused, match="is the whole file system"):
        argv_for("/srv/ws", [], SandboxPolicy(type_writable=["/srv/ws/../.."]))


def test_an_agent_types_writable_folder_around_hidden_ones_keeps_them_hidden() -> None:
    got = mounts(argv_for("/srv/ws", ["/data/root"], SandboxPolicy(type_writable=["~"])))
    assert got.index(("--bind", "/home/u", "/home/u")) < got.index(("--tmpfs", "/home/u/.ssh"))
    assert got.index(("--bind", "/home/u", "/home/u")) < got.index(("--ro-bind", "/dev/null", "/home/u/.netrc"))


def typed_ctx(agent_type: str | None) -> ToolContext:
    """A call from an agent spawned as `agent_type` (its header's `agent_preset`)."""
    agent = SimpleNamespace(session=SimpleNamespace(header=SimpleNamespace(agent_preset=agent_type)))
    return ToolContext(session_id="s-1", call_id="call-1", turn=1, step=1, abort=Abort(), agent=agent)


async def test_an_agent_type_with_the_sandbox_off_asks_as_leaving_the_box(tmp_path: Path) -> None:
    asked = Asked("allow")
    policy = SandboxPolicy()
    sandbox = Sandbox(policy, env={"PATH": str(tmp_path / "no-bin")}, by_type={"wild": SandboxPolicy(mode="off")})
    tools = ToolSet(
        guard_tools(workspace_tools(str(tmp_path), sandbox=sandbox), default_permissions(True), asked, Remembered())
    )
    plain = await tools.execute("run_command", json.dumps({"command": "true"}), typed_ctx("plain"))
    assert plain.error == {"name": "ToolFailure", "code": "SANDBOX_UNAVAILABLE"} and asked.requests == []
    wild = await tools.execute("run_command", json.dumps({"command": "echo hi > w.txt"}), typed_ctx("wild"))
    assert [r.tool for r in asked.requests] == ["run_command_unsandboxed"]
    assert wild.content[0]["text"] == "exit code: 0 (ran outside the sandbox: agent type 'wild' turns it off)"
    assert (tmp_path / "w.txt").read_text() == "hi\n"
    refused = await ToolSet(
        guard_tools(
            workspace_tools(str(tmp_path), sandbox=sandbox), default_permissions(True), headless_approver, Remembered()
        )
    ).execute("run_command", json.dumps({"command": "touch x"}), typed_ctx("wild"))
    assert refused.error == {"name": "PermissionDenied", "code": "PERMISSION_DENIED"}  # run refuses it
    assert not (tmp_path / "x").exists()


def run_command_spec(tools: ToolSet) -> tuple[str, dict[str, Any]]:
    (spec,) = [spec for spec in tools.specs() if spec.name == "run_command"]
    properties = spec.parameters["properties"]
    assert isinstance(properties, dict)
    return spec.description, properties


async def test_run_commands_description_tells_of_the_callers_box(tmp_path: Path) -> None:
    by_type = {
        "fetcher": SandboxPolicy(network=True),
        "builder": SandboxPolicy(type_writable=["~/.cache/pip"]),
        "wild": SandboxPolicy(mode="off"),
    }
    sandbox = Sandbox(SandboxPolicy(), env={"PATH": str(tmp_path / "no-bin")}, by_type=by_type)
    asked = Asked("allow")
    tools = ToolSet(
        guard_tools(workspace_tools(str(tmp_path), sandbox=sandbox), default_permissions(True), asked, Remembered())
    )
    text, params = run_command_spec(tools)  # offered to any agent: the runtime's box
    assert "network off" in text and "unsandboxed" in params
    text, params = run_command_spec(tools.for_agent_type("fetcher"))
    assert "It runs in a sandbox: the workspace writable" in text and "the network on" in text
    assert "unsandboxed" in params
    text, _ = run_command_spec(tools.for_agent_type("builder"))
    assert "the workspace, ~/.cache/pip writable" in text and "the network off" in text
    for other in ("other", None):  # a type that sets nothing, a root: the runtime's box
        text, _ = run_command_spec(tools.for_agent_type(other))
        assert "It runs in a sandbox: the workspace writable" in text and "the network off" in text
    text, params = run_command_spec(tools.for_agent_type("wild"))
    assert "It runs outside the sandbox (your agent type turns it off)" in text and "network" not in text
    assert "unsandboxed" not in params  # nothing to leave
    # Described for its type, the tool is still behind its permission: leaving the box asks.
    wild = tools.for_agent_type("wild")
    outcome = await wild.execute("run_command", json.dumps({"command": "echo hi"}), typed_ctx("wild"))
    assert [r.tool for r in asked.requests] == ["run_command_unsandboxed"] and not outcome.is_error
    unchanged = ToolSet(workspace_tools(str(tmp_path), sandbox=Sandbox(SandboxPolicy())))
    assert unchanged.for_agent_type("fetcher") is unchanged  # no type sets a box: one description


class Described(Offering):
    """The scripted model, remembering `run_command`'s description in each session's requests."""

    def __init__(self, script: dict[str, Any]) -> None:
        super().__init__(script)
        self.seen: dict[str, str] = {}

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Any]:
        for tool in request.tools:
            if tool.name == "run_command":
                self.seen[session.label or "root"] = tool.description
        return super().answer(session, inner, request)


async def test_a_child_is_told_of_its_own_types_box(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    fetcher = parse_agent_type("---\nname: fetcher\ndescription: Fetches\nsandbox_network: true\n---\nFetch.")
    spawn = {"description": "fetch one", "prompt": "go", "agent_type": "fetcher"}
    script = {
        "agents": [
            {
                "session": "s",
                "responses": [
                    {"tool_calls": [call("subagent", **spawn)]},
                    {"wait_for": {"settled": "fetch one"}, "text": "done"},
                ],
            },
            {"label": "fetch one", "responses": [{"text": "fetched"}]},
        ]
    }
    model = Described(script)
    with trio.fail_after(60):  # real seconds: only reached if something hangs
        async with open_runtime(
            tmp_path / "root",
            model=model,
            clock=ScenarioClock(),
            workspace=tmp_path / "ws",
            sandbox=SandboxPolicy(),
            agent_types={"fetcher": fetcher},
        ) as rt:
            agent = await rt.agents.create(session_id="s")
            await agent.send("go")
            await agent.wait_idle()
    assert "the network off" in model.seen["root"] and "the network on" not in model.seen["root"]
    assert "the network on" in model.seen["fetch one"]
