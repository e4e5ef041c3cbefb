"""The `subagents` command line (README, "The CLI").

Every argument is validated before the runtime opens; bad input (argparse's own usage errors
included) is one clear line on stderr and exit status 2; a damaged log `show` cannot read is one
line naming the seq or byte offset and exit status 1. Read-only commands never create the root
(they may refresh the index inside an existing one). Log records of the packages below are one
line each on stderr, and read-only commands print no warnings at all: the index is a cache, and
its trouble is not the reader's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

import trio
from subagents.storage import InvalidSessionId, SessionNotFound, StorageError, StoreUnreachable, check_session_id

from ...delegation.agents_text import render_agents
from ...delegation.listing import ChildRow
from ...foundation.errors import (
    AgentError,
    AgentStopped,
    CommandFailed,
    QuerySessionNotFound,
    ScenarioError,
    SessionQueryError,
    SubagentError,
    SubagentsError,
    UsageError,
)
from ...models.defaults import DEFAULT_MODEL, DEFAULT_STALL_TIMEOUT, parse_stall_timeout
from ...read_side import open_read_side
from ...usage import own_totals, tree_json, tree_totals
from ..run_output import RunWatch, drop_stdout, result_line, stdout_binary, watch_run
from ..transcript import render, transcript

# Only what every command needs, and what the read-only commands (`children`, `agents`,
# `sessions`, `show`, `tail`, `config`) need, is imported here: the agent loop, the models, the
# tools, the demo and the scenarios load inside the commands that run them (issue 20, start-up;
# tests/runtime/test_startup_imports.py).
from .operator import OPERATOR_COMMANDS, add_operator_commands, operator_command, runs_elsewhere, tail_command
from .serve import add_serve_commands, hosts_command, serve_command

if TYPE_CHECKING:
    from ...agent.loop import Agent, TurnResult
    from ...app import Runtime
    from ..setup import HostSetup

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit status 2), like every other
    piece of bad input; subcommand parsers are made of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"subagents: {_one_line(message)} (see '{self.prog} --help')\n")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _version() -> str:
    # Imported here: importlib.metadata loads email, zipfile and csv, which no other command needs.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trio-subagents")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        print(f"{parser.prog} {_version()}")  # on stdout, as argparse's own version action
        parser.exit(0)


_STALL_HELP = f"fail a scripted wait_for after this many seconds without progress (default: {DEFAULT_STALL_TIMEOUT:g})"


def _stall_timeout(args: argparse.Namespace) -> float:
    if args.stall_timeout is None:
        return DEFAULT_STALL_TIMEOUT
    try:
        return parse_stall_timeout(args.stall_timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="subagents",
        description=(
            "trio-subagents: a Trio runtime for LLM agents with durable background subagents. "
            "Every session is an append-only log under --root; children survive restarts."
        ),
    )
    parser.add_argument("--version", action=_VersionAction, help="show the version and exit")
    root = _Parser(add_help=False)
    root.add_argument("--root", default="./.subagents", help="the store root (default: ./.subagents)")
    root.add_argument("--store", metavar="URL", default=None, help=_STORE_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", help="what to do (each takes --help)")
    for name, what, shown in (
        ("children", "children", "list a session's subagent children"),
        ("agents", "continuable children", "a session's continuable children as list_agents shows them"),
    ):
        listing = commands.add_parser(name, parents=[root], help=f"{shown} (read-only)")
        listing.add_argument("parent_id", metavar="PARENT_ID", help=f"the session whose {what} to list")
        listing.add_argument("--descendants", action="store_true", help="the whole tree below PARENT_ID")
        if name == "children":
            listing.add_argument("--json", action="store_true", help="the rows as JSON")
    demo = commands.add_parser(
        "demo", parents=[root], help="a keyless story: background children, a restart, a cold resume"
    )
    demo.add_argument("--plain", action="store_true", help="print the plain log even on a terminal")
    scenario = commands.add_parser("scenario", help="run, check or update keyless scenarios")
    scenario.add_argument(
        "action",
        choices=("run", "check", "update"),
        metavar="ACTION",
        help="run: print the outputs; check: compare with the goldens; update: rewrite them",
    )
    scenario.add_argument("path", metavar="PATH", help="a scenario folder, or a folder of them")
    scenario.add_argument("--stall-timeout", metavar="SECONDS", default=None, help=_STALL_HELP)
    sessions = commands.add_parser("sessions", parents=[root], help="every session in the store (read-only)")
    sessions.add_argument("--json", action="store_true", help="one JSON object per session")
    show = commands.add_parser("show", parents=[root], help="a readable transcript of one session (read-only)")
    show.add_argument("session_id", metavar="ID", help="the session to show")
    show.add_argument("--json", action="store_true", help="the transcript entries as JSON")
    config = commands.add_parser(
        "config",
        help="the effective configuration (subagents.toml, user file, defaults) and where each value came from",
    )
    config.add_argument("--json", action="store_true", help="the rows as JSON")
    model_options = _model_options()
    run = commands.add_parser(
        "run",
        parents=[root, model_options],
        help="run one prompt in a session (created or resumed) and print the answer",
    )
    run.add_argument("prompt", metavar="PROMPT", help="the user message to send")
    run.add_argument("--session", metavar="ID", help="resume this session (or create it with this id)")
    run.add_argument("--compression", choices=("zstd", "none"), default="zstd", help="the form of new logs")
    shape = run.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help='print {"session_id": ..., "output": ...}')
    shape.add_argument(
        "--stream",
        action="store_true",
        help="print every durable event of the session and its descendants as a JSON line, then a result line",
    )
    _add_acp(commands, model_options)
    _chat_parser(commands, root, model_options)
    add_operator_commands(commands, root, model_options)
    add_serve_commands(commands, root, model_options)
    _add_transfer_commands(commands)
    return parser


_STORE_HELP = (
    "the store: postgresql://... for PostgreSQL (the logs and the mailbox), or a folder (the same as --root FOLDER)"
)


def _add_transfer_commands(commands: Any) -> None:
    """`store init`, `export` and `import` (runtime/hosts/cli/transfer.py)."""
    store = commands.add_parser("store", help="manage a PostgreSQL store")
    store.add_argument("action", choices=("init",), metavar="ACTION", help="init: create or migrate the schema")
    store.add_argument("url", metavar="URL", help="postgresql://...")
    export = commands.add_parser("export", help="copy every session of a PostgreSQL store into format-1 files")
    export.add_argument("--store", metavar="URL", required=True, help="the PostgreSQL store to read")
    export.add_argument("--to", metavar="DIR", required=True, help="the folder to write (a file store root)")
    export.add_argument("--compression", choices=("zstd", "none"), default="zstd", help="the form of the files")
    export.add_argument("--into-existing", action="store_true", help="write into a non-empty folder too")
    imp = commands.add_parser("import", help="copy every session of a file store into a PostgreSQL store")
    imp.add_argument("source", metavar="DIR", help="the file store root to read")
    imp.add_argument("--store", metavar="URL", required=True, help="the PostgreSQL store to write")


def _model_options() -> argparse.ArgumentParser:
    """The model options every host command (`run`, `chat`, `acp`) takes."""
    options = _Parser(add_help=False)
    options.add_argument(
        "--model",
        default=None,
        help=f"scripted:PATH, deepseek:MODEL or openai:MODEL (default: subagents.toml's, else {DEFAULT_MODEL})",
    )
    options.add_argument(
        "--workspace",
        metavar="DIR",
        default=None,
        help="the folder the workspace tools act in (default: subagents.toml's, else the current folder)",
    )
    options.add_argument("--base-url", metavar="URL", help="the API base URL (requests go to URL/chat/completions)")
    options.add_argument("--stall-timeout", metavar="SECONDS", default=None, help=_STALL_HELP)
    return options


def _add_acp(commands: Any, model_options: argparse.ArgumentParser) -> None:
    acp = commands.add_parser(
        "acp", parents=[model_options], help="an Agent Client Protocol agent on stdin/stdout (for editors such as Zed)"
    )
    acp.add_argument("--root", default="./.subagents", help="the store root (default: ./.subagents)")
    acp.add_argument("--store", metavar="URL", default=None, help=_STORE_HELP)


def _acp(args: argparse.Namespace) -> int:
    """`subagents acp`: checked like `run`, then served until stdin ends."""
    from ..acp.host import run_acp

    _writable_root(args.root)
    setup = _host_setup(args)
    _raise_open_file_limit()
    # Unless a workspace was chosen (subagents.toml or --workspace), each session's workspace
    # tools act in the cwd its client gives (the editor's project).
    options = {**setup.runtime_options(), "store": args.store}
    per_session = options["workspace"] is not None and "workspace" not in setup.config.sources
    return trio.run(partial(run_acp, session_workspace=per_session), args.root, setup.model, _version(), options)


def _chat_parser(commands: Any, root: argparse.ArgumentParser, model_options: argparse.ArgumentParser) -> None:
    chat = commands.add_parser(
        "chat", parents=[root, model_options], help="an interactive session (created or resumed)"
    )
    chat.add_argument("--session", metavar="ID", help="resume this session (or create it with this id)")
    chat.add_argument("--compression", choices=("zstd", "none"), default="zstd", help="the form of new logs")


def _writable_root(path: str) -> None:
    """A root `run` and `demo` may create or use: absent, or a folder whose sessions/ (if any)
    is a folder. Anything else is refused before a runtime opens on it."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"the root is not a folder: {path}")
    sessions = os.path.join(path, "sessions")
    if os.path.lexists(sessions) and (os.path.islink(sessions) or not os.path.isdir(sessions)):
        raise UsageError(f"not a subagents root (its sessions is not a folder): {path}")


