"""The `subagents` command line (README, "The CLI"): the parser and `main`, which sends each
command to its group's module — `run` (run, chat, acp, demo), `listings` (children, agents,
sessions, show), `operator` (send, interrupt, stop, tail), `store` (store init, export,
import), `serve` (serve, hosts) and `scenario` — with what they share in `common`.

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
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import trio

from ...foundation.errors import CommandFailed, UsageError
from ...models.defaults import DEFAULT_MODEL

# Only what every command needs, and what the read-only commands (`children`, `agents`,
# `sessions`, `show`, `tail`, `config`) need, is imported here: the agent loop, the models, the
# tools, the demo and the scenarios load inside the commands that run them (issue 20, start-up;
# tests/runtime/test_startup_imports.py).
from .common import (
    STALL_HELP,
    STORE_HELP,
    Parser,
    check_session_arg,
    command_setup,
    iso_time,
    one_line,
    raise_open_file_limit,
    read_only_store,
    until_interrupted,
    version,
)
from .listings import children_command, sessions_command, show_command
from .operator import OPERATOR_COMMANDS, add_operator_commands, operator_main
from .scenario import add_scenario_command, scenario_main
from .serve import add_serve_commands, hosts_command, serve_command
from .store import add_store_commands, select_store, transfer_command
from .web import add_web_command, web_main

if TYPE_CHECKING:
    from .common import Commands

__all__ = ["build_parser", "iso_time", "main"]


class _VersionAction(argparse.Action):
    """`--version`: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        print(f"{parser.prog} {version()}")  # on stdout, as argparse's own version action
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The `subagents` parser: every command, each group's parsers made by its module."""
    parser = Parser(
        prog="subagents",
        description=(
            "trio-subagents: a Trio runtime for LLM agents with durable background subagents. "
            "Every session is an append-only log under --root; children survive restarts."
        ),
    )
    parser.add_argument("--version", action=_VersionAction, help="show the version and exit")
    root = Parser(add_help=False)
    root.add_argument("--root", default="./.subagents", help="the store root (default: ./.subagents)")
    root.add_argument("--store", metavar="URL", default=None, help=STORE_HELP)
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
    add_scenario_command(commands)
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
    run.add_argument(
        "prompt",
        metavar="PROMPT",
        nargs="?",
        help="the user message to send (without one, --session ID resumes the session: an interrupted turn goes on)",
    )
    run.add_argument("--session", metavar="ID", help="resume this session (or create it with this id)")
    _budget_options(run)
    _run_shape(run)
    resume = commands.add_parser(
        "resume",
        parents=[root, model_options],
        help="resume a session: an interrupted turn goes on, waiting notices and mail are taken, then the answer",
    )
    resume.add_argument("session_id", metavar="ID", help="the session to resume")
    _run_shape(resume)
    _add_acp(commands, model_options)
    _chat_parser(commands, root, model_options)
    add_operator_commands(commands, root, model_options)
    add_serve_commands(commands, root, model_options)
    add_web_command(commands, root)
    add_store_commands(commands)
    return parser


def _run_shape(run: Parser) -> None:
    """What `run` and `resume` share: the form of new logs and of the output."""
    run.add_argument("--compression", choices=("zstd", "none"), default="zstd", help="the form of new logs")
    shape = run.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help='print {"session_id": ..., "output": ...}')
    shape.add_argument(
        "--stream",
        action="store_true",
        help="print every durable event of the session and its descendants as a JSON line, then a result line",
    )


def _model_options() -> Parser:
    """The model options every host command (`run`, `chat`, `acp`) takes."""
    options = Parser(add_help=False)
    options.add_argument(
        "--model",
        default=None,
        help=f"scripted:PATH, deepseek:MODEL, openai:MODEL or anthropic:MODEL[,thinking=N] (default: subagents.toml's, else {DEFAULT_MODEL})",
    )
    options.add_argument(
        "--workspace",
        metavar="DIR",
        default=None,
        help="the folder the workspace tools act in (default: subagents.toml's, else the current folder)",
    )
    options.add_argument("--base-url", metavar="URL", help="the API base URL (requests go to URL/chat/completions)")
    options.add_argument("--stall-timeout", metavar="SECONDS", default=None, help=STALL_HELP)
    return options


def _add_acp(commands: Commands, model_options: Parser) -> None:
    acp = commands.add_parser(
        "acp", parents=[model_options], help="an Agent Client Protocol agent on stdin/stdout (for editors such as Zed)"
    )
    acp.add_argument("--root", default="./.subagents", help="the store root (default: ./.subagents)")
    acp.add_argument("--store", metavar="URL", default=None, help=STORE_HELP)


