"""What `run` writes while it works: `--stream` JSON lines on stdout, progress on a terminal.

Both read the event stream of the run's session (from the seq its prompt is written at) and its
descendants. `watch_run` owns one consumer task; when its block ends normally it finishes the
stream and waits until every event durable by then has been written, so the caller can print
the result line last. Writes to stdout go through a worker thread, a batch of ready lines per
hop: a slow reader of the pipe holds only this stream (its bounded buffers then fall back to
log reads), never the runtime's event loop; a cancelled watch (a second Ctrl-C) abandons a
write its reader is not taking.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, BinaryIO

import attrs
import trio

from ..event_stream import EventStream, StreamEvent, open_event_stream
from ..foundation.json_values import JsonValue
from ..foundation.pricing import PriceTable
from ..usage import MODEL, Tokens, cost_of, recorded_model, usage_of
from .run_progress import RunProgress, render_progress

if TYPE_CHECKING:  # annotations: `tail` writes through this module without the runtime, and rich loads late
    from rich.console import Console
    from rich.live import Live
    from subagents.storage import Event

    from ..app import Runtime

__all__ = ["RunWatch", "drop_stdout", "result_line", "watch_run"]

_TICK = 0.1  # seconds between refreshes of the live display (the spinner moves)


@attrs.define(eq=False)
class RunWatch:
    """What the watch saw: the token usage of the streamed events (`stream_usage`)."""

    usage: Tokens = attrs.field(factory=Tokens)
    reader_gone: bool = False  # stdout's reader went away: no more lines are written
    models: dict[str, str] = attrs.field(factory=dict)  # session → the model it runs (for cost)


def stream_usage(batch: list[StreamEvent], models: dict[str, str] | None = None) -> Tokens:
    """The usage the `assistant/message` events of `batch` record, own events only (a fork's
    inherited copies are its parent's, counted there): `runtime.usage`'s arithmetic, applied
    to what a run streamed — the root's events from the run's start and its descendants' —
    session by session, each call with the model its session recorded (`models`, kept across
    batches, is updated)."""
    models = {} if models is None else models
    by_session: dict[str, tuple[int, list[Event]]] = {}
    for item in batch:
        by_session.setdefault(item.session_id, (item.inherited_event_count, []))[1].append(item.event)
    total = Tokens()
    for sid, (inherited, events) in by_session.items():
        total = total + usage_of(events, inherited, models.get(sid, ""))[1]
        for event in events:
            if event.type == MODEL:
                models[sid] = recorded_model(event)
    return total


def result_line(
    session_id: str, output: str, usage: Tokens, reason: dict[str, JsonValue], prices: PriceTable | None = None
) -> bytes:
    """The `--stream` output's last line: `{"type": "result", "session_id", "output", "usage",
    "reason"}` (`usage`: `{input_tokens, output_tokens, calls, reported}` and the cache counts
    when any, as `show` and `sessions` give, over the session and its descendants; with prices,
    `cost` — a number, or null when unknown; `reason`: how the run ended, the root's last
    `turn/end` reason)."""
    import json

    counts: dict[str, JsonValue] = dict(usage.to_json())
    if prices:
        counts["cost"] = cost_of(usage, prices)
    record = {
        "type": "result",
        "session_id": session_id,
        "output": output,
        "usage": counts,
        "reason": reason,
    }
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


@asynccontextmanager
async def watch_run(
    runtime: Runtime,
    root_id: str,
    from_seq: int,
    *,
    stream_to: BinaryIO | None,
    progress: Console | None,
) -> AsyncIterator[RunWatch]:
    """Stream `root_id`'s tree from `from_seq` while the block runs: JSON lines to `stream_to`
    (if given) and a live display on `progress` (a rich `Console`, if given)."""
    watch = RunWatch()
    if stream_to is None and progress is None:
        yield watch
        return
    async with open_event_stream(runtime.query, root_id, from_seq=from_seq) as stream:
        done = trio.Event()
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_consume, stream, watch, stream_to, progress, RunProgress(root_id), done)
            try:
                yield watch
            except BaseException as exc:  # re-raised bare once the nursery has closed
                body_error = exc
                nursery.cancel_scope.cancel()
            else:
                stream.finish()
                await done.wait()  # everything durable by now is out
        if body_error is not None:
            raise body_error


async def _consume(
    stream: EventStream,
    watch: RunWatch,
    stream_to: BinaryIO | None,
    console: Console | None,
    state: RunProgress,
    done: trio.Event,
) -> None:
    live = None
    spinner = None
    if console is not None:
        from rich.live import Live
        from rich.spinner import Spinner

        spinner = Spinner("dots")
        # Refreshed from this task only (no refresh thread); stderr writes (log lines) go above
        # the display; stdout is another stream unless it is the same terminal.
        live = Live(
            render_progress(state, spinner),
            console=console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=True,
        )
        live.start()
    try:
        async with trio.open_nursery() as nursery:
            if live is not None:
                nursery.start_soon(_tick, live)
            while True:
                try:
                    batch = [await stream.receive()]
                except trio.EndOfChannel:
                    break
                while True:  # whatever else is ready goes out with it
                    try:
                        batch.append(stream.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                watch.usage = watch.usage + stream_usage(batch, watch.models)
                for item in batch:
                    state.apply(item)
                if stream_to is not None and not watch.reader_gone:
                    try:
                        # Abandoned on cancel (a second Ctrl-C): a reader that stopped reading
                        # must not hold the exit; the thread's write goes with the process.
                        await trio.to_thread.run_sync(_write, stream_to, batch, abandon_on_cancel=True)
                    except OSError:  # `run --stream | head`: the run goes on, unheard
                        watch.reader_gone = True
                        drop_stdout(stream_to)
                if live is not None:
                    live.update(render_progress(state, spinner), refresh=True)
            nursery.cancel_scope.cancel()
    finally:
        if live is not None:
            live.stop()
    done.set()


async def _tick(live: Live) -> None:
    while True:
        await trio.sleep(_TICK)
        live.refresh()


def _write(out: BinaryIO, batch: list[StreamEvent]) -> None:
    data = memoryview(b"".join(item.json_bytes() + b"\n" for item in batch))
    try:
        fd = out.fileno()
    except (OSError, ValueError):  # not a real file (a test's buffer)
        out.write(data)
        out.flush()
        return
    # Straight to the descriptor, not through `out`'s buffer: an abandoned write must not hold
    # the buffer's lock when Python flushes stdout at exit.
    while data:
        data = data[os.write(fd, data) :]


def drop_stdout(out: BinaryIO) -> None:
    """Point stdout at /dev/null, so nothing (Python's own flush at exit included) writes to
    the pipe whose reader went away."""
    try:
        fd = out.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # not a real file (a test's buffer)
        return
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def stdout_binary() -> BinaryIO:
    """Where `--stream` lines go (flushed after every batch)."""
    sys.stdout.flush()
    return sys.stdout.buffer
