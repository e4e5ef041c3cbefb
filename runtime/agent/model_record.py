"""The model travels with the session (issue 27; `session/model` in docs/format.md).

A session writes `session/model {model, base_url?}` (ignorable) before the first turn it runs
with a model that has a record (`models.specs.record_of`: a provider model the CLI built; a
scripted model has none), and again only when its model changes: `ModelRecorder`, one per agent.

A host that resumes a session runs the model its log recorded last, built with the host's own
credentials by its `ModelFactory` (the CLI's: the same spec parsing and keys as `--model`), unless
that is the model it would run anyway; when it cannot build it — no key for that provider, say —
the resume is refused with one line naming the model (`OptionsNotReapplied`: a serving host gives
the child to the others). A session that recorded nothing runs the host's model (`serve --model`).
A runtime without a factory (an embedder's) runs the model it was given, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
from subagents.storage import Event

from ..foundation.errors import ModelSpecError, OptionsNotReapplied
from ..models.base import AnyModel
from ..models.specs import ModelRecord, record_of

__all__ = ["MODEL_TYPE", "ModelFactory", "ModelRecorder", "last_recorded", "resumed_model"]

MODEL_TYPE = "session/model"

# (spec "scheme:name", base URL or None) -> a model with this host's credentials; ModelSpecError
# when this host cannot build it.
ModelFactory = Callable[[str, "str | None"], AnyModel]


def last_recorded(events: Sequence[Event]) -> ModelRecord | None:
    """The last `session/model` of a log (an unreadable one counts as none: it is ignorable)."""
    for event in reversed(events):
        if event.type == MODEL_TYPE:
            try:
                data = msgspec.json.decode(event.data)
            except msgspec.DecodeError:
                return None
            model, base_url = data.get("model"), data.get("base_url")
            if isinstance(model, str) and (base_url is None or isinstance(base_url, str)):
                return ModelRecord(model=model, base_url=base_url)
            return None
    return None


class ModelRecorder:
    """What an agent has recorded of its model; `changed(model)` is the `session/model` payload
    to write before its next turn, or None when the log says so already."""

    def __init__(self, events: Sequence[Event]) -> None:
        self._last = last_recorded(events)

    def changed(self, model: object) -> dict[str, str] | None:
        record = record_of(model)
        if record is None or record == self._last:
            return None
        self._last = record
        return record.data()


def resumed_model(
    session_id: str, events: Sequence[Event], default: AnyModel, factory: ModelFactory | None
) -> AnyModel:
    """The model a resumed session runs: the one its log recorded, built by `factory`, unless
    it is `default`'s (or nothing was recorded, or there is no factory). `OptionsNotReapplied`
    naming the model when `factory` cannot build it."""
    recorded = last_recorded(events)
    if factory is None or recorded is None or recorded == record_of(default):
        return default
    # A base URL that lost a secret to redaction cannot be used as it is: this host's own.
    base_url = recorded.base_url if recorded.base_url is not None and "***" not in recorded.base_url else None
    try:
        return factory(recorded.model, base_url)
    except ModelSpecError as exc:
        raise OptionsNotReapplied(
            f"session {session_id!r} runs model {recorded.model}, which this host cannot run: {exc}"
        ) from None
