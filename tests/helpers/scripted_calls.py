"""Calling a `ScriptedModel` directly, as the agent loop does: bind it to a session, stream one
request, collect the chunks or the `ModelError`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import attrs
import pytest
from subagents.runtime import Chunk, ModelRequest, ScenarioClock, ScriptedModel, SessionBinding, TextDelta
from subagents.runtime.foundation.errors import ModelError


@attrs.frozen
class Call:
    """One model call: the session it comes from and its request."""

    session: SessionBinding
    request: ModelRequest
    waits: Any = None  # the test's own `ScriptWaits` (the runtime's published ones are not here)


def req(
    session: str = "root",
    *,
    messages: Sequence[Any] = (),
    label: str | None = None,
    created_at: int = 0,
    assistant_count: int = 0,
    waits: Any = None,
    purpose: Any = "turn",
    clock: Any = None,
) -> Call:
    """A call of session `session` (a fresh `ScenarioClock` unless `clock` is given)."""
    binding = SessionBinding(
        session_id=session,
        label=label,
        created_at=created_at,
        clock=clock if clock is not None else ScenarioClock(),
        assistant_count=lambda: assistant_count,
    )
    return Call(binding, ModelRequest(messages=messages, purpose=purpose), waits)


def stream(model: ScriptedModel, call: Call) -> AsyncIterator[Chunk]:
    """The call's stream, from the model bound to its session."""
    return model.bind(call.session, waits=call.waits).stream(call.request)


async def collect(model: ScriptedModel, call: Call) -> list[Chunk]:
    async with aclosing(stream(model, call)) as chunks:
        return [chunk async for chunk in chunks]


async def text_of(model: ScriptedModel, call: Call) -> str:
    return "".join(c.text for c in await collect(model, call) if isinstance(c, TextDelta))


async def failure(model: ScriptedModel, call: Call) -> ModelError:
    with pytest.raises(ModelError) as info:
        await collect(model, call)
    return info.value