def _select_store(args: argparse.Namespace) -> None:
    """`--store`, checked before anything runs: a folder stands for `--root` (and `args.store`
    becomes None); a PostgreSQL URL is connected to once (its schema created or checked), so a
    malformed URL, a refused connection or a newer schema is a usage error before any work."""
    spec = getattr(args, "store", None)
    if spec is None or args.command in ("store", "export", "import"):
        return
    if not _is_pg(spec):
        args.root, args.store = spec, None
        return
    # Only the commands that may create sessions create (or migrate) the schema; the others
    # say that the store is not initialized and write nothing.
    _open_pg(spec, create_schema=args.command in _CREATES_SCHEMA).close_store()


def _is_pg(spec: str) -> bool:
    from ...store_select import is_pg_url

    try:
        return is_pg_url(spec)
    except StorageError as exc:
        raise UsageError(str(exc)) from None


_CREATES_SCHEMA = ("run", "chat", "acp", "demo", "serve")  # and `store init`, `import` (_transfer_command)


def _open_pg(url: str, *, create_schema: bool = True) -> Any:
    """The PostgreSQL store at `url`, or `UsageError` in one line (exit status 2)."""
    from ...store_select import open_log_store

    if not _is_pg(url):
        raise UsageError(f"not a PostgreSQL URL (postgresql://...): {url}")
    try:
        return open_log_store(url, create_schema=create_schema)
    except StorageError as exc:
        raise UsageError(str(exc)) from None


