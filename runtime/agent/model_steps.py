"""The model half of an agent's step (docs/design.md, "The agent loop and models"): one model
call streamed into a reply, the reply kept as `assistant/message`, and compaction's summary call.

The call runs in a cancel scope the turn's cancel (or its budget's deadline) cuts at any chunk:
the text streamed so far is kept as `assistant/message {interrupted: true}`. A `ModelError`, or
a transport's bug, ends the turn as an error; the loop never retries.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any, Literal

import attrs
import trio
from subagents.actors import Abort
from subagents.storage import ReplaceOp
from trio_util import AsyncValue

from ..foundation.budgets import Spent
from ..foundation.errors import ModelError
from ..models.base import Finish, Model, ModelRequest, TextDelta, Thinking, ToolCallDelta, Usage
from ..models.messages import message, text_blocks
from ..models.specs import record_of
from ..telemetry.seam import TurnTrace
from ..tools.base import ToolSet
from .compaction import plan_compaction
from .step_writer import StepWriter
from .tool_steps import ToolCall
from .tree_ledger import CHARGED_COUNTS, request_estimate

__all__ = ["ModelReply", "ModelSteps"]

log = logging.getLogger(__name__)

Json = dict[str, Any]


@attrs.define
class ModelReply:
    """What one model call gave: its text, tool calls, finish and usage, or its error, and
    whether it was cut (`interrupted`)."""

    text: str = ""
    calls: list[ToolCall] = attrs.field(factory=list)
    thinking: list[Json] = attrs.field(factory=list)  # whole thinking blocks, as logged
    finish: str | None = None
    usage: Json | None = None
    error: str | None = None
    interrupted: bool = False


class ModelSteps(StepWriter):
    """An agent's model calls (see the module docstring); the attributes are the agent's."""

    tools: ToolSet
    spent: Spent
    assistant_count: int
    _stream_model: Model
    _model_scope: trio.CancelScope | None
    _closing_text: str | None
    _phase: AsyncValue[Any]
    _turn_trace: TurnTrace
    model: Any

    def model_spec(self) -> str | None:
        """The spec of the model this session runs (`session/model`'s), for prices."""
        record = record_of(self.model)
        return None if record is None else record.model

    def _request(self, purpose: Literal["turn", "compaction"], messages: Sequence[Json]) -> ModelRequest:
        return ModelRequest(
            messages=list(messages),
            tools=self.tools.specs() if purpose == "turn" else (),
            purpose=purpose,
        )

    async def _call_model(self, turn: int, step: int, abort: Abort) -> ModelReply:
        """The step's model call, in its `chat` span (runtime/telemetry/seam.py)."""
        messages = self.surface.messages()
        chat = self._turn_trace.chat(messages)
        try:
            reply = await self._stream_reply(messages, abort)
        except BaseException as exc:  # the span ends failed on any exit (a cancel too); re-raised
            chat.fail(exc)
            raise
        chat.end(
            text=reply.text,
            calls=[(c.id, c.name, c.arguments) for c in reply.calls],
            finish=reply.finish,
            usage=reply.usage,
            error=reply.error,
            interrupted=reply.interrupted,
        )
        return reply

    async def _stream_reply(self, messages: list[Json], abort: Abort) -> ModelReply:
        reply = ModelReply()
        parts: list[str] = []
        calls: dict[int, list[Any]] = {}  # index -> [id, name, [argument fragments]]
        with trio.CancelScope(deadline=self._turn_deadline) as scope:
            self._model_scope = scope
            if abort.is_set():
                scope.cancel()
            self._phase.value = "model"
            try:
                async with aclosing(self._stream_model.stream(self._request("turn", messages))) as stream:
                    async for chunk in stream:
                        if isinstance(chunk, TextDelta):
                            parts.append(chunk.text)
                        elif isinstance(chunk, ToolCallDelta):
                            slot = calls.setdefault(chunk.index, [None, None, []])
                            slot[0] = slot[0] or chunk.id
                            slot[1] = slot[1] or chunk.name
                            slot[2].append(chunk.arguments)
                        elif isinstance(chunk, Thinking):
                            reply.thinking.append(chunk.block())
                        elif isinstance(chunk, Usage):
                            reply.usage = chunk.record()
                        elif isinstance(chunk, Finish):
                            reply.finish = chunk.reason
            except ModelError as exc:
                reply.error = exc.message
            except Exception as exc:  # a transport bug must end the turn, not the runtime
                log.exception("model transport failed for session %s", self.session_id)
                reply.error = f"model call failed: {type(exc).__name__}: {exc}"
            finally:
                self._phase.value = "writing"
        self._model_scope = None
        reply.text = "".join(parts)
        if scope.cancelled_caught and not abort.is_set():
            self._expire(abort)  # only the budget's deadline cancels it without an abort
        if scope.cancelled_caught or abort.is_set():
            reply.interrupted = True
            return reply
        if reply.error is None and reply.finish is None:
            reply.error = "the model stream ended without a finish"
        n = self.assistant_count + 1
        for i, index in enumerate(sorted(calls), start=1):
            call_id, name, fragments = calls[index]
            reply.calls.append(ToolCall(i - 1, call_id or f"call_{n}_{i}", name or "", "".join(fragments)))
        return reply

    async def _record_reply(self, turn: int, step: int, reply: ModelReply, *, attempt: int | None = None) -> None:
        """Keep the reply as `assistant/message`; `attempt`: it answers a model call issued again
        after its turn was continued (docs/format.md, "Continued turns")."""
        # Thinking first, as the provider gave it: it is sent back ahead of the text and calls.
        content: list[Json] = [*reply.thinking, *(text_blocks(reply.text) if reply.text else [])]
        if reply.interrupted or reply.error is not None:
            if not reply.text:
                return  # nothing visible was produced: no assistant message
            reply.calls = []
            finish = "aborted" if reply.interrupted else "error"
        else:
            content += [
                {"type": "tool-call", "id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.calls
            ]
            finish = "tool-calls" if reply.calls else (reply.finish or "stop")
        data: Json = {
            "turn": turn,
            "step": step,
            "message": message(self._next_message_id(), "assistant", content, {"kind": "model"}),
            "finish": finish,
        }
        if reply.usage is not None:
            data["usage"] = reply.usage
            self._charge(reply.usage)
        if reply.interrupted:
            data["interrupted"] = True
        if attempt is not None:
            data["attempt"] = attempt
        self._stage("assistant/message", data, surface_op="append")
        self.assistant_count += 1
        self._closing_text = reply.text or None
        if not reply.calls:
            return
        with trio.CancelScope(shield=True):
            await self._flush()

    def _charge(self, usage: Json) -> None:
        """A recorded model call's usage: charged to its own count and, through the ledger, to
        it and every ancestor (tree_ledger.py)."""
        charged = sum(usage.get(k, 0) for k in CHARGED_COUNTS)  # reasoning is part of output
        self.spent = attrs.evolve(self.spent, tokens=self.spent.tokens + charged)
        if self.config.ledger is not None:
            self.config.ledger.charge(self.session_id, usage, self.model_spec())

    # --- compaction -----------------------------------------------------------------------

    async def _maybe_compact(self, turn: int, step: int, abort: Abort) -> tuple[str | None, int | None]:
        """Compact the surface when it is over the policy's size. Returns the message of the
        budget its summary call would have crossed (then it was not sent), and, when it
        compacted, the estimated size of the step's call with the summary in place of the range
        (the surface changes only when the events are written, with the step's input)."""
        policy = self.config.compaction
        if policy is None or abort.is_set() or self.surface.size() <= policy.max_chars:
            return None, None
        plan = plan_compaction(self.surface.nodes, keep_recent=policy.keep_recent)
        if plan is None:
            return None, None
        messages = [n.message for n in plan.nodes]
        ledger = self.config.ledger
        if ledger is not None and ledger.bounded(self.session_id):
            # Checked like a step's call: its estimated size against every ancestor's remainder.
            refused = ledger.refusal(self.session_id, request_estimate(messages), self.model_spec())
            if refused is not None:
                return refused, None
        self._stage("compaction/start", {"turn": turn})
        summary, usage = await self._summarize(messages, abort)
        if summary is None:
            self._staged.pop()  # no summary, no compaction: the log shows none of it
            return None, None
        data: Json = {"text": summary}
        if usage is not None:
            data["usage"] = usage
            self._charge(usage)
        self._stage("compaction/summary", data)
        replacement = message(
            self._next_message_id(),
            "user",
            text_blocks(f"<compacted-summary>{summary}</compacted-summary>"),
            {"kind": "compaction"},
        )
        self._stage(
            "user/message",
            {"turn": turn, "step": step, "message": replacement},
            surface_op=ReplaceOp(op="replace", start_seq=plan.start_seq, end_seq=plan.end_seq),
            source_event_seqs=sorted(n.seq for n in plan.nodes),
        )
        self._stage("compaction/end", {"start_seq": plan.start_seq, "end_seq": plan.end_seq})
        size = request_estimate(self.surface.messages()) - request_estimate(messages)
        return None, max(0, size) + request_estimate([replacement])

    async def _summarize(self, messages: list[Json], abort: Abort) -> tuple[str | None, Json | None]:
        """Compaction's summary call, in a `chat` span of its own: its text and usage."""
        chat = self._turn_trace.chat(messages)
        try:
            summary, usage = await self._summary_call(messages, abort)
        except BaseException as exc:  # the span ends failed on any exit (a cancel too); re-raised
            chat.fail(exc)
            raise
        chat.end(
            text=summary or "",
            calls=(),
            finish="stop" if summary is not None else None,
            usage=usage,
            error=None,
            interrupted=summary is None and abort.is_set(),
        )
        return summary, usage

    async def _summary_call(self, messages: list[Json], abort: Abort) -> tuple[str | None, Json | None]:
        parts: list[str] = []
        usage: Json | None = None
        with trio.CancelScope(deadline=self._turn_deadline) as scope:
            self._model_scope = scope
            try:
                async with aclosing(self._stream_model.stream(self._request("compaction", messages))) as stream:
                    async for chunk in stream:
                        if isinstance(chunk, TextDelta):
                            parts.append(chunk.text)
                        elif isinstance(chunk, Usage):
                            usage = chunk.record()
            except ModelError as exc:
                log.warning("compaction of session %s failed: %s", self.session_id, exc.message)
                return None, None
        self._model_scope = None
        if scope.cancelled_caught and not abort.is_set():
            self._expire(abort)
        if scope.cancelled_caught or abort.is_set() or not parts:
            return None, None
        return "".join(parts), usage
