"""`open_runtime`: the one composition root (README, "open_runtime").

It builds everything and passes it explicitly — the log store (and its index), the projection
registry with the subagent units and the usage unit, the session store (which owns the actors' nursery), the store
reader (the one read side), the session query and the listing service — and tears it down in reverse. Nothing below
it reads the environment or a global registry. The agents run in a nursery inside the session store's, so they stop (and close their
turns) before their session actors do. The agent registry gets its hooks (the subagent service)
at construction; the service's parts are then built from the registry and bound to the service
once (runtime/delegation/service.py says why), so nothing is assigned to the registry after.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Literal

import attrs
import trio
from subagents.actors import ContinuationManager, SessionStore, StoreReader, open_session_store
from subagents.storage import (
    Continuation,
    LogStore,
    Mailbox,
    Placements,
    ProjectionRegistry,
    StorageError,
    plan_continuation,
)

from .agent.loop import Agent, AgentConfig
from .agent.mailbox_owner import MailboxOwners
from .agent.model_record import ModelFactory
from .agent.registry import AgentRegistry, SessionTools
from .agent.tree_ledger import Seeded, TreeLedger
from .delegation.agent_types import AgentType
from .delegation.listing import ListingService
from .delegation.listing_stall import STALL_AFTER
from .delegation.options import ChildModel
from .delegation.service import SubagentParts, SubagentService
from .delegation.tools import DelegationParts, subagent_tools
from .foundation.budgets import Budget
from .foundation.clock import Clock, RealClock
from .foundation.ids import IdFactory, RandomIds
from .foundation.pricing import PriceTable
from .lease_renewal import renew_leases
from .models.base import AnyModel
from .models.specs import build_model, parse_model_spec
from .query import SessionQuery
from .read_side import runtime_registry
from .sandbox.box import Sandbox
from .sandbox.policy import SandboxPolicy
from .store_select import StoreOptions, open_log_store, open_mailbox
from .telemetry.seam import Telemetry
from .telemetry.settings import TelemetrySettings
from .tools.base import Tool, ToolSet
from .tools.mcp_servers import McpServers
from .tools.mcp_spec import McpServerSpec
from .tools.permissions import DEFAULT_PERMISSIONS, Approver, Permissions, Remembered, default_permissions, guard_tools
from .tools.workspace_tools import workspace_tools
from .usage_totals import descendant_spent

__all__ = ["Runtime", "open_runtime"]

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class Runtime:
    root: str
    log_store: LogStore
    registry: ProjectionRegistry
    sessions: SessionStore
    query: SessionQuery
    listing: ListingService
    agents: AgentRegistry
    subagents: SubagentService
    clock: Clock
    mcp: McpServers | None = None  # the MCP servers' status, for the host to show
    mailbox: Mailbox | None = None  # deliveries to any session (SPEC §9; runtime/agent/mailbox_owner.py)
    prices: PriceTable = attrs.field(factory=PriceTable)  # `[prices]`: what costs are shown at
    sandbox: Sandbox | None = None  # `run_command`'s box (README "Sandbox"): a host's own workspace tools use it

    async def resume(
        self, session_id: str, *, on_interrupted_turn: Literal["continue", "close"] | None = None
    ) -> Agent:
        """The session's agent, live or resumed from its log. A turn a crash left open is
        continued or closed (README "When a process dies") as `on_interrupted_turn` says — for
        a host that asked the person — else as the session's own policy (its agent type's,
        else the runtime's). Whether a session has such a turn: `open_turn`."""
        return await self.agents.resume(session_id, on_interrupted_turn=on_interrupted_turn)

    async def open_turn(self, session_id: str) -> Continuation | None:
        """The turn a crash left open in the session's log — what resuming it would continue
        (its turn, step, attempt, lost model call, cut tool calls) — or None. Readers close
        such a turn in memory, so this reads the log itself (a whole read, in a thread). A
        session running here has none to continue; one held elsewhere may be mid-turn."""
        if self.agents.get(session_id) is not None:
            return None
        store = self.log_store

        def read() -> Continuation | None:
            handle = store.open_read(session_id)
            try:
                events = store.read(handle, poll=trio.from_thread.check_cancelled)
            finally:
                store.close(handle)
            return plan_continuation(events, session_id=session_id)

        return await trio.to_thread.run_sync(read)


