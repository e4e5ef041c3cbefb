"""The workspace tools (README "Workspace tools"; SPEC §8): `read_file`, `write_file`, `edit_file`,
`list_dir`, `glob`, `grep`, `run_command`, acting inside one workspace root.

Paths are confined by `Workspace.locate` (workspace_paths.py): a call that would reach outside the
root is an error result and touches nothing. File work runs in worker threads behind one
`CapacityLimiter` per tool set; results are text the model reads, capped so one call cannot
flood the context (each cap is named in the result when it cut something). A failure is a
`ToolFailure` whose `{name, code}` the durable `tool/result` records.

`run_command` runs in the runtime's sandbox when it is on (README "Sandbox"; runtime/sandbox/):
its result says so, and a call may ask to leave the box (`unsandboxed` with a `reason`), which
is judged under its own permission name, `UNSANDBOXED`. Where the box cannot be made the call is
an error result (`SANDBOX_UNAVAILABLE`): it never falls back to running unconfined.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import attrs
import trio

from ..foundation.errors import ToolFailure
from ..foundation.json_values import JsonObject as Json
from ..sandbox.box import Sandbox, SandboxUnavailable
from ..sandbox.policy import PolicyRefused, SandboxPolicy
from .base import ToolContext
from .workspace_command import run_command
from .workspace_files import edit_text, glob_regex, list_folder, read_text, searchable_text, walk_files, write_text
from .workspace_paths import Workspace, refused

__all__ = ["READ_TOOLS", "UNSANDBOXED", "WORKSPACE_TOOL_NAMES", "WorkspaceLimits", "workspace_tools"]

T = TypeVar("T")

READ_TOOLS = ("read_file", "list_dir", "glob", "grep")
# The permission of a `run_command` call asking to run outside the sandbox (README "Sandbox").
UNSANDBOXED = "run_command_unsandboxed"
WORKSPACE_TOOL_NAMES = ("read_file", "write_file", "edit_file", "list_dir", "glob", "grep", "run_command")


@attrs.frozen(kw_only=True)
class WorkspaceLimits:
    """The caps of one tool set (defaults fit a model's context)."""

    read_lines: int = 2000  # lines `read_file` returns when no limit is given
    line_chars: int = 2000  # a longer line is cut
    file_bytes: int = 10 * 1024 * 1024  # files `read_file`, `edit_file` and `grep` take at most
    list_entries: int = 1000  # `list_dir` and `glob` entries shown
    grep_matches: int = 200  # `grep` lines shown
    output_chars: int = 30_000  # `run_command` output kept (its head and tail)
    command_timeout: float = 120.0  # `run_command` default, seconds
    max_command_timeout: float = 600.0
    threads: int = 4  # file work at once


def _schema(required: Sequence[str] = (), **properties: Json) -> Json:
    schema: Json = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def _p(kind: str | list[str], description: str, **more: Any) -> Json:
    return {"type": kind, "description": description, **more}


_PATH = _p("string", "A path relative to the workspace root (or absolute, inside it).")


@attrs.define
class _WorkspaceTool:
    workspace: Workspace
    limits: WorkspaceLimits
    limiter: trio.CapacityLimiter
    sandbox: Sandbox | None = None  # `run_command`'s box (None: commands run unconfined)
    # `run_command` as offered to one agent type's agents (`for_agent_type`): its description
    # and parameters tell of their box. Unset: offered to any agent, it tells of the runtime's.
    offered_to: tuple[str | None] | None = None
    name: ClassVar[str]  # and a description and parameters, each tool's own
    parallel_safe: ClassVar[bool] = True
    # Runs again when a crash cut it (docs/format.md, "Continued turns"): reads, and a
    # whole-file write; an edit or a command is in doubt instead.
    idempotent: ClassVar[bool] = False

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)


class _ReadFile(_WorkspaceTool):
    name: ClassVar[str] = "read_file"
    idempotent: ClassVar[bool] = True
    description: ClassVar[str] = (
        "Read a text file in the workspace. Returns numbered lines (`<n>\\t<line>`). Reads up to 2000 lines "
        "by default; use offset (1-based first line) and limit for other ranges of long files."
    )
    parameters: ClassVar[Json] = _schema(
        ("path",),
        path=_PATH,
        offset=_p("integer", "The first line to read, 1-based (default 1).", minimum=1),
        limit=_p("integer", "How many lines to read (default 2000).", minimum=1),
    )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        text, shown = await self._thread(lambda: read_text(self.workspace, args["path"], cap=self.limits.file_bytes))
        lines = text.splitlines()
        first = int(args.get("offset", 1))  # an integral float is an integer to the schema
        count = int(args.get("limit", self.limits.read_lines))
        if lines and first > len(lines):
            raise refused(f"{shown} has {len(lines)} lines; offset {first} is past its end", "BAD_RANGE")
        chosen = lines[first - 1 : first - 1 + count]
        width = self.limits.line_chars
        body = "\n".join(
            f"{n:6}\t{line if len(line) <= width else line[:width] + ' … (line cut)'}"
            for n, line in enumerate(chosen, start=first)
        )
        if not lines:
            return f"({shown} is empty)"
        rest = len(lines) - (first - 1 + len(chosen))
        if rest > 0:
            body += f"\n… {rest} more lines (read on with offset {first + len(chosen)})"
        return body


