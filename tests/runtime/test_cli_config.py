"""`subagents config` and the hosts' configuration through the CLI: precedence with a user file,
a project file and a flag; a bad key is one line and exit 2 before anything is written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cli_process import CLI, clean_env, write_script


def cli(tmp_path: Path, *args: str, user: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = clean_env(SUBAGENTS_CONFIG_DIR=str(user)) if user is not None else clean_env()
    return subprocess.run([*CLI, *args], cwd=tmp_path, env=env, input=stdin, capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # real subagents processes
def test_config_prints_each_value_with_its_source(tmp_path: Path) -> None:
    user = tmp_path / "user"
    (user / "agents").mkdir(parents=True)
    (user / "subagents.toml").write_text('max_depth = 3\nmodel = "openai:from-user"\n')
    (user / "agents" / "helper.md").write_text("---\nname: helper\ndescription: Helps\n---\nHelp.")
    (user / "agents" / "bad.md").write_text("nope")
    (tmp_path / "subagents.toml").write_text('max_depth = 2\n[permissions]\nrun_command = "allow"\n')
    done = cli(tmp_path, "config", "--json", user=user)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    values = {row["key"]: (row["value"], row["source"]) for row in document["values"]}
    assert values["max_depth"] == (2, str(tmp_path / "subagents.toml"))
    assert values["model"] == ("openai:from-user", str(user / "subagents.toml"))
    assert values["permissions.run_command"] == ("allow", str(tmp_path / "subagents.toml"))
    assert values["permissions.write_file"] == ("ask", "default")
    assert values["max_steps"] == (64, "default")
    assert [t["name"] for t in document["agent_types"]] == ["helper"]
    assert [Path(p["path"]).name for p in document["agent_type_problems"]] == ["bad.md"]
    text = cli(tmp_path, "config", user=user).stdout
    assert "max_depth = 2" in text and f"# {tmp_path / 'subagents.toml'}" in text


@pytest.mark.slow  # real subagents processes
@pytest.mark.parametrize("command", [["run", "hi"], ["chat"], ["config"]])
def test_a_bad_key_is_one_line_and_exit_2_and_nothing_is_written(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "subagents.toml").write_text("max_dept = 2\n")
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "x"}]}]})
    extra = ["--model", model, "--root", str(tmp_path / "root")] if command[0] != "config" else []
    done = cli(tmp_path, *command, *extra)
    assert done.returncode == 2
    assert done.stderr == f"subagents: {tmp_path / 'subagents.toml'}: unknown key max_dept\n"
    assert not (tmp_path / "root").exists()


@pytest.mark.slow  # a real subagents process
def test_the_flag_beats_the_project_file_and_run_has_the_workspace_tools(tmp_path: Path) -> None:
    (tmp_path / "subagents.toml").write_text('model = "scripted:missing.json"\n')
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]},
                    {"text": "read"},
                ]
            }
        ]
    }
    model = write_script(tmp_path / "s.json", script)
    (tmp_path / "note.txt").write_text("hello\n")
    done = cli(tmp_path, "run", "--model", model, "--root", str(tmp_path / "root"), "--json", "read it")
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session_id"]
    shown = cli(tmp_path, "show", "--root", str(tmp_path / "root"), "--json", session)
    results = [e["text"] for e in json.loads(shown.stdout) if e["type"] == "tool/result"]
    assert results == ["     1\thello"]


@pytest.mark.slow  # a real subagents process
def test_chat_names_an_mcp_server_from_the_config_that_did_not_start(tmp_path: Path) -> None:
    (tmp_path / "subagents.toml").write_text('[mcp_servers.broken]\ncommand = "/no/such/mcp-server"\n')
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "x"}]}]})
    done = cli(tmp_path, "chat", "--model", model, "--root", str(tmp_path / "root"), stdin="/quit\n")
    assert done.returncode == 0, done.stderr
    assert "MCP server 'broken' is unavailable: " in done.stdout


@pytest.mark.slow  # a real subagents process
def test_run_names_an_mcp_server_from_the_config_that_did_not_start(tmp_path: Path) -> None:
    (tmp_path / "subagents.toml").write_text('[mcp_servers.broken]\ncommand = "/no/such/mcp-server"\n')
    model = write_script(tmp_path / "s.json", {"agents": [{"responses": [{"text": "x"}]}]})
    done = cli(tmp_path, "run", "--model", model, "--root", str(tmp_path / "root"), "go")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "x\n"
    (line,) = [ln for ln in done.stderr.splitlines() if "MCP" in ln]
    assert line.startswith("subagents: MCP server 'broken' is unavailable: ")
    assert line.endswith(" (its tools are not offered)")


@pytest.mark.slow  # a real subagents process
def test_headless_run_denies_ask_and_says_how_to_allow_it(tmp_path: Path) -> None:
    # Unconfined, run_command asks (with the sandbox on, a boxed command is allowed: test_sandbox*).
    (tmp_path / "subagents.toml").write_text('[sandbox]\nmode = "off"\n')
    script = {
        "agents": [
            {
                "responses": [
                    {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch x"}}]},
                    {"text": "ok"},
                ]
            }
        ]
    }
    model = write_script(tmp_path / "s.json", script)
    done = cli(tmp_path, "run", "--model", model, "--root", str(tmp_path / "root"), "--json", "go")
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session_id"]
    shown = cli(tmp_path, "show", "--root", str(tmp_path / "root"), "--json", session)
    (result,) = [e for e in json.loads(shown.stdout) if e["type"] == "tool/result"]
    assert result["text"] == (
        "Error: run_command needs permission and `subagents run` cannot ask (it is headless): denied. "
        'To let it run unattended, set `run_command = "allow"` under [permissions] in subagents.toml.'
    )
    assert not (tmp_path / "x").exists()
    (tmp_path / "subagents.toml").write_text('[sandbox]\nmode = "off"\n[permissions]\nrun_command = "allow"\n')
    assert cli(tmp_path, "run", "--model", model, "--root", str(tmp_path / "root"), "go").returncode == 0
    assert (tmp_path / "x").exists()


@pytest.mark.slow  # real subagents processes, one killed mid-command
@pytest.mark.parametrize("policy", ["close", "continue"])
def test_a_run_killed_mid_command_resumes_with_the_closers_or_continues(tmp_path: Path, policy: str) -> None:
    """`close` (the closers, as before issue 27) or `continue` (the default): the command cut
    mid-run is not run again either way — its result says its outcome is unknown."""
    import os
    import signal

    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    (tmp_path / "subagents.toml").write_text(
        f'on_interrupted_turn = "{policy}"\n[permissions]\nrun_command = "allow"\n'
    )
    command = f"echo $$ > {fifo}; exec sleep 1000"
    script = {
        "agents": [
            {
                "session": "s",
                "responses": [
                    {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
                    {"text": "after the restart"},
                ],
            }
        ]
    }
    model = write_script(tmp_path / "s.json", script)
    root = str(tmp_path / "root")
    env = clean_env()
    run = subprocess.Popen(
        [*CLI, "run", "--model", model, "--root", root, "--session", "s", "go"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sleeper = int(fifo.read_text())  # the command runs: kill the host under it
    run.kill()
    run.wait(timeout=60)
    os.kill(sleeper, signal.SIGKILL)  # its own process group outlived the host
    # A script runs per process: the restarted host's session answers from its own.
    responses = [{"text": "resumed"}] if policy == "close" else [{"text": "continued"}, {"text": "resumed"}]
    after = write_script(tmp_path / "after.json", {"agents": [{"session": "s", "responses": responses}]})
    done = cli(tmp_path, "run", "--model", after, "--root", root, "--session", "s", "again")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "resumed\n"
    shown = json.loads(cli(tmp_path, "show", "--root", root, "--json", "s").stdout)
    (result,) = [e for e in shown if e["type"] == "tool/result"]
    assert result["is_error"] and result["text"].startswith("The tool call was interrupted after it was recorded")
    ends = [e["reason"]["kind"] for e in shown if e["type"] == "turn/end"]
    assert ends == (["interrupted", "completed"] if policy == "close" else ["completed", "completed"])
    assert [e["type"] == "turn/continue" for e in shown].count(True) == (policy == "continue")
    # Not run again: a second run would block writing to the fifo nobody reads, and `run` would hang.
    if policy == "continue":
        text = cli(tmp_path, "show", "--root", root, "s").stdout
        assert "── turn 1 continued (attempt 2)\n" in text
        assert "  ← in doubt: The tool call was interrupted after it was recorded" in text
