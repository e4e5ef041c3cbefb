"""Test models that wrap another model (usually a `ScriptedModel`) and see every call together
with the session making it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
from subagents.runtime.models.base import Chunk, Model, ModelRequest, SessionBinding, bind_model


class WrappedModel:
    """A `SessionModel` over `self.inner`: each session streams from `answer(session, inner,
    request)`, `inner` being `self.inner` bound to that session. Subclasses set `inner` and
    define `answer`."""

    inner: Any

    def bind(self, session: SessionBinding) -> Model:
        return _Bound(self, session, bind_model(self.inner, session))

    def answer(self, session: SessionBinding, inner: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        raise NotImplementedError


@attrs.frozen
class _Bound:
    wrapper: WrappedModel
    session: SessionBinding
    inner: Model

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        return self.wrapper.answer(self.session, self.inner, request)
