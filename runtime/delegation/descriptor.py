"""The `subagent/descriptor` payload (docs/format.md, "The subagent descriptor"): one value, its
builder and its parser.

A child session records how it was created in one `subagent/descriptor` event in its own
suffix. The payload is versioned (`DESCRIPTOR_VERSION`, 2) and snake_case:

    {version: 2, mode: "one-shot" | "continuable", provider: str, label?: str,
     agent_provider?: str, agent_model?: str, agent_reasoning_effort?: str, persona?: str,
     tool_filter?: {allow?: [str], deny?: [str]},
     budget?: {max_turns?: int, max_tokens?: int, deadline?: int, max_cost?: number, max_descendants?: int},
     on_interrupted_turn?: "continue" | "close"}

`label` is required for a continuable child and optional for a one-shot one; the fields after
it exist only for continuable children. `parse_descriptor` sorts a payload into three outcomes:
a `SubagentDescriptor` (valid), `None` (another integer version: unsupported, not an error), or
`MalformedDescriptor` (anything else that is wrong). It is strict — no `"2"`, `true` or `2.0`
for the version, no non-str where a str belongs — because the payload comes from disk.
`snapshot_descriptor` builds the payload that `parse_descriptor` reads back unchanged.
"""

from __future__ import annotations

from typing import Literal, TypeVar, cast

import attrs
from subagents.storage import NonLosslessData, check_lossless

from ..foundation.budgets import Budget, budget_json, parse_budget
from ..foundation.errors import MalformedDescriptor

__all__ = [
    "DESCRIPTOR_VERSION",
    "DescriptorMode",
    "SubagentDescriptor",
    "ToolFilter",
    "parse_descriptor",
    "snapshot_descriptor",
]

DESCRIPTOR_VERSION = 2

DescriptorMode = Literal["one-shot", "continuable"]
_MODES: tuple[DescriptorMode, ...] = ("one-shot", "continuable")

# Optional string fields a continuable child may carry (and a one-shot child may not).
_CONTINUABLE_STRINGS = ("agent_provider", "agent_model", "agent_reasoning_effort", "persona")
_COMMON_KEYS = frozenset({"version", "mode", "provider", "label"})
_ALLOWED_KEYS: dict[str, frozenset[str]] = {
    "one-shot": _COMMON_KEYS,
    "continuable": _COMMON_KEYS | {*_CONTINUABLE_STRINGS, "tool_filter", "budget", "on_interrupted_turn"},
}
_FILTER_KEYS = ("allow", "deny")

_PAYLOAD = "persisted subagent descriptor payload"


# --- the value --------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


_T = TypeVar("_T")  # a validated field's type: what the checks below test the value against


def _str_tuple(value: object) -> tuple[str, ...] | None:
    # Lists are accepted for convenience and frozen into tuples; anything else is left for the
    # validator to refuse (a bare str must not become a tuple of characters): what the field
    # holds once its validator passed is the declared type.
    return cast("tuple[str, ...] | None", tuple(value) if type(value) is list else value)


def _check_str_tuple(_inst: object, attribute: attrs.Attribute[_T], value: _T) -> None:
    if value is None:
        return
    if type(value) is not tuple:
        raise TypeError(f"tool_filter.{attribute.name} must be a list of str, got {_type_name(value)}")
    for i, item in enumerate(value):
        if type(item) is not str:
            raise TypeError(f"tool_filter.{attribute.name}[{i}] must be a str, got {_type_name(item)}")


@attrs.frozen(kw_only=True)
class ToolFilter:
    """Tool scoping re-applied to a continuable child on resume; at least one list is given."""

    allow: tuple[str, ...] | None = attrs.field(default=None, converter=_str_tuple, validator=_check_str_tuple)
    deny: tuple[str, ...] | None = attrs.field(default=None, converter=_str_tuple, validator=_check_str_tuple)

    def __attrs_post_init__(self) -> None:
        if self.allow is None and self.deny is None:
            raise ValueError("tool_filter needs at least one of allow or deny")


def _check_str(_inst: object, attribute: attrs.Attribute[_T], value: _T) -> None:
    if type(value) is not str:
        raise TypeError(f"{attribute.name} must be a str, got {_type_name(value)}")