class _WriteFile(_WorkspaceTool):
    name: ClassVar[str] = "write_file"
    idempotent: ClassVar[bool] = True
    description: ClassVar[str] = (
        "Write a text file in the workspace, replacing it if it exists (its folders are made as needed). "
        "Prefer edit_file to change part of an existing file."
    )
    parameters: ClassVar[Json] = _schema(
        ("path", "content"), path=_PATH, content=_p("string", "The whole new content of the file.")
    )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        size, shown, existed = await self._thread(lambda: write_text(self.workspace, args["path"], args["content"]))
        return f"{'replaced' if existed else 'created'} {shown} ({size:,} bytes)"


class _EditFile(_WorkspaceTool):
    name: ClassVar[str] = "edit_file"
    description: ClassVar[str] = (
        "Replace an exact string in a workspace file. old_string must match the file exactly (whitespace "
        "included) and only once, unless replace_all is true; an ambiguous or missing match changes nothing."
    )
    parameters: ClassVar[Json] = _schema(
        ("path", "old_string", "new_string"),
        path=_PATH,
        old_string=_p("string", "The exact text to replace."),
        new_string=_p("string", "The text to put in its place."),
        replace_all=_p("boolean", "Replace every occurrence (default false)."),
    )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        count, shown = await self._thread(
            lambda: edit_text(
                self.workspace,
                args["path"],
                args["old_string"],
                args["new_string"],
                replace_all=args.get("replace_all", False),
                cap=self.limits.file_bytes,
            )
        )
        return f"edited {shown} ({count} {'replacement' if count == 1 else 'replacements'})"


class _ListDir(_WorkspaceTool):
    name: ClassVar[str] = "list_dir"
    idempotent: ClassVar[bool] = True
    description: ClassVar[str] = (
        "List a folder of the workspace (default: its root): folders end with /, symlinks show their target."
    )
    parameters: ClassVar[Json] = _schema(path=_p("string", "The folder, relative to the workspace root (default .)."))

    async def run(self, args: Json, ctx: ToolContext) -> str:
        entries, shown = await self._thread(lambda: list_folder(self.workspace, args.get("path", ".")))
        if not entries:
            return f"({shown} is empty)"
        return _capped(entries, self.limits.list_entries, "entries")


class _Glob(_WorkspaceTool):
    name: ClassVar[str] = "glob"
    idempotent: ClassVar[bool] = True
    description: ClassVar[str] = (
        "Find workspace files whose path matches a glob pattern (`*` and `?` within a path component, `**` "
        "across folders, e.g. `**/*.py`), relative to path (default the root). Symlinks are not followed; "
        ".git and .subagents are skipped."
    )
    parameters: ClassVar[Json] = _schema(
        ("pattern",),
        pattern=_p("string", "The glob pattern."),
        path=_p("string", "The folder to search in (default .)."),
    )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        regex = glob_regex(args["pattern"])
        base = args.get("path", ".")

        def find() -> list[str]:
            return [shown for shown, inner, _, _ in walk_files(self.workspace, base) if regex.match(inner)]

        found = await self._thread(find)
        if not found:
            return f"no files match {args['pattern']}"
        return _capped(found, self.limits.list_entries, "files")


