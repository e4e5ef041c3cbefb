"""The actors' branch of the error tree (its root: `subagents.storage.SubagentsError`).

    ActorError                    ACTOR_ERROR
    ├── ActorStopped              ACTOR_STOPPED            (the actor is gone: every pending and later request)
    ├── ActivationLimitReached    ACTOR_ACTIVATION_LIMIT_REACHED  (a family's active children are at its limit)
    ├── Draining                  ACTOR_DRAINING           (a family is shutting down: nothing new is admitted)
    ├── ParentClosing             ACTOR_PARENT_CLOSING     (the parent takes no new subagents)
    ├── AlreadyResident           ACTOR_ALREADY_RESIDENT   (a child registered twice: a caller's bug)
    └── ReadAborted               ACTOR_READ_ABORTED       (a cold read's abort was set)

Messages here are for people and logs; what a model is told (the runtime's tool results) is
worded by the runtime.

Storage errors raised while serving a request (`SequenceConflict`, `InvalidEvent`,
`PersistenceFailed`, ...) reach the requester unchanged: they are already in the tree.
"""

from __future__ import annotations

from subagents.storage import SubagentsError

__all__ = [
    "ActivationLimitReached",
    "ActorError",
    "ActorStopped",
    "AlreadyResident",
    "Draining",
    "ParentClosing",
    "ReadAborted",
]


class ActorError(SubagentsError):
    code = "ACTOR_ERROR"


class ActorStopped(ActorError):
    code = "ACTOR_STOPPED"

    def __init__(self, name: str, reason: str = "stopped") -> None:
        super().__init__(f"actor {name!r} is {reason}")
        self.name = name
        self.reason = reason


class ActivationLimitReached(ActorError):
    code = "ACTOR_ACTIVATION_LIMIT_REACHED"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the family is at its limit of {limit} active children")
        self.limit = limit


class Draining(ActorError):
    code = "ACTOR_DRAINING"

    def __init__(self) -> None:
        super().__init__("the continuation manager is draining: nothing new is admitted")


class ParentClosing(ActorError):
    code = "ACTOR_PARENT_CLOSING"

    def __init__(self, parent_id: str) -> None:
        super().__init__(f"parent {parent_id!r} is closing: no child is admitted under it")
        self.parent_id = parent_id


class AlreadyResident(ActorError):
    code = "ACTOR_ALREADY_RESIDENT"

    def __init__(self, child_id: str) -> None:
        super().__init__(f"subagent {child_id!r} is already resident")
        self.child_id = child_id


class ReadAborted(ActorError):
    code = "ACTOR_READ_ABORTED"

    def __init__(self) -> None:
        super().__init__("the cold read was aborted")