def _check_optional_str(_inst: object, attribute: attrs.Attribute[_T], value: _T) -> None:
    if value is not None:
        _check_str(_inst, attribute, value)


def _check_mode(_inst: object, _attribute: attrs.Attribute[_T], value: _T) -> None:
    if value not in _MODES or type(value) is not str:
        raise ValueError(f'mode must be "one-shot" or "continuable", got {value!r}')


def _check_filter(_inst: object, _attribute: attrs.Attribute[_T], value: _T) -> None:
    if value is not None and type(value) is not ToolFilter:
        raise TypeError(f"tool_filter must be a ToolFilter, got {_type_name(value)}")


def _check_budget(_inst: object, _attribute: attrs.Attribute[_T], value: _T) -> None:
    # A recorded budget is absolute (resolved) and limits something.
    if value is None:
        return
    if type(value) is not Budget:
        raise TypeError(f"budget must be a Budget, got {_type_name(value)}")
    if value.seconds is not None or value.unlimited:
        raise ValueError("a recorded budget is resolved (no seconds) and sets at least one limit")


@attrs.frozen(kw_only=True)
class SubagentDescriptor:
    """How a child session was created: the durable facts a listing and a cold resume need.

    Raises `ValueError`/`TypeError` on construction when the fields break the rules of the
    payload (wrong types, a continuable child without a label, a one-shot child with a
    continuable-only field), so a descriptor that exists can always be snapshotted.
    """

    mode: DescriptorMode = attrs.field(validator=_check_mode)
    provider: str = attrs.field(validator=_check_str)
    label: str | None = attrs.field(default=None, validator=_check_optional_str)
    agent_provider: str | None = attrs.field(default=None, validator=_check_optional_str)
    agent_model: str | None = attrs.field(default=None, validator=_check_optional_str)
    agent_reasoning_effort: str | None = attrs.field(default=None, validator=_check_optional_str)
    persona: str | None = attrs.field(default=None, validator=_check_optional_str)
    tool_filter: ToolFilter | None = attrs.field(default=None, validator=_check_filter)
    budget: Budget | None = attrs.field(default=None, validator=_check_budget)
    # Its agent type's choice for a turn a crash leaves open (None: the runtime's).
    on_interrupted_turn: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(("continue", "close")))
    )

    def __attrs_post_init__(self) -> None:
        if self.mode == "continuable":
            if self.label is None:
                raise ValueError("a continuable subagent descriptor requires a label")
            return
        for name in (*_CONTINUABLE_STRINGS, "tool_filter", "budget", "on_interrupted_turn"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is only allowed on a continuable subagent descriptor")


# --- building ---------------------------------------------------------------------------------


def snapshot_descriptor(descriptor: SubagentDescriptor) -> dict[str, object]:
    """The version-2 `subagent/descriptor` payload for `descriptor`, absent optionals omitted.

    Raises `NonLosslessData` (a `ValueError`) if a string cannot be carried by JSON (a lone
    surrogate), so what is written always reads back as the same descriptor.
    """
    payload: dict[str, object] = {
        "version": DESCRIPTOR_VERSION,
        "mode": descriptor.mode,
        "provider": descriptor.provider,
    }
    if descriptor.label is not None:
        payload["label"] = descriptor.label
    for name in _CONTINUABLE_STRINGS:
        value = getattr(descriptor, name)
        if value is not None:
            payload[name] = value
    tool_filter = descriptor.tool_filter
    if tool_filter is not None:
        payload["tool_filter"] = {
            name: list(getattr(tool_filter, name)) for name in _FILTER_KEYS if getattr(tool_filter, name) is not None
        }
    if descriptor.budget is not None:
        payload["budget"] = budget_json(descriptor.budget)
    if descriptor.on_interrupted_turn is not None:
        payload["on_interrupted_turn"] = descriptor.on_interrupted_turn
    try:
        check_lossless(payload)
    except NonLosslessData as exc:
        raise NonLosslessData(f"subagent descriptor is not losslessly JSON-serializable: {exc.message}") from None
    return payload


# --- parsing ----------------------------------------------------------------------------------


def _required_str(data: dict[object, object], key: str, why: str = "") -> str:
    if key not in data:
        raise MalformedDescriptor(f'{_PAYLOAD} is missing required field "{key}"{why}')
    return _str_field(data[key], key)


def _str_field(value: object, key: str) -> str:
    if type(value) is not str:
        raise MalformedDescriptor(f'{_PAYLOAD} field "{key}" must be a str, got {_type_name(value)}')
    return value


def _parse_filter(value: object) -> ToolFilter:
    if type(value) is not dict:
        raise MalformedDescriptor(f'{_PAYLOAD} field "tool_filter" must be an object, got {_type_name(value)}')
    for key in value:
        if key not in _FILTER_KEYS:
            raise MalformedDescriptor(f'{_PAYLOAD} field "tool_filter" has unknown field "{key}"')
    if not value:
        raise MalformedDescriptor(f'{_PAYLOAD} field "tool_filter" needs "allow" or "deny"')
    lists: dict[str, tuple[str, ...]] = {}
    for key, items in value.items():
        if type(items) is not list:
            raise MalformedDescriptor(
                f'{_PAYLOAD} field "tool_filter.{key}" must be a list of str, got {_type_name(items)}'
            )
        for i, item in enumerate(items):
            if type(item) is not str:
                raise MalformedDescriptor(
                    f'{_PAYLOAD} field "tool_filter.{key}[{i}]" must be a str, got {_type_name(item)}'
                )
        lists[key] = tuple(items)
    return ToolFilter(**lists)


def parse_descriptor(data: object) -> SubagentDescriptor | None:
    """Read a decoded `subagent/descriptor` payload.

    Returns the descriptor, or `None` when `version` is an integer other than
    `DESCRIPTOR_VERSION` (unsupported: no identity, not an error). Raises `MalformedDescriptor`
    when `data` is not an object, `version` is missing or not an int, `mode` is not one of the
    two modes, a key is not allowed for the mode, or a field is missing or of the wrong type.
    """
    if type(data) is not dict:
        raise MalformedDescriptor(f"{_PAYLOAD} must be an object, got {_type_name(data)}")
    if "version" not in data:
        raise MalformedDescriptor(f'{_PAYLOAD} is missing required field "version"')
    version = data["version"]
    if type(version) is not int:
        raise MalformedDescriptor(f'{_PAYLOAD} field "version" must be an int, got {_type_name(version)}')
    if version != DESCRIPTOR_VERSION:
        return None
    if "mode" not in data:
        raise MalformedDescriptor(f'{_PAYLOAD} is missing required field "mode"')
    mode = data["mode"]
    if type(mode) is not str or mode not in _MODES:
        raise MalformedDescriptor(f'{_PAYLOAD} field "mode" must be "one-shot" or "continuable", got {mode!r}')
    allowed = _ALLOWED_KEYS[mode]
    for key in data:
        if key not in allowed:
            raise MalformedDescriptor(f'{_PAYLOAD} has unknown field "{key}"')
    provider = _required_str(data, "provider")
    if mode == "continuable":
        label: str | None = _required_str(data, "label", " (a continuable child needs one)")
    else:
        label = _str_field(data["label"], "label") if "label" in data else None
    strings = {key: _str_field(data[key], key) for key in _CONTINUABLE_STRINGS if key in data}
    tool_filter = _parse_filter(data["tool_filter"]) if "tool_filter" in data else None
    budget: Budget | None = None
    if "budget" in data:
        parsed = parse_budget(data["budget"])
        if isinstance(parsed, str):
            raise MalformedDescriptor(f'{_PAYLOAD} field "budget" {parsed}')
        budget = parsed
    policy: str | None = None
    if "on_interrupted_turn" in data:
        policy = data["on_interrupted_turn"]
        if policy not in ("continue", "close"):
            raise MalformedDescriptor(
                f'{_PAYLOAD} field "on_interrupted_turn" must be "continue" or "close", got {policy!r}'
            )
    return SubagentDescriptor(
        mode=mode,  # checked against _MODES above
        provider=provider,
        label=label,
        tool_filter=tool_filter,
        budget=budget,
        on_interrupted_turn=policy,
        **strings,
    )