class _Grep(_WorkspaceTool):
    name: ClassVar[str] = "grep"
    idempotent: ClassVar[bool] = True
    description: ClassVar[str] = (
        "Search workspace files for a regular expression (Python syntax); returns `path:line:text` lines. "
        "path narrows the search to a folder or one file, glob to file names matching a pattern "
        "(e.g. `*.py`). Binary files, .git and .subagents are skipped."
    )
    parameters: ClassVar[Json] = _schema(
        ("pattern",),
        pattern=_p("string", "The regular expression."),
        path=_p("string", "A folder or file to search (default .)."),
        glob=_p("string", "Only files whose name matches this glob."),
        ignore_case=_p("boolean", "Match without regard to case (default false)."),
    )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        try:
            regex = re.compile(args["pattern"], re.IGNORECASE if args.get("ignore_case") else 0)
        except re.error as exc:
            raise refused(f"bad regular expression {args['pattern']!r}: {exc}", "INVALID_PATTERN") from None
        names = glob_regex(args["glob"]) if "glob" in args else None
        most = self.limits.grep_matches
        width = self.limits.line_chars

        def search() -> tuple[list[str], int]:
            hits: list[str] = []
            more = 0
            for shown, _, name, fd in walk_files(self.workspace, args.get("path", ".")):
                if names is not None and not names.match(name):
                    continue
                text = searchable_text(name, fd, self.limits.file_bytes)
                if text is None:
                    continue
                for n, line in enumerate(text.splitlines(), start=1):
                    if regex.search(line):
                        if len(hits) < most:
                            hits.append(f"{shown}:{n}:{line if len(line) <= width else line[:width] + ' …'}")
                        else:
                            more += 1
            return hits, more

        hits, more = await self._thread(search)
        if not hits:
            return f"no matches for {args['pattern']}"
        if more:
            hits.append(f"… {more} more matches (narrow the search with path or glob)")
        return "\n".join(hits)


class _RunCommand(_WorkspaceTool):
    name: ClassVar[str] = "run_command"
    description_unconfined: ClassVar[str] = (
        "Run a command in the workspace: a shell string (run by /bin/sh) or an argv array. stdout and stderr "
        "come back merged with the exit code; long output keeps its head and tail. The command is killed "
        "(with everything it started) when the timeout passes. stdin is empty."
    )
    _SANDBOXED: ClassVar[str] = (
        " It runs in a sandbox: {writable} writable, the rest of the file system read-only, /tmp "
        "private and empty, the network {network}, credentials hidden and API keys unset; every process it "
        "started ends with it. A command that truly needs more may ask to run outside the sandbox "
        "(unsandboxed: true, with a reason); a person must approve that, and unattended runs refuse it."
    )
    _COMMAND: ClassVar[Json] = {
        "type": ["string", "array"],
        "description": "A shell command line, or the program and its arguments as an array.",
        "items": {"type": "string"},
        "minItems": 1,
        "minLength": 1,
    }
    _TIMEOUT: ClassVar[Json] = _p(
        "number", "Seconds before the command is killed (default 120, at most 600).", minimum=0
    )
    _CWD: ClassVar[Json] = _p("string", "The folder to run in, relative to the workspace root (default .).")
    parallel_safe: ClassVar[bool] = False  # commands may depend on each other's effects: model order

    _OUTSIDE: ClassVar[str] = (
        " It runs outside the sandbox (your agent type turns it off): a person must approve each command, "
        "and unattended runs refuse it."
    )

    def for_agent_type(self, agent_type: str | None) -> _RunCommand:
        """This tool as offered to an agent of `agent_type` (tools/base.py `ToolSet.for_agent_type`)."""
        if self.sandbox is None or not self.sandbox.by_type:
            return self  # every agent's box is the runtime's: one description fits all
        return attrs.evolve(self, offered_to=(agent_type,))

    def _offered_policy(self) -> SandboxPolicy | None:
        """The box the description tells of: the offered agent type's, else the runtime's."""
        if self.sandbox is None:
            return None
        return self.sandbox.policy if self.offered_to is None else self.sandbox.policy_for(self.offered_to[0])

    @property
    def description(self) -> str:
        policy = self._offered_policy()
        if self.sandbox is None or policy is None:
            return self.description_unconfined
        if not policy.on:
            return self.description_unconfined + (self._OUTSIDE if self.sandbox.on else "")
        writable = ", ".join(("the workspace", *policy.writable, *policy.type_writable))
        network = "on" if policy.network else "off"
        return self.description_unconfined + self._SANDBOXED.format(writable=writable, network=network)

    @property
    def parameters(self) -> Json:
        policy = self._offered_policy()
        # Offered to any agent, the way out is offered where any box exists; to one type's, where its does.
        leaving = self.sandbox is not None and (
            self.sandbox.ever_on if self.offered_to is None else policy is not None and policy.on
        )
        if not leaving:
            return _schema(("command",), command=self._COMMAND, timeout_seconds=self._TIMEOUT, cwd=self._CWD)
        return _schema(
            ("command",),
            command=self._COMMAND,
            timeout_seconds=self._TIMEOUT,
            cwd=self._CWD,
            unsandboxed=_p("boolean", "Run outside the sandbox (needs a person's approval; default false)."),
            reason=_p("string", "Why the command must run outside the sandbox (required with unsandboxed)."),
        )

    @property
    def permission_names(self) -> tuple[str, ...]:
        """The names its calls are judged under (tools/permissions.py): leaving the box is its own."""
        return (self.name, UNSANDBOXED) if self.sandbox is not None else (self.name,)

    def permission_name(self, args: Json, ctx: ToolContext) -> str:
        """`UNSANDBOXED` for a call that runs outside a box its agent would otherwise be in: one
        asking to (`unsandboxed`), or any of an agent whose type turns the sandbox off while the
        runtime's is on."""
        if self.sandbox is None:
            return self.name
        policy = self.sandbox.policy_for(_agent_type(ctx))
        if policy.on:
            return UNSANDBOXED if args.get("unsandboxed") is True else self.name
        return UNSANDBOXED if self.sandbox.on else self.name

    async def run(self, args: Json, ctx: ToolContext) -> str:
        limits = self.limits
        timeout = min(float(args.get("timeout_seconds", limits.command_timeout)), limits.max_command_timeout)
        cwd = await self._thread(lambda: _folder(self.workspace, args.get("cwd", ".")))
        command: str | list[str] = args["command"]
        env: Mapping[str, str] | None = None
        ran = ""
        kind = _agent_type(ctx)
        policy = self.sandbox.policy_for(kind) if self.sandbox is not None else None
        if policy is not None and policy.on and args.get("unsandboxed") is True:
            reason = str(args.get("reason", "")).strip()
            if not reason:
                raise refused("unsandboxed: true needs a reason (say why the sandbox is not enough)", "REASON_MISSING")
            ran = " (ran outside the sandbox)"
        elif self.sandbox is not None and policy is not None and policy.on:
            argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
            try:
                command, env = await self.sandbox.wrap(argv, workspace=self.workspace.root, cwd=cwd, policy=policy)
            except SandboxUnavailable as exc:
                raise ToolFailure(f"run_command did not run: {exc}", code="SANDBOX_UNAVAILABLE") from None
            except PolicyRefused as exc:
                raise ToolFailure(f"run_command did not run: {exc}", code="SANDBOX_REFUSED") from None
            except OSError as exc:  # the program is missing, or hidden in the box
                raise ToolFailure(
                    f"the command cannot start: {exc.strerror or exc}", code="COMMAND_NOT_STARTED"
                ) from None
            ran = f" (sandboxed: {policy.summary()})"
        elif self.sandbox is not None and self.sandbox.on:
            ran = f" (ran outside the sandbox: agent type {kind!r} turns it off)"
        try:
            outcome = await run_command(command, cwd=cwd, time_limit=timeout, cap=limits.output_chars, env=env)
        except OSError as exc:
            raise ToolFailure(f"the command cannot start: {exc.strerror or exc}", code="COMMAND_NOT_STARTED") from None
        if outcome.timed_out:
            raise ToolFailure(
                f"the command timed out after {timeout:g}s and was killed{ran}; its output so far:\n{outcome.output}",
                code="COMMAND_TIMEOUT",
            )
        return f"exit code: {outcome.exit_code}{ran}\n{outcome.output}".rstrip("\n")


