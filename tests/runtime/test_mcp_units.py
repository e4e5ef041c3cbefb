"""MCP server specs, tool names and result rendering (no server needed), and the lazy import:
a read-only command never loads the `mcp` SDK."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_process import clean_env
from subagents.runtime import McpServerSpec, open_runtime
from subagents.runtime.tools.mcp_render import render_content
from subagents.runtime.tools.mcp_spec import mcp_tool_name


def test_a_spec_is_a_stdio_command_or_an_http_url() -> None:
    stdio = McpServerSpec(name="git-tools", command="uvx", args=["mcp-server-git"], env={"TOKEN": "x"}, cwd="/tmp")
    assert (stdio.transport, stdio.args, stdio.env) == ("stdio", ("mcp-server-git",), {"TOKEN": "x"})
    http = McpServerSpec(name="docs", url="https://example.test/mcp", headers={"Authorization": "Bearer t"})
    assert (http.transport, http.headers, http.call_timeout, http.startup_timeout) == (
        "http",
        {"Authorization": "Bearer t"},
        300.0,
        30.0,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "a b", "command": "x"}, "MCP server name 'a b' must be letters, digits, '_' or '-', without '__'"),
        ({"name": "a__b", "command": "x"}, "MCP server name 'a__b' must be letters"),
        ({"name": "a.b", "command": "x"}, "MCP server name 'a.b' must be letters"),
        ({"name": "", "command": "x"}, "must be letters, digits"),
        ({"name": "s"}, "give exactly one of command (stdio) or url (streamable HTTP)"),
        ({"name": "s", "command": "x", "url": "http://h/mcp"}, "give exactly one of command"),
        ({"name": "s", "command": ""}, "command must be a non-empty string"),
        ({"name": "s", "command": "x", "args": [1]}, "args must be strings"),
        ({"name": "s", "command": "x", "env": {"A": 1}}, "env must map strings to strings"),
        ({"name": "s", "url": "ftp://h"}, "url must start with http:// or https://"),
        ({"name": "s", "url": "http://h", "args": ["a"]}, "args, env and cwd belong to a stdio server"),
        ({"name": "s", "command": "x", "headers": {"A": "b"}}, "headers belong to an HTTP server"),
        ({"name": "s", "command": "x", "call_timeout": 0}, "call_timeout must be a positive number of seconds"),
        ({"name": "s", "command": "x", "startup_timeout": float("inf")}, "startup_timeout must be a positive"),
        ({"name": "s", "command": "x", "startup_timeout": True}, "startup_timeout must be a positive"),
        ({"name": "s", "command": "x", "output_chars": 5}, "output_chars must be an integer of at least 100"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_server_and_the_field(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        McpServerSpec(**options)
    assert message in str(raised.value)


async def test_a_server_named_twice_is_refused_before_anything_opens(tmp_path: Path) -> None:
    specs = [McpServerSpec(name="s", command="a"), McpServerSpec(name="s", url="http://h/mcp")]
    with pytest.raises(ValueError, match="MCP server names must be unique, given twice: s"):
        async with open_runtime(tmp_path / "root", mcp_servers=specs):
            pass
    assert not (tmp_path / "root").exists()


def test_tool_names_keep_to_what_model_apis_accept() -> None:
    assert mcp_tool_name("docs", "search") == "mcp__docs__search"
    assert mcp_tool_name("docs", "files.read/v2") == "mcp__docs__files_read_v2"


def test_results_render_text_as_is_and_summarize_the_rest() -> None:
    content = [
        {"type": "text", "text": "one"},
        {"type": "image", "data": "AAECAw==", "mimeType": "image/png"},
        {"type": "audio", "data": "not base64!", "mimeType": "audio/wav"},
        {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt"},
        {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "bee"}},
        {"type": "resource", "resource": {"uri": "file:///c.bin", "blob": "AAA=", "mimeType": "application/x"}},
        {"type": "hologram"},
    ]
    assert render_content(content, None, 1000).split("\n") == [
        "one",
        "[image: image/png, 4 bytes]",
        "[audio: audio/wav, 11 characters of data]",
        "[resource link: a.txt <file:///a.txt>]",
        "[resource <file:///b.txt>]",
        "bee",
        "[resource <file:///c.bin>: application/x, 2 bytes]",
        "[hologram content]",
    ]
    assert render_content([], {"answer": 42}, 1000) == '{"answer": 42}'
    assert render_content([], None, 1000) == "(the tool returned no content)"
    assert render_content([{"type": "text", "text": "x" * 250}], None, 100) == (
        "x" * 100 + "\n[cut: the result had 250 characters, 100 kept]"
    )


@pytest.mark.slow  # a real subagents process
def test_read_only_commands_never_import_mcp(tmp_path: Path) -> None:
    code = (
        "import sys; from subagents.runtime.hosts.cli import entry as cli; "
        "(tmp := sys.argv[1]); __import__('os').makedirs(tmp + '/sessions'); "
        "assert cli.main(['sessions', '--root', tmp]) == 0; "
        "assert not [m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')], 'mcp was imported'; "
        "from subagents.runtime.tools import mcp_servers; assert 'mcp' not in sys.modules; "
        "import mcp"  # it is installed (the `mcp` extra): its absence above is the lazy import's doing
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "r")], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow  # a real subprocess running a runtime with a misbehaving server
def test_a_servers_stray_output_does_not_reach_the_hosts_terminal(tmp_path: Path) -> None:
    # The server writes junk on its stdout (the protocol channel) and never answers.
    code = (
        "import trio; from subagents.runtime import McpServerSpec, open_runtime\n"
        "async def main():\n"
        "    spec = McpServerSpec(name='j', command='sh', args=['-c', 'echo junk; cat >/dev/null'], startup_timeout=0.5)\n"
        "    async with open_runtime(__import__('sys').argv[1], mcp_servers=[spec]) as rt:\n"
        "        print(rt.mcp.status()[0].error)\n"
        "trio.run(main)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "r")], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "it did not start within 0.5s\n", "")


async def test_without_the_sdk_a_configured_server_fails_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # `import mcp` fails as if it were not installed
    spec = McpServerSpec(name="s", command="never-run")
    async with open_runtime(tmp_path / "root", mcp_servers=[spec]) as rt:
        assert rt.mcp is not None
        assert [(s.state, s.error) for s in rt.mcp.status()] == [
            ("failed", "the MCP SDK is not installed (install the `mcp` extra: pip install 'trio-subagents[mcp]')")
        ]


def test_an_mcp_tool_is_idempotent_when_its_annotations_say_read_only_or_idempotent() -> None:
    """Issue 27: a call of such a tool cut by a crash runs again when its turn is continued."""
    from types import SimpleNamespace

    from subagents.runtime.tools.mcp_servers import _tools_of

    def listed(name: str, **hints: Any) -> Any:
        annotations = SimpleNamespace(readOnlyHint=hints.get("read_only"), idempotentHint=hints.get("idempotent"))
        return SimpleNamespace(name=name, description="d", inputSchema={}, annotations=annotations)

    server = SimpleNamespace(
        spec=SimpleNamespace(name="srv"),
        listed=[
            listed("reads", read_only=True),
            listed("sets", idempotent=True),
            listed("sends"),
            listed("hinted_false", read_only=False, idempotent=False),
            SimpleNamespace(name="bare", description=None, inputSchema={}),
        ],
    )
    tools = {t.name.removeprefix("mcp__srv__"): t for t in _tools_of(server)}  # type: ignore[arg-type]  # a stand-in server
    assert {name: t.idempotent for name, t in tools.items()} == {
        "reads": True,
        "sets": True,
        "sends": False,
        "hinted_false": False,
        "bare": False,
    }


def test_the_workspace_tools_say_which_run_again_after_a_crash(tmp_path: Path) -> None:
    from subagents.runtime import workspace_tools

    idempotent = {t.name: t.idempotent for t in workspace_tools(str(tmp_path))}
    assert idempotent == {
        "read_file": True,
        "write_file": True,  # the whole file: writing it twice leaves what writing it once does
        "edit_file": False,
        "list_dir": True,
        "glob": True,
        "grep": True,
        "run_command": False,
    }
