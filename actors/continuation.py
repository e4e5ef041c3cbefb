"""The continuation manager: residency of continuable children as Activations
(docs/design.md, "Subagents: activations and settlement").

It knows nothing of agents. The runtime admits an Activation for a child (on start, or on a
message to a non-resident child), hands the manager a *body* — an async callable that runs
until the child settles and returns — and a *settle* callback; the manager runs the body in its
own nursery, then awaits `settle(activation)` (the runtime appends `subagent/settled` to the
parent there, durably) and only then `dispose` (the runtime stops the child's agent and
releases its session). So an Activation is never disposed before its settlement is durable.

Families: a child admitted under a resident parent Activation joins that parent's family (the
root is the top-level session), and at most `max_active` Activations of one family are resident
(`ActivationLimitReached`). A parent keeps the ids of its resident children (`owned`), so the
runtime can keep it resident while they run, and `stop` disposes children before parents.
`drain` closes admission (`Draining`) and stops everything, child-first; a parent that is
closing admits no new child (`ParentClosing`), so no child outlives its parent's disposal.

A body, `ready`, `settle` or `dispose` that raises is a bug of the caller's: it is logged, the
Activation still settles and is disposed (a failed body counts as stopped), and the other
Activations carry on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import trio
from trio_util import RepeatedEvent  # pyright: ignore[reportMissingTypeStubs]  # trio-util ships no type marker; its source is typed

from .errors import ActivationLimitReached, AlreadyResident, Draining, ParentClosing

__all__ = ["Activation", "ContinuationManager", "open_continuation_manager"]

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class Activation:
    child_id: str
    parent_id: str
    root_id: str
    owned: set[str] = attrs.field(factory=set)
    closing: bool = False
    cause: str | None = None  # why it was stopped, when it was
    stop_requested: bool = False
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    disposed: trio.Event = attrs.field(factory=trio.Event)
    lock: trio.Lock = attrs.field(factory=trio.Lock)  # serializes delivery, settlement, disposal


Body = Callable[[Activation], Awaitable[None]]
Hook = Callable[[Activation], Awaitable[None]]


@attrs.define(eq=False)
class ContinuationManager:
    _nursery: trio.Nursery
    max_active: int = 8
    stop_grace: float = 5.0
    resident: dict[str, Activation] = attrs.field(factory=dict)
    draining: bool = False
    _changed: RepeatedEvent = attrs.field(factory=RepeatedEvent)  # set on every admit and forget

    def get(self, child_id: str) -> Activation | None:
        return self.resident.get(child_id)

    def family_size(self, root_id: str) -> int:
        return sum(1 for a in self.resident.values() if a.root_id == root_id)

    def root_of(self, session_id: str) -> str:
        parent = self.resident.get(session_id)
        return parent.root_id if parent is not None else session_id

    def ancestors(self, child_id: str) -> list[str]:
        """The live lineage above a resident child, nearest first (the top-level session last)."""
        out: list[str] = []
        current = self.resident.get(child_id)
        seen = {child_id}
        while current is not None and current.parent_id not in seen:
            out.append(current.parent_id)
            seen.add(current.parent_id)
            current = self.resident.get(current.parent_id)
        return out

    def admit(self, child_id: str, parent_id: str) -> Activation:
        """Reserve residency for a child (before its agent exists); `start` runs it."""
        if self.draining:
            raise Draining()
        if child_id in self.resident:
            raise AlreadyResident(child_id)
        parent = self.resident.get(parent_id)
        if parent is not None and parent.closing:
            raise ParentClosing(parent_id)  # its children are being stopped: none may join
        root = self.root_of(parent_id)
        if self.family_size(root) >= self.max_active:
            raise ActivationLimitReached(self.max_active)
        activation = Activation(child_id=child_id, parent_id=parent_id, root_id=root)
        self.resident[child_id] = activation
        if parent is not None:
            parent.owned.add(child_id)
        self._changed.set()
        return activation

    def making_room(self, parent_id: str) -> bool:
        """Whether an admission under `parent_id` should wait for `wait_changed` rather than be
        refused: its family is full, but an Activation of it is on its way out (closing: settling,
        or being stopped), which frees its slot by itself once disposed. A parent is given a
        child's settlement notice before that child is disposed; the child it starts on reading
        the notice must not be refused for the slot the settled one still holds. False while
        draining or when the parent is closing (`admit` refuses those at once)."""
        if self.draining:
            return False
        parent = self.resident.get(parent_id)
        if parent is not None and parent.closing:
            return False
        root = self.root_of(parent_id)
        family = [a for a in self.resident.values() if a.root_id == root]
        return len(family) >= self.max_active and any(a.closing for a in family)

    def forget(self, activation: Activation) -> None:
        """Drop a reservation whose child never started (creation failed)."""
        if self.resident.get(activation.child_id) is activation:
            del self.resident[activation.child_id]
        parent = self.resident.get(activation.parent_id)
        if parent is not None:
            parent.owned.discard(activation.child_id)
        activation.disposed.set()
        self._changed.set()

    def start(
        self, activation: Activation, body: Body, ready: Callable[[Activation], bool], settle: Hook, dispose: Hook
    ) -> None:
        """Run `body` until it returns; then, under the Activation's lock, settle and dispose —
        unless `ready` says work arrived meanwhile (a message delivered just as the body
        returned), in which case the body runs again. A stopped Activation always settles."""
        self._nursery.start_soon(self._run, activation, body, ready, settle, dispose)

    async def _run(
        self, activation: Activation, body: Body, ready: Callable[[Activation], bool], settle: Hook, dispose: Hook
    ) -> None:
        name = activation.child_id
        try:
            while True:
                activation.scope = trio.CancelScope()  # a scope is entered once: one per round
                if activation.stop_requested:
                    activation.scope.cancel()
                failed = False
                with activation.scope:
                    try:
                        await body(activation)
                    except Exception:  # a bug: this child settles as stopped, the others go on
                        log.exception("subagent %r: its body failed", name)
                        failed = True
                forced = activation.stop_requested or failed
                with trio.CancelScope(shield=True):
                    async with activation.lock:
                        if not forced and not _ready(ready, activation):
                            continue
                        activation.closing = True
                        await self._stop_owned(activation)
                        try:
                            await settle(activation)
                        except Exception:  # the settlement is lost; the child is disposed still
                            log.exception("subagent %r: settling failed", name)
                        try:
                            await dispose(activation)
                        except Exception:  # the slot is freed below all the same
                            log.exception("subagent %r: disposing failed", name)
                        return
        finally:
            self.forget(activation)

    async def stop(self, child_id: str, cause: str, interrupt: Callable[[Activation], None]) -> None:
        """Stop a resident child (its own children first): `interrupt` asks its turn to end with
        `cause`; the body is cancelled after `stop_grace` seconds if it has not returned."""
        activation = self.resident.get(child_id)
        if activation is None:
            return
        for owned in list(activation.owned):
            await self.stop(owned, cause, interrupt)
        activation.cause = activation.cause or cause
        interrupt(activation)
        with trio.move_on_after(self.stop_grace):
            await activation.disposed.wait()
        activation.stop_requested = True
        activation.scope.cancel()  # the body returns; settle and dispose still run (shielded)
        await activation.disposed.wait()

    async def _stop_owned(self, activation: Activation) -> None:
        for owned in list(activation.owned):
            child = self.resident.get(owned)
            if child is not None:
                child.cause = child.cause or activation.cause or "disposed"
                child.stop_requested = True
                child.scope.cancel()
                await child.disposed.wait()

    async def wait_changed(self) -> None:
        """Until the next admission or release (callers test `resident` again, then wait on)."""
        await self._changed.wait()

    def poke(self) -> None:
        """Wake every `wait_changed` for a change outside the manager (a session another host took
        over: its waiters look again)."""
        self._changed.set()

    async def drain(self, interrupt: Callable[[Activation], None]) -> None:
        self.draining = True
        while self.resident:
            # Stop the top-most Activations; `stop` takes their children first.
            tops = [a for a in self.resident.values() if a.parent_id not in self.resident]
            for activation in tops or list(self.resident.values()):
                await self.stop(activation.child_id, "disposed", interrupt)


def _ready(ready: Callable[[Activation], bool], activation: Activation) -> bool:
    try:
        return ready(activation)
    except Exception:  # a bug: treated as nothing more to do, so the child settles
        log.exception("subagent %r: its ready check failed", activation.child_id)
        return True


@asynccontextmanager
async def open_continuation_manager(
    *, max_active: int = 8, stop_grace: float = 5.0
) -> AsyncGenerator[ContinuationManager]:
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        manager = ContinuationManager(nursery, max_active=max_active, stop_grace=stop_grace)
        try:
            yield manager
        except BaseException as exc:  # re-raised bare once the nursery has closed
            body_error = exc
        finally:
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error
