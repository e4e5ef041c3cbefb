"""The workspace tools through the tool framework, on real files: each tool's happy path, every
way out of the root refused with nothing touched, the caps, and `run_command`'s exit codes,
timeout (a mock clock, moved by hand once the command waits) and cancellation."""

from __future__ import annotations

import json
import os
import select
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from subagents.actors import Abort
from subagents.runtime.tools.base import ToolContext, ToolOutcome, ToolSet
from subagents.runtime.tools.workspace_tools import WorkspaceLimits, workspace_tools


def ctx() -> ToolContext:
    return ToolContext(session_id="s-1", call_id="call-1", turn=1, step=1, abort=Abort())


class Tools:
    def __init__(self, root: Path, **limits: Any) -> None:
        self.root = root
        self.set = ToolSet(workspace_tools(str(root), WorkspaceLimits(**limits)))

    async def call(self, name: str, **args: Any) -> ToolOutcome:
        return await self.set.execute(name, json.dumps(args), ctx())

    async def text(self, name: str, **args: Any) -> str:
        outcome = await self.call(name, **args)
        assert not outcome.is_error, outcome.content
        return "".join(block["text"] for block in outcome.content)

    async def refused(self, name: str, code: str, **args: Any) -> str:
        outcome = await self.call(name, **args)
        assert outcome.is_error, outcome.content
        assert outcome.error == {"name": "WorkspaceError", "code": code}, outcome.error
        return outcome.content[0]["text"]


def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace `ws` beside a folder `outside` with a secret, and links of every kind."""
    ws = tmp_path / "ws"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "a.py").write_text("import os\nprint('hello')\n")
    (ws / "src" / "b.py").write_text("x = 1\n")
    (ws / "notes.md").write_text("# notes\nhello world\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    os.symlink("../outside/secret.txt", ws / "leak.txt")  # relative, leaves the root
    os.symlink(str(outside), ws / "away")  # absolute folder outside
    os.symlink("src/pkg", ws / "inner")  # stays inside: followed
    os.symlink(str(ws / "notes.md"), ws / "abs-inner.md")  # absolute, inside: followed
    return ws, outside


def gone(pid: int) -> bool:
    """Whether the process ends (SIGKILL lands a moment after `killpg` returns): waits on a pidfd,
    which turns readable when it exits; 10 s is a hang guard only."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 10)[0])
    finally:
        os.close(fd)