def _read_only_store(args: argparse.Namespace) -> None:
    """A read-only command's store exists: a PostgreSQL store was checked by `_select_store`;
    a folder must be a root."""
    if args.store is None:
        _read_only_root(args.root)


def _transfer_command(args: argparse.Namespace) -> int:
    """`store init`, `export`, `import`: one line per session copied, then a summary."""
    from subagents.storage import FileLogStore

    from ...store_select import store_label
    from .transfer import copy_sessions, empty_folder

    if args.command == "export" and not empty_folder(args.to) and not args.into_existing:
        raise UsageError(f"the target folder is not empty (--into-existing to write into it): {args.to}")
    if args.command == "import":
        _read_only_root(args.source)
    pg = _open_pg(args.url if args.command == "store" else args.store, create_schema=args.command != "export")
    try:
        if args.command == "store":
            count = len(pg.list())
            print(f"store init: {store_label(pg)}: schema ready ({count} sessions)")
            return 0
        if args.command == "export":
            os.makedirs(args.to, exist_ok=True)
        files = FileLogStore(
            args.to if args.command == "export" else args.source, compression=getattr(args, "compression", "zstd")
        )
        try:
            source, target = (pg, files) if args.command == "export" else (files, pg)
            copied = copy_sessions(source, target)
        finally:
            files.close_store()
    finally:
        pg.close_store()
    for one in copied:
        print(f"{args.command}: {one.session_id} ({one.events} events)")
    where = f"to {args.to}" if args.command == "export" else f"into {store_label(pg)}"
    print(f"{args.command}: {len(copied)} sessions, {sum(c.events for c in copied)} events {where}")
    return 0


def _read_only_root(path: str) -> str:
    if not os.path.isdir(os.path.join(path, "sessions")):
        raise UsageError(f"not a subagents root: {path}")
    return path


async def _children(args: argparse.Namespace) -> int:
    rows, created = await _list(args)
    if args.command == "agents":
        # Nothing runs in this process: a continuable child is `running` when another process
        # holds it (the listing says so), `ready` otherwise.
        running = {row.id for row in rows if isinstance(row, ChildRow) and row.activity == "running"}
        print(render_agents(rows, args.descendants, lambda sid: "running" if sid in running else "ready"))
    elif args.json:
        print(json.dumps([row.to_json() for row in rows], ensure_ascii=False))
    else:
        _print_table(rows, args.descendants, created)
    return 0


