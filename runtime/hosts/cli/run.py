"""The commands that run agents: `run`, `chat`, `acp` and `demo` (README, "The CLI").

Each is checked as a whole before a runtime opens (`common`); the runtime, the models, the
tools, the chat and the demo load inside the command that needs them (issue 20, start-up).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import TYPE_CHECKING

import trio
from subagents.storage import SessionNotFound, StorageError

from ...foundation.errors import AgentError, AgentStopped, SubagentsError, UsageError
from ..run_output import RunWatch, result_line, stdout_binary, watch_run
from .common import (
    Interrupt,
    check_session_arg,
    command_setup,
    print_stdout,
    raise_open_file_limit,
    until_interrupted,
    version,
    writable_root,
    write_stdout,
)

if TYPE_CHECKING:
    from ...agent.loop import Agent, TurnResult
    from ...app import Runtime
    from ..chat.input import Lines
    from ..setup import HostSetup

__all__ = ["acp_command", "chat_command", "demo_command", "run_command", "run_main"]


def acp_command(args: argparse.Namespace) -> int:
    """`subagents acp`: checked like `run`, then served until stdin ends."""
    from ..acp.host import run_acp

    writable_root(args.root)
    setup = command_setup(args)
    raise_open_file_limit()
    # Unless a workspace was chosen (subagents.toml or --workspace), each session's workspace
    # tools act in the cwd its client gives (the editor's project).
    options = {**setup.runtime_options(), "store": args.store}
    per_session = options["workspace"] is not None and "workspace" not in setup.config.sources
    return trio.run(partial(run_acp, session_workspace=per_session), args.root, setup.model, version(), options)


def chat_command(args: argparse.Namespace) -> int:
    """`chat`: arguments checked as `run` checks them, then the chat (runtime/hosts/chat/host.py) on a
    terminal (prompt-toolkit) or on piped lines."""
    writable_root(args.root)
    if args.session is not None:
        check_session_arg(args.session)
    setup = command_setup(args)
    raise_open_file_limit()
    from rich.console import Console

    from ..chat.host import PipedLines, chat
    from ..chat.terminal import TerminalLines, TerminalOutput, history_path

    lines: Lines = PipedLines()
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


async def run_command(args: argparse.Namespace, setup: HostSetup, *, interrupt: Interrupt) -> int:
    from ...app import open_runtime
    from ..setup import headless_approver, mcp_failures

    options = {**setup.runtime_options(), "approver": headless_approver}
    async with open_runtime(
        args.root, model=setup.model, compression=args.compression, store=args.store, **options
    ) as runtime:
        for line in mcp_failures(runtime):
            print(f"subagents: {line} (its tools are not offered)", file=sys.stderr)
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
    if result is None and args.prompt is None and not interrupt.hit:
        # A resume that found nothing to do: no open turn, no waiting notice or mail.
        print(f"subagents: session {agent.session_id} had nothing to resume", file=sys.stderr)
        if args.stream and not watch.reader_gone:
            write_stdout(result_line(agent.session_id, "", watch.usage, {"kind": "completed"}, setup.config.prices))
        elif args.json:
            print_stdout(json.dumps({"session_id": agent.session_id, "output": ""}, ensure_ascii=False))
        return 0
    output = (result.text if result is not None else None) or ""
    reason = result.reason if result is not None else {"kind": "error", "message": "no turn ran"}
    between_turns = interrupt.hit and (result is None or reason["kind"] == "completed")
    if between_turns:
        # Ctrl-C while no turn of the root ran (before its first, or while only its children
        # worked): the run still ended as the person's abort.
        reason = {"kind": "aborted", "cause": "user"}
    if args.stream:
        if not watch.reader_gone:
            write_stdout(result_line(agent.session_id, output, watch.usage, reason, setup.config.prices))
    elif not interrupt.hit:
        if args.json:
            print_stdout(json.dumps({"session_id": agent.session_id, "output": output}, ensure_ascii=False))
        elif output or reason["kind"] == "completed":
            print_stdout(output)  # a failed turn that said nothing prints nothing (the error is on stderr)
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
    runtime: Runtime, args: argparse.Namespace, interrupt: Interrupt
) -> int | tuple[Agent, TurnResult | None, RunWatch]:
    """`run`'s work in an open runtime: the status when it ended early, else the agent, its
    last turn's result and what the watch saw."""
    watched = args.stream or _progress_wanted(args)
    # The stream starts where the log ended before the resume: its closers and a notice
    # turn it starts are part of this run.
    before = await _event_count(runtime, args.session) if watched else None
    try:
        agent = await _session_agent(runtime, args.session, create=args.prompt is not None)
    except (StorageError, AgentError) as exc:
        raise UsageError(str(exc)) from None  # a bad root, or a session that cannot be taken
    # Named before the work starts, so a person can resume it (`run --session ID`).
    print(f"session {agent.session_id}", file=sys.stderr, flush=True)
    result = None
    stopped: AgentStopped | None = None
    async with _watching(runtime, agent, args, before) as watch:
        with interrupt.cancels():  # the first Ctrl-C stops the work
            if args.prompt is not None:
                await agent.send(args.prompt)
            else:
                await _taken_up(runtime, agent)
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
        info, _held = await runtime.query.stat(session_id)  # the index's one worker slot
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


async def _session_agent(runtime: Runtime, session_id: str | None, *, create: bool = True) -> Agent:
    if session_id is None:
        return await runtime.agents.create()
    try:
        agent = await runtime.agents.resume(session_id)
    except SessionNotFound:
        if not create:  # a resume: there is nothing to resume
            raise UsageError(f"session {session_id!r} not found") from None
        return await runtime.agents.create(session_id=session_id)
    if runtime.agents.owners is not None:
        # What waited in its mailbox (settlements of its children, messages) is taken in before
        # the prompt's turn: no sweep resumes a root, so this host is the one that records it.
        await runtime.agents.owners.first_drain(session_id)
    return agent


async def _taken_up(runtime: Runtime, agent: Agent) -> None:
    """A resume without a prompt: until what was waiting for the session is in its hands — its
    mailbox drained once (queued mail), so the wait for the tree that follows does not end
    before that work starts. (An interrupted turn and undelivered notices start with the agent.)"""
    owners = runtime.agents.owners
    if owners is not None:
        await owners.first_drain(agent.session_id)


async def demo_command(args: argparse.Namespace, *, interrupt: Interrupt) -> int:
    from ..demo import run_demo

    try:
        return await run_demo(args.root, live=False if args.plain else None, store=args.store)
    except SubagentsError as exc:  # the root was checked before: the run failed
        print(f"subagents: demo failed: {exc}", file=sys.stderr)
        return 1


def run_main(args: argparse.Namespace) -> int:
    """`run`, `chat`, `acp` or `demo`: checked (a root they may create, the session id, the
    configuration), the open file limit raised, then run until done or Ctrl-C."""
    if args.command == "chat":
        return chat_command(args)
    if args.command == "acp":
        return acp_command(args)
    writable_root(args.root)
    if args.command == "demo":
        raise_open_file_limit()
        return trio.run(until_interrupted, demo_command, args)
    if args.session is not None:
        check_session_arg(args.session)
    elif args.prompt is None:
        raise UsageError("run needs a PROMPT (or --session ID to resume a session)")
    setup = command_setup(args)
    raise_open_file_limit()
    return trio.run(until_interrupted, run_command, args, setup)
