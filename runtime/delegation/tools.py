"""`subagent`, `subagent_fork`, `list_agents`, `send_message`, `interrupt_agent` (README,
"Model-facing tools").

Names, parameters and renders are exact; the descriptions keep the phrases of the agent harness
this runtime reimplements, because they steer model behaviour. A refused call raises the
service's `SubagentError`, whose pinned record makes the durable `tool/result` carry
`error: {name: "SubagentError", code}` (runtime/foundation/errors.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import attrs
from subagents.storage import CatalogedChild

from ..agent.registry import AgentRegistry
from ..foundation.budgets import Budget
from ..foundation.errors import NoCallingAgent, Unauthorized
from ..models.messages import text_blocks
from ..tools.base import Reconciled, ToolContext, ToolOutcome, in_doubt_outcome
from .agent_types import AgentType, describe_types
from .agents_text import render_agents
from .listing import ChildRow, ListingService
from .messaging import Messaging
from .options import ChildOptions
from .spawning import Reservation, Spawning
from .stopping import Stopping

__all__ = ["DelegationParts", "agent_status", "interrupt_text", "render_agents", "subagent_tools"]

Json = dict[str, Any]


def _schema(required: Sequence[str] = (), **properties: Json) -> Json:
    """An object schema that takes exactly `properties` (in order), `required` among them."""
    schema: Json = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    schema["additionalProperties"] = False
    return schema


def _text(kind: str, description: str) -> Json:
    return {"type": kind, "description": description}


_DELEGATE_PARAMS = _schema(
    ("description", "prompt"),
    description=_text("string", "A short (3-5 word) description of the delegated task, for display."),
    prompt=_text("string", "The task for the subagent: everything it needs to know."),
    run_in_background=_text(
        "boolean", "true (default): start a continuable background child and return its id; false: wait for its answer."
    ),
    # Optional budget limits (runtime/foundation/budgets.py): they can only lower what the child inherits.
    max_turns={
        "type": "integer",
        "minimum": 1,
        "description": "Optional: at most this many turns for the child (never more than you have left).",
    },
    max_tokens={
        "type": "integer",
        "minimum": 1,
        "description": "Optional: at most this many model tokens (input + output) for the child (never more than you have left).",
    },
    deadline_seconds={
        "type": "number",
        "minimum": 1,
        "description": "Optional: the child stops this many seconds from now (never later than your own deadline).",
    },
)

_BACKGROUND = (
    " This tool runs in the background by default, immediately returns a durable subagent id, and keeps the "
    "child conversation available for later turns. When that run settles, the runtime sends the parent a notice "
    "containing its outcome and any final assistant message; `send_message` steers the child's nearest step "
    "while it is running and starts a turn while it is idle. Set `run_in_background: false` only when your next "
    "action depends on receiving the result."
)

LIST_AGENTS_DESCRIPTION = (
    "List your continuable background subagents by durable id and label. Use it to recall which ones you "
    "started, not to poll for completion — you are told when one finishes. Status comes from the live registry: "
    "running means the agent is working right now, idle means it is loaded but between turns (it may be waiting "
    "on agents it started), and ready means it exists only in storage — resumable, not terminal, and not a result "
    "waiting to be collected; a `send_message` steers a running child at its nearest step boundary or starts a "
    "turn for an idle or ready child, and a direct child remains a `send_message` candidate in every status. The "
    "snapshot is not a delivery promise — `send_message` performs the authoritative check and may still fail. "
    "Children that could not be read are reported as diagnostics instead of being silently dropped. Scope "
    "`descendants` walks the whole tree below you in stable pre-order, annotating each entry with its durable "
    "direct-parent session id and depth. You may use `send_message` only for depth-1 entries; deeper entries are "
    "candidates for `interrupt_agent` only."
)

SEND_MESSAGE_DESCRIPTION = (
    "Send a message to a direct continuable child by its agent id. If you are a resident continuable child, you "
    "may also target your direct parent. If the target is still working, the message steers its nearest step; if "
    "it is idle, the message starts a turn. This call returns no answer from the agent — only confirmation that "
    "the message was delivered. A failure means the message was NOT delivered."
)

INTERRUPT_DESCRIPTION = (
    "Request cancellation of a background agent's current turn by its agent id. The target may be your direct "
    "child or a deeper agent created under you. Only the current turn stops: messages already queued for the "
    "agent stay parked until a later send_message, agents it started keep running, and the agent itself stays "
    "available for follow-ups. This call returns as soon as the stop request is accepted, so the target may keep "
    "running briefly; interrupting an agent that already finished is an accepted no-op."
)


def _caller(ctx: ToolContext, tool: str) -> Any:
    if ctx.agent is None:
        raise NoCallingAgent(f"{tool} requires a calling agent (exec.agent was undefined)")
    return ctx.agent


@attrs.frozen(kw_only=True)
class DelegationParts:
    """The parts of the subagent service the subagent tools act through."""

    spawning: Spawning
    messaging: Messaging
    listing: ListingService
    agents: AgentRegistry
    stopping: Stopping  # `interrupt_agent`'s `stop` option (issue 27)


@attrs.frozen
class _ServiceTool:
    """A model-facing tool that acts through the subagent service's parts; every one is
    parallel-safe (the parts order what must be ordered)."""

    service: DelegationParts
    parallel_safe: ClassVar[bool] = True


@attrs.frozen
class _Delegate(_ServiceTool):
    name: str
    provider: Literal["spawn", "fork"]
    agent_types: Mapping[str, AgentType] = attrs.field(factory=dict)  # choosable by `agent_type` (spawn only)

    @property
    def parameters(self) -> Json:
        if not self.agent_types:
            return _DELEGATE_PARAMS  # exactly SPEC 5.5's
        choice = {"type": "string", "enum": sorted(self.agent_types), "description": describe_types(self.agent_types)}
        return {**_DELEGATE_PARAMS, "properties": {**_DELEGATE_PARAMS["properties"], "agent_type": choice}}

    @property
    def description(self) -> str:
        if self.provider == "fork":
            head = "Delegate a task to a subagent that inherits this conversation (its history up to your last finished turn)."
        else:
            head = "Delegate a self-contained task to a subagent with a fresh context: give it everything it needs in the prompt."
        return head + _BACKGROUND

    async def prepare(self, args: Json, ctx: ToolContext) -> Reservation:
        return await self.service.spawning.reserve(ctx.session_id, (ctx.turn, ctx.step), call_id=ctx.call_id)

    def reconcile(self, args: Json, child: CatalogedChild | None, unkeyed: bool) -> Reconciled:
        """A call a crash cut after it started (docs/format.md, "Continued turns"): its
        catalog says whether it created its child. No catalog names it: it never got that far,
        so it runs (unless the turn's catalog names no calls: an older log, where it is in doubt)."""
        if child is None:
            return Reconciled(in_doubt_outcome(), in_doubt=True) if unkeyed else Reconciled()
        if child.mode == "continuable":
            # What the call returned once its child was catalogued: the child runs on by itself
            # (its own resume continues its turn) and its settlement comes as a notice.
            return Reconciled(ToolOutcome(text_blocks(f"started subagent {child.child_id}")))
        # A one-shot child ran inside this very call; its turn is closed on this resume (it is
        # nobody else's to continue), so what it did is not known here.
        return Reconciled(
            in_doubt_outcome(
                f"The one-shot subagent {child.child_id} was started by this call, but the call was interrupted "
                "before its result was durably recorded; the subagent's turn was closed unfinished and its "
                "outcome is unknown. Inspect its effects before starting the task again."
            ),
            in_doubt=True,
        )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        try:
            return await self._run(args, ctx)
        finally:
            if isinstance(ctx.prepared, Reservation):
                ctx.prepared.announced.set()  # refused or failed: the next catalog of its step goes on

    async def _run(self, args: Json, ctx: ToolContext) -> str:
        parent = _caller(ctx, self.name)
        options = _child_options(args, self.agent_types)
        if args.get("run_in_background", True):
            child_id = await self.service.spawning.start_continuable(
                parent,
                self.provider,
                args["description"],
                args["prompt"],
                ctx.abort,
                reserved=ctx.prepared,
                options=options,
            )
            return f"started subagent {child_id}"
        result = await self.service.spawning.start(
            parent,
            self.provider,
            args["prompt"],
            label=args["description"],
            abort=ctx.abort,
            reserved=ctx.prepared,
            options=options,
        )
        return result.text or ""


def _child_options(args: Json, agent_types: Mapping[str, AgentType]) -> ChildOptions | None:
    """The options a call asks for: its agent type's (the schema's enum admits only known types)
    and its budget (integers and a number >= 1, by the schema); they go into the descriptor."""
    options = agent_types[args["agent_type"]].options() if "agent_type" in args else None
    turns, tokens, seconds = args.get("max_turns"), args.get("max_tokens"), args.get("deadline_seconds")
    if turns is None and tokens is None and seconds is None:
        return options
    budget = Budget(
        max_turns=None if turns is None else int(turns),
        max_tokens=None if tokens is None else int(tokens),
        seconds=None if seconds is None else float(seconds),
    )
    return attrs.evolve(options or ChildOptions(), budget=budget)


def interrupt_text(agent_id: str, outcome: str) -> str:
    """What an interrupt's outcome is called (the tool's answer, chat's `/interrupt`)."""
    tail = {"not-running": " (it is not running)", "idle": " (it was idle: nothing was running)"}.get(outcome, "")
    return f"interrupt requested for agent {agent_id}{tail}"


def agent_status(agents: Any, child_id: str) -> str:
    """`list_agents` status from the agent registry: running, idle (resident), or ready (disk)."""
    agent = agents.get(child_id)
    return "ready" if agent is None else ("running" if agent.status == "running" else "idle")


class _ListAgents(_ServiceTool):
    name: ClassVar[str] = "list_agents"
    idempotent: ClassVar[bool] = True  # it only reads
    description: ClassVar[str] = LIST_AGENTS_DESCRIPTION
    parameters: ClassVar[Json] = _schema(
        scope={
            "type": "string",
            "enum": ["children", "descendants"],
            "description": "children (default) lists direct children only; descendants walks the complete tree below you.",
        },
    )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        caller = _caller(ctx, self.name)
        descendants = args.get("scope", "children") == "descendants"
        listing = self.service.listing
        if descendants:
            rows = await listing.list_descendants(caller.session_id, ctx.abort)
        else:
            rows = await listing.list_children(caller.session_id, ctx.abort)
        # A child not resident here that the listing found `running` is held by another process.
        elsewhere = {row.id for row in rows if isinstance(row, ChildRow) and row.activity == "running"}
        agents = self.service.agents
        manager = self.service.spawning.manager

        def status(child_id: str) -> str:
            activation = manager.get(child_id)
            if activation is not None and activation.closing:
                # Settled, its disposal under way: its agent and its session go one after the
                # other, and a parent woken by the settlement must not see either half.
                return "ready"
            if child_id in elsewhere and agents.get(child_id) is None:
                return "running"
            return agent_status(agents, child_id)

        return render_agents(rows, descendants, status)


class _SendMessage(_ServiceTool):
    name: ClassVar[str] = "send_message"
    description: ClassVar[str] = SEND_MESSAGE_DESCRIPTION
    parameters: ClassVar[Json] = _schema(
        ("agent_id", "message"),
        agent_id=_text(
            "string",
            "The agent id of your direct continuable child, or your direct parent when you are a resident continuable child.",
        ),
        message=_text("string", "The message to deliver to the agent."),
    )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        sender = _caller(ctx, self.name)
        await self.service.messaging.send_message(sender, args["agent_id"], args["message"], ctx.abort)
        return f"message delivered to agent {args['agent_id']}"


STOP_OPTION_DESCRIPTION = (
    "Optional: true stops the agent and every agent below it for good, wherever they run: their turns end, "
    "they are settled, and nothing resumes them until you send the agent a new message. Use it for work you no "
    "longer want; the default (false) ends only the current turn."
)


class _InterruptAgent(_ServiceTool):
    name: ClassVar[str] = "interrupt_agent"
    description: ClassVar[str] = INTERRUPT_DESCRIPTION
    parameters: ClassVar[Json] = _schema(
        ("agent_id",),
        agent_id=_text("string", "The agent id of the running agent to interrupt."),
        stop=_text("boolean", STOP_OPTION_DESCRIPTION),
    )

    async def run(self, args: Json, ctx: ToolContext) -> str:
        caller = _caller(ctx, self.name)
        if args.get("stop") is True:
            return await _stop_tree(self.service.stopping, args["agent_id"], caller)
        outcome = await self.service.messaging.interrupt(args["agent_id"], caller)
        return interrupt_text(args["agent_id"], outcome)


async def _stop_tree(stopping: Stopping, target_id: str, caller: Any) -> str:
    """`interrupt_agent` with `stop: true`: the target must be below the caller (its lineage in
    the store, wherever it runs); then its whole tree is stopped (`Stopping.stop_tree`)."""
    if target_id == caller.session_id or target_id not in (await stopping.subtree(caller.session_id))[1:]:
        raise Unauthorized(f'subagent "{target_id}" is not a descendant of agent "{caller.session_id}"')
    done = await stopping.stop_tree(target_id, by=caller.session_id, cause="parent")
    below = [sid for sid in done.descendants if sid in done.stopped]
    tail = f" with its descendants {', '.join(below)}" if below else ""
    late = f"; not yet confirmed: {', '.join(done.unconfirmed)}" if done.unconfirmed else ""
    return f"stopped agent {target_id}{tail} ({len(done.stopped)} stopped for good){late}"


def subagent_tools(service: DelegationParts, agent_types: Mapping[str, AgentType] | None = None) -> list[Any]:
    """The five subagent tools, acting through `service` (the parts they use); `subagent` offers
    `agent_type` when `agent_types` holds any."""
    return [
        _Delegate(service, "subagent", "spawn", dict(agent_types or {})),
        _Delegate(service, "subagent_fork", "fork"),
        _ListAgents(service),
        _SendMessage(service),
        _InterruptAgent(service),
    ]
