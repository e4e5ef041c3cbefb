"""The actor error tree.

    ActorError
    └── ActorStopped      ACTOR_STOPPED    (the actor is gone: every pending and later request)

Storage errors raised while serving a request (`SequenceConflict`, `InvalidEvent`,
`PersistenceFailed`, ...) reach the requester unchanged: they are already typed and coded.
"""

from __future__ import annotations

__all__ = ["ActorError", "ActorStopped"]


class ActorError(Exception):
    code = "ACTOR_ERROR"


class ActorStopped(ActorError):
    code = "ACTOR_STOPPED"

    def __init__(self, name: str, reason: str = "stopped") -> None:
        super().__init__(f"actor {name!r} is {reason}")
        self.name = name
        self.reason = reason