def _agent_type(ctx: ToolContext) -> str | None:
    """The agent type the calling agent was spawned as (its header's `agent_preset`), if any."""
    session = getattr(ctx.agent, "session", None)
    header = getattr(session, "header", None)
    preset = getattr(header, "agent_preset", None)
    return preset if isinstance(preset, str) else None


def _folder(ws: Workspace, path: str) -> str:
    """The real path of a folder inside the workspace (a process's cwd is a path, not an fd)."""
    with ws.locate(path) as loc:
        if loc.name:
            try:
                fd = os.open(loc.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=loc.dir_fd)
            except OSError:
                raise refused(f"{loc.shown} is not a folder", "NOT_A_FOLDER") from None
            os.close(fd)
        return ws.root if loc.shown == "." else f"{ws.root}/{loc.shown}"


def _capped(items: list[str], most: int, what: str) -> str:
    if len(items) <= most:
        return "\n".join(items)
    return "\n".join([*items[:most], f"… {len(items) - most} more {what}"])


_TOOLS: tuple[type[_WorkspaceTool], ...] = (_ReadFile, _WriteFile, _EditFile, _ListDir, _Glob, _Grep, _RunCommand)


def workspace_tools(root: str, limits: WorkspaceLimits | None = None, *, sandbox: Sandbox | None = None) -> list[Any]:
    """The seven workspace tools acting in `root` (an existing folder); `run_command` runs in
    `sandbox` when it is on (README "Sandbox")."""
    limits = limits or WorkspaceLimits()
    workspace = Workspace(root)
    limiter = trio.CapacityLimiter(limits.threads)
    return [tool(workspace, limits, limiter, sandbox) for tool in _TOOLS]
