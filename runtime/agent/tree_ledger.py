"""Budgets shared down the tree (README "Budgets"; issue 30 item 4): one runtime's running totals.

Theory of operation. Every agent of a runtime joins its `TreeLedger` (one per runtime, built by
`open_runtime`) with its parent's id, its budget and what its tree had spent when it joined:
its own usage records (from the events its resume read) plus, for a session whose budget limits
anything the tree shares, its descendants' (`seeder`: their tree and each one's own spending,
from their `usage` cells and checkpoint rows — runtime/usage_totals.py `descendant_spent` — read
once, at join). From then on nothing is re-read: each recorded reply (a step's or compaction's)
is charged (`charge`) to its session and every ancestor in the ledger, and each new turn
(`turn_started`) likewise — less a turn a budget refused before its first call (`turn_refused`,
budgets.py `turn_counted`) — so an ancestor's spent total is a dict walk, not a read of every
descendant's log. A turn is checked against every `max_turns` of the chain before its first call.

Joining is exact whatever runs meanwhile. The read awaits, and a descendant in the ledger may
be charged (or join) during it: its charge stops below the joining session, which is not in the
ledger yet, and the read may or may not have seen it. So the read's totals are not added up
until it returns, and then in one synchronous step (nothing interleaves) the descendants that
are in the ledger by then bring their ledger totals (all they were charged, their subtree's
included) and only the others what the read found — each of those plus, by the same rule, its
children. A node whose totals lack its descendants' spending from before it joined (it joined
unseeded with children already) keeps its own spending apart (`_Node.own`) until such a join
completes it.

A charge goes up through the ledger's nodes, so every session between a descendant and an
ancestor here must be a node, even one that never runs here (a child resumed on its own: by a
message, on a serving host). Two joins see to it, whichever comes first. A session joining
while its parent is not here looks its ancestors up in the store (`lineage`: the headers'
parents, at most `LINK_DEPTH`), up to the first one that is here, and (after the reads, in the
same synchronous step) puts stand-ins for the missing ones between (`_link`): closed, no
budget, nothing spent — the ancestor's totals are left as they are, since its own join counted
their spending until then. A stand-in's totals are only what was charged through it since
(`_Node.stand_in`): its own join, or a seed above it (which reads its own spending), completes
them. And an ancestor that joins seeded after such a descendant puts the sessions its read
found between them in whole (`_combine`: their totals are what it just added up). A stand-in has
no budget: a descriptor is in its log's body, not its header (a whole log read), and the
descendant under it was reserved out of its remainder when it started.

Reservations. Starting a child reserves its budget out of its parent's remainder (`start_child`):
what a parent can give a new child is its limit less its tree's spending less what its open
children still hold (their limit less their own tree's spending); a child is open from its start
until its turn ends (it settles), and again from each turn it starts, so a settled child's
unused reservation returns to its parent. The number of descendants is charged at start.

The check (`refusal`) runs before every model call: the call's estimated size (its request's
characters / 4) on top of what each ancestor's tree has spent and has in flight (the estimates
of its calls sent and not yet charged; under `max_cost` priced as this call) must fit each
limit; otherwise the call is not sent, and the message names the session whose budget would be
crossed. An estimate is not the bill: the final call may overshoot, and the message of the
refusal that follows says by how much (`... 1042 used (42 over)`).

Durable: nothing here is stored. Limits are in the descriptors (and the embedder's root
budget), spending in the usage records; a restarted or taken-over runtime rebuilds the totals
when its agents join again. A child that runs in another process (a serving host) is checked
there against its own budget and whatever of its ancestors that process holds; its own budget
was reserved out of its parent's remainder when it started, so it cannot spend more than that.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

import attrs
import msgspec
from subagents.storage import Event

from ..foundation.budgets import Budget, count_turns
from ..foundation.pricing import PriceTable, format_cost

__all__ = [
    "CHARGED_COUNTS",
    "LINK_DEPTH",
    "Lineage",
    "OwnSpent",
    "Seeded",
    "Seeder",
    "TreeLedger",
    "TreeSpent",
    "own_spent",
    "request_estimate",
]

# The disjoint counts of a usage record a token budget adds up (`reasoning_tokens` is a part of
# `output_tokens`, not one more).
CHARGED_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def request_estimate(messages: object) -> int:
    """A model call's size before it is sent: its messages' encoded length / 4 (about a token
    per four characters); the tool definitions are left out (a provider's cache holds them)."""
    return len(msgspec.json.encode(messages)) // 4


@attrs.frozen
class TreeSpent:
    """What a tree has spent: tokens (every kind), cost (None: unknown — a call of a model with
    no price), and descendants started."""

    tokens: int = 0
    cost: float | None = 0.0
    descendants: int = 0
    turns: int = 0


@attrs.frozen(kw_only=True)
class OwnSpent:
    """What a session spent itself, as it joins: `tokens` (every kind), `cost` (None: a call's
    model has no price), `unpriced` (that model) and `parent` (it started children: only then
    are its descendants read when it joins) and `turns` (its turns started)."""

    tokens: int = 0
    cost: float | None = 0.0
    unpriced: str | None = None
    parent: bool = False
    turns: int = 0


class _Model(msgspec.Struct):
    model: str | None = None


class _Counts(msgspec.Struct):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class _Reply(msgspec.Struct):
    usage: _Counts | None = None


# The events whose `usage` record is a model call's: a turn's step and compaction's summary.
_CALLS = frozenset({"assistant/message", "compaction/summary"})

_model = msgspec.json.Decoder(_Model)
_reply = msgspec.json.Decoder(_Reply)


def own_spent(events: Iterable[Event], inherited_event_count: int, prices: PriceTable) -> OwnSpent:
    """A session's own spending over its own suffix, for `join`. Bad payloads are not counted
    (as in runtime/usage.py)."""
    model: str | None = None
    tokens, cost, unpriced, parent = 0, 0.0, None, False
    for event in events:
        if event.type == "subagent/catalog" and event.seq >= inherited_event_count:
            parent = True  # it started children: a resume reads what they spent
        elif event.type == "session/model":
            try:
                model = _model.decode(event.data).model
            except (msgspec.DecodeError, RecursionError):
                model = None
        elif event.type in _CALLS and event.seq >= inherited_event_count:
            try:
                usage = _reply.decode(event.data).usage
            except (msgspec.DecodeError, RecursionError):
                continue
            if usage is None:
                continue
            counts = [
                max(0, n)
                for n in (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens)
            ]
            tokens += sum(counts)
            price = prices.price_of(model)
            if price is None:
                unpriced = unpriced or (model or "(none recorded)")
            else:
                cost += price.cost(*counts)
    turns = count_turns(events, inherited_event_count).turns
    return OwnSpent(tokens=tokens, cost=None if unpriced else cost, unpriced=unpriced, parent=parent, turns=turns)


@attrs.frozen
class Seeded:
    """A descendant as the store has it when a session joins: its parent and its own spending
    (`spent.parent` is not read: the tree is the parents)."""

    parent: str
    spent: OwnSpent


# session id → its descendants (not itself) by id, read from the store.
Seeder = Callable[[str], Awaitable[Mapping[str, Seeded]]]
# session id → its parent as its header names it (None: a root, or its log cannot be read).
Lineage = Callable[[str], Awaitable[str | None]]

LINK_DEPTH = 32  # the ancestors a join looks up at most for one that is here (`_lookup`)


@attrs.define(eq=False)
class _Node:
    parent: str | None
    budget: Budget | None
    tokens: int = 0
    cost: float | None = 0.0
    descendants: int = 0
    turns: int = 0  # turns started in its tree (its own and its descendants')
    open: bool = True  # holds its reservation (started or in a turn, not settled)
    inflight: int = 0  # the estimates of its tree's calls sent and not yet charged
    unpriced: str | None = None  # a model of its tree that has no price (why its cost is unknown)
    # Its own spending, kept only while its totals lack its descendants' from before it joined
    # (None: they are its whole tree's). A join above it uses this and completes it.
    own: OwnSpent | None = None
    # Put between a descendant that joined and an ancestor that is here, for a session that never
    # joined (`_link`): its totals are only what was charged through it since, its own spending is
    # unknown (`own` is empty: a seed above reads it) — its join, or one above it, completes it.
    stand_in: bool = False


@attrs.define
class _Sum:
    """A subtree's totals being added up by `TreeLedger._combine`."""

    tokens: int = 0
    cost: float | None = 0.0
    unpriced: str | None = None
    turns: int = 0
    descendants: int = 0

    def add(self, tokens: int, cost: float | None, unpriced: str | None, turns: int) -> None:
        self.tokens += tokens
        self.turns += turns
        if cost is None or self.cost is None:
            self.cost, self.unpriced = None, self.unpriced or unpriced or "(usage not reported)"
        else:
            self.cost += cost


@attrs.define(eq=False)
class TreeLedger:
    """The running totals of a runtime's sessions (see the module docstring)."""

    prices: PriceTable = attrs.field(factory=PriceTable)
    seeder: Seeder | None = None
    lineage: Lineage | None = None
    _nodes: dict[str, _Node] = attrs.field(factory=dict)
    _sent: dict[str, int] = attrs.field(factory=dict)  # session → its call in flight's estimate

    # --- joining --------------------------------------------------------------------------

    def shares(self, budget: Budget | None) -> bool:
        """Whether `budget` limits something its descendants' spending counts against."""
        return budget is not None and not (
            budget.max_tokens is None
            and budget.max_cost is None
            and budget.max_descendants is None
            and budget.max_turns is None
        )

    async def join(self, session_id: str, parent: str | None, budget: Budget | None, own: OwnSpent) -> None:
        """Enter (or enter again) a session: its own spending `own`, its descendants' from the
        seeder when its budget is shared and it started children, and, when its parent is not
        here, the missing sessions between it and the nearest ancestor that is (see the module
        docstring: exact whatever is charged while the store is read). A session already here
        keeps its totals (they have been charged all along)."""
        node = self._nodes.get(session_id)
        if node is not None and not node.stand_in:
            node.budget, node.open = budget, True
            return
        seeds: Mapping[str, Seeded] | None = None
        if self.seeder is not None and self.shares(budget) and own.parent:
            seeds = await self.seeder(session_id)
        path = await self._lookup(parent) if parent is not None and parent not in self._nodes else []
        # No await from here: nothing interleaves.
        node = self._nodes.get(session_id)
        if node is not None and not node.stand_in:  # joined meanwhile, or put here whole by a seed
            node.budget, node.open = budget, True
            return
        if parent is not None:
            self._link(parent, path)
        if node is None:
            node = _Node(parent, budget, own.tokens, own.cost, 0, own.turns, unpriced=own.unpriced)
            # Unseeded with children already: its totals lack theirs, so its own are kept apart.
            node.own = own if seeds is None and own.parent else None
            self._nodes[session_id] = node
        else:  # a stand-in: what was charged through it stays, its own spending is added
            node.budget, node.open, node.stand_in, node.own = budget, True, False, own
            node.tokens, node.turns = node.tokens + own.tokens, node.turns + own.turns
            if own.cost is None or node.cost is None:
                node.cost, node.unpriced = None, node.unpriced or own.unpriced or "(usage not reported)"
            else:
                node.cost += own.cost
        if seeds is not None:
            self._combine(session_id, own, seeds)

    async def _lookup(self, parent: str) -> list[tuple[str, str | None]]:
        """The sessions from `parent` up to the first one that is here, a root, or one whose log
        cannot be read (at most `LINK_DEPTH`), each with its parent, nearest first."""
        path: list[tuple[str, str | None]] = []
        sid: str | None = parent
        seen: set[str] = set()
        while self.lineage is not None and sid is not None and sid not in self._nodes and sid not in seen:
            if len(path) >= LINK_DEPTH:
                return []  # no ancestor here within reach: nothing to link
            seen.add(sid)
            above = await self.lineage(sid)
            path.append((sid, above))
            sid = above
        return path

    def _link(self, parent: str, path: list[tuple[str, str | None]]) -> None:
        """Put stand-ins (closed, no budget, nothing spent) for the sessions of `path` (read by
        `_lookup`) that are not here, up to the first one that is, so that the charges of a
        session joining under `parent` reach it. Nothing is added to that ancestor: its own
        join counted their spending until then. No ancestor here: nothing is put."""
        missing: list[tuple[str, str | None]] = []
        for sid, above in path:
            if sid in self._nodes:
                break
            missing.append((sid, above))
        else:
            if not missing or missing[-1][1] not in self._nodes:
                return
        for sid, above in missing:
            self._nodes[sid] = _Node(above, None, open=False, own=OwnSpent(), stand_in=True)

    def _combine(self, root: str, own: OwnSpent, seeds: Mapping[str, Seeded]) -> None:
        """Set the totals of `root` (just entered) to its whole tree's: `own`, and for each
        session below it, the ledger's totals where they are complete, else its own spending
        (the ledger's, else the read's `seeds`) plus, by the same rule, its children's. The
        incomplete ones and stand-ins met are completed on the way, and those read that are not
        here but above one that is are put in, whole, so that its charges reach `root`."""
        children: dict[str, dict[str, None]] = {}  # parent → children, in order, once each
        for sid, seed in seeds.items():
            children.setdefault(seed.parent, {})[sid] = None
        for sid, each in self._nodes.items():
            if each.parent is not None:
                children.setdefault(each.parent, {})[sid] = None
        # The sessions whose own spending is added up (parents before children); a complete
        # node below brings its totals instead, and its subtree is not walked.
        order: list[str] = []
        stack, seen = [root], {root}
        while stack:
            sid = stack.pop()
            order.append(sid)
            for child in children.get(sid, {}):
                node = self._nodes.get(child)
                if child not in seen and (node is None or node.own is not None):
                    seen.add(child)
                    stack.append(child)
        sums: dict[str, _Sum] = {}
        for sid in reversed(order):  # children before parents: each sum is whole when read
            node = self._nodes.get(sid)
            mine = own if sid == root else None
            if mine is None and node is not None and node.own is not None and not node.stand_in:
                mine = node.own
            if mine is None:
                mine = seeds[sid].spent if sid in seeds else OwnSpent()
            total = sums[sid] = _Sum()
            total.add(mine.tokens, mine.cost, mine.unpriced, mine.turns)
            for child in children.get(sid, {}):
                below = self._nodes.get(child)
                if child in sums:
                    sub = sums[child]
                    total.add(sub.tokens, sub.cost, sub.unpriced, sub.turns)
                    total.descendants += 1 + sub.descendants
                elif below is not None and below.own is None and child != root:
                    total.add(below.tokens, below.cost, below.unpriced, below.turns)
                    total.descendants += 1 + below.descendants
            if node is None and sid in seeds and any(child in self._nodes for child in children.get(sid, {})):
                # Not here, but above a descendant that is: put in, whole, so its charges reach root.
                node = self._nodes[sid] = _Node(seeds[sid].parent, None, open=False)
            if node is not None:  # the root, an incomplete one, or one just put in: whole from now on
                node.tokens, node.cost, node.unpriced = total.tokens, total.cost, total.unpriced
                node.turns, node.descendants, node.own = total.turns, total.descendants, None
                node.stand_in = False

    def leave(self, session_id: str) -> None:
        """A session stopped here: its totals stay for its ancestors (they have them already);
        its reservation is returned."""
        self._land(session_id)  # a call that left no usage record is over too
        node = self._nodes.get(session_id)
        if node is not None:
            node.open = False

    def turn_started(self, session_id: str) -> None:
        """A new turn (not a continued one): one more turn for it and every ancestor, and it
        holds its reservation again."""
        node = self._nodes.get(session_id)
        if node is not None:
            node.open = True
            if node.own is not None:
                node.own = attrs.evolve(node.own, turns=node.own.turns + 1)
        for _sid, each in self._chain(session_id):
            each.turns += 1

    def turn_refused(self, session_id: str) -> None:
        """Its turn ended by a budget before any model call of it was recorded (budgets.py
        `turn_counted`): not counted after all — one turn less for it and every ancestor, as
        the logs recount it."""
        node = self._nodes.get(session_id)
        if node is not None and node.own is not None:
            node.own = attrs.evolve(node.own, turns=max(0, node.own.turns - 1))
        for _sid, each in self._chain(session_id):
            each.turns = max(0, each.turns - 1)

    def settled(self, session_id: str) -> None:
        """Its turn ended: what it did not use of its reservation returns to its parent."""
        self.leave(session_id)

    # --- charging -------------------------------------------------------------------------

    def _chain(self, session_id: str) -> Iterator[tuple[str, _Node]]:
        """The session and its ancestors that are in the ledger, nearest first."""
        seen: set[str] = set()
        sid: str | None = session_id
        while sid is not None and sid not in seen:
            seen.add(sid)
            node = self._nodes.get(sid)
            if node is None:
                return
            yield sid, node
            sid = node.parent

    def charge(self, session_id: str, usage: Mapping[str, int], model: str | None) -> None:
        """One recorded reply's `usage`, made by `model`, charged to the session and every
        ancestor."""
        # Clamped at zero for the cost as for the tokens, as `own_spent` recounts them on a resume.
        counts = [max(0, int(usage.get(k, 0))) for k in CHARGED_COUNTS]
        tokens = sum(counts)
        self._land(session_id)
        price = self.prices.price_of(model)
        cost = None if price is None else price.cost(*counts)
        mine = self._nodes.get(session_id)
        if mine is not None and mine.own is not None:
            own = mine.own
            mine.own = attrs.evolve(
                own,
                tokens=own.tokens + tokens,
                cost=None if cost is None or own.cost is None else own.cost + cost,
                unpriced=own.unpriced or (None if cost is not None else model or "(none recorded)"),
            )
        for _sid, node in self._chain(session_id):
            node.tokens += tokens
            if cost is None:
                node.cost, node.unpriced = None, node.unpriced or (model or "(none recorded)")
            elif node.cost is not None:
                node.cost += cost

    # --- checking -------------------------------------------------------------------------

    def _land(self, session_id: str) -> None:
        """The session's call in flight is over (charged, or replaced by its next one)."""
        estimate = self._sent.pop(session_id, 0)
        if estimate:
            for _sid, node in self._chain(session_id):
                node.inflight = max(0, node.inflight - estimate)

    def bounded(self, session_id: str) -> bool:
        """Whether a limit of the session or an ancestor is shared (else no call needs an
        estimate)."""
        return any(self.shares(node.budget) for _sid, node in self._chain(session_id))

    def refusal(self, session_id: str, estimate: int, model: str | None, *, first_call: bool = False) -> str | None:
        """Before a model call of `session_id` whose request is about `estimate` tokens: the
        message of the first budget of it or an ancestor the call would cross, or None — and
        then the estimate is held as in flight until the reply is charged, so calls of one
        tree made at the same time are checked against each other too. Before a turn's first
        call (`first_call`) the turns its tree started are checked too."""
        self._land(session_id)
        refused = self._turns_refusal(session_id) if first_call else None
        refused = refused or self._refusal(session_id, estimate, model)
        if refused is None and estimate > 0 and session_id in self._nodes:
            self._sent[session_id] = estimate
            for _sid, node in self._chain(session_id):
                node.inflight += estimate
        return refused

    def _turns_refusal(self, session_id: str) -> str | None:
        """The `max_turns` of it or an ancestor that the turns started in its tree (this one
        included) have crossed."""
        for sid, node in self._chain(session_id):
            limit = None if node.budget is None else node.budget.max_turns
            if limit is not None and node.turns > limit:
                whose = "" if sid == session_id else f"ancestor {sid}'s "
                return f"{whose}max_turns {limit} reached: {node.turns} started (with its subagents')"
        return None

    def _refusal(self, session_id: str, estimate: int, model: str | None) -> str | None:
        price = self.prices.price_of(model)
        for sid, node in self._chain(session_id):
            budget = node.budget
            if budget is None:
                continue
            whose = "" if sid == session_id else f"ancestor {sid}'s "
            if budget.max_tokens is not None and node.tokens + node.inflight + estimate > budget.max_tokens:
                over = node.tokens - budget.max_tokens
                if over >= 0:  # the last call's overshoot, reported
                    tail = f" ({over} over)" if over else ""
                    return f"{whose}max_tokens {budget.max_tokens} reached: {node.tokens} used{tail}"
                sent = f", ~{node.inflight} in flight" if node.inflight else ""
                return (
                    f"{whose}max_tokens {budget.max_tokens} would be crossed: {node.tokens} used{sent}, "
                    f"this call ~{estimate}"
                )
            if budget.max_cost is not None:
                limit = format_cost(budget.max_cost)
                if node.cost is None:
                    return f"{whose}max_cost {limit}: cost unknown (no price for {node.unpriced})"
                if price is None:
                    return f"{whose}max_cost {limit}: cost unknown (no price for {model or '(none recorded)'})"
                guess = price.cost(estimate, 0, 0, 0)
                # The tree's calls in flight, priced as this one (their models' are not held).
                held = price.cost(node.inflight, 0, 0, 0)
                if node.cost + held + guess > budget.max_cost:
                    over = node.cost - budget.max_cost
                    if over >= 0:
                        tail = f" ({format_cost(over)} over)" if over else ""
                        return f"{whose}max_cost {limit} reached: {format_cost(node.cost)} used{tail}"
                    used = format_cost(node.cost)
                    sent = f", ~{format_cost(held)} in flight" if node.inflight else ""
                    return (
                        f"{whose}max_cost {limit} would be crossed: {used} used{sent}, this call ~{format_cost(guess)}"
                    )
        return None

    def remainder(self, session_id: str) -> Budget | None:
        """What `session_id` can reserve for a new child of the shared limits: each limit of it
        and its ancestors, less their trees' spending and what their open children hold."""
        tokens: int | None = None
        cost: float | None = None
        descendants: int | None = None
        turns: int | None = None
        below: str | None = None  # the chain's previous session: the new child draws on its reservation
        for sid, node in self._chain(session_id):
            budget, via, below = node.budget, below, sid
            if budget is None:
                continue
            held_tokens, held_cost, held_turns = self._held(sid, via)
            if budget.max_turns is not None:
                left_turns = max(0, budget.max_turns - node.turns - held_turns)
                turns = left_turns if turns is None else min(turns, left_turns)
            if budget.max_tokens is not None:
                left = max(0, budget.max_tokens - node.tokens - held_tokens)
                tokens = left if tokens is None else min(tokens, left)
            if budget.max_cost is not None:
                left_cost = max(0.0, budget.max_cost - (node.cost or 0.0) - held_cost)
                cost = left_cost if cost is None else min(cost, left_cost)
            if budget.max_descendants is not None:
                left_n = max(0, budget.max_descendants - node.descendants - 1)  # the child itself
                descendants = left_n if descendants is None else min(descendants, left_n)
        if tokens is None and cost is None and descendants is None and turns is None:
            return None
        return Budget(max_turns=turns, max_tokens=tokens, max_cost=cost, max_descendants=descendants)

    def _held(self, session_id: str, via: str | None) -> tuple[int, float, int]:
        """What the open children of `session_id` (but `via`, the one a grandchild is started
        under) hold of their reservations, unused: tokens, cost, turns."""
        tokens, cost, turns = 0, 0.0, 0
        for sid, node in self._nodes.items():
            if node.parent != session_id or sid == via or not node.open or node.budget is None:
                continue
            if node.budget.max_tokens is not None:
                tokens += max(0, node.budget.max_tokens - node.tokens)
            if node.budget.max_cost is not None:
                cost += max(0.0, node.budget.max_cost - (node.cost or 0.0))
            if node.budget.max_turns is not None:
                turns += max(0, node.budget.max_turns - node.turns)
        return tokens, cost, turns

    def start_refusal(self, parent: str) -> str | None:
        """Before a child of `parent` is made: the message of the `max_descendants` it would
        cross, or None."""
        for sid, node in self._chain(parent):
            limit = None if node.budget is None else node.budget.max_descendants
            if limit is not None and node.descendants + 1 > limit:
                whose = "" if sid == parent else f"ancestor {sid}'s "
                return f"{whose}max_descendants {limit} reached: {node.descendants} started"
        return None

    def start_child(self, parent: str, child_id: str | None, budget: Budget | None) -> None:
        """A child of `parent` is being made: one more descendant for it and every ancestor, and,
        its id known, its reservation held from now (before a sibling started in the same step
        asks for its own)."""
        for _sid, node in self._chain(parent):
            node.descendants += 1
        if child_id is not None and child_id not in self._nodes and parent in self._nodes:
            self._nodes[child_id] = _Node(parent, budget)

    def start_failed(self, parent: str, child_id: str | None) -> None:
        """A start of a child of `parent` failed before its catalog was written: the descendant
        `start_child` counted is none (a recount from the logs does not find it), and its
        reservation returns."""
        for _sid, node in self._chain(parent):
            node.descendants = max(0, node.descendants - 1)
        if child_id is not None:
            self.leave(child_id)

    def spent(self, session_id: str) -> TreeSpent | None:
        """What the session's tree has spent, as far as this runtime knows (None: not here)."""
        node = self._nodes.get(session_id)
        return None if node is None else TreeSpent(node.tokens, node.cost, node.descendants, node.turns)