def _with_budget(config: AgentConfig, budget: Budget | None) -> AgentConfig:
    return config if budget is None else attrs.evolve(config, budget=budget)


def _with_policy(config: AgentConfig, policy: Literal["continue", "close"] | None) -> AgentConfig:
    if policy is None:
        return config
    if policy not in ("continue", "close"):
        raise ValueError(f'on_interrupted_turn must be "continue" or "close", got {policy!r}')
    return attrs.evolve(config, on_interrupted_turn=policy)


@asynccontextmanager
async def open_runtime(
    root: str | os.PathLike[str],
    *,
    model: AnyModel | str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    clock: Clock | None = None,
    id_factory: IdFactory | None = None,
    compression: Literal["zstd", "none"] = "zstd",
    agent_config: AgentConfig | None = None,
    tools: Callable[[], Sequence[Tool]] | None = None,
    max_depth: int = 1,
    max_active_subagents: int = 8,
    child_model: ChildModel | None = None,
    model_factory: ModelFactory | None = None,
    log_store: LogStore | None = None,
    now_ms: Callable[[], int] | None = None,
    workspace: str | os.PathLike[str] | None = None,
    permissions: Permissions | None = None,
    approver: Approver | None = None,
    agent_types: Mapping[str, AgentType] | None = None,
    disabled_tools: Collection[str] = (),
    budget: Budget | None = None,
    mcp_servers: Sequence[McpServerSpec] = (),
    mailbox: Mailbox | None = None,
    store: str | None = None,
    placements: Placements | None = None,
    store_options: StoreOptions | None = None,
    on_interrupted_turn: Literal["continue", "close"] | None = None,
    stall_after: float = STALL_AFTER,
    telemetry: TelemetrySettings | Telemetry | None = None,
    prices: PriceTable | None = None,
    sandbox: SandboxPolicy | None = None,
) -> AsyncIterator[Runtime]:
    """Open the runtime on `root`. `model` is a `Model` or a spec (`openai:MODEL`, `anthropic:MODEL`,
    `deepseek:MODEL`, `scripted:PATH`) built with `api_key` and `base_url` — the environment is
    never read here. `clock` and `id_factory` make runs deterministic; `now_ms` overrides only
    the clock's readings (tests of the storage-facing layers use it). `child_model` builds the
    model of a child whose `ChildOptions` select one (without it, such a child is refused).
    `model_factory` builds the model a resumed subagent's log recorded (`session/model`) when it
    is not `model` (runtime/agent/model_record.py); without it every session runs `model`.
    `workspace` (a folder) gives every agent the workspace tools acting in it; `permissions`
    (default `DEFAULT_PERMISSIONS` when a workspace is given) puts tools behind allow/ask/deny,
    `ask` answered by `approver` (none: denied). `agent_types` are offered by the `subagent`
    tool's `agent_type` parameter; `disabled_tools` are left out of every agent's tools.
    `budget` limits every session this runtime starts or resumes that is not a subagent (its
    `seconds` count from each agent's start); subagents get their parent's remainder
    (runtime/foundation/budgets.py). `mcp_servers` are started before the runtime is yielded (each ready or
    failed); their tools `mcp__<server>__<tool>` join the workspace tools, under the same policy
    (default `DEFAULT_PERMISSIONS`). `mailbox` (default when the runtime makes its own log
    store: the store's — a `PostgresMailbox` on a PostgreSQL store's connections, else a
    `FileMailbox` on `root`; none with a `log_store` passed in) is drained by an owner
    task of every resident session and carries messages, interrupts and settlements to sessions
    another process holds (runtime/agent/mailbox_owner.py). `store` (instead of `log_store`) names
    the log store the runtime opens and closes: a `postgresql://` URL or a folder
    (runtime/store_select.py). `placements` (a placement queue, SPEC §9) leaves background
    children to serving hosts while any serve (runtime/hosts/serve.py); it needs the mailbox, which
    carries their prompts and settlements. `store_options` go to the PostgreSQL store `store`
    opens (`lease_ttl`, `lease_renew_interval`). `on_interrupted_turn` (default `agent_config`'s,
    "continue") is what resuming a session whose last turn a crash left open does: continue that
    turn, or close it as interrupted (docs/format.md, "Continued turns"); an agent type's own
    choice wins for its children. `telemetry` traces every agent in the OpenTelemetry GenAI
    conventions (README "Traces (OpenTelemetry)"): settings (the runtime builds the exporter
    from the `otel` extra and flushes it when it closes) or a `Telemetry` of the caller's (an SDK
    tracer provider it owns: `OtelTelemetry(provider)`); None (the default) traces nothing and
    imports none of it. `stall_after` (seconds, default 300): listings call a running child
    whose open turn made no durable progress for that long `stalled` (by `clock`). `prices`
    (`[prices]`, runtime/foundation/pricing.py) price the model calls a `max_cost` budget counts;
    budgets are shared down each tree through one ledger per runtime (runtime/agent/tree_ledger.py).
    `sandbox` (README "Sandbox"; None: commands run unconfined) confines `run_command` and the
    MCP servers marked `sandbox` in bubblewrap when its mode is on, with `root` (and `store`'s
    folder) hidden from them; the default permissions then allow boxed commands."""
    McpServers.check(mcp_servers)
    root = os.fspath(root)
    clock = clock if clock is not None else RealClock()
    if isinstance(model, str):
        model = build_model(parse_model_spec(model, base_url=base_url, api_key=api_key), clock=clock)
    if log_store is not None and store is not None:
        raise TypeError("open_runtime takes log_store or store, not both")
    owned = log_store is None
    owned_telemetry: Telemetry | None = None
    if isinstance(telemetry, TelemetrySettings):
        from .telemetry.exporting import open_telemetry

        telemetry = owned_telemetry = open_telemetry(telemetry)
    if telemetry is not None:
        agent_config = attrs.evolve(agent_config or AgentConfig(), telemetry=telemetry)
    registry = runtime_registry()
    logs = (
        log_store
        if log_store is not None
        else open_log_store(
            store or root, compression=compression, projections=registry, **(store_options or StoreOptions())
        )
    )
    leased = logs.leased
    if placements is None and owned and leased is not None:
        # A store shared by hosts (PostgreSQL) has a placement queue: children may be left to
        # serving hosts while any serve.
        placements = leased.placements()
    try:
        if mailbox is None and owned:
            mailbox = open_mailbox(logs, root)
        if mailbox is not None:
            await _sync_clock(mailbox)
        async with open_session_store(logs, registry, now_ms=now_ms or clock.now_ms) as sessions:
            reader = StoreReader(logs)  # the one read side: the query's, and the registry's existence checks
            query = SessionQuery(logs, sessions, registry, reader=reader)
            listing = ListingService(
                registry=registry,
                sessions=sessions,
                query=query,
                now_ms=now_ms or clock.now_ms,
                stall_after=stall_after,
            )
            # The body's own error is re-raised after the nursery closes, unchanged rather than
            # wrapped in an ExceptionGroup (agents never raise out of their tasks).
            body_error: BaseException | None = None
            async with trio.open_nursery() as nursery:
                manager = ContinuationManager(nursery, max_active=max_active_subagents)

                hidden = [root] if store is None or "://" in store else [root, store]
                box = None
                if sandbox is not None:
                    # An agent type may change the box of its agents (found by their header's type).
                    by_type = {name: t.sandbox_policy(sandbox) for name, t in (agent_types or {}).items()}
                    own = {name: policy for name, policy in by_type.items() if policy is not None}
                    box = Sandbox(sandbox, hidden=hidden, by_type=own)
                # A server marked `sandbox` is boxed even when commands are not (by the default policy).
                server_box = box if box is not None else Sandbox(SandboxPolicy(), hidden=hidden)
                folder = os.fspath(workspace) if workspace is not None else None
                shared = workspace_tools(folder, sandbox=box) if folder is not None else []
                mcp = (
                    await McpServers.start(nursery, mcp_servers, sandbox=server_box, workspace=folder)
                    if mcp_servers
                    else None
                )
                shared = [*shared, *(mcp.tools() if mcp is not None else ())]
                defaults = default_permissions(box is not None and box.on)
                policy = permissions if permissions is not None else (defaults if shared else None)
                remembered = Remembered()

                # The registry's hooks and the owners' actions; its parts are bound below.
                service = SubagentService()
                owners = MailboxOwners(mailbox, nursery, actions=service) if mailbox is not None else None

                def lost(session_id: str) -> None:
                    # Another host took the session over: nothing here acts for it any more.
                    if owners is not None:
                        owners.stop(session_id)
                    sessions.mark_lost(session_id)
                    manager.poke()  # a tree waited for (`wait_tree_idle`) looks again

                nursery.start_soon(renew_leases, logs, lost)  # a PostgreSQL store's leases (none: returns)

                prices = prices if prices is not None else PriceTable()

                async def seed(session_id: str) -> dict[str, Seeded]:
                    return await descendant_spent(query, listing, session_id, prices)

                async def parent_of(session_id: str) -> str | None:
                    try:
                        info, _held = await query.stat(session_id)
                    except StorageError:
                        return None  # unreadable: the ledger links no ancestor through it
                    header = None if info is None else info.header
                    return header.parent_session if header is not None and header.origin == "subagent" else None

                ledger = TreeLedger(prices=prices, seeder=seed, lineage=parent_of)
                agents = AgentRegistry(
                    sessions=sessions,
                    reader=reader,
                    clock=clock,
                    id_factory=id_factory or RandomIds(),
                    model=model,
                    config=attrs.evolve(
                        _with_policy(_with_budget(agent_config or AgentConfig(), budget), on_interrupted_turn),
                        ledger=ledger,
                    ),
                    nursery=nursery,
                    hooks=service,
                    owners=owners,
                    model_factory=model_factory,
                )
                parts = SubagentParts.build(
                    agents=agents,
                    manager=manager,
                    query=query,
                    mailbox=mailbox,
                    placements=placements,
                    max_depth=max_depth,
                    child_model=child_model,
                )
                delegation = DelegationParts(
                    spawning=parts.spawning,
                    messaging=parts.messaging,
                    listing=listing,
                    agents=agents,
                    stopping=parts.stopping,
                )

                def toolset(extra: SessionTools | None = None) -> ToolSet:
                    # A session's own tools (an ACP client's MCP servers) replace the shared ones
                    # they hide, and are guarded like them (by default: the default policy).
                    own = extra.tools if extra is not None else ()
                    kept = [t for t in shared if extra is None or t.name not in extra.hides]
                    user = tools() if tools is not None else ()
                    every = [*user, *kept, *own, *subagent_tools(delegation, agent_types)]
                    every = [tool for tool in every if tool.name not in disabled_tools]
                    guard = policy if policy is not None or not own else DEFAULT_PERMISSIONS
                    return ToolSet(every if guard is None else guard_tools(every, guard, approver, remembered))

                service.bind(parts, toolset)
                try:
                    yield Runtime(
                        root=root,
                        log_store=logs,
                        registry=registry,
                        sessions=sessions,
                        query=query,
                        listing=listing,
                        agents=agents,
                        subagents=service,
                        clock=clock,
                        mcp=mcp,
                        mailbox=mailbox,
                        prices=prices,
                        sandbox=box,
                    )
                except BaseException as exc:  # re-raised bare once the nursery has closed
                    body_error = exc
                finally:
                    with trio.CancelScope(shield=True):
                        await service.drain()  # children first, while their parents can still record them
                        await agents.aclose()
                        if mcp is not None:
                            await mcp.aclose()  # after the agents: no call is left in flight
                    nursery.cancel_scope.cancel()
            if body_error is not None:
                raise body_error
    finally:
        if owned:
            # The store this call made: its index connection and change notification go with
            # it (a store passed in belongs to the caller).
            logs.close_store()
        if owned_telemetry is not None:
            await _flush_telemetry(owned_telemetry)


async def _flush_telemetry(telemetry: Telemetry) -> None:
    """Export the spans left (every agent has stopped) and stop the exporter; bounded, so a
    collector that is down delays the close by seconds, never holds it."""
    with trio.move_on_after(10, shield=True):
        await trio.to_thread.run_sync(telemetry.shutdown, abandon_on_cancel=True)


async def _sync_clock(mailbox: Mailbox) -> None:
    """Measure the mailbox's clock before any envelope is stamped or owner started on it; one
    that cannot be read now is measured again by the next deliver or drain."""
    try:
        await trio.to_thread.run_sync(mailbox.sync_clock)
    except StorageError as exc:
        log.warning("the mailbox's clock could not be read (%s): this host's wall clock until it can", exc)