async def _list(args: argparse.Namespace) -> tuple[list[Any], dict[str, int]]:
    async with open_read_side(args.root, store=args.store) as runtime:
        try:
            corpus = await runtime.query.list_sessions()
            if not any(record.id == args.parent_id for record in corpus):
                raise UsageError(f'session "{args.parent_id}" not found')
            created = {r.id: r.header.created_at for r in corpus if r.header is not None}
            if args.descendants:
                rows = await runtime.listing.list_descendants(args.parent_id)
            else:
                rows = await runtime.listing.list_children(args.parent_id)
        except (SessionQueryError, SubagentError) as exc:
            raise UsageError(exc.message) from None
    return list(rows), created


class _Interrupt:
    """Ctrl-C for a command. The command marks scopes with the Ctrl-C that cancels them
    (`cancels(on=1)`: the first; `on=2`: the second); the Nth Ctrl-C cancels every open scope
    marked N or lower, and a scope entered after it is cancelled at once. A Ctrl-C no open
    scope waits for (a command that marked none, or a third one in `run`) cancels the whole
    command at once. Scopes, not the whole command: the runtime around them then closes
    normally and drains."""

    def __init__(self, everything: trio.CancelScope) -> None:
        self.hits = 0
        self._everything = everything
        self._scopes: list[tuple[int, trio.CancelScope]] = []

    @property
    def hit(self) -> bool:
        """Ctrl-C came at least once."""
        return self.hits > 0

    @contextmanager
    def cancels(self, on: int = 1) -> Iterator[trio.CancelScope]:
        with trio.CancelScope() as scope:
            entry = (on, scope)
            self._scopes.append(entry)
            if self.hits >= on:
                scope.cancel()
            try:
                yield scope
            finally:
                self._scopes.remove(entry)

    def fire(self) -> None:
        self.hits += 1
        if not any(on >= self.hits for on, _ in self._scopes):
            self._everything.cancel()
        for on, scope in self._scopes:
            if on <= self.hits:
                scope.cancel()


