"""The console's first feed paths, `/session/ID/events` and `/tree/ID/events`, kept working
where they are unambiguous.

A session id may hold `/`, so `/session/a/events` names both the feed of `a` and the page of a
session `a/events`. The feeds now live under `/events/session/ID` and `/events/tree/ID`, where no
id can be mistaken for a route; an old path is the page of the session its whole path names
when such a session exists (one stat), else the feed of the id before `/events`, as it was.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from subagents.storage import InvalidSessionId, StorageError, check_session_id

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from ...read_side import ReadSide

__all__ = ["OldFeedPath"]


class OldFeedPath:
    """`GET /session/ID/events` (or `/tree/ID/events`): the page of the session `ID/events` when
    the store has one, else `feed` of `ID`."""

    def __init__(self, side: ReadSide, feed: ASGIApp, page: Callable[[Request], Awaitable[Response]]) -> None:
        self.side = side
        self.feed = feed
        self.page = page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        whole = f"{scope['path_params']['session_id']}/events"
        if await self._exists(whole):
            scope = {**scope, "path_params": {**scope["path_params"], "session_id": whole}}
            response = await self.page(Request(scope, receive))
            await response(scope, receive, send)
            return
        await self.feed(scope, receive, send)

    async def _exists(self, session_id: str) -> bool:
        try:
            check_session_id(session_id)
            info, _held = await self.side.query.stat(session_id)
        except (InvalidSessionId, StorageError):
            return False  # not a session the store can name: the path is the feed's, as before
        return info is not None
