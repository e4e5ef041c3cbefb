"""The sandbox through the hosts (issue 32; README "Sandbox"): a background child under
`subagents run` runs an allowed command in the box, `subagents config` says whether the sandbox
works here and why not, and a stdio MCP server marked `sandbox = true` runs boxed.

Folders live in /var/tmp, not pytest's /tmp: the box's /tmp is private, so a tree under /tmp
would be hidden whole and prove nothing about the rest of the file system.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from cli_process import CLI, clean_env, write_script
from mcp_runs import call, one_turn, results, stdio_spec
from subagents.runtime import Permissions, SandboxPolicy, ScenarioClock, open_runtime

from .test_mcp import run_turns

TIMEOUT = 60  # real seconds: only reached if a subprocess hangs


@pytest.fixture
def base() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="sandbox-run-", dir="/var/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=TIMEOUT)


def test_a_background_child_under_run_runs_an_allowed_command_in_the_box(base: Path) -> None:
    project = base / "project"
    project.mkdir()
    home = base / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    command = (
        "echo built > out.txt; cat ~/.ssh/id_ed25519; echo key=[$OPENAI_API_KEY];"
        f" ls -A {base}/root | wc -l; touch {base}/escaped"
    )
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [{"name": "subagent", "arguments": {"description": "builder", "prompt": "build"}}]},
                    {"wait_for": {"settled": "builder"}, "text": "STARTED", "tool_calls": [call("list_agents")]},
                    {"text": "NOTED"},
                ]
            },
            {
                "label": "builder",
                "responses": [{"tool_calls": [call("run_command", command=command)]}, {"text": "BUILT"}],
            },
        ]
    }
    model = write_script(base / "s.json", script)
    root = base / "root"
    done = cli(
        project,
        "run",
        "--root",
        str(root),
        "--model",
        model,
        "--json",
        "go",
        HOME=str(home),
        OPENAI_API_KEY="sk-sentinel",
    )
    assert done.returncode == 0, done.stderr
    parent = json.loads(done.stdout)["session_id"]
    listed = json.loads(cli(project, "children", "--root", str(root), "--json", parent).stdout)
    (child,) = [row["id"] for row in listed]
    shown = json.loads(cli(project, "show", "--root", str(root), "--json", child).stdout)
    (result,) = [e["text"] for e in shown if e["type"] == "tool/result"]
    assert result.splitlines() == [
        "exit code: 1 (sandboxed: workspace writable, network off)",
        f"cat: {home}/.ssh/id_ed25519: No such file or directory",
        "key=[]",
        "0",  # the store's root is hidden: an empty folder
        f"touch: cannot touch '{base}/escaped': Read-only file system",
    ]
    assert (project / "out.txt").read_text() == "built\n"
    assert not (base / "escaped").exists()


def test_a_child_of_a_type_that_turns_the_sandbox_off_is_refused_under_run(base: Path) -> None:
    project = base / "project"
    (project / ".subagents" / "agents").mkdir(parents=True)
    (project / ".subagents" / "agents" / "wild.md").write_text(
        "---\nname: wild\ndescription: Runs unconfined\nsandbox: off\n---\nRun things."
    )
    spawn = {"description": "wild one", "prompt": "go", "agent_type": "wild"}
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [call("subagent", **spawn)]},
                    {"wait_for": {"settled": "wild one"}, "text": "STARTED", "tool_calls": [call("list_agents")]},
                    {"text": "NOTED"},
                ]
            },
            {
                "label": "wild one",
                "responses": [{"tool_calls": [call("run_command", command="touch ran")]}, {"text": "x"}],
            },
        ]
    }
    model = write_script(base / "s.json", script)
    root = base / "root"
    done = cli(project, "run", "--root", str(root), "--model", model, "--json", "go")
    assert done.returncode == 0, done.stderr
    parent = json.loads(done.stdout)["session_id"]
    (child,) = [row["id"] for row in json.loads(cli(project, "children", "--root", str(root), "--json", parent).stdout)]
    shown = json.loads(cli(project, "show", "--root", str(root), "--json", child).stdout)
    (result,) = [e["text"] for e in shown if e["type"] == "tool/result"]
    assert result.startswith("Error: run_command_unsandboxed needs permission and `subagents run` cannot ask")
    assert not (project / "ran").exists()


def test_a_command_cannot_rewrite_the_projects_own_configuration(base: Path) -> None:
    # The workspace is the project: a command that rewrote its `subagents.toml` or an agent
    # type (`sandbox: off`, `sandbox_writable: [~]`) would leave the box at the next start, and
    # the file may hold an MCP server's token. Both are hidden, as the user's config folder is.
    project = base / "project"
    (project / ".subagents" / "agents").mkdir(parents=True)
    (project / "subagents.toml").write_text('[mcp_servers.gh]\ncommand = "true"\nenv = { GH_TOKEN = "ghp_secret" }\n')
    (project / ".subagents" / "agents" / "helper.md").write_text("---\nname: helper\ndescription: Helps\n---\nHelp.")
    command = (
        "cat subagents.toml; printf '[permissions]\\nrun_command_unsandboxed = \"allow\"\\n' >> subagents.toml;"
        " echo 'sandbox: off' > .subagents/agents/helper.md; ls -A .subagents/agents | wc -l"
    )
    script = {"agents": [{"responses": [{"tool_calls": [call("run_command", command=command)]}, {"text": "DONE"}]}]}
    model = write_script(base / "s.json", script)
    root = base / "root"
    done = cli(project, "run", "--root", str(root), "--model", model, "--json", "go", HOME=str(base / "home"))
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session_id"]
    shown = json.loads(cli(project, "show", "--root", str(root), "--json", session).stdout)
    (result,) = [e["text"] for e in shown if e["type"] == "tool/result"]
    assert "ghp_secret" not in result, result
    assert (project / "subagents.toml").read_text().count("[") == 1  # unchanged
    assert "sandbox" not in (project / ".subagents" / "agents" / "helper.md").read_text()


def test_the_default_root_is_hidden_from_a_workspace_elsewhere(base: Path) -> None:
    # `--root` defaults to `./.subagents`, relative to the folder the host starts in, not to
    # the workspace: with `--workspace src` the store is `../.subagents` seen from the workspace.
    project = base / "project"
    (project / "src").mkdir(parents=True)
    command = "ls -A ../.subagents | wc -l; ls ../.subagents/index.sqlite3"
    script = {"agents": [{"responses": [{"tool_calls": [call("run_command", command=command)]}, {"text": "DONE"}]}]}
    model = write_script(base / "s.json", script)
    done = cli(project, "run", "--workspace", "src", "--model", model, "--json", "go", HOME=str(base / "home"))
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session_id"]
    assert (project / ".subagents").is_dir()
    shown = json.loads(cli(project, "show", "--json", session).stdout)
    (result,) = [e["text"] for e in shown if e["type"] == "tool/result"]
    assert result.splitlines()[1] == "0", result  # an empty folder


def test_config_says_whether_the_sandbox_works_here_and_why_not(base: Path) -> None:
    done = cli(base, "config", "--json")
    values = {row["key"]: (row["value"], row["source"]) for row in json.loads(done.stdout)["values"]}
    assert values["sandbox.mode"] == ("on", "default")
    assert values["sandbox.status"] == (f"works ({shutil.which('bwrap')})", "probe: bwrap --unshare-all … true")
    assert values["permissions.run_command"] == ("allow", "default")
    assert values["permissions.run_command_unsandboxed"] == ("ask", "default")
    bare = base / "bin"
    bare.mkdir()  # a PATH without bwrap
    done = cli(base, "config", PATH=str(bare))
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("sandbox.status")]
    assert "does not work here: bwrap (bubblewrap) is not on PATH" in line
    assert "run_command fails until you install bubblewrap (Debian: apt-get install bubblewrap)" in line


@pytest.mark.slow  # real MCP server subprocesses
async def test_an_mcp_server_marked_sandbox_runs_in_the_box(base: Path) -> None:
    secret = base / "secret.txt"
    secret.write_text("the secret\n")
    (base / "open.txt").write_text("open\n")
    calls = [call("mcp__boxed__look", path=str(secret)), call("mcp__boxed__look", path=str(base / "open.txt"))]
    calls += [call("mcp__plain__look", path=str(secret))]
    servers = [stdio_spec("boxed", sandbox=True), stdio_spec("plain")]
    policy = SandboxPolicy(readable_hidden=[str(secret)])
    allow = Permissions({"mcp__*": "allow"})
    await run_turns(base, one_turn(calls), ["go"], servers, permissions=allow, sandbox=policy)
    assert [r["text"] for r in results(base / "root", "s")] == [
        "PermissionError: Permission denied",  # /dev/null covers it, in the box
        "open\n",
        "the secret\n",  # the server not marked sandbox reads it
    ]


async def test_an_mcp_server_marked_sandbox_does_not_start_without_bwrap(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(base))  # the runtime's sandbox looks for bwrap on our PATH
    model = write_script(base / "s.json", {"agents": [{"responses": [{"text": "x"}]}]})
    with trio.fail_after(TIMEOUT):
        async with open_runtime(
            base / "root", model=model, clock=ScenarioClock(), mcp_servers=[stdio_spec("boxed", sandbox=True)]
        ) as rt:
            assert rt.mcp is not None
            (status,) = rt.mcp.status()
    assert status.state != "ready"
    assert status.error is not None and "bwrap (bubblewrap) is not on PATH" in status.error