def _chat_parser(commands: Commands, root: Parser, model_options: Parser) -> None:
    chat = commands.add_parser(
        "chat", parents=[root, model_options], help="an interactive session (created or resumed)"
    )
    chat.add_argument("--session", metavar="ID", help="resume this session (or create it with this id)")
    chat.add_argument("--compression", choices=("zstd", "none"), default="zstd", help="the form of new logs")
    _budget_options(chat)


def _budget_options(command: Parser) -> None:
    """The root session's budget, over subagents.toml's [budget] (README "Budgets")."""
    group = command.add_argument_group("budget (shared with every subagent below the session)")
    group.add_argument("--budget-tokens", metavar="N", default=None, help="tokens of every kind the tree may use")
    group.add_argument("--budget-cost", metavar="AMOUNT", default=None, help="cost at [prices] the tree may run up")
    group.add_argument("--budget-turns", metavar="N", default=None, help="turns the session may start")


class _OneLineHandler(logging.Handler):
    """A log record as one line on stderr: no traceback, newlines folded."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = one_line(record.getMessage())
        except Exception:  # a record whose arguments do not format: say what it was about
            text = one_line(str(record.msg))
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


def config_command(args: argparse.Namespace) -> int:
    """`config`: every key with its value and source, then the agent types found."""
    from ...config import load_config, user_config_dir
    from ...delegation.agent_types import agent_type_dirs, load_agent_types
    from ...telemetry.settings import tracing_rows

    config = load_config(".")
    # The tracing in effect: the [telemetry] keys with the OTEL_* variables over them.
    tracing = tracing_rows(
        enabled=config.telemetry_enabled,
        endpoint=config.telemetry_endpoint,
        capture_content=config.telemetry_capture_content,
        sources=config.sources,
        env=os.environ,
    )
    types, problems = load_agent_types(agent_type_dirs(".", user_config_dir()))
    tracing = [*tracing, _sandbox_row(config.sandbox_mode)]
    if args.json:
        document = {
            "values": [{"key": k, "value": v, "source": src} for k, v, src in [*config.rows(), *tracing]],
            "files": list(config.files),
            "agent_types": [{"name": t.name, "path": t.path} for t in types.values()],
            "agent_type_problems": [{"path": p.path, "reason": p.reason} for p in problems],
        }
        print(json.dumps(document, ensure_ascii=False, default=list))
        return 0
    rows = [
        (key, json.dumps(value, ensure_ascii=False, default=list), source)
        for key, value, source in [*config.rows(), *tracing]
    ]
    width = max(len(key) + len(value) for key, value, _ in rows) + 3
    for key, value, source in rows:
        print(f"{f'{key} = {value}':<{width}}  # {source}")
    for kind in sorted(types.values(), key=lambda t: t.name):
        print(f"agent type {kind.name}  # {kind.path}")
    for problem in problems:
        print(f"agent type left out: {problem.path}: {one_line(problem.reason)}")
    return 0


def _sandbox_row(mode: str) -> tuple[str, str, str]:
    """Whether bubblewrap works here, and why not (README "Sandbox"): one trial run."""
    from ...sandbox.probe import FIX, probe_bwrap

    probed = probe_bwrap(os.environ)
    shown = probed.describe()
    if not probed.works and mode == "on":
        shown += f"; run_command fails until you {FIX}"
    return ("sandbox.status", shown, "probe: bwrap --unshare-all … true")


def _command(args: argparse.Namespace) -> int:
    try:
        select_store(args)
        if args.command in ("store", "export", "import"):
            return transfer_command(args)
        if args.command in ("children", "agents"):
            check_session_arg(args.parent_id)
            read_only_store(args)
            raise_open_file_limit()
            return trio.run(children_command, args)
        if args.command in ("sessions", "show"):
            if args.command == "show":
                check_session_arg(args.session_id)
            read_only_store(args)
            raise_open_file_limit()
            return trio.run(sessions_command if args.command == "sessions" else show_command, args)
        if args.command == "scenario":
            return scenario_main(args)
        if args.command == "config":
            return config_command(args)
        if args.command == "resume":
            args.session, args.prompt = args.session_id, None  # `run --session ID` without a prompt
            args.command = "run"
        if args.command in ("run", "chat", "acp", "demo"):
            from .run import run_main

            return run_main(args)
        if args.command in (*OPERATOR_COMMANDS, "tail"):
            return operator_main(args)
        if args.command == "serve":
            setup = command_setup(args)
            raise_open_file_limit()
            return trio.run(until_interrupted, serve_command, args, setup)
        if args.command == "hosts":
            return hosts_command(args)
        if args.command == "web":
            return web_main(args)
    except UsageError as exc:
        print(f"subagents: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"subagents: {one_line(str(exc))}", file=sys.stderr)
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