async def _until_interrupted(fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    """Run `fn(*args, interrupt=...)`; Ctrl-C makes the status 130. SIGINT is taken as a
    signal here, so no KeyboardInterrupt lands in some agent's task."""
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        status = 130
        refused: UsageError | None = None
        async with trio.open_nursery() as nursery:
            interrupt = _Interrupt(nursery.cancel_scope)

            async def on_interrupt() -> None:
                async for _ in signals:
                    interrupt.fire()

            async def body() -> None:
                nonlocal status, refused
                try:
                    status = await fn(*args, interrupt=interrupt)
                except UsageError as exc:
                    refused = exc  # raised below, bare: main() prints it as one line (exit 2)
                except StorageError as exc:
                    print(f"subagents: {_one_line(str(exc))}", file=sys.stderr)  # the store failed under the run
                    status = 1
                nursery.cancel_scope.cancel()

            nursery.start_soon(on_interrupt)
            nursery.start_soon(body)
        if refused is not None:
            raise refused
        return 130 if interrupt.hit else status


async def _run(args: argparse.Namespace, setup: HostSetup, *, interrupt: _Interrupt) -> int:
    from ...app import open_runtime
    from ..setup import headless_approver

    options = {**setup.runtime_options(), "approver": headless_approver}
    async with open_runtime(
        args.root, model=setup.model, compression=args.compression, store=args.store, **options
    ) as runtime:
        # Ctrl-C: the first stops the work and drains (below), the second stops the waiting for
        # stdout's reader; either way the runtime then closes normally. (A third stops it all.)
        with interrupt.cancels(on=2) as again:
            ran = await _run_in(runtime, args, interrupt)
        if again.cancelled_caught:
            print("subagents: interrupted again: stopped without waiting for the rest", file=sys.stderr)
            return 130
    if isinstance(ran, int):
        return ran
    agent, result, watch = ran
    output = (result.text if result is not None else None) or ""
    reason = result.reason if result is not None else {"kind": "error", "message": "no turn ran"}
    between_turns = interrupt.hit and (result is None or reason["kind"] == "completed")
    if between_turns:
        # Ctrl-C while no turn of the root ran (before its first, or while only its children
        # worked): the run still ended as the person's abort.
        reason = {"kind": "aborted", "cause": "user"}
    if args.stream:
        if not watch.reader_gone:
            _write_stdout(result_line(agent.session_id, output, watch.usage, reason))
    elif not interrupt.hit:
        if args.json:
            _print_stdout(json.dumps({"session_id": agent.session_id, "output": output}, ensure_ascii=False))
        else:
            _print_stdout(output)
    if between_turns:
        print("subagents: interrupted while no turn ran (running subagents were stopped)", file=sys.stderr)
    elif reason["kind"] != "completed":
        detail = f": {reason['message']}" if reason.get("message") else ""
        cause = f" ({reason['cause']})" if reason.get("cause") else ""
        print(f"subagents: the turn ended {reason['kind']}{cause}{detail}", file=sys.stderr)
    if interrupt.hit:
        return 130
    return 0 if reason["kind"] == "completed" else 1


async def _run_in(
    runtime: Runtime, args: argparse.Namespace, interrupt: _Interrupt
) -> int | tuple[Agent, TurnResult | None, RunWatch]:
    """`run`'s work in an open runtime: the status when it ended early, else the agent, its
    last turn's result and what the watch saw."""
    watched = args.stream or _progress_wanted(args)
    # The stream starts where the log ended before the resume: its closers and a notice
    # turn it starts are part of this run.
    before = await _event_count(runtime, args.session) if watched else None
    try:
        agent = await _session_agent(runtime, args.session)
    except (StorageError, AgentError) as exc:
        raise UsageError(str(exc)) from None  # a bad root, or a session that cannot be taken
    # Named before the work starts, so a person can resume it (`run --session ID`).
    print(f"session {agent.session_id}", file=sys.stderr, flush=True)
    result = None
    stopped: AgentStopped | None = None
    async with _watching(runtime, agent, args, before) as watch:
        with interrupt.cancels():  # the first Ctrl-C stops the work
            await agent.send(args.prompt)
            try:
                result = await runtime.subagents.wait_tree_idle(agent)
            except AgentStopped as exc:
                stopped = exc
        if interrupt.hit and stopped is None:
            # Inside the watch, so the stream and the progress follow the drain to its end.
            # Shielded, as the runtime's own close is (and bounded by the same graces): the
            # second Ctrl-C stops the waiting for stdout's reader, not a write to a log.
            with trio.CancelScope(shield=True):
                result = await _drain_on_ctrl_c(runtime, agent)
    if stopped is not None:
        print(f"subagents: {stopped}", file=sys.stderr)
        return 1
    return agent, result, watch


async def _drain_on_ctrl_c(runtime: Runtime, agent: Agent) -> TurnResult | None:
    """Ctrl-C: the root's turn is cancelled at once (two-phase, cause `user`) and closes; then
    the run drains as the runtime's close would — every resident descendant stopped (cause
    `disposed`; its settlement recorded in its parent's log, no notice turn started) — and the
    root is released, then any other agent. Each wait is bounded by the registry's drain
    grace. Every closer is durable when this returns, so the watch streams it; the root's last
    turn result, if one ended in this run."""
    agent.cancel("user")
    with trio.move_on_after(runtime.agents.drain_grace):
        await agent.wait_turn_closed()  # so its children's settlements land after its turn/end
    await runtime.subagents.drain()
    await runtime.agents.stop(agent.session_id, cause="user")
    await runtime.agents.aclose()  # any other agent, as the close would (none in a plain run)
    return agent.last_result


def _progress_wanted(args: argparse.Namespace) -> bool:
    """Progress goes to stderr when it is a terminal, unless `--stream` lines go to the same
    terminal."""
    return sys.stderr.isatty() and not (args.stream and sys.stdout.isatty())


async def _event_count(runtime: Runtime, session_id: str | None) -> int | None:
    """How many events the session's log holds now (0 for a new session; None: unknown)."""
    if session_id is None:
        return 0
    try:
        info, _held = await runtime.query.reader.stat(session_id)  # the index's one worker slot
    except StorageError:
        return None  # the resume below says what is wrong with it
    return 0 if info is None else int(info.event_count) if info.damage is None else None


def _watching(
    runtime: Runtime, agent: Agent, args: argparse.Namespace, before: int | None
) -> AbstractAsyncContextManager[RunWatch]:
    """`run`'s event stream (from `before`, else from now): JSON lines with `--stream`,
    progress on a terminal, nothing extra otherwise."""
    progress = None
    if _progress_wanted(args):
        from rich.console import Console

        progress = Console(file=sys.stderr)
    stream_to = stdout_binary() if args.stream else None
    start = agent.session.durable_next if before is None else before
    return watch_run(runtime, agent.session_id, start, stream_to=stream_to, progress=progress)


def _write_stdout(data: bytes) -> None:
    """Write `data` to stdout; a reader that went away (`run | head`) is not an error of the
    run's: stdout is pointed at /dev/null and the run's own exit status stands."""
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        drop_stdout(sys.stdout.buffer)


def _print_stdout(text: str) -> None:
    """`print(text)` to stdout, flushed; a reader that went away is handled as above."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        drop_stdout(sys.stdout.buffer)


async def _session_agent(runtime: Runtime, session_id: str | None) -> Agent:
    if session_id is None:
        return await runtime.agents.create()
    try:
        return await runtime.agents.resume(session_id)
    except SessionNotFound:
        return await runtime.agents.create(session_id=session_id)


async def _scenario(action: str, dirs: list[Any], stall_timeout: float) -> int:
    from ...testing.scenario import check_scenario, run_scenario, update_scenario

    failed = 0
    for directory in dirs:
        try:
            if action == "run":
                import tempfile

                with tempfile.TemporaryDirectory(prefix="scenario-") as tmp:
                    result = await run_scenario(directory, tmp, stall_timeout=stall_timeout)
                print(json.dumps({"scenario": directory.name, "outputs": result.outputs}, ensure_ascii=False))
            elif action == "update":
                sessions = await update_scenario(directory, stall_timeout=stall_timeout)
                print(f"{directory.name}: updated ({len(sessions)} sessions)")
            else:
                problems = await check_scenario(directory, stall_timeout=stall_timeout)
                if problems:
                    failed += 1
                    print(f"{directory.name}: FAILED", file=sys.stderr)
                    for problem in problems:
                        print(problem, file=sys.stderr)
                else:
                    print(f"{directory.name}: ok")
        except ScenarioError as exc:
            raise UsageError(str(exc)) from None
    return 1 if failed else 0


async def _demo(args: argparse.Namespace, *, interrupt: _Interrupt) -> int:
    from ..demo import run_demo

    try:
        return await run_demo(args.root, live=False if args.plain else None, store=args.store)
    except SubagentsError as exc:  # the root was checked before: the run failed
        print(f"subagents: demo failed: {exc}", file=sys.stderr)
        return 1


async def _sessions(args: argparse.Namespace) -> int:
    async with open_read_side(args.root, store=args.store) as runtime:
        try:
            records = await runtime.query.list_sessions(probe_locks=True)
        except SessionQueryError as exc:
            raise UsageError(exc.message) from None
        # Usage (JSON only): own totals from cells and checkpoint rows (a log is read only when
        # neither answers), tree totals summed from those over the corpus's lineage, no more reads.
        own = await own_totals(runtime.query, records) if args.json else {}
    rows = [_session_row(r) for r in records]
    if args.json:
        trees = tree_totals(records, own)
        for row in rows:
            tokens, tree = own.get(row["id"]), trees.get(row["id"])
            row["usage"] = None if tokens is None else tokens.to_json()
            row["tree_usage"] = None if tree is None else tree_json(tree)
        print(json.dumps(rows, ensure_ascii=False))
        return 0
    if not rows:
        print("(no sessions)")
        return 0
    cells = []
    for row in rows:
        state = "live (another process)" if row["live_elsewhere"] else "live" if row["live"] else "persisted"
        cells.append(
            [
                row["id"],
                iso_time(row["created"]),
                row["origin"] or "-",
                row["parent"] or "-",
                _text(row["depth"]),
                _text(row["events"]),
                state,
                row["damage"] or "-",
            ]
        )
    print("\n".join(_table(["ID", "CREATED", "ORIGIN", "PARENT", "DEPTH", "EVENTS", "STATE", "DAMAGE"], cells)))
    return 0


def iso_time(ms: int | None) -> str:
    """Milliseconds since the epoch as ISO 8601 in UTC (`2026-12-01T13:17:21.123Z`)."""
    if ms is None:
        return "-"
    try:
        second = datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    except (OverflowError, OSError, ValueError):  # outside what a calendar date can say
        return str(ms)
    return f"{second}.{ms % 1000:03d}Z"


def _text(value: object) -> str:
    return "-" if value is None else _one_line(str(value))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, a header line first."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def _session_row(record: Any) -> dict[str, Any]:
    header = record.header
    return {
        "id": record.id,
        "created": header.created_at if header is not None else None,
        "origin": header.origin if header is not None else None,
        "parent": header.parent_session if header is not None else None,
        "depth": header.delegation_depth if header is not None else None,
        "events": record.event_count,
        "live": record.live or record.held,
        "live_elsewhere": record.held,  # another process holds its lock
        "persisted": record.persisted,
        "damage": record.damage,
    }


async def _show(args: argparse.Namespace) -> int:
    async with open_read_side(args.root, store=args.store) as runtime:
        try:
            async with runtime.query.observe_session(args.session_id) as observation:
                entries = transcript(
                    observation.events,
                    session_id=args.session_id,
                    inherited_event_count=observation.inherited_event_count,
                    inherited_from=observation.header.parent_session,
                    held=observation.held,
                )
        except QuerySessionNotFound:
            raise UsageError(f'session "{args.session_id}" not found') from None
        except SessionQueryError as exc:
            if isinstance(exc.__cause__, StoreUnreachable):  # the store did not answer: as a refused connection
                raise UsageError(exc.message) from None
            raise CommandFailed(exc.message) from None  # damaged, unsupported, unreadable
        except StorageError as exc:  # a payload the transcript could not decode
            seq = getattr(exc, "seq", None)
            at = f" (seq {seq})" if seq is not None and f"seq {seq}" not in str(exc) else ""
            raise CommandFailed(f"{exc}{at}") from None
    if args.json:
        print(json.dumps(entries, ensure_ascii=False))
    else:
        print("\n".join(render(entries)))
    return 0


def _print_table(rows: Sequence[Any], descendants: bool, created: dict[str, int]) -> None:
    if not rows:
        print("(no subagents)")
        return
    header = ["ID", *(["PARENT", "DEPTH"] if descendants else []), "STATE", "MODE", "CREATED", "CHILDREN", "LABEL"]
    cells = []
    for row in rows:
        where = [row.parent_id, str(row.depth)] if descendants else []
        when = iso_time(created.get(row.id))
        if isinstance(row, ChildRow):
            children = "yes" if row.has_children else "no"
            cells.append([row.id, *where, row.activity, row.mode, when, children, _text(row.label)])
        else:
            cells.append([row.id, *where, f"diagnostic: {row.reason}", "-", when, "-", "-"])
    print("\n".join(_table(header, cells)))


def _raise_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # keep the soft limit: listings still work, just with fewer files open at once


class _OneLineHandler(logging.Handler):
    """A log record as one line on stderr: no traceback, newlines folded."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = _one_line(record.getMessage())
        except Exception:  # a record whose arguments do not format: say what it was about
            text = _one_line(str(record.msg))
        sys.stderr.write(f"subagents: {record.levelname.lower()}: {text}\n")


@contextmanager
def _logging(level: int) -> Iterator[None]:
    """Records of the `subagents` packages at `level` or above as one line each, for the
    length of one command (an embedding program's own logging setup is left alone after)."""
    logger = logging.getLogger("subagents")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    handler = _OneLineHandler()
    logger.handlers = [handler]
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


_READ_ONLY = ("sessions", "show", "children", "agents", "tail")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        print("subagents: a command is required (see 'subagents --help')", file=sys.stderr)
        return 2
    # Read-only commands print no warnings (index trouble is a cache miss, not the reader's).
    with _logging(logging.ERROR if args.command in _READ_ONLY else logging.WARNING):
        return _command(args)


def _session_id_arg(session_id: str) -> None:
    try:
        check_session_id(session_id)
    except InvalidSessionId as exc:
        raise UsageError(exc.message) from None


def _host_setup(args: argparse.Namespace) -> HostSetup:
    """The configuration a host command (`run`, `chat`, `acp`) runs with: subagents.toml under
    its flags; a bad file, flag or model spec is a usage error. Agent type files that cannot be
    used are named on stderr once."""
    from ..setup import host_setup

    flags = {
        "model": args.model,
        "base_url": args.base_url,
        "stall_timeout": None if args.stall_timeout is None else _stall_timeout(args),
        "workspace": args.workspace,
    }
    setup = host_setup(flags)
    for problem in setup.problems:
        print(f"subagents: agent type {problem.path} left out: {_one_line(problem.reason)}", file=sys.stderr)
    return setup


def _config(args: argparse.Namespace) -> int:
    """`config`: every key with its value and source, then the agent types found."""
    from ...config import load_config, user_config_dir
    from ...delegation.agent_types import agent_type_dirs, load_agent_types

    config = load_config(".")
    types, problems = load_agent_types(agent_type_dirs(".", user_config_dir()))
    if args.json:
        document = {
            "values": [{"key": k, "value": v, "source": src} for k, v, src in config.rows()],
            "files": list(config.files),
            "agent_types": [{"name": t.name, "path": t.path} for t in types.values()],
            "agent_type_problems": [{"path": p.path, "reason": p.reason} for p in problems],
        }
        print(json.dumps(document, ensure_ascii=False, default=list))
        return 0
    rows = [(key, json.dumps(value, ensure_ascii=False, default=list), source) for key, value, source in config.rows()]
    width = max(len(key) + len(value) for key, value, _ in rows) + 3
    for key, value, source in rows:
        print(f"{f'{key} = {value}':<{width}}  # {source}")
    for kind in sorted(types.values(), key=lambda t: t.name):
        print(f"agent type {kind.name}  # {kind.path}")
    for problem in problems:
        print(f"agent type left out: {problem.path}: {_one_line(problem.reason)}")
    return 0


def _chat(args: argparse.Namespace) -> int:
    """`chat`: arguments checked as `run` checks them, then the chat (runtime/hosts/chat/host.py) on a
    terminal (prompt-toolkit) or on piped lines."""
    _writable_root(args.root)
    if args.session is not None:
        _session_id_arg(args.session)
    setup = _host_setup(args)
    _raise_open_file_limit()
    from rich.console import Console

    from ..chat.host import PipedLines, chat
    from ..chat.terminal import TerminalLines, TerminalOutput, history_path

    lines: Any = PipedLines()
    console = Console()
    if sys.stdin.isatty() and sys.stdout.isatty():
        output = TerminalOutput()
        lines, console = TerminalLines(output, history_path()), Console(file=output)
    return trio.run(
        lambda: chat(
            args.root,
            setup.model,
            session_id=args.session,
            compression=args.compression,
            lines=lines,
            console=console,
            runtime_options={**setup.runtime_options(), "store": args.store},
        )
    )


def _operator(args: argparse.Namespace) -> int:
    """`send`, `interrupt`, `stop`, `tail` (runtime/hosts/cli/operator.py)."""
    _session_id_arg(args.session_id)
    _read_only_store(args)
    if args.command == "tail":
        return trio.run(_until_interrupted, _tail, args)
    if args.command == "send" and not args.queue and not runs_elsewhere(args.store or args.root, args.session_id):
        # Nobody runs it: this process resumes it and runs the turn, as `run --session ID TEXT`
        # (a message to a cold target is answered by the sender's process, as inside a runtime).
        setup = _host_setup(args)
        _raise_open_file_limit()
        run_args = argparse.Namespace(
            **vars(args), session=args.session_id, prompt=args.text, compression="zstd", json=False, stream=False
        )
        return trio.run(_until_interrupted, _run, run_args, setup)
    return trio.run(operator_command, args)


async def _tail(args: argparse.Namespace, *, interrupt: _Interrupt) -> int:
    try:
        return await tail_command(args, write=_write_stdout)
    except CommandFailed as exc:  # a damaged log: one line, exit 1 (inside the interrupt's nursery)
        print(f"subagents: {_one_line(str(exc))}", file=sys.stderr)
        return 1


def _command(args: argparse.Namespace) -> int:
    try:
        _select_store(args)
        if args.command in ("store", "export", "import"):
            return _transfer_command(args)
        if args.command in ("children", "agents"):
            _session_id_arg(args.parent_id)
            _read_only_store(args)
            _raise_open_file_limit()
            return trio.run(_children, args)
        if args.command in ("sessions", "show"):
            if args.command == "show":
                _session_id_arg(args.session_id)
            _read_only_store(args)
            _raise_open_file_limit()
            return trio.run(_sessions if args.command == "sessions" else _show, args)
        if args.command == "scenario":
            from ...testing.scenario import scenario_dirs

            stall_timeout = _stall_timeout(args)
            try:
                dirs = scenario_dirs(args.path)
            except ScenarioError as exc:
                raise UsageError(str(exc)) from None
            return trio.run(_scenario, args.action, dirs, stall_timeout)
        if args.command == "demo":
            _writable_root(args.root)
            _raise_open_file_limit()
            return trio.run(_until_interrupted, _demo, args)
        if args.command == "config":
            return _config(args)
        if args.command == "chat":
            return _chat(args)
        if args.command == "run":
            _writable_root(args.root)
            if args.session is not None:
                _session_id_arg(args.session)
            setup = _host_setup(args)
            _raise_open_file_limit()
            return trio.run(_until_interrupted, _run, args, setup)
        if args.command == "acp":
            return _acp(args)
        if args.command in (*OPERATOR_COMMANDS, "tail"):
            return _operator(args)
        if args.command == "serve":
            setup = _host_setup(args)
            _raise_open_file_limit()
            return trio.run(_until_interrupted, serve_command, args, setup)
        if args.command == "hosts":
            return hosts_command(args)
    except UsageError as exc:
        print(f"subagents: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"subagents: {_one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`subagents sessions | head`): not an error of ours, and Python
        # must not complain again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    raise AssertionError(f"unhandled command {args.command!r}")
