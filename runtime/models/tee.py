"""A model wrapper that hands each session's answer text to a callback as it streams (the
hosts that show text live: `chat`, `acp`). The durable `assistant/message` stays the record;
the callback only sees text early."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import attrs

from .base import AnyModel, Chunk, Model, ModelRequest, SessionBinding, TextDelta, bind_model

__all__ = ["OnText", "TeeModel"]

# on_text(session_id, call, text): `call` is how many `assistant/message` events the session
# had when the model call began, so its reply will be the next one.
OnText = Callable[[str, int, str], None]


@attrs.frozen
class _TeedModel:
    """A session's model whose text deltas are also handed on as they arrive."""

    inner: Model
    session: SessionBinding
    on_text: OnText

    async def stream(self, request: ModelRequest) -> AsyncGenerator[Chunk]:
        call = self.session.assistant_count()
        async with aclosing(self.inner.stream(request)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, TextDelta) and request.purpose == "turn":
                    self.on_text(self.session.session_id, call, chunk.text)
                yield chunk


@attrs.frozen
class TeeModel:
    """`inner`, bound per session as the runtime binds it, with every session's answer text
    (turn replies, not compaction summaries) handed to `on_text` as it streams."""

    inner: AnyModel
    on_text: OnText

    def bind(self, session: SessionBinding) -> Model:
        return _TeedModel(bind_model(self.inner, session), session, self.on_text)
