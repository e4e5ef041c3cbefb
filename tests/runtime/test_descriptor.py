"""Table tests for the `subagent/descriptor` payload (SPEC 3.6, reference-notes 5.1).

Payloads are written out as literal snake_case dicts, as they land on disk, and read with
`parse_descriptor`; `snapshot_descriptor` is checked against the same literals and round-trips.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from subagents.runtime.delegation.descriptor import (
    DESCRIPTOR_VERSION,
    SubagentDescriptor,
    ToolFilter,
    parse_descriptor,
    snapshot_descriptor,
)
from subagents.runtime.foundation.errors import MalformedDescriptor
from subagents.storage import NonLosslessData

ONE_SHOT = {"version": 2, "mode": "one-shot", "provider": "spawn"}
CONTINUABLE = {"version": 2, "mode": "continuable", "provider": "fork", "label": "review the diff"}
CONTINUABLE_FULL = {
    **CONTINUABLE,
    "agent_provider": "openai",
    "agent_model": "gpt-x",
    "agent_reasoning_effort": "high",
    "persona": "a careful reviewer",
    "tool_filter": {"allow": ["read", "grep"], "deny": ["shell"]},
}


def test_version_is_two() -> None:
    assert DESCRIPTOR_VERSION == 2


# --- valid payloads ---------------------------------------------------------------------------

VALID: list[tuple[str, dict[str, Any], SubagentDescriptor]] = [
    ("one-shot", ONE_SHOT, SubagentDescriptor(mode="one-shot", provider="spawn")),
    (
        "one-shot with label",
        {**ONE_SHOT, "label": "count files"},
        SubagentDescriptor(mode="one-shot", provider="spawn", label="count files"),
    ),
    (
        "one-shot with empty strings",
        {**ONE_SHOT, "provider": "", "label": ""},
        SubagentDescriptor(mode="one-shot", provider="", label=""),
    ),
    (
        "continuable, label only",
        CONTINUABLE,
        SubagentDescriptor(mode="continuable", provider="fork", label="review the diff"),
    ),
    (
        "continuable, every optional field",
        CONTINUABLE_FULL,
        SubagentDescriptor(
            mode="continuable",
            provider="fork",
            label="review the diff",
            agent_provider="openai",
            agent_model="gpt-x",
            agent_reasoning_effort="high",
            persona="a careful reviewer",
            tool_filter=ToolFilter(allow=("read", "grep"), deny=("shell",)),
        ),
    ),
    (
        "continuable, tool_filter allow only (empty list)",
        {**CONTINUABLE, "tool_filter": {"allow": []}},
        SubagentDescriptor(
            mode="continuable", provider="fork", label="review the diff", tool_filter=ToolFilter(allow=())
        ),
    ),
    (
        "continuable, tool_filter deny only",
        {**CONTINUABLE, "tool_filter": {"deny": ["shell"]}},
        SubagentDescriptor(
            mode="continuable", provider="fork", label="review the diff", tool_filter=ToolFilter(deny=("shell",))
        ),
    ),
    (
        "continuable, some optionals",
        {**CONTINUABLE, "agent_model": "m", "persona": "p"},
        SubagentDescriptor(mode="continuable", provider="fork", label="review the diff", agent_model="m", persona="p"),
    ),
]


@pytest.mark.parametrize(("payload", "expected"), [v[1:] for v in VALID], ids=[v[0] for v in VALID])
def test_valid_payloads_parse(payload: dict[str, Any], expected: SubagentDescriptor) -> None:
    assert parse_descriptor(payload) == expected
    # The parser reads what came off the disk; a JSON round trip changes nothing.
    assert parse_descriptor(json.loads(json.dumps(payload))) == expected


@pytest.mark.parametrize(("payload", "descriptor"), [v[1:] for v in VALID], ids=[v[0] for v in VALID])
def test_snapshot_builds_exactly_the_payload(payload: dict[str, Any], descriptor: SubagentDescriptor) -> None:
    built = snapshot_descriptor(descriptor)
    assert built == payload
    assert json.loads(json.dumps(built)) == payload
    assert parse_descriptor(built) == descriptor


def test_snapshot_omits_absent_optionals_and_orders_keys() -> None:
    built = snapshot_descriptor(SubagentDescriptor(mode="one-shot", provider="spawn"))
    assert list(built) == ["version", "mode", "provider"]
    full = snapshot_descriptor(parse_descriptor(CONTINUABLE_FULL))  # type: ignore[arg-type]  # parse_descriptor returns a descriptor for this input
    assert list(full) == [
        "version",
        "mode",
        "provider",
        "label",
        "agent_provider",
        "agent_model",
        "agent_reasoning_effort",
        "persona",
        "tool_filter",
    ]
    assert full["tool_filter"] == {"allow": ["read", "grep"], "deny": ["shell"]}


def test_snapshot_refuses_lossy_strings() -> None:
    with pytest.raises(NonLosslessData, match="not losslessly JSON-serializable.*label"):
        snapshot_descriptor(SubagentDescriptor(mode="one-shot", provider="spawn", label="bad \ud800"))
    with pytest.raises(NonLosslessData, match="not losslessly JSON-serializable"):
        snapshot_descriptor(
            SubagentDescriptor(mode="continuable", provider="fork", label="l", tool_filter=ToolFilter(deny=["\udfff"]))
        )


# --- unsupported versions: no value, not an error ---------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 3, -2, 2**70])
def test_another_integer_version_is_unsupported(version: int) -> None:
    assert parse_descriptor({**ONE_SHOT, "version": version}) is None
    # Unsupported wins over anything else in the payload: a later version may change it all.
    assert parse_descriptor({"version": version, "mode": "later", "whatever": 1}) is None


# --- malformed payloads -----------------------------------------------------------------------

PREFIX = "persisted subagent descriptor payload"

MALFORMED: list[tuple[str, object, str]] = [
    ("not an object: list", [ONE_SHOT], "must be an object, got list"),
    ("not an object: str", json.dumps(ONE_SHOT), "must be an object, got str"),
    ("not an object: null", None, "must be an object, got null"),
    ("version missing", {"mode": "one-shot", "provider": "spawn"}, 'missing required field "version"'),
    ("version str", {**ONE_SHOT, "version": "2"}, 'field "version" must be an int, got str'),
    ("version bool", {**ONE_SHOT, "version": True}, 'field "version" must be an int, got bool'),
    ("version float", {**ONE_SHOT, "version": 2.0}, 'field "version" must be an int, got float'),
    ("version fraction", {**ONE_SHOT, "version": 5.9}, 'field "version" must be an int, got float'),
    ("version null", {**ONE_SHOT, "version": None}, 'field "version" must be an int, got null'),
    ("mode missing", {"version": 2, "provider": "spawn"}, 'missing required field "mode"'),
    (
        "mode unknown",
        {**ONE_SHOT, "mode": "background"},
        """field "mode" must be "one-shot" or "continuable", got 'background'""",
    ),
    ("mode wrong case", {**ONE_SHOT, "mode": "One-Shot"}, 'field "mode" must be'),
    ("mode not str", {**ONE_SHOT, "mode": 1}, 'field "mode" must be'),
    ("mode list", {**ONE_SHOT, "mode": ["one-shot"]}, 'field "mode" must be'),
    ("unknown key, one-shot", {**ONE_SHOT, "extra": 1}, 'has unknown field "extra"'),
    ("unknown key, continuable", {**CONTINUABLE, "extra": 1}, 'has unknown field "extra"'),
    ("camelCase key", {**CONTINUABLE, "agentModel": "m"}, 'has unknown field "agentModel"'),
    ("one-shot with agent_provider", {**ONE_SHOT, "agent_provider": "x"}, 'has unknown field "agent_provider"'),
    ("one-shot with agent_model", {**ONE_SHOT, "agent_model": "x"}, 'has unknown field "agent_model"'),
    (
        "one-shot with agent_reasoning_effort",
        {**ONE_SHOT, "agent_reasoning_effort": "low"},
        'has unknown field "agent_reasoning_effort"',
    ),
    ("one-shot with persona", {**ONE_SHOT, "persona": "p"}, 'has unknown field "persona"'),
    ("one-shot with tool_filter", {**ONE_SHOT, "tool_filter": {"allow": []}}, 'has unknown field "tool_filter"'),
    ("provider missing", {"version": 2, "mode": "one-shot"}, 'missing required field "provider"'),
    ("provider int", {**ONE_SHOT, "provider": 5}, 'field "provider" must be a str, got int'),
    ("provider null", {**ONE_SHOT, "provider": None}, 'field "provider" must be a str, got null'),
    ("provider bool", {**CONTINUABLE, "provider": True}, 'field "provider" must be a str, got bool'),
    ("one-shot label int", {**ONE_SHOT, "label": 1}, 'field "label" must be a str, got int'),
    ("one-shot label null", {**ONE_SHOT, "label": None}, 'field "label" must be a str, got null'),
    (
        "continuable without label",
        {"version": 2, "mode": "continuable", "provider": "fork"},
        'missing required field "label"',
    ),
    ("continuable label list", {**CONTINUABLE, "label": ["x"]}, 'field "label" must be a str, got list'),
    ("agent_provider int", {**CONTINUABLE, "agent_provider": 1}, 'field "agent_provider" must be a str, got int'),
    ("agent_model null", {**CONTINUABLE, "agent_model": None}, 'field "agent_model" must be a str, got null'),
    (
        "agent_reasoning_effort float",
        {**CONTINUABLE, "agent_reasoning_effort": 0.5},
        'field "agent_reasoning_effort" must be a str, got float',
    ),
    ("persona dict", {**CONTINUABLE, "persona": {}}, 'field "persona" must be a str, got dict'),
    ("tool_filter empty", {**CONTINUABLE, "tool_filter": {}}, 'field "tool_filter" needs "allow" or "deny"'),
    ("tool_filter list", {**CONTINUABLE, "tool_filter": ["read"]}, 'field "tool_filter" must be an object, got list'),
    ("tool_filter null", {**CONTINUABLE, "tool_filter": None}, 'field "tool_filter" must be an object, got null'),
    (
        "tool_filter other key",
        {**CONTINUABLE, "tool_filter": {"allow": [], "only": ["x"]}},
        'field "tool_filter" has unknown field "only"',
    ),
    (
        "tool_filter allow not a list",
        {**CONTINUABLE, "tool_filter": {"allow": "read"}},
        'field "tool_filter.allow" must be a list of str, got str',
    ),
    (
        "tool_filter deny null",
        {**CONTINUABLE, "tool_filter": {"deny": None}},
        'field "tool_filter.deny" must be a list of str, got null',
    ),
    (
        "tool_filter allow non-str item",
        {**CONTINUABLE, "tool_filter": {"allow": ["read", 5]}},
        'field "tool_filter.allow[1]" must be a str, got int',
    ),
    (
        "tool_filter deny nested list",
        {**CONTINUABLE, "tool_filter": {"deny": [["x"]]}},
        'field "tool_filter.deny[0]" must be a str, got list',
    ),
]


@pytest.mark.parametrize(("payload", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_payloads_raise(payload: object, message: str) -> None:
    with pytest.raises(MalformedDescriptor) as exc:
        parse_descriptor(payload)
    text = str(exc.value)
    assert text.startswith(PREFIX), text
    assert message in text, text
    assert isinstance(exc.value, ValueError)
    assert exc.value.code == "SUBAGENT_DESCRIPTOR_MALFORMED"


# --- the value refuses what the payload refuses -----------------------------------------------

BAD_VALUES: list[tuple[str, dict[str, Any]]] = [
    ("mode unknown", {"mode": "background", "provider": "p"}),
    ("provider not str", {"mode": "one-shot", "provider": 5}),
    ("label not str", {"mode": "one-shot", "provider": "p", "label": 1}),
    ("continuable without label", {"mode": "continuable", "provider": "p"}),
    ("one-shot with persona", {"mode": "one-shot", "provider": "p", "persona": "x"}),
    ("one-shot with tool_filter", {"mode": "one-shot", "provider": "p", "tool_filter": ToolFilter(allow=())}),
    ("tool_filter as dict", {"mode": "continuable", "provider": "p", "label": "l", "tool_filter": {"allow": []}}),
    ("agent_model not str", {"mode": "continuable", "provider": "p", "label": "l", "agent_model": 3}),
]


@pytest.mark.parametrize("fields", [b[1] for b in BAD_VALUES], ids=[b[0] for b in BAD_VALUES])
def test_descriptor_value_refuses_invalid_fields(fields: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        SubagentDescriptor(**fields)


@pytest.mark.parametrize(
    "fields",
    [{}, {"allow": "read"}, {"deny": ["x", 1]}, {"allow": None, "deny": None}],
    ids=["empty", "str", "non-str item", "both none"],
)
def test_tool_filter_refuses_invalid_lists(fields: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        ToolFilter(**fields)


def test_tool_filter_freezes_lists() -> None:
    assert ToolFilter(allow=["a", "b"]).allow == ("a", "b")


def test_an_interrupted_turn_policy_round_trips_and_reaches_the_childs_config() -> None:
    """Issue 27: an agent type's `on_interrupted_turn`, recorded as other options are."""
    from subagents.runtime import AgentConfig, ChildOptions

    descriptor = SubagentDescriptor(mode="continuable", provider="spawn", label="L", on_interrupted_turn="close")
    payload = snapshot_descriptor(descriptor)
    assert payload["on_interrupted_turn"] == "close"
    assert parse_descriptor(payload) == descriptor
    options = ChildOptions.of(descriptor)
    assert options.config(AgentConfig()).on_interrupted_turn == "close"
    assert ChildOptions().config(AgentConfig(on_interrupted_turn="close")).on_interrupted_turn == "close"
    with pytest.raises(MalformedDescriptor, match='"on_interrupted_turn" must be "continue" or "close"'):
        parse_descriptor({**payload, "on_interrupted_turn": "retry"})
    with pytest.raises(MalformedDescriptor, match="unknown field"):
        parse_descriptor({"version": 2, "mode": "one-shot", "provider": "spawn", "on_interrupted_turn": "close"})
    with pytest.raises(ValueError):
        SubagentDescriptor(mode="continuable", provider="spawn", label="L", on_interrupted_turn="retry")
