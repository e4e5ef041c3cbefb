"""The keyless scripted model (docs/scripts.md): a `SessionModel` that answers from a `Script`.

Theory of operation. The runtime binds the model to each session (`bind(SessionBinding)`: id,
label, `created_at`, the runtime clock, what the session publishes (`waits`), the session's
assistant-message count) and streams from the bound model. Binding registers the session (id,
label, `created_at`), as does each `stream(request)`, which returns an async generator; on its
first step the generator yields to the scheduler once (shielded, so it cannot be cancelled
there), then binds the session to a script entry and *consumes* that entry's next response —
from then on the response is used up even if the call is cancelled, hangs or fails. Playing a
response is: expand its `{{from_request:...}}` templates against the request's text, hold on
`wait_for` (see "Waits" below), sleep `delay_ms` on the binding's `clock`, `hang` until
cancelled, raise the scripted `error`, or stream — text as a few `TextDelta`s split at word
boundaries, each tool call as one `ToolCallDelta` with id and name then its arguments in
fragments, `Usage` if scripted, and one `Finish`. A checkpoint precedes every chunk, so a
consumer can be cancelled between any two chunks and keep partial text. Compaction requests
(`purpose == "compaction"`) take the next of the script's `summaries`. Rendering a response
(templates, call ids, the pieces it streams) is in `script_render.py`; what its waits hold on,
in `script_waits.py`.

Stalls. A `wait_for` that nothing will ever satisfy must not hang a run: each hold is watched
on Trio's clock (never the runtime clock, whose sleeps may be virtual) and fails with
`MODEL_SCRIPT_STALLED` — one line naming the session, the response and the wait — once
`stall_timeout` seconds pass with no progress. Progress is anything the model sees move: a call
starting, a response finishing or failing, a hold released, a session registered, a scripted
delay ending, or a host calling `note_progress()`; each restarts every watch. (Appends by the
runtime are not progress, though the settled count follows them: in a scripted run every step
makes a model call, so they come with model activity; a host with long-running tools calls
`note_progress()` or raises the timeout.) While a scripted `delay_ms` sleeps, the watches are
suspended (the delay's end is progress that is certain to come).

Waits. A `wait_for` holds on what the runtime publishes anyway, never on a hook of its own:
`steered` until the session's inbox has accepted a delivery since its turn claimed its input
(`SessionWaits.inbox`: a steer accepted while the call is held is recorded only at the next
step, so no log has it yet); `settled` until the session's own log holds `count`
`subagent/settled` records of the child named by id or by the label its `subagent/catalog`
gives — counted from the events the log held when the session was bound (`SessionWaits.history`,
so a settlement an earlier process recorded counts) and from the store's durable feed, which
the model observes from the first binding that carries it (a feed observer is called in the
appending actor's stretch, so the hold is released as the record's append is answered);
`waiting` until a session named by id or label holds on a `wait_for` of this model. A test that
drives the model directly may give `bind` its own `ScriptWaits` instead.

Binding (fixed for the life of the instance once a session's first call starts):
1. an entry with `session` answers that session id;
2. entries with a `label` are shared out among the sessions with that label: the entries not yet
   taken, in script order, go to the sessions with that label that are known and not yet bound,
   in (`created_at`, id) order, and the calling session takes the entry that falls to it.
   "Known" means bound (the runtime binds a child as it creates it), registered with
   `register_session`, or having started a call — including a call started in the same
   scheduler tick, thanks to the yield before binding. Limitation: a session that calls while an earlier-created
   sibling with the same label is not yet known takes that sibling's entry;
3. otherwise (no such entry, or none left for it) the session takes the next unnamed entry in
   first-call order; if there is none, the call fails with `MODEL_SCRIPT_NO_AGENT`.

Script positions live in the instance: reusing it (e.g. across `open_runtime` calls) continues
where it stopped; a new instance starts every entry at its first response.

Error codes (`ModelError.code`): `MODEL_SCRIPTED_ERROR` (a scripted `error`, with its status),
`MODEL_SCRIPT_NO_AGENT`, `MODEL_SCRIPT_EXHAUSTED` (responses or summaries ran out),
`MODEL_SCRIPT_NO_MATCH` (a `{{from_request:...}}` regex found nothing),
`MODEL_SCRIPT_NO_WAITS` (a `wait_for` response but the session's binding publishes nothing to
hold on), `MODEL_SCRIPT_WAIT` (a `wait_for: settled` but the runtime publishes no durable feed),
`MODEL_SCRIPT_STALLED` (a `wait_for` with no progress for `stall_timeout` seconds).
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial

import attrs
import trio
from trio_util import RepeatedEvent

from ..foundation.errors import (
    ScriptedFailure,
    ScriptExhausted,
    ScriptNoAgent,
    ScriptNoWaits,
    ScriptStalled,
)
from ..models.base import (
    Chunk,
    Finish,
    Model,
    ModelRequest,
    SessionBinding,
    TextDelta,
    ToolCallDelta,
)
from ..models.defaults import DEFAULT_STALL_TIMEOUT, parse_stall_timeout
from .script_format import (
    Script,
    ScriptedResponse,
    WaitFor,
    WaitForSettled,
    WaitForWaiting,
)
from .script_render import (
    describe_wait,
    dump_wait,
    render_response,
    request_text,
    split_arguments,
    split_text,
)
from .script_waits import PublishedWaits, ScriptWaits, SettledTally

__all__ = [
    "DEFAULT_STALL_TIMEOUT",
    "ScriptedModel",
    "ScriptedModelStatistics",
    "parse_stall_timeout",
    "request_text",
    "split_text",
]


@attrs.frozen(kw_only=True)
class ScriptedModelStatistics:
    """Where a `ScriptedModel` stands: calls started per entry (script order), the session each
    entry is bound to (`None`: not yet), and how many summaries were used."""

    calls: tuple[int, ...]
    bindings: tuple[str | None, ...]
    summaries_used: int


class ScriptedModel:
    """A `SessionModel` answering each session from its entry of `script` (see the module
    docstring): the runtime streams from `bind(session)`.

    Args:
        script: the loaded script.
        stall_timeout: seconds (Trio's clock) a `wait_for` may go without any progress before
            its call fails with `MODEL_SCRIPT_STALLED`; `None` waits forever.

    Raises `ValueError` when `stall_timeout` is not a positive finite number or `None`.
    """

    def __init__(self, script: Script, *, stall_timeout: float | None = DEFAULT_STALL_TIMEOUT) -> None:
        if stall_timeout is not None and (
            isinstance(stall_timeout, bool)
            or not isinstance(stall_timeout, int | float)
            or not math.isfinite(stall_timeout)
            or stall_timeout <= 0
        ):
            raise ValueError(f"stall_timeout must be a positive number of seconds, got {stall_timeout!r}")
        self._script = script
        self._stall_timeout = None if stall_timeout is None else float(stall_timeout)
        self._watches: set[trio.CancelScope] = set()  # the deadlines of the holds in progress
        self._delaying = 0  # scripted delays sleeping now
        self._calls = [0] * len(script.agents)
        self._summaries_used = 0
        self._session_entries: dict[str, int] = {}
        self._label_entries: dict[str, list[int]] = {}
        self._unnamed: list[int] = []
        for k, entry in enumerate(script.agents):
            if entry.session is not None:
                self._session_entries[entry.session] = k
            elif entry.label is not None:
                self._label_entries.setdefault(entry.label, []).append(k)
            else:
                self._unnamed.append(k)
        self._bound: dict[str, int] = {}  # session id → entry index
        self._owner: dict[int, str] = {}  # entry index → session id
        self._known: dict[str, dict[str, int]] = {}  # label → session id → created_at
        self._labels: dict[str, str] = {}  # session id → its identity label
        self._holding: dict[str, int] = {}  # session id → calls held on a wait_for now
        self._hold_changed = RepeatedEvent()
        self._settled = SettledTally()

    @property
    def script(self) -> Script:
        return self._script

    @property
    def stall_timeout(self) -> float | None:
        return self._stall_timeout

    def note_progress(self) -> None:
        """Restart the stall timer of every held `wait_for`: something in the runtime moved.

        The model calls it itself on its own activity; a host whose tools run for long stretches
        without model calls may call it too. Synchronous; a no-op outside Trio."""
        if not self._watches:
            return
        deadline = self._deadline()
        for scope in self._watches:
            scope.deadline = deadline

    def _deadline(self) -> float:
        if self._stall_timeout is None or self._delaying:
            return math.inf
        try:
            return trio.current_time() + self._stall_timeout
        except RuntimeError:  # not in Trio: nothing can be held then either
            return math.inf

    async def _watched(self, hold: Callable[[], Awaitable[None]], session: SessionBinding, n: int, wait: str) -> None:
        """Run `hold()` under the stall watch; raise `MODEL_SCRIPT_STALLED` when it fires."""
        scope = trio.CancelScope(deadline=self._deadline())
        self._watches.add(scope)
        try:
            with scope:
                await hold()
        finally:
            self._watches.discard(scope)
        if scope.cancelled_caught:
            label = f' (label "{session.label}")' if session.label is not None else ""
            raise ScriptStalled(
                f'scripted wait stalled: session "{session.session_id}"{label} response {n} waits for'
                f" {wait} with no progress for {self._stall_timeout:g} s",
            )
        self.note_progress()

    async def _wait_until_holding(self, name: str) -> None:
        """Until a session named `name` (its id, or its label) is held on a `wait_for`."""
        while not any(n and (sid == name or self._labels.get(sid) == name) for sid, n in self._holding.items()):
            await self._hold_changed.wait()

    def register_session(self, session_id: str, *, label: str | None, created_at: int) -> None:
        """Make a session known for label binding before it calls (idempotent, synchronous)."""
        if label is not None:
            self._labels[session_id] = label
        self.note_progress()
        if session_id in self._session_entries:
            return
        if label is not None and label in self._label_entries:
            self._known.setdefault(label, {}).setdefault(session_id, created_at)

    def statistics(self) -> ScriptedModelStatistics:
        return ScriptedModelStatistics(
            calls=tuple(self._calls),
            bindings=tuple(self._owner.get(k) for k in range(len(self._calls))),
            summaries_used=self._summaries_used,
        )

    def bind(self, session: SessionBinding, *, waits: ScriptWaits | None = None) -> Model:
        """The model `session` streams from (see the module docstring); binding registers the
        session. Its `wait_for` holds on `waits` when given (a test driving the model directly),
        else on what the binding publishes (`session.waits`), else a hold fails with
        `MODEL_SCRIPT_NO_WAITS`."""
        self.register_session(session.session_id, label=session.label, created_at=session.created_at)
        published = session.waits
        if waits is None and published is not None:
            if published.feed is not None:
                self._settled.observe(published.feed)
                self._settled.seed(session.session_id, published.history, published.inherited_event_count)
            waits = PublishedWaits(session.session_id, published, self._settled)
            # Folded already: the bound session need not keep the log it started with.
            session = attrs.evolve(session, waits=attrs.evolve(published, history=()))
        return _ScriptedSession(self, session, waits)

    async def wait_settled(self, session_id: str, child: str, count: int = 1) -> None:
        """Until `count` settlements of the child (id or label) of `session_id` are durable in
        its log, as this model counts them for `wait_for: settled` (a test's checkpoint)."""
        await self._settled.wait(session_id, child, count)

    def _stream(
        self, session: SessionBinding, waits: ScriptWaits | None, request: ModelRequest
    ) -> AsyncGenerator[Chunk]:
        self.register_session(session.session_id, label=session.label, created_at=session.created_at)
        # Read now, as the call starts: the count is the session's at the time of this request.
        return self._play(session, waits, request, session.assistant_count())

    async def _play(
        self, session: SessionBinding, waits: ScriptWaits | None, request: ModelRequest, assistant_count: int
    ) -> AsyncGenerator[Chunk]:
        # Let calls started in the same tick register before binding; shielded so that the
        # response is consumed even if the call is cancelled already.
        await trio.lowlevel.cancel_shielded_checkpoint()
        if request.purpose == "compaction":
            summary = self._next_summary(session)
            for piece in split_text(summary):
                await trio.lowlevel.checkpoint()
                yield TextDelta(piece)
            await trio.lowlevel.checkpoint()
            yield Finish("stop")
            return
        response, n = self._next_response(session)
        rendered = render_response(response, session, request, assistant_count)
        wait = response.wait_for
        if isinstance(wait, WaitForWaiting):
            target = rendered.settled or wait.session
            await self._watched(partial(self._wait_until_holding, target), session, n, dump_wait({"waiting": target}))
        elif wait is not None:
            self._holding[session.session_id] = self._holding.get(session.session_id, 0) + 1
            self._hold_changed.set()
            try:
                await self._watched(
                    partial(_wait, wait, rendered.settled, session, waits),
                    session,
                    n,
                    describe_wait(wait, rendered.settled),
                )
            finally:
                self._holding[session.session_id] -= 1
        if response.delay_ms:
            self._delaying += 1
            self.note_progress()  # suspends the watches: the delay's end is certain progress
            try:
                await session.clock.sleep(response.delay_ms / 1000)
            finally:
                self._delaying -= 1
                self.note_progress()
        if response.hang:
            await trio.sleep_forever()
        if response.error is not None:
            assert rendered.error_message is not None
            self.note_progress()
            raise ScriptedFailure(rendered.error_message, status=response.error.status)
        for piece in split_text(rendered.text):
            await trio.lowlevel.checkpoint()
            yield TextDelta(piece)
        for index, (call_id, name, arguments) in enumerate(rendered.calls):
            await trio.lowlevel.checkpoint()
            yield ToolCallDelta(index, id=call_id, name=name)
            for fragment in split_arguments(arguments):
                await trio.lowlevel.checkpoint()
                yield ToolCallDelta(index, arguments=fragment)
        if response.usage is not None:
            await trio.lowlevel.checkpoint()
            yield response.usage
        await trio.lowlevel.checkpoint()
        self.note_progress()
        yield Finish(response.finish or ("tool-calls" if rendered.calls else "stop"))

    # --- script positions ---------------------------------------------------------------------

    def _next_summary(self, session: SessionBinding) -> str:
        summaries = self._script.summaries
        self._summaries_used += 1
        n = self._summaries_used
        if n > len(summaries):
            raise ScriptExhausted(
                f'script summaries exhausted: compaction call {n} for session "{session.session_id}"'
                f" but the script has {len(summaries)} summaries",
            )
        return summaries[n - 1]

    def _next_response(self, session: SessionBinding) -> tuple[ScriptedResponse, int]:
        """The response the call consumes and its number in its entry (1-based)."""
        k = self._entry(session)
        self.note_progress()
        self._calls[k] += 1
        n = self._calls[k]
        responses = self._script.agents[k].responses
        if n > len(responses):
            raise ScriptExhausted(
                f'script exhausted for session "{session.session_id}": call {n} but its entry'
                f" $.agents[{k}] has {len(responses)} responses",
            )
        return responses[n - 1], n

    def _entry(self, binding: SessionBinding) -> int:
        """The index of the entry answering the session, binding one on its first call."""
        session = binding.session_id
        k = self._bound.get(session)
        if k is None:
            k = self._session_entries.get(session)
        if k is None and binding.label is not None:
            k = self._label_entry(session, binding.label)
        if k is None and self._unnamed:
            k = self._unnamed.pop(0)
        if k is None:
            label = f' (label "{binding.label}")' if binding.label is not None else ""
            raise ScriptNoAgent(
                f'script has no entry for session "{session}"{label}: no entry names it and no unnamed entry is left',
            )
        self._bound[session] = k
        self._owner[k] = session
        return k

    def _label_entry(self, session: str, label: str) -> int | None:
        entries = self._label_entries.get(label, [])
        free_entries = [k for k in entries if k not in self._owner]
        known = self._known.get(label, {})
        free_sessions = sorted((created_at, sid) for sid, created_at in known.items() if sid not in self._bound)
        for k, (_, sid) in zip(free_entries, free_sessions):
            if sid == session:
                return k
        return None


@attrs.frozen
class _ScriptedSession:
    """A `ScriptedModel` bound to one session: the `Model` that session streams from."""

    _model: ScriptedModel
    _session: SessionBinding
    _waits: ScriptWaits | None

    def stream(self, request: ModelRequest) -> AsyncGenerator[Chunk]:
        """Answer `request` from the session's script entry; failures are raised as `ModelError`
        while iterating."""
        return self._model._stream(self._session, self._waits, request)


async def _wait(wait_for: WaitFor, settled: str | None, session: SessionBinding, waits: ScriptWaits | None) -> None:
    if waits is None:
        raise ScriptNoWaits(
            f'a scripted response of session "{session.session_id}" has wait_for but the session'
            " binding carries no waits to hold on",
        )
    if isinstance(wait_for, WaitForSettled):
        assert settled is not None
        await waits.settled(settled, wait_for.count)
    else:
        await waits.steered()