def snapshot(path: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            out[str(p)] = "-> " + os.readlink(p)
        elif p.is_file():
            out[str(p)] = p.read_bytes()
        else:
            out[str(p)] = "dir"
    return out


async def test_read_file_numbers_lines_and_reads_ranges(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    tools = Tools(ws, read_lines=4, line_chars=6)
    assert await tools.text("read_file", path="src/pkg/a.py") == (
        "     1\timport … (line cut)\n     2\tprint( … (line cut)"
    )
    assert await tools.text("read_file", path="long.txt") == (
        "     1\tline 1\n     2\tline 2\n     3\tline 3\n     4\tline 4\n… 6 more lines (read on with offset 5)"
    )
    assert (
        await tools.text("read_file", path="long.txt", offset=9, limit=5)
        == "     9\tline 9\n    10\tline 1 … (line cut)"
    )
    await tools.refused("read_file", "BAD_RANGE", path="long.txt", offset=11)
    await tools.refused("read_file", "NOT_FOUND", path="nope.txt")
    await tools.refused("read_file", "NOT_A_FILE", path="src")
    (ws / "bin").write_bytes(b"\x7fELF\x00\x01")
    await tools.refused("read_file", "BINARY_FILE", path="bin")
    assert (
        await tools.text("read_file", path="inner/a.py") == "     1\timport … (line cut)\n     2\tprint( … (line cut)"
    )


async def test_read_file_refuses_a_file_over_the_cap(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    (ws / "big.txt").write_text("x" * 101)
    text = await Tools(ws, file_bytes=100).refused("read_file", "FILE_TOO_LARGE", path="big.txt")
    assert "101 bytes, over the 100-byte cap" in text


@pytest.mark.parametrize(
    "path",
    ["../outside/secret.txt", "src/../../outside/secret.txt", "leak.txt", "away/secret.txt", "/etc/passwd"],
)
@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read_file", {}),
        ("write_file", {"content": "pwned"}),
        ("edit_file", {"old_string": "top", "new_string": "pwned"}),
        ("list_dir", {}),
        ("grep", {"pattern": "secret"}),
        ("glob", {"pattern": "*"}),
    ],
)
async def test_every_way_out_of_the_root_is_refused_and_nothing_is_touched(
    tmp_path: Path, path: str, tool: str, args: dict[str, Any]
) -> None:
    ws, outside = tree(tmp_path)
    before = snapshot(tmp_path)
    text = await Tools(ws).refused(tool, "PATH_OUTSIDE_WORKSPACE", path=path, **args)
    assert "outside the workspace" in text or "leads out of the workspace" in text
    assert snapshot(tmp_path) == before


async def test_run_command_refuses_a_cwd_outside_the_root(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    await Tools(ws).refused("run_command", "PATH_OUTSIDE_WORKSPACE", command="touch x", cwd="away")
    assert not (tmp_path / "outside" / "x").exists()


async def test_symlinks_that_stay_inside_are_followed_and_dotdot_within_is_fine(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    tools = Tools(ws)
    assert "hello world" in await tools.text("read_file", path="abs-inner.md")
    assert "x = 1" in await tools.text("read_file", path="src/pkg/../b.py")
    assert "x = 1" in await tools.text("read_file", path=str(ws / "src" / "b.py"))  # absolute, inside


async def test_write_file_creates_folders_replaces_atomically_and_keeps_the_mode(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    tools = Tools(ws)
    assert await tools.text("write_file", path="new/deep/f.txt", content="héllo\n") == (
        "created new/deep/f.txt (7 bytes)"
    )
    assert (ws / "new" / "deep" / "f.txt").read_text() == "héllo\n"
    script = ws / "run.sh"
    script.write_text("old")
    script.chmod(0o750)
    assert await tools.text("write_file", path="run.sh", content="new") == "replaced run.sh (3 bytes)"
    assert script.read_text() == "new" and (script.stat().st_mode & 0o777) == 0o750
    assert sorted(p.name for p in ws.iterdir() if p.name.endswith(".tmp")) == []  # no temp left
    await tools.refused("write_file", "NOT_A_FILE", path="src", content="x")


async def test_edit_file_replaces_one_exact_match_and_refuses_ambiguity(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    tools = Tools(ws)
    target = ws / "c.py"
    target.write_text("a = 1\nb = 1\n")
    text = await tools.refused("edit_file", "EDIT_AMBIGUOUS", path="c.py", old_string="= 1", new_string="= 2")
    assert "occurs 2 times" in text and target.read_text() == "a = 1\nb = 1\n"
    await tools.refused("edit_file", "EDIT_NO_MATCH", path="c.py", old_string="zzz", new_string="y")
    await tools.refused("edit_file", "EDIT_NO_CHANGE", path="c.py", old_string="a", new_string="a")
    assert await tools.text("edit_file", path="c.py", old_string="a = 1", new_string="a = 3") == (
        "edited c.py (1 replacement)"
    )
    assert await tools.text("edit_file", path="c.py", old_string="= ", new_string="== ", replace_all=True) == (
        "edited c.py (2 replacements)"
    )
    assert target.read_text() == "a == 3\nb == 1\n"


async def test_list_dir_glob_and_grep(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    (ws / ".git").mkdir()
    (ws / ".git" / "config.py").write_text("hello = 1\n")
    tools = Tools(ws)
    assert (await tools.text("list_dir")).splitlines() == [
        ".git/",
        "abs-inner.md -> " + str(ws / "notes.md"),
        "away -> " + str(tmp_path / "outside"),
        "inner -> src/pkg",
        "leak.txt -> ../outside/secret.txt",
        "notes.md",
        "src/",
    ]
    assert await tools.text("list_dir", path="src") == "b.py\npkg/"
    assert await tools.text("glob", pattern="**/*.py") == "src/b.py\nsrc/pkg/a.py"
    assert await tools.text("glob", pattern="*.py", path="src") == "src/b.py"
    assert await tools.text("glob", pattern="*.rs") == "no files match *.rs"
    assert await tools.text("grep", pattern="hel+o") == "notes.md:2:hello world\nsrc/pkg/a.py:2:print('hello')"
    assert await tools.text("grep", pattern="HELLO", ignore_case=True, glob="*.py") == "src/pkg/a.py:2:print('hello')"
    assert await tools.text("grep", pattern="x", path="src/b.py") == "src/b.py:1:x = 1"
    await Tools(ws).refused("grep", "INVALID_PATTERN", pattern="(")


async def test_listing_caps_say_what_they_cut(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(5):
        (ws / f"f{i}.txt").write_text("match\nmatch\n")
    tools = Tools(ws, list_entries=3, grep_matches=4)
    assert (await tools.text("list_dir")).splitlines()[-1] == "… 2 more entries"
    assert (await tools.text("glob", pattern="*.txt")).splitlines()[-1] == "… 2 more files"
    lines = (await tools.text("grep", pattern="match")).splitlines()
    assert len(lines) == 5 and lines[-1] == "… 6 more matches (narrow the search with path or glob)"


async def test_run_command_shell_and_argv_with_the_exit_code(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    tools = Tools(ws)
    assert await tools.text("run_command", command="echo out; echo err >&2; exit 3") == "exit code: 3\nout\nerr"
    assert await tools.text("run_command", command=["ls", "src"], cwd=".") == "exit code: 0\nb.py\npkg"
    assert await tools.text("run_command", command="pwd", cwd="inner") == f"exit code: 0\n{ws}/src/pkg"
    outcome = await tools.call("run_command", command=["/no/such/program"])
    assert outcome.is_error and outcome.error == {"name": "ToolFailure", "code": "COMMAND_NOT_STARTED"}


async def test_run_command_keeps_the_head_and_tail_of_long_output(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    text = await Tools(ws, output_chars=20).text("run_command", command="seq 1 1000")
    # 3,893 bytes of output: the first 10 and the last 10 kept.
    assert text == "exit code: 0\n1\n2\n3\n4\n5\n\n… 3,873 bytes cut …\n\n999\n1000"


def test_run_command_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    fifo = ws / "pid"
    os.mkfifo(fifo)
    tools = Tools(ws)
    clock = trio.testing.MockClock()  # time moves only when the test moves it
    command = f"sleep 1000 & echo $! > {fifo}; wait"

    async def main() -> tuple[ToolOutcome, int]:
        outcome: list[ToolOutcome] = []

        async def call() -> None:
            outcome.append(await tools.call("run_command", command=command, timeout_seconds=5))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            sleeper = int(await trio.to_thread.run_sync(fifo.read_text))  # the shell has started it
            # From now on time jumps to the next deadline whenever every task waits: the tool's
            # timeout, once it is in its timeout scope (before that there is no deadline to jump
            # to; a fixed jump could come before the scope and move its deadline with it).
            clock.autojump_threshold = 0
        return outcome[0], sleeper

    outcome, sleeper = trio.run(main, clock=clock)
    assert outcome.is_error and outcome.error == {"name": "ToolFailure", "code": "COMMAND_TIMEOUT"}
    assert "timed out after 5s and was killed" in outcome.content[0]["text"]
    assert gone(sleeper)  # the background sleep went with its group


async def test_a_cancelled_turn_leaves_no_process_behind(tmp_path: Path) -> None:
    ws, _ = tree(tmp_path)
    fifo = ws / "pid"
    os.mkfifo(fifo)
    tools = Tools(ws)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: tools.call("run_command", command=f"echo $$ > {fifo}; exec sleep 1000"))
            pid = int(await trio.to_thread.run_sync(fifo.read_text))
            scope.cancel()
    assert gone(pid)
