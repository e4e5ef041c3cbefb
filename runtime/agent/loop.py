"""The agent loop: turns and steps over one session actor
(docs/design.md, "The agent loop and models").

Theory of operation. One `Agent` drives one session. Its task waits for input that wakes it,
claims the next-step input plus one follow-up, and runs a turn: `turn/start`, then steps —
`step/start`, the claimed input as `user/message`s, one model call kept as `assistant/message`,
each requested tool call as `tool/call` → run → `tool/result` (results in model order),
`step/end` — while the model calls tools or steering arrives, then `turn/end {reason}`.
Everything goes through the session actor, so each write is durable before the loop moves on;
a `tool/call` is durable before its tool runs, so a crash never leads to a silent retry: a
resume either closes the turn (an outcome-unknown closer) or continues it, running such a call
again only if its tool is idempotent and otherwise recording it `in_doubt`.

A continued turn (docs/format.md, "Continued turns") is handed to the agent by the registry's
resume, its `turn/continue` durable already; the driver runs it before it waits for input, in the
same step loop as any turn (`_steps`), entered where the crash left it.

Cancellation is two-phase: `cancel(cause)` sets the turn's `Abort` and cuts the model stream at
once (the text streamed so far is kept as `assistant/message {interrupted: true}`); tools that
are running get `tool_abort_grace` seconds of the runtime clock to return (what they return is
recorded), then their scope is cancelled: a dispatched call with no result gets
`Error: tool call was cancelled`, an undispatched one a `tool/call` and
`Error: tool call aborted before dispatch`, and the turn ends `aborted` with its cause. Writes
that close a turn run shielded, so the log and the in-memory surface never disagree.

Here are the driver, the turn and its budget; a step's model call and compaction are in
`model_steps.py`, its tool calls and their two-phase cancel in `tool_steps.py`, and the staging
and durable flushing both share in `step_writer.py`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import msgspec
import trio
from subagents.actors import Abort, ActorStopped, DurableFeed, EventDraft, SessionRef
from subagents.storage import Continuation, Event, StorageError, decode_payload
from trio_util import AsyncValue, RepeatedEvent

from ..foundation.budgets import DEADLINE_TEXT, Budget, Spent, count_turns, exhausted, remainder, spent_of, turn_counted
from ..foundation.clock import Clock
from ..foundation.errors import AgentStopped
from ..models.base import (
    AnyModel,
    SessionBinding,
    SessionWaits,
    bind_model,
)
from ..models.messages import Surface, text_blocks
from ..models.specs import record_of
from ..telemetry.seam import NO_TURN, TRACE_TYPE, TurnTrace, trace_of
from ..tools.base import ToolSet
from .agent_config import DEFAULT_CONFIG, AgentConfig
from .inbox import Delivery, Inbox, Mode
from .model_record import ModelRecorder
from .model_steps import ModelSteps
from .step_writer import SURFACE_TYPES
from .tool_steps import ToolSteps
from .tree_ledger import own_spent, request_estimate

__all__ = ["Agent", "AgentConfig", "TurnResult", "recorded_delivery_ids"]

log = logging.getLogger(__name__)

Json = dict[str, Any]
Cause = Literal["user", "parent", "disposed"]
# What the driver is doing: waiting for input, writing a turn, waiting on the turn's model call
# (the step's input is durable, its reply not yet begun), or ended for good.
Phase = Literal["idle", "writing", "model", "stopped"]


@attrs.frozen(kw_only=True)
class TurnResult:
    turn: int
    reason: Json  # the `turn/end` reason
    text: str | None  # the text of the turn's last assistant message that had text
    closing_text: str | None = None  # the text blocks of the turn's last assistant message


class Agent(ModelSteps, ToolSteps):
    """One session's driver (see the module docstring); its model and tool steps are in
    runtime/agent/model_steps.py and tool_steps.py, the writing they share in step_writer.py."""

    def __init__(
        self,
        session: SessionRef,
        *,
        model: AnyModel,
        tools: ToolSet,
        clock: Clock,
        config: AgentConfig = DEFAULT_CONFIG,
        events: Sequence[Event] = (),
        label: str | None = None,
        feed: DurableFeed | None = None,  # the session store's: published to a bound model
        surface: Surface | None = None,  # already built from `events` (a resume builds it in a thread)
        # The open last turn of `events` to continue first (its `turn/continue` is durable).
        continuation: Continuation | None = None,
    ) -> None:
        self.session = session
        self.session_id = session.session_id
        self.model = model
        self.tools = tools
        self.clock = clock
        self.config = config
        self.label = label
        self.inbox = Inbox(config.inbox_capacity)
        self.surface = surface if surface is not None else Surface.from_events(events, session_id=self.session_id)
        self.turn = _last_turn(events, self.session_id)
        self._model_recorder = ModelRecorder(events)  # `session/model` (model_record.py)
        # How many of its events end with its last closed turn (what a fork of it inherits).
        self.closed_prefix = next((e.seq + 1 for e in reversed(events) if e.type == "turn/end"), 0)
        self.assistant_count = sum(1 for e in events if e.type == "assistant/message")
        self._messages = sum(1 for e in events if e.type in SURFACE_TYPES)  # message ids stay unique
        self.last_result: TurnResult | None = None
        # Resumed with a turn its last host left open and closed by the closers (the `close`
        # policy): its work was cut. A continued turn is not: it finishes as any turn does.
        self.resumed_interrupted = False
        self.failure: BaseException | None = None
        self._continuation = continuation
        # Running from the start when it continues a turn: nobody may take it for idle.
        self._phase: AsyncValue[Phase] = AsyncValue("writing" if continuation is not None else "idle")
        # A continued turn's abort exists from the start: a cancel that comes before its driver
        # runs still stops it.
        self._abort: Abort | None = Abort() if continuation is not None else None
        self._cause: Cause = "user"
        self._model_scope: trio.CancelScope | None = None
        self._staged: list[EventDraft] = []
        # The model this session streams from; `self.model` stays what was given (a child may
        # be given its parent's).
        self._stream_model = bind_model(
            model,
            SessionBinding(
                session_id=self.session_id,
                label=label,
                created_at=session.header.created_at,
                clock=clock,
                waits=SessionWaits(
                    inbox=self.inbox,
                    history=events,
                    inherited_event_count=session.inherited_event_count,
                    feed=feed,
                ),
                assistant_count=lambda: self.assistant_count,
            ),
        )
        self._closing_text: str | None = None
        self._scope = trio.CancelScope()
        budget = config.budget
        if budget is not None and budget.seconds is not None:
            budget = budget.resolved(clock.now_ms())
        self.budget: Budget | None = None if budget is None or budget.unlimited else budget
        self.spent = spent_of(events, session.inherited_event_count) if self.budget is not None else Spent()
        self._budget_stop: str | None = None  # the budget that ran out mid-turn (its message)
        # Whether the turn in progress recorded a model call: a continued one's may have before
        # the crash (what its log says).
        self._turn_called = continuation is not None and not count_turns(events, session.inherited_event_count).bare
        ledger = config.ledger  # budgets shared down the tree: joined when the driver starts
        self._own_spent = own_spent(events, session.inherited_event_count, ledger.prices) if ledger else None
        self._turn_deadline = math.inf  # the budget's deadline on Trio's clock, for this turn
        # The mailbox deliveries its log records (durably): the owner acks them and drops a
        # redelivered id (SPEC §9, "recorded once").
        self.recorded_deliveries: set[str] = recorded_delivery_ids(events)
        self.deliveries_recorded = RepeatedEvent()
        # Spans (runtime/telemetry/seam.py): no-ops when tracing is off.
        self._trace = trace_of(
            config.telemetry,
            session_id=self.session_id,
            label=label,
            events=events,
            inherited_event_count=session.inherited_event_count,
            header=session.header,  # a root's spans are named too (`agent_name`)
        )
        self._turn_trace: TurnTrace = NO_TURN

    # --- the public face ------------------------------------------------------------------

    @property
    def status(self) -> Literal["running", "idle", "stopped"]:
        phase = self._phase.value
        return "running" if phase in ("writing", "model") else phase

    async def send(
        self,
        content: str | Sequence[Mapping[str, Any]],
        mode: Mode = "follow-up",
        *,
        abort: Abort | None = None,
        **fields: Any,
    ) -> None:
        if self._phase.value == "stopped":
            raise AgentStopped(f"agent {self.session_id!r} has stopped")
        blocks = text_blocks(content) if isinstance(content, str) else [dict(b) for b in content]
        await self.inbox.put(Delivery(content=blocks, **fields), mode, abort)

    def cancel(self, cause: Cause = "user") -> bool:
        """Stop the current turn (two-phase); False when no turn is running."""
        abort = self._abort
        if abort is None or abort.is_set():
            return False
        self._cause = cause
        abort.set()
        if self._model_scope is not None:
            self._model_scope.cancel()
        return True

    @property
    def quiet(self) -> bool:
        """True while the agent writes nothing of its own: no turn runs, or the turn waits on
        its model call (its step's input is durable, its reply not yet begun)."""
        return self._phase.value != "writing"

    async def wait_quiet(self) -> None:
        """Wait until `quiet` (the subagent service places settlements there, so a child that
        settles while its parent finishes a step lands at the same place on every run)."""
        await self._until(lambda phase: phase != "writing")

    async def wait_turn_closed(self) -> None:
        """Wait until no turn is running (input may be waiting)."""
        await self._until(lambda phase: phase in ("idle", "stopped"))

    async def wait_stopped(self) -> None:
        """Until the driver has ended for good."""
        await self._until(lambda phase: phase == "stopped")

    async def stop(self) -> None:
        """Stop the driver now (a turn still open is closed by the next resume's closers)."""
        self._scope.cancel()
        await self._until(lambda phase: phase == "stopped")

    async def wait_idle(self) -> TurnResult | None:
        """Wait until no turn runs and no input would start one; the last turn's result."""
        await self._until(lambda phase: phase == "stopped" or (phase == "idle" and not self.inbox.wakes()))
        if self.failure is not None:
            raise AgentStopped(f"agent {self.session_id!r} stopped: {self.failure}") from self.failure
        return self.last_result

    async def _until(self, holds: Callable[[Phase], bool]) -> None:
        """Until `holds` is true when this task runs again, not merely when the phase changed:
        the driver may start the next turn before a woken waiter runs, so a wake looks again.
        (Not `wait_value`: that returns what held at the change, and checkpoints even when
        `holds` is true already; the waits here return at once then, as they always did.)"""
        while not holds(self._phase.value):
            await self._phase.wait_transition(lambda new, _old: holds(new))

    # --- the driver -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._join_ledger()
        task_status.started()
        try:
            with self._scope:
                await self._drive()
        except (ActorStopped, StorageError) as exc:
            log.warning("agent %s stopped: %s", self.session_id, exc)
            self.failure = exc
        except ExceptionGroup as group:
            # From the tool pool: a log failure while a result was recorded is a stop, not a bug.
            matched, rest = group.split((ActorStopped, StorageError))
            if rest is not None:
                log.exception("agent %s failed", self.session_id)
                self.failure = group
            else:
                assert matched is not None
                first = matched.exceptions[0]
                while isinstance(first, ExceptionGroup):
                    first = first.exceptions[0]
                log.warning("agent %s stopped: %s", self.session_id, first)
                self.failure = first
        except Exception as exc:  # a bug: this agent stops, loudly, and the others carry on
            log.exception("agent %s failed", self.session_id)
            self.failure = exc
        finally:
            self._phase.value = "stopped"
            if self.config.ledger is not None:
                self.config.ledger.leave(self.session_id)  # its unused reservation returns

    async def _drive(self) -> None:
        plan, self._continuation = self._continuation, None
        if plan is not None:
            try:
                self.last_result = await self._continue_turn(plan)
            finally:
                self._abort = None
                self._phase.value = "idle"
        while True:
            await self.inbox.wait_wake()
            claimed = self.inbox.claim_turn()
            self._phase.value = "writing"
            try:
                self.last_result = await self._turn(claimed)
            finally:
                self._abort = None
                self._phase.value = "idle"

    def budget_remaining(self) -> Budget | None:
        """What is left of this agent's budget for a child it starts now (None: unlimited): its
        own turns and deadline, and what it and its ancestors can still reserve of the limits
        shared down the tree."""
        own = remainder(self.budget, self.spent, in_turn=self.status == "running")
        shared = self.config.ledger.remainder(self.session_id) if self.config.ledger is not None else None
        if shared is None:
            return own
        return shared.clamped(own) if own is not None else shared

    def _begin(self, abort: Abort | None = None) -> Abort:
        """What every turn starts with, a new one or a continued one: its abort (a continued
        turn's was made with the agent, and may be set already), its deadline."""
        if abort is None:
            abort = self._abort = Abort()
            self._cause = "user"
        self._budget_stop = None
        self._turn_deadline = self._trio_deadline()
        self._closing_text = None
        return abort

    async def _turn(self, claimed: list[Delivery]) -> TurnResult:
        self.turn += 1
        turn = self.turn
        abort = self._begin()
        self._turn_called = False
        self.spent = attrs.evolve(self.spent, turns=self.spent.turns + 1)
        if self.config.ledger is not None:
            self.config.ledger.turn_started(self.session_id)  # holds its reservation again
        trigger = claimed[-1].trigger if claimed else "message"
        if (model_changed := self._model_recorder.changed(self.model)) is not None:
            self._stage("session/model", model_changed, ignorable=True)  # before the turn it runs
        self._stage("turn/start", {"turn": turn, "trigger": {"kind": trigger}})
        return await self._steps(turn, abort, pending=claimed)

    async def _continue_turn(self, plan: Continuation) -> TurnResult:
        """Go on with the turn a crash left open (docs/format.md, "Continued turns"): its
        `turn/continue` is durable already (the registry wrote it); the turn counts in the
        budget once, as it did when it started."""
        self.turn = plan.turn
        self._turn_called = self._turn_called or plan.lost_model_call  # a lost call was sent
        abort = self._abort
        if abort is None:
            abort = self._abort = Abort()
        if (model_changed := self._model_recorder.changed(self.model)) is not None:
            self._stage("session/model", model_changed, ignorable=True)  # another host's model goes on
        return await self._steps(plan.turn, self._begin(abort), resume=plan)

    async def _steps(
        self, turn: int, abort: Abort, *, pending: list[Delivery] | None = None, resume: Continuation | None = None
    ) -> TurnResult:
        """`_turn_steps` in the turn's `invoke_agent` span (and the session's trace anchor
        recorded with the first traced turn: runtime/telemetry/seam.py)."""
        provider, model = _model_names(self.model)
        trace = self._turn_trace = self._trace.turn(turn, provider=provider, model=model, continued=resume is not None)
        if (record := self._trace.anchor_record()) is not None:
            self._stage(TRACE_TYPE, record, ignorable=True)
        try:
            result = await self._turn_steps(turn, abort, pending=pending, resume=resume)
        except BaseException as exc:  # the span ends failed on any exit (a cancel too); re-raised
            trace.fail(exc)
            raise
        trace.end(result.reason)
        return result

    def child_trace(self, call_id: str | None) -> list[EventDraft]:
        """What a child started by the tool call `call_id` records of its trace with its first
        append: its anchor, that call's span (none when tracing is off)."""
        record = self._trace.child_record(call_id)
        return [] if record is None else [EventDraft(type=TRACE_TYPE, data=record, ignorable=True)]

    async def _turn_steps(
        self, turn: int, abort: Abort, *, pending: list[Delivery] | None = None, resume: Continuation | None = None
    ) -> TurnResult:
        """A turn's steps until it ends, then its `turn/end`. `resume` enters a continued turn
        where the crash left it: at the open step's lost model call, at its cut tool calls, or
        (no step open) where the loop would go next."""
        reason: Json = {"kind": "completed"}
        text: str | None = None
        step = resume.step if resume is not None else 0
        pending = pending or []
        attempt: int | None = None  # the re-issued model call's attempt number
        while True:
            if resume is not None and resume.step_open and not resume.lost_model_call:
                # The open step's reply is durable: its cut calls, then on as after any step.
                await self._finish_cut_calls(turn, step, resume, abort)
                self._stage("step/end", {"turn": turn, "step": step})
                finish, resume = resume.last_finish, None
                if abort.is_set():
                    reason = self._aborted()
                    break
                if finish != "tool-calls":
                    reason = _ended_by(finish)
                    break
                pending = self.inbox.claim_step()
                continue
            if resume is not None and not resume.step_open and resume.step > 0 and resume.last_finish != "tool-calls":
                reason = _ended_by(resume.last_finish)  # its last step had ended the turn
                break
            if abort.is_set():
                if resume is not None and resume.step_open:
                    self._stage("step/end", {"turn": turn, "step": step})  # the open step, never re-issued
                reason = self._aborted()
                break
            lost = resume is not None and resume.lost_model_call
            if lost:
                assert resume is not None
                attempt = resume.attempt
                resume = None
                out = self._budget_out(step)
                if out is not None:
                    self._stage("step/end", {"turn": turn, "step": step})
                    reason = {"kind": "budget", "message": out}
                    break
                # The step's input is durable: its model call is issued again.
            else:
                resume = None
                attempt = None
                if step >= self.config.max_steps:
                    reason = {
                        "kind": "blocked",
                        "message": f"the turn reached its step limit ({self.config.max_steps})",
                    }
                    break
                step += 1
                # What has run out already, then compaction (its summary call checked on its
                # own: a surface too large for the remainder may fit once compacted), then the
                # step's call with its size.
                out = self._budget_out(step, sized=False)
                size = None
                if out is None:
                    out, size = await self._maybe_compact(turn, step, abort)
                if out is None:
                    out = self._budget_out(step, size=size)
                if out is not None:
                    self._stage_refused(turn, step, pending)
                    reason = {"kind": "budget", "message": out}
                    break
                self._stage("step/start", {"turn": turn, "step": step})
                self._stage_input(turn, step, pending)
                await self._flush()
            reply = await self._call_model(turn, step, abort)
            if reply.text:
                text = reply.text
            await self._record_reply(turn, step, reply, attempt=attempt)
            if reply.calls and not reply.interrupted and reply.error is None:
                await self._run_tools(turn, step, reply.calls, abort)
            self._stage("step/end", {"turn": turn, "step": step})
            if reply.interrupted or abort.is_set():
                reason = self._aborted()
                break
            if reply.error is not None:
                reason = {"kind": "error", "message": reply.error}
                break
            if reply.finish == "max-tokens" and not reply.calls:
                reason = {"kind": "max-tokens"}
                break
            if reply.calls or self.inbox.steered():
                pending = self.inbox.claim_step()
                continue
            break
        if not turn_counted(self._turn_called, reason["kind"]):
            self._refund_turn()  # before any await: nothing reads the count in between
        self._stage("turn/end", {"turn": turn, "reason": reason})
        with trio.CancelScope(shield=True):
            await self._flush()
        if self.config.ledger is not None:
            self.config.ledger.settled(self.session_id)  # what it did not use returns to its parent
        return TurnResult(turn=turn, reason=reason, text=text, closing_text=self._closing_text)

    def _stage_refused(self, turn: int, step: int, pending: list[Delivery]) -> None:
        """A step whose model call a budget refused: the input that came for it is kept, in a
        step without a model call."""
        if pending:
            self._stage("step/start", {"turn": turn, "step": step})
            self._stage_input(turn, step, pending)
            self._stage("step/end", {"turn": turn, "step": step})

    def _refund_turn(self) -> None:
        """A budget ended the turn before any model call of it was recorded: it does not count
        as started (budgets.py `turn_counted`), here and in every ancestor's count."""
        self.spent = attrs.evolve(self.spent, turns=max(0, self.spent.turns - 1))
        if self.config.ledger is not None:
            self.config.ledger.turn_refused(self.session_id)

    def _aborted(self) -> Json:
        if self._budget_stop is not None:
            return {"kind": "budget", "message": self._budget_stop}
        return {"kind": "aborted", "cause": self._cause}

    # --- budgets --------------------------------------------------------------------------

    def _budget_out(self, step: int, *, sized: bool = True, size: int | None = None) -> str | None:
        """Before a model call: the message of the budget that has run out, or None; `sized`:
        with the call's estimated size (`size`, else the surface's) on top of what was spent
        (else only what has run out)."""
        budget = self.budget
        if budget is not None:
            now = self.clock.now_ms() if budget.deadline is not None else None
            out = exhausted(budget, self.spent, first_call=step == 1, now_ms=now)
            if out is not None:
                return out
        ledger = self.config.ledger
        if ledger is None or not ledger.bounded(self.session_id):
            return None
        # Its own and every ancestor's shared limits, with this call's estimated size on top.
        estimate = 0 if not sized else size if size is not None else request_estimate(self.surface.messages())
        return ledger.refusal(self.session_id, estimate, self.model_spec(), first_call=step == 1)

    async def _join_ledger(self) -> None:
        """Enter the runtime's ledger (tree_ledger.py) with what this session spent, and, when
        its budget is shared, what its descendants spent (read once, here)."""
        ledger, header = self.config.ledger, self.session.header
        if ledger is None or self._own_spent is None:
            return
        parent = header.parent_session if header.origin == "subagent" else None
        await ledger.join(self.session_id, parent, self.budget, self._own_spent)

    def _trio_deadline(self) -> float:
        """The budget's deadline (runtime clock) as a Trio deadline for this turn's waits."""
        budget = self.budget
        if budget is None or budget.deadline is None:
            return math.inf
        return trio.current_time() + max(0, budget.deadline - self.clock.now_ms()) / 1000

    def _expire(self, abort: Abort) -> None:
        """The deadline passed mid-turn: stop the turn as a cancel does (two-phase), with the
        budget as its reason."""
        if abort.is_set():
            return  # stopped already, for another reason
        self._budget_stop = DEADLINE_TEXT
        abort.set()
        if self._model_scope is not None:
            self._model_scope.cancel()

    # --- writing --------------------------------------------------------------------------


_RECORDING = frozenset({"user/message", "subagent/settled"})  # the events that carry a delivery_id


def recorded_delivery_ids(events: Sequence[Event]) -> set[str]:
    """The mailbox delivery ids the events record (`user/message` and `subagent/settled` data's
    `delivery_id`): the projection that makes a redelivery recorded once."""
    ids: set[str] = set()
    for event in events:
        if event.type in _RECORDING:
            try:
                value = _DELIVERY_ID.decode(event.data).delivery_id
            except msgspec.DecodeError:
                continue  # the log was checked when read: no such payload reaches here
            if value is not None:
                ids.add(value)
    return ids


class _DeliveryIdOnly(msgspec.Struct):
    delivery_id: str | None = None


_DELIVERY_ID = msgspec.json.Decoder(_DeliveryIdOnly)


def _ended_by(finish: str | None) -> Json:
    """The reason of a turn whose last durable reply ended it, though its `turn/end` was not
    (a hand-written log: the loop writes such a reply with the turn's end)."""
    if finish == "max-tokens":
        return {"kind": "max-tokens"}
    if finish in (None, "stop"):
        return {"kind": "completed"}
    return {"kind": "interrupted"}


def _model_names(model: object) -> tuple[str, str]:
    """(provider, model name) for spans: a built model's record (`deepseek:deepseek-chat`), else
    this runtime and the model's class (a scripted model, an embedder's own)."""
    record = record_of(getattr(model, "inner", model))
    if record is None:
        return "subagents", type(model).__name__
    provider, _, name = record.model.partition(":")
    return provider, name


def _last_turn(events: Sequence[Event], session_id: str) -> int:
    for event in reversed(events):
        if event.type == "turn/start":
            return int(decode_payload(event, session_id=session_id).turn)
    return 0
