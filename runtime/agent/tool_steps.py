"""The tool half of an agent's step (docs/design.md, "The agent loop and models"): each requested
call written as `tool/call` (durable before it runs), run, and its `tool/result` written in model
order. Consecutive parallel-safe calls run together (at most `max_parallel_tools` at once); an
exclusive call runs alone.

Cancellation is two-phase: after the turn's abort, running tools get `tool_abort_grace` seconds
of the runtime clock to return (what they return is recorded), then their scope is cancelled: a
dispatched call with no result gets `Error: tool call was cancelled`, an undispatched one a
`tool/call` and `Error: tool call aborted before dispatch`. Result writes run shielded, so the
log and the in-memory surface never disagree.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio
from subagents.actors import Abort
from subagents.storage import Continuation
from trio_util import move_on_when

from ..models.messages import tool_result_message
from ..telemetry.seam import ToolTrace, TurnTrace
from ..tools.base import PreparedCall, ToolContext, ToolOutcome, ToolSet
from .step_writer import Json, StepWriter

__all__ = ["CANCELLED_TEXT", "NOT_DISPATCHED_TEXT", "ToolCall", "ToolSteps"]

CANCELLED_TEXT = "tool call was cancelled"
NOT_DISPATCHED_TEXT = "tool call aborted before dispatch"


@attrs.define
class ToolCall:
    """One call the model asked for in this step, from dispatch to its recorded result."""

    index: int
    id: str
    name: str
    arguments: str
    outcome: ToolOutcome | None = None
    prepared: PreparedCall | None = None
    dispatched: bool = False
    recorded: bool = False
    done: trio.Event = attrs.field(factory=trio.Event)
    trace: ToolTrace | None = None  # its `execute_tool` span, from dispatch to its result


class ToolSteps(StepWriter):
    """An agent's tool calls (see the module docstring); the attributes are the agent's."""

    tools: ToolSet
    _turn_trace: TurnTrace

    async def _run_tools(self, turn: int, step: int, calls: list[ToolCall], abort: Abort) -> None:
        limiter = trio.CapacityLimiter(self.config.max_parallel_tools)
        async with move_on_when(self._grace, abort):
            for group in _groups(calls, self.tools.parallel_safe):
                if abort.is_set():
                    break
                for call in group:
                    self._stage(
                        "tool/call",
                        {
                            "turn": turn,
                            "step": step,
                            "call_id": call.id,
                            "name": call.name,
                            "arguments": call.arguments,
                        },
                    )
                    call.dispatched = True
                    call.trace = self._turn_trace.tool(call.id, call.name, call.arguments)
                with trio.CancelScope(shield=True):
                    await self._flush()
                for call in group:  # in model order: ids and times drawn here follow it
                    call.prepared = await self.tools.prepare(
                        call.name, call.arguments, self._ctx(turn, step, call, abort)
                    )
                async with trio.open_nursery() as pool:
                    for call in group:
                        # Slots are taken in model order, so a call that waits on an
                        # earlier one of its step (a child's catalog) never holds the slot
                        # that earlier call needs.
                        await limiter.acquire_on_behalf_of(call.index)
                        pool.start_soon(self._execute, turn, step, call, abort, limiter)
                    for call in group:
                        await _announced(call)
                    for call in group:
                        await call.done.wait()
                        await self._record_result(turn, step, call)
        for call in calls:
            if call.recorded:
                continue
            if call.outcome is not None:
                pass  # it returned, but the cancel came before its result was written
            elif call.dispatched:
                call.outcome = ToolOutcome.failure(CANCELLED_TEXT, name="ToolCancelledError", code="CANCELLED")
            else:
                self._stage(
                    "tool/call",
                    {"turn": turn, "step": step, "call_id": call.id, "name": call.name, "arguments": call.arguments},
                )
                call.outcome = ToolOutcome.failure(
                    NOT_DISPATCHED_TEXT, name="ToolAbortedError", code="ABORTED_BEFORE_DISPATCH"
                )
            await self._record_result(turn, step, call)

    async def _finish_cut_calls(self, turn: int, step: int, plan: Continuation, abort: Abort) -> None:
        """A continued turn's open step: the calls its reply requested that have no result.
        One recorded as started is reconciled first (`ToolSet.reconcile`: its recorded result,
        in doubt, or run again), so every result that does not run is durable before anything
        runs; then the rest run as any step's calls do (a new `tool/call` each)."""
        rerun: list[ToolCall] = []
        for cut in plan.pending:
            if cut.call_seq is not None:
                found = await self.tools.reconcile(
                    cut.name, cut.arguments, plan.catalog.get(cut.call_id), plan.unkeyed_catalog
                )
                if found.outcome is not None:
                    call = ToolCall(len(rerun), cut.call_id, cut.name, cut.arguments, outcome=found.outcome)
                    await self._record_result(turn, step, call, in_doubt=found.in_doubt, call_seq=cut.call_seq)
                    continue
            rerun.append(ToolCall(len(rerun), cut.call_id, cut.name, cut.arguments))
        if rerun:
            await self._run_tools(turn, step, rerun, abort)

    async def _grace(self, abort: Abort) -> None:
        """Returns (and so cancels the running tools) `tool_abort_grace` after the abort."""
        with trio.move_on_at(self._turn_deadline):
            await abort.wait()
        self._expire(abort)  # no-op when the abort came first
        await self.clock.sleep(self.config.tool_abort_grace)

    def _ctx(self, turn: int, step: int, call: ToolCall, abort: Abort) -> ToolContext:
        return ToolContext(session_id=self.session_id, call_id=call.id, turn=turn, step=step, abort=abort, agent=self)

    async def _execute(self, turn: int, step: int, call: ToolCall, abort: Abort, limiter: trio.CapacityLimiter) -> None:
        assert call.prepared is not None
        try:
            call.outcome = await self.tools.run(call.prepared, self._ctx(turn, step, call, abort))
        finally:
            limiter.release_on_behalf_of(call.index)
        call.done.set()

    async def _record_result(
        self, turn: int, step: int, call: ToolCall, *, in_doubt: bool = False, call_seq: int | None = None
    ) -> None:
        outcome = call.outcome
        assert outcome is not None
        data: Json = {
            "turn": turn,
            "step": step,
            "message": tool_result_message(
                self._next_message_id(), call.id, outcome.content, is_error=outcome.is_error
            ),
        }
        if outcome.error is not None:
            data["error"] = outcome.error
        if in_doubt:
            data["in_doubt"] = True
        seqs = {"source_event_seqs": [call_seq]} if call_seq is not None else {}
        self._stage("tool/result", data, surface_op="append", **seqs)
        call.recorded = True
        trace = call.trace or self._turn_trace.tool(call.id, call.name, call.arguments)
        trace.end(content=outcome.content, is_error=outcome.is_error, error=outcome.error)
        with trio.CancelScope(shield=True):
            await self._flush()


async def _announced(call: ToolCall) -> None:
    """Until the call wrote what it writes to this session's log before its result (a child's
    `subagent/catalog`): results then never interleave with a later call's such writes."""
    announced = getattr(call.prepared.state if call.prepared is not None else None, "announced", None)
    if isinstance(announced, trio.Event):
        await announced.wait()


def _groups(calls: list[ToolCall], parallel_safe: Callable[[str], bool]) -> list[list[ToolCall]]:
    """Consecutive parallel-safe calls run together; an exclusive call runs alone (a barrier)."""
    groups: list[list[ToolCall]] = []
    for call in calls:
        if parallel_safe(call.name) and groups and parallel_safe(groups[-1][0].name):
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups
