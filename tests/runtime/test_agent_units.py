"""Table tests for the small parts of the agent package (SPEC 3.2, 5.2, 5.5): the tool framework
(`ToolSet`, schema checks, argument validation, outcome rendering, cancellation), the inbox
(follow-up / steer / inject, capacity, aborts), the surface (append and replace ops, text, size)
and the compaction planner.

No real IO and no real time: async tests run under `autojump_clock` and synchronise on
`wait_all_tasks_blocked`, so a hang shows up as a `TooSlowError` at once instead of a stall.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import pytest
import trio
from clocks import T
from events import turn_end_event
from subagents.actors import Abort
from subagents.runtime.agent.compaction import CompactionPlan, CompactionPolicy, plan_compaction
from subagents.runtime.agent.inbox import Delivery, DeliveryCancelled, Inbox
from subagents.runtime.foundation.errors import ToolFailure
from subagents.runtime.models.base import ToolSpec
from subagents.runtime.models.messages import Surface, SurfaceNode, message, message_text, tool_result_message
from subagents.runtime.tools.base import FunctionTool, ToolContext, ToolOutcome, ToolSet, check_schema
from subagents.storage import Event, ReplaceOp, make_event
from trio.testing import wait_all_tasks_blocked

Json = dict[str, Any]

# =============================================================================================
# tools
# =============================================================================================


def ctx() -> ToolContext:
    return ToolContext(session_id="s-1", call_id="call-1", turn=1, step=1, abort=Abort())


class Recorder:
    """A tool body that records the arguments it ran with and returns a fixed output."""

    def __init__(self, output: Any = "ok") -> None:
        self.output = output
        self.calls: list[tuple[Json, ToolContext]] = []

    async def __call__(self, args: Json, context: ToolContext) -> Any:
        self.calls.append((args, context))
        return self.output


def tool(name: str = "t", parameters: Any = None, fn: Any = None, *, parallel_safe: bool = True) -> FunctionTool:
    params = {"type": "object", "properties": {}} if parameters is None else parameters
    return FunctionTool(
        name=name, description=f"the {name} tool", parameters=params, fn=fn or Recorder(), parallel_safe=parallel_safe
    )


def raising(exc: BaseException) -> Any:
    async def fn(args: Json, context: ToolContext) -> Any:
        raise exc

    return fn


def error_text(outcome: ToolOutcome) -> str:
    assert outcome.is_error
    assert len(outcome.content) == 1 and outcome.content[0]["type"] == "text"
    return outcome.content[0]["text"]


SCHEMA: Json = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 5},
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        "opt": {"type": ["string", "null"]},
        "filter": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "depth": {"type": "integer"}},
            "required": ["path"],
            "additionalProperties": False,
        },
        "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "anything": {"description": "no type: any JSON value"},
    },
    "required": ["query"],
    "additionalProperties": False,
}


# --- ToolSet registration ----------------------------------------------------------------------


def test_toolset_keeps_registration_order_in_specs() -> None:
    params = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    tools = ToolSet([tool("b"), tool("a", params)])
    tools.add(tool("c"))
    assert tools.specs() == [
        ToolSpec("b", "the b tool", {"type": "object", "properties": {}}),
        ToolSpec("a", "the a tool", params),
        ToolSpec("c", "the c tool", {"type": "object", "properties": {}}),
    ]
    assert len(tools) == 3 and "a" in tools and "z" not in tools
    assert tools.get("a") is not None and tools.get("z") is None


def test_toolset_refuses_a_duplicate_name_and_keeps_the_first() -> None:
    first = tool("dup")
    tools = ToolSet([first])
    with pytest.raises(ValueError, match="dup"):
        tools.add(tool("dup", SCHEMA))
    assert len(tools) == 1 and tools.get("dup") is first
    with pytest.raises(ValueError, match="twice"):
        ToolSet([tool("x"), tool("x")])


@pytest.mark.parametrize("name", ["", None, 3])
def test_toolset_refuses_a_tool_without_a_name(name: Any) -> None:
    with pytest.raises(ValueError, match="name"):
        ToolSet([tool(name)])


def test_parallel_safe_follows_the_tool_and_is_true_for_unknown_names() -> None:
    tools = ToolSet([tool("safe"), tool("serial", parallel_safe=False)])
    assert [tools.parallel_safe(n) for n in ("safe", "serial", "unknown")] == [True, False, True]


BAD_SCHEMAS: list[tuple[str, Any]] = [
    ("not a mapping", ["type", "object"]),
    ("no type", {"properties": {}}),
    ("not an object schema", {"type": "string"}),
    ("object type in a list", {"type": ["object"]}),
    ("top-level typo", {"type": "object", "propertes": {"q": {"type": "string"}}}),
    ("unsupported keyword", {"type": "object", "patternProperties": {}}),
    ("nested typo", {"type": "object", "properties": {"q": {"type": "string", "maxlength": 3}}}),
    ("nested unsupported keyword", {"type": "object", "properties": {"q": {"type": "string", "pattern": "^a"}}}),
    ("unknown type", {"type": "object", "properties": {"n": {"type": "int"}}}),
    ("unknown type in a list", {"type": "object", "properties": {"n": {"type": ["string", "float"]}}}),
    ("property not a schema", {"type": "object", "properties": {"n": "string"}}),
    ("items not a schema", {"type": "object", "properties": {"l": {"type": "array", "items": [{"type": "string"}]}}}),
    ("typo inside items", {"type": "object", "properties": {"l": {"type": "array", "items": {"tpye": "string"}}}}),
    ("deep typo", {"type": "object", "properties": {"o": {"type": "object", "properties": {"p": {"enumm": [1]}}}}}),
]


@pytest.mark.parametrize(("case", "schema"), BAD_SCHEMAS, ids=[c for c, _ in BAD_SCHEMAS])
def test_a_schema_the_validator_would_not_honour_is_refused(case: str, schema: Any) -> None:
    with pytest.raises(ValueError, match="bad-tool"):
        check_schema(schema, "tool 'bad-tool' parameters")
    tools = ToolSet()
    with pytest.raises(ValueError, match="bad-tool"):
        tools.add(tool("bad-tool", schema))
    assert "bad-tool" not in tools


# Keyword *values* the validator would misread. The module promises "a typo must not pass
# silently"; each of these is accepted today and then honoured wrongly (or crashes the check).
MISREAD_SCHEMAS: list[tuple[str, Any]] = [
    ("required as a string (validated char by char)", {"type": "object", "required": "query"}),
    ("enum as a string (substring match)", {"type": "object", "properties": {"m": {"enum": "fast"}}}),
    (
        "additionalProperties as a schema (ignored)",
        {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}},
    ),
    ("properties as a list", {"type": "object", "properties": ["q"]}),
    ("nested type not a string", {"type": "object", "properties": {"n": {"type": 5}}}),
    ("minimum not a number", {"type": "object", "properties": {"n": {"type": "integer", "minimum": "1"}}}),
]


@pytest.mark.parametrize(("case", "schema"), MISREAD_SCHEMAS, ids=[c for c, _ in MISREAD_SCHEMAS])
def test_a_keyword_with_a_value_of_the_wrong_shape_is_refused(case: str, schema: Any) -> None:
    with pytest.raises(ValueError, match="bad-tool"):
        check_schema(schema, "tool 'bad-tool' parameters")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {"type": "object", "properties": {}},
        SCHEMA,
        {
            "type": "object",
            "title": "T",
            "description": "d",
            "default": {},
            "properties": {"n": {"type": ["integer", "null"], "default": None, "title": "N"}},
        },
    ],
)
def test_supported_schemas_are_accepted(schema: Json) -> None:
    check_schema(schema, "tool 'ok' parameters")
    assert "ok" in ToolSet([tool("ok", schema)])


# --- execute: unknown tools and arguments --------------------------------------------------------


@pytest.mark.parametrize("raw", ["{}", "not json", ""])
async def test_an_unknown_tool_is_an_error_result(raw: str) -> None:
    outcome = await ToolSet([tool("known")]).execute("missing", raw, ctx())
    assert error_text(outcome) == 'Error: unknown tool "missing"'
    assert outcome.error == {"name": "ToolNotFoundError", "code": "UNKNOWN_TOOL"}


ACCEPTED: list[str] = [
    '{"query": "a"}',
    '  {"query": "a"}\n',
    '{"query": "abcde", "count": 1, "ratio": 0.5, "flag": false, "mode": "slow"}',
    '{"query": "a", "count": 10.0}',  # 1.0-style floats count as integers
    '{"query": "a", "count": 1e0}',
    '{"query": "a", "ratio": 3}',  # an integer is a number
    '{"query": "a", "opt": null}',
    '{"query": "a", "opt": "x"}',
    '{"query": "a", "tags": ["x", "y"]}',
    '{"query": "a", "filter": {"path": "/", "depth": 2}}',
    '{"query": "a", "matrix": [[1, 2], [], [3]]}',
    '{"query": "a", "anything": [{"x": null}, true, "s"]}',
]


@pytest.mark.parametrize("raw", ACCEPTED)
async def test_valid_arguments_reach_the_tool_unchanged(raw: str) -> None:
    body = Recorder("done")
    context = ctx()
    outcome = await ToolSet([tool("t", SCHEMA, body)]).execute("t", raw, context)
    assert outcome == ToolOutcome([{"type": "text", "text": "done"}])
    assert body.calls == [(json.loads(raw), context)]
    assert body.calls[0][1] is context


@pytest.mark.parametrize("raw", ["", "   ", "\n\t"])
async def test_an_empty_argument_string_means_an_empty_object(raw: str) -> None:
    body = Recorder()
    outcome = await ToolSet([tool("t", {"type": "object"}, body)]).execute("t", raw, ctx())
    assert not outcome.is_error and body.calls[0][0] == {}
    # ... and the empty object is still validated
    required = await ToolSet([tool("t", SCHEMA)]).execute("t", raw, ctx())
    assert error_text(required) == 'Error: invalid arguments for tool "t": $.query is required'


INVALID: list[tuple[str, str]] = [
    # types (bool is not an integer nor a number; 1.5 is not an integer)
    ('{"query": 5}', "$.query must be string, got integer"),
    ('{"query": "a", "count": true}', "$.count must be integer, got boolean"),
    ('{"query": "a", "count": 1.5}', "$.count must be integer, got number"),
    ('{"query": "a", "count": "3"}', "$.count must be integer, got string"),
    ('{"query": "a", "ratio": false}', "$.ratio must be number, got boolean"),
    ('{"query": "a", "ratio": "1"}', "$.ratio must be number, got string"),
    ('{"query": "a", "flag": 1}', "$.flag must be boolean, got integer"),
    ('{"query": "a", "flag": null}', "$.flag must be boolean, got null"),
    ('{"query": "a", "opt": 3}', "$.opt must be string or null, got integer"),
    ('{"query": "a", "tags": "x"}', "$.tags must be array, got string"),
    ('{"query": "a", "filter": "p"}', "$.filter must be object, got string"),
    # required and unknown parameters, at every depth
    ("{}", "$.query is required"),
    ('{"count": 2}', "$.query is required"),
    ('{"query": "a", "extra": 1}', "$.extra is not a known parameter"),
    ('{"query": "a", "filter": {}}', "$.filter.path is required"),
    ('{"query": "a", "filter": {"path": "p", "depth": "deep"}}', "$.filter.depth must be integer, got string"),
    ('{"query": "a", "filter": {"path": "p", "deep": 1}}', "$.filter.deep is not a known parameter"),
    # enum
    ('{"query": "a", "mode": "medium"}', '$.mode must be one of ["fast", "slow"]'),
    ('{"query": "a", "mode": "FAST"}', '$.mode must be one of ["fast", "slow"]'),
    # bounds
    ('{"query": ""}', "$.query must have at least 1 characters"),
    ('{"query": "abcdef"}', "$.query must have at most 5 characters"),
    ('{"query": "a", "count": 0}', "$.count must be >= 1"),
    ('{"query": "a", "count": 11}', "$.count must be <= 10"),
    ('{"query": "a", "tags": []}', "$.tags must have at least 1 items"),
    ('{"query": "a", "tags": ["x", "y", "z"]}', "$.tags must have at most 2 items"),
    # arrays: items, nested arrays
    ('{"query": "a", "tags": ["x", 1]}', "$.tags[1] must be string, got integer"),
    ('{"query": "a", "matrix": [1]}', "$.matrix[0] must be array, got integer"),
    ('{"query": "a", "matrix": [[1], [2, "x"]]}', "$.matrix[1][1] must be integer, got string"),
    ('{"query": "a", "matrix": [[1], [2, 2.5]]}', "$.matrix[1][1] must be integer, got number"),
]


@pytest.mark.parametrize(("raw", "detail"), INVALID, ids=[d for _, d in INVALID])
async def test_invalid_arguments_name_the_json_path_and_skip_the_tool(raw: str, detail: str) -> None:
    body = Recorder()
    outcome = await ToolSet([tool("search", SCHEMA, body)]).execute("search", raw, ctx())
    assert error_text(outcome) == f'Error: invalid arguments for tool "search": {detail}'
    assert outcome.error == {"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"}
    assert body.calls == []


UNPARSEABLE: list[tuple[str, Any, str]] = [
    ("truncated", '{"query": ', "malformed JSON ("),
    ("trailing garbage", '{"query": "a"} x', "malformed JSON ("),
    ("single quotes", "{'query': 'a'}", "malformed JSON ("),
    ("NaN", '{"query": "a", "ratio": NaN}', "malformed JSON (NaN is not JSON)"),
    ("Infinity", '{"query": "a", "ratio": Infinity}', "malformed JSON (Infinity is not JSON)"),
    ("-Infinity", '{"query": "a", "anything": -Infinity}', "malformed JSON (-Infinity is not JSON)"),
    ("bare NaN", "NaN", "malformed JSON (NaN is not JSON)"),
    ("hostile nesting", "[" * 100_000, "malformed JSON ("),
    ("array", '[{"query": "a"}]', "expected a JSON object, got array"),
    ("string", '"query"', "expected a JSON object, got string"),
    ("integer", "3", "expected a JSON object, got integer"),
    ("number", "2.5", "expected a JSON object, got number"),
    ("boolean", "true", "expected a JSON object, got boolean"),
    ("null", "null", "expected a JSON object, got null"),
    ("not a str", None, "arguments must be a JSON string"),
    ("bytes", b'{"query": "a"}', "arguments must be a JSON string"),
]


@pytest.mark.parametrize(("case", "raw", "detail"), UNPARSEABLE, ids=[c for c, _, _ in UNPARSEABLE])
async def test_unparseable_arguments_are_an_error_result(case: str, raw: Any, detail: str) -> None:
    body = Recorder()
    outcome = await ToolSet([tool("t", SCHEMA, body)]).execute("t", raw, ctx())
    assert error_text(outcome).startswith(f'Error: invalid arguments for tool "t": {detail}')
    assert outcome.error == {"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"}
    assert body.calls == []


async def test_an_overflowing_number_literal_is_refused_like_infinity() -> None:
    # `1e400` parses to float('inf') without `parse_constant` being asked: a non-finite value
    # reaches the tool through an untyped parameter (and a typed one reads "must be number,
    # got number").
    body = Recorder()
    outcome = await ToolSet([tool("t", SCHEMA, body)]).execute("t", '{"query": "a", "anything": 1e400}', ctx())
    assert outcome.error == {"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"}
    assert body.calls == []


@pytest.mark.parametrize(
    ("enum", "raw"),
    [([0, 1], '{"v": true}'), ([0, 1], '{"v": false}'), ([True], '{"v": 1}'), ([[1]], '{"v": [true]}')],
)
async def test_enum_does_not_equate_booleans_with_integers(enum: list[Any], raw: str) -> None:
    schema = {"type": "object", "properties": {"v": {"enum": enum}}}
    body = Recorder()
    outcome = await ToolSet([tool("t", schema, body)]).execute("t", raw, ctx())
    assert outcome.error == {"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"}
    assert body.calls == []


async def test_enum_equates_1_0_with_1() -> None:
    schema = {"type": "object", "properties": {"v": {"enum": [1, "a"]}}}
    outcome = await ToolSet([tool("t", schema)]).execute("t", '{"v": 1.0}', ctx())
    assert not outcome.is_error


# --- execute: what the tool does ---------------------------------------------------------------


OUTPUTS: list[tuple[str, Any, list[Json]]] = [
    ("string", "hello", [{"type": "text", "text": "hello"}]),
    ("empty string", "", [{"type": "text", "text": ""}]),
    ("one block", [{"type": "text", "text": "a"}], [{"type": "text", "text": "a"}]),
    (
        "blocks",
        [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    ),
    ("tuple of blocks", ({"type": "text", "text": "a"},), [{"type": "text", "text": "a"}]),
    ("no blocks", [], []),
]


@pytest.mark.parametrize(("case", "output", "content"), OUTPUTS, ids=[c for c, _, _ in OUTPUTS])
async def test_a_tool_output_is_rendered_to_text_blocks(case: str, output: Any, content: list[Json]) -> None:
    outcome = await ToolSet([tool("t", fn=Recorder(output))]).execute("t", "{}", ctx())
    assert outcome == ToolOutcome(content, False, None)
    if isinstance(output, list) and output:
        assert outcome.content[0] is not output[0]  # copied: the tool cannot alias the log


BAD_OUTPUTS: list[tuple[str, Any]] = [
    ("image block", [{"type": "image", "data": "..."}]),
    ("block with extra key", [{"type": "text", "text": "a", "cache": True}]),
    ("text not a str", [{"type": "text", "text": 3}]),
    ("None", None),
    ("int", 42),
]


@pytest.mark.parametrize(("case", "output"), BAD_OUTPUTS, ids=[c for c, _ in BAD_OUTPUTS])
async def test_a_tool_returning_something_that_is_not_text_fails_the_call_not_the_turn(case: str, output: Any) -> None:
    # A tool bug must reach the model as an error result (like a tool raising); an exception
    # out of `execute` would crash the step's tool pool and with it the agent.
    outcome = await ToolSet([tool("t", fn=Recorder(output))]).execute("t", "{}", ctx())
    assert outcome.is_error
    assert outcome.error is not None and outcome.error["code"] == "TOOL_FAILED"
    assert error_text(outcome).startswith("Error: ")


class QuotaExceeded(ToolFailure):
    pass


class CustomError(Exception):
    pass


FAILURES: list[tuple[str, Exception, str, Json]] = [
    (
        "ToolFailure",
        ToolFailure("quota exceeded", code="QUOTA"),
        "Error: quota exceeded",
        {"name": "ToolFailure", "code": "QUOTA"},
    ),
    (
        "ToolFailure with a name",
        ToolFailure('session "x" not found', code="NOT_FOUND", name="SessionNotFound"),
        'Error: session "x" not found',
        {"name": "SessionNotFound", "code": "NOT_FOUND"},
    ),
    (
        "ToolFailure subclass",
        QuotaExceeded("slow down", code="QUOTA"),
        "Error: slow down",
        {"name": "QuotaExceeded", "code": "QUOTA"},
    ),
    ("ValueError", ValueError("bad path"), "Error: bad path", {"name": "ValueError", "code": "TOOL_FAILED"}),
    (
        "OSError",
        FileNotFoundError(2, "No such file or directory"),
        "Error: [Errno 2] No such file or directory",
        {"name": "FileNotFoundError", "code": "TOOL_FAILED"},
    ),
    ("custom", CustomError("boom"), "Error: boom", {"name": "CustomError", "code": "TOOL_FAILED"}),
    ("no message", RuntimeError(), "Error: RuntimeError", {"name": "RuntimeError", "code": "TOOL_FAILED"}),
]


@pytest.mark.parametrize(("case", "exc", "text", "error"), FAILURES, ids=[c for c, *_ in FAILURES])
async def test_a_tool_raising_becomes_an_error_result(case: str, exc: Exception, text: str, error: Json) -> None:
    outcome = await ToolSet([tool("t", fn=raising(exc))]).execute("t", "{}", ctx())
    assert error_text(outcome) == text
    assert outcome.error == error


async def _sleep_forever(args: Json, context: ToolContext) -> str:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def _sleep_forever_in_a_nursery(args: Json, context: ToolContext) -> str:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever)
        await trio.sleep_forever()
    raise AssertionError("unreachable")


async def _cancelled_then_raises(args: Json, context: ToolContext) -> str:
    try:
        await trio.sleep_forever()
    finally:
        await trio.lowlevel.checkpoint()  # a checkpoint in a cancelled scope raises Cancelled again
    raise AssertionError("unreachable")


@pytest.mark.parametrize("fn", [_sleep_forever, _sleep_forever_in_a_nursery, _cancelled_then_raises])
async def test_cancellation_of_a_running_tool_is_not_converted(fn: Any, autojump_clock: Any) -> None:
    tools = ToolSet([tool("slow", fn=fn)])
    outcomes: list[ToolOutcome] = []
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                outcomes.append(await tools.execute("slow", "{}", ctx()))

            nursery.start_soon(call)
            await wait_all_tasks_blocked()
            scope.cancel()
    assert scope.cancelled_caught
    assert outcomes == []


async def test_a_deadline_cancels_a_tool_without_an_outcome(autojump_clock: Any) -> None:
    tools = ToolSet([tool("slow", fn=_sleep_forever)])
    outcome = None
    with trio.move_on_after(5) as scope:
        outcome = await tools.execute("slow", "{}", ctx())
    assert scope.cancelled_caught and outcome is None


# =============================================================================================
# inbox
# =============================================================================================


def dl(text: str) -> Delivery:
    return Delivery(content=[{"type": "text", "text": text}])


def texts(deliveries: Sequence[Delivery]) -> list[str]:
    return [d.content[0]["text"] for d in deliveries]


@pytest.mark.parametrize(
    ("mode", "wakes", "steered", "by_step"),
    [
        ("follow-up", True, False, []),
        ("steer", True, True, ["x"]),
        ("inject", False, False, ["x"]),
    ],
)
def test_one_delivery_per_mode(mode: Any, wakes: bool, steered: bool, by_step: list[str]) -> None:
    inbox = Inbox()
    assert (inbox.wakes(), inbox.steered(), len(inbox), inbox.received) == (False, False, 0, 0)
    inbox.put_nowait(dl("x"), mode)
    assert (inbox.wakes(), inbox.steered(), len(inbox), inbox.received) == (wakes, steered, 1, 1)
    assert texts(inbox.claim_step()) == by_step
    assert len(inbox) == 1 - len(by_step)
    assert texts(inbox.claim_turn()) == ["x"][len(by_step) :]
    assert (inbox.wakes(), inbox.steered(), len(inbox), inbox.claim_turn()) == (False, False, 0, [])


def test_claim_turn_takes_the_next_step_input_and_one_follow_up() -> None:
    inbox = Inbox()
    for text, mode in [("i1", "inject"), ("f1", "follow-up"), ("s1", "steer"), ("f2", "follow-up"), ("i2", "inject")]:
        inbox.put_nowait(dl(text), mode)  # type: ignore[arg-type]  # mode is a str from the test table
    assert (len(inbox), inbox.received, inbox.steered()) == (5, 5, True)
    assert texts(inbox.claim_turn()) == ["i1", "s1", "i2", "f1"]
    assert (len(inbox), inbox.wakes(), inbox.steered()) == (1, True, False)
    assert texts(inbox.claim_step()) == []  # a follow-up waits for its own turn
    assert texts(inbox.claim_turn()) == ["f2"]
    assert (len(inbox), inbox.wakes()) == (0, False)


def test_claim_step_leaves_follow_ups_queued() -> None:
    inbox = Inbox()
    for text, mode in [("f1", "follow-up"), ("s1", "steer"), ("i1", "inject")]:
        inbox.put_nowait(dl(text), mode)  # type: ignore[arg-type]  # mode is a str from the test table
    assert texts(inbox.claim_step()) == ["s1", "i1"]
    assert (len(inbox), inbox.wakes(), inbox.steered()) == (1, True, False)


def test_an_inject_alone_does_not_wake_but_rides_along_with_a_steer() -> None:
    inbox = Inbox()
    inbox.put_nowait(dl("i"), "inject")
    assert not inbox.wakes()
    inbox.put_nowait(dl("s"), "steer")
    assert inbox.wakes() and inbox.steered()
    assert texts(inbox.claim_step()) == ["i", "s"]


def test_put_nowait_refuses_over_capacity_unless_forced() -> None:
    inbox = Inbox(capacity=2)
    inbox.put_nowait(dl("a"), "follow-up")
    inbox.put_nowait(dl("b"), "inject")
    for mode in ("follow-up", "steer", "inject"):
        with pytest.raises(trio.WouldBlock):
            inbox.put_nowait(dl("c"), mode)  # type: ignore[arg-type]  # mode is a str from the test table
    assert (len(inbox), inbox.received) == (2, 2)
    inbox.put_nowait(dl("notice"), "steer", force=True)  # durable notices are never dropped
    inbox.put_nowait(dl("notice2"), "follow-up", force=True)
    assert (len(inbox), inbox.received) == (4, 4)
    assert texts(inbox.claim_turn()) == ["b", "notice", "a"]


def test_unknown_mode_and_bad_capacity_are_refused() -> None:
    inbox = Inbox()
    with pytest.raises(ValueError, match="broadcast"):
        inbox.put_nowait(dl("x"), "broadcast")  # type: ignore[arg-type]  # an unknown mode, on purpose
    assert (len(inbox), inbox.received) == (0, 0)
    for capacity in (0, -1):
        with pytest.raises(ValueError):
            Inbox(capacity)


@pytest.mark.parametrize(
    ("queued_mode", "claim"), [("steer", "claim_step"), ("inject", "claim_step"), ("follow-up", "claim_turn")]
)
async def test_put_waits_when_full_and_proceeds_when_a_claim_frees_room(
    queued_mode: Any, claim: str, autojump_clock: Any
) -> None:
    inbox = Inbox(capacity=1)
    inbox.put_nowait(dl("first"), queued_mode)
    done: list[str] = []
    async with trio.open_nursery() as nursery:

        async def send() -> None:
            await inbox.put(dl("second"), "steer", Abort())
            done.append("second")

        nursery.start_soon(send)
        await wait_all_tasks_blocked()
        assert (done, len(inbox), inbox.received) == ([], 1, 1)
        assert texts(getattr(inbox, claim)()) == ["first"]
        await wait_all_tasks_blocked()
        assert (done, len(inbox), inbox.received) == (["second"], 1, 2)
    assert texts(inbox.claim_step()) == ["second"]


async def test_a_claim_that_frees_no_room_keeps_the_sender_waiting(autojump_clock: Any) -> None:
    inbox = Inbox(capacity=1)
    inbox.put_nowait(dl("later"), "follow-up")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(inbox.put, dl("x"), "inject")
        await wait_all_tasks_blocked()
        assert inbox.claim_step() == []  # follow-ups are not next-step input
        await wait_all_tasks_blocked()
        assert (len(inbox), inbox.received) == (1, 1)
        assert texts(inbox.claim_turn()) == ["later"]
    assert texts(inbox.claim_step()) == ["x"]


async def test_waiting_senders_get_in_one_per_freed_slot(autojump_clock: Any) -> None:
    inbox = Inbox(capacity=1)
    inbox.put_nowait(dl("0"), "inject")
    async with trio.open_nursery() as nursery:
        for text in ("a", "b"):
            nursery.start_soon(inbox.put, dl(text), "inject")
        await wait_all_tasks_blocked()
        first = inbox.claim_step()
        await wait_all_tasks_blocked()
        assert texts(first) == ["0"] and (len(inbox), inbox.received) == (1, 2)
        second = inbox.claim_step()
        await wait_all_tasks_blocked()
        assert (len(inbox), inbox.received) == (1, 3)
    assert sorted(texts(second) + texts(inbox.claim_step())) == ["a", "b"]


@pytest.mark.parametrize("free_room_too", [False, True])
async def test_an_abort_while_waiting_cancels_the_delivery(free_room_too: bool, autojump_clock: Any) -> None:
    inbox = Inbox(capacity=1)
    inbox.put_nowait(dl("first"), "steer")
    abort = Abort()
    raised: list[BaseException] = []
    async with trio.open_nursery() as nursery:

        async def send() -> None:
            try:
                await inbox.put(dl("second"), "steer", abort)
            except DeliveryCancelled as exc:
                raised.append(exc)

        nursery.start_soon(send)
        await wait_all_tasks_blocked()
        abort.set()
        if free_room_too:  # room frees in the same tick: the abort still wins
            assert texts(inbox.claim_step()) == ["first"]
        await wait_all_tasks_blocked()
    assert len(raised) == 1 and str(raised[0]) == "message delivery was cancelled"
    assert inbox.received == 1
    rest = [] if free_room_too else ["first"]
    assert texts(inbox.claim_step()) == rest and len(inbox) == 0


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("mode", ["follow-up", "steer", "inject"])
async def test_an_abort_set_before_put_delivers_nothing(full: bool, mode: Any, autojump_clock: Any) -> None:
    inbox = Inbox(capacity=1)
    if full:
        inbox.put_nowait(dl("first"), "inject")
    before = (len(inbox), inbox.received)
    abort = Abort()
    abort.set()
    with trio.fail_after(1):  # never waits for room it will not use
        with pytest.raises(DeliveryCancelled):
            await inbox.put(dl("x"), mode, abort)
    assert (len(inbox), inbox.received) == before
    assert "x" not in texts(inbox.claim_turn())


@pytest.mark.parametrize("with_abort", [False, True])
async def test_outer_cancellation_of_a_waiting_put_propagates(with_abort: bool, autojump_clock: Any) -> None:
    inbox = Inbox(capacity=1)
    inbox.put_nowait(dl("first"), "inject")
    with trio.move_on_after(10) as scope:
        await inbox.put(dl("x"), "inject", Abort() if with_abort else None)
    assert scope.cancelled_caught
    assert (len(inbox), inbox.received) == (1, 1)


async def test_put_with_room_returns_without_waiting(autojump_clock: Any) -> None:
    inbox = Inbox(capacity=2)
    with trio.fail_after(1):
        await inbox.put(dl("a"), "follow-up")
        await inbox.put(dl("b"), "steer", Abort())
    assert (len(inbox), inbox.received, inbox.steered()) == (2, 2, True)


async def test_wait_received_returns_once_more_than_count_were_accepted(autojump_clock: Any) -> None:
    inbox = Inbox()
    returned: list[int] = []
    async with trio.open_nursery() as nursery:

        async def wait(count: int) -> None:
            await inbox.wait_received(count)
            returned.append(count)

        nursery.start_soon(wait, 0)
        nursery.start_soon(wait, 1)
        await wait_all_tasks_blocked()
        assert returned == []
        inbox.put_nowait(dl("a"), "inject")  # counts although it does not wake
        await wait_all_tasks_blocked()
        assert returned == [0]
        inbox.claim_step()  # a claim changes nothing that was received
        await wait_all_tasks_blocked()
        assert returned == [0]
        inbox.put_nowait(dl("b"), "follow-up")
        await wait_all_tasks_blocked()
        assert returned == [0, 1]
    with trio.fail_after(1):
        await inbox.wait_received(1)  # already true: returns at once


@pytest.mark.parametrize(("mode", "wakes"), [("inject", False), ("steer", True), ("follow-up", True)])
async def test_wait_wake(mode: Any, wakes: bool, autojump_clock: Any) -> None:
    inbox = Inbox()
    woke: list[bool] = []
    async with trio.open_nursery() as nursery:

        async def wait() -> None:
            await inbox.wait_wake()
            woke.append(True)

        nursery.start_soon(wait)
        await wait_all_tasks_blocked()
        inbox.put_nowait(dl("x"), mode)
        await wait_all_tasks_blocked()
        assert bool(woke) is wakes
        nursery.cancel_scope.cancel()


# =============================================================================================
# messages and the surface
# =============================================================================================


def msg(seq: int, role: str = "user", *blocks: Json, source: Json | None = None) -> Json:
    default = {"system": {"kind": "user"}, "user": {"kind": "user"}, "assistant": {"kind": "model"}}[role]
    content = list(blocks) or [{"type": "text", "text": f"{role} {seq}"}]
    return message(f"m{seq}", role, content, source or default)


def system_ev(seq: int, text: str = "be brief") -> Event:
    data = {"turn": 1, "step": 1, "message": msg(seq, "system", {"type": "text", "text": text})}
    return make_event(seq, "system/message", T + seq, data, surface_op="append")


def user_ev(seq: int, text: str | None = None) -> Event:
    message_ = msg(seq, "user", *([{"type": "text", "text": text}] if text is not None else []))
    return make_event(seq, "user/message", T + seq, {"turn": 1, "step": 1, "message": message_}, surface_op="append")


def assistant_ev(seq: int, *call_ids: str) -> Event:
    blocks = [{"type": "text", "text": f"assistant {seq}"}]
    blocks += [{"type": "tool-call", "id": c, "name": "ls", "arguments": "{}"} for c in call_ids]
    data = {
        "turn": 1,
        "step": 1,
        "message": msg(seq, "assistant", *blocks),
        "finish": "tool-calls" if call_ids else "stop",
    }
    return make_event(seq, "assistant/message", T + seq, data, surface_op="append")


def result_ev(seq: int, call_id: str) -> Event:
    message_ = tool_result_message(f"m{seq}", call_id, [{"type": "text", "text": f"result {seq}"}], is_error=False)
    return make_event(seq, "tool/result", T + seq, {"turn": 1, "step": 1, "message": message_}, surface_op="append")


def summary_ev(seq: int, start: int, end: int, replaced: Sequence[int], text: str = "summary") -> Event:
    message_ = message(f"m{seq}", "user", [{"type": "text", "text": text}], {"kind": "compaction"})
    return make_event(
        seq,
        "user/message",
        T + seq,
        {"turn": 1, "step": 1, "message": message_},
        surface_op=ReplaceOp(op="replace", start_seq=start, end_seq=end),
        source_event_seqs=sorted(replaced),
    )


def seqs(surface: Surface) -> list[int]:
    return [n.seq for n in surface.nodes]


def base_log() -> list[Event]:
    """sys0 u1 a2(call c1) r3 u4 a5 u6, with log-only events around them."""
    return [
        make_event(0, "system/message", T, {"turn": 1, "step": 1, "message": msg(0, "system")}, surface_op="append"),
        user_ev(1),
        assistant_ev(2, "c1"),
        result_ev(3, "c1"),
        user_ev(4),
        assistant_ev(5),
        user_ev(6),
    ]


def test_from_events_keeps_surface_events_only_with_their_messages() -> None:
    events = [
        make_event(0, "turn/start", T, {"turn": 1, "trigger": {"kind": "message"}}),
        make_event(1, "step/start", T, {"turn": 1, "step": 1}),
        system_ev(2),
        user_ev(3, "hi"),
        assistant_ev(4, "c1"),
        make_event(5, "tool/call", T, {"turn": 1, "step": 1, "call_id": "c1", "name": "ls", "arguments": "{}"}),
        result_ev(6, "c1"),
        make_event(7, "step/end", T, {"turn": 1, "step": 1}),
        turn_end_event(8, T, 1),
    ]
    surface = Surface.from_events(events)
    assert [(n.seq, n.type) for n in surface.nodes] == [
        (2, "system/message"),
        (3, "user/message"),
        (4, "assistant/message"),
        (6, "tool/result"),
    ]
    # exactly the messages that were written, as plain JSON
    assert surface.messages() == [
        msg(2, "system", {"type": "text", "text": "be brief"}),
        msg(3, "user", {"type": "text", "text": "hi"}),
        msg(
            4,
            "assistant",
            {"type": "text", "text": "assistant 4"},
            {"type": "tool-call", "id": "c1", "name": "ls", "arguments": "{}"},
        ),
        tool_result_message("m6", "c1", [{"type": "text", "text": "result 6"}], is_error=False),
    ]
    assert surface.last_system_text() == "be brief"


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (1, 3, [0, 7, 4, 5, 6]),  # a call with its result
        (1, 6, [0, 7]),  # everything after the system message
        (4, 5, [0, 1, 2, 3, 7, 6]),  # in the middle
        (2, 2, [0, 1, 7, 3, 4, 5, 6]),  # a single node
        (5, 6, [0, 1, 2, 3, 4, 7]),  # up to the newest node
        (0, 6, [7]),  # everything
    ],
)
def test_a_replace_op_swaps_its_seq_range_for_one_node_in_place(start: int, end: int, expected: list[int]) -> None:
    events = [*base_log(), summary_ev(7, start, end, range(start, end + 1))]
    surface = Surface.from_events(events)
    assert seqs(surface) == expected
    node = surface.nodes[expected.index(7)]
    assert node.type == "user/message" and message_text(node.message) == "summary"
    assert node.message["source"] == {"kind": "compaction"}
    incremental = Surface()
    for event in events:
        incremental.apply(event)
    assert incremental.nodes == surface.nodes


def test_replace_ops_then_appends() -> None:
    # After the first replace the surface is out of seq order ([0, 7, 4, 5, 6, 8]): the second
    # summary belongs where 4 was, after summary 7, not before the first node with seq >= 4.
    events = [*base_log(), summary_ev(7, 1, 3, [1, 2, 3], "first"), user_ev(8), summary_ev(9, 4, 5, [4, 5], "second")]
    surface = Surface.from_events(events)
    assert seqs(surface) == [0, 7, 9, 6, 8]
    assert [message_text(m) for m in surface.messages()][1:3] == ["first", "second"]


def test_last_system_text_is_the_newest_system_message() -> None:
    assert Surface().last_system_text() is None
    assert Surface.from_events([user_ev(0)]).last_system_text() is None
    surface = Surface.from_events([system_ev(0, "old"), user_ev(1), system_ev(2, "new"), user_ev(3)])
    assert surface.last_system_text() == "new"


TEXT = {"type": "text", "text": "abc"}
CALL = {"type": "tool-call", "id": "c1", "name": "ls", "arguments": '{"p": "/"}'}


def result_block(*blocks: Json) -> Json:
    return {"type": "tool-result", "call_id": "c1", "content": list(blocks), "is_error": False}


@pytest.mark.parametrize(
    ("blocks", "sep", "text"),
    [
        ([], "\n", ""),
        ([TEXT], "\n", "abc"),
        ([TEXT, {"type": "text", "text": "de"}], "\n", "abc\nde"),
        ([TEXT, {"type": "text", "text": "de"}], "", "abcde"),
        ([TEXT, CALL], "\n", "abc"),  # tool calls are not text
        ([result_block(TEXT, {"type": "text", "text": "x"})], "|", "abc|x"),  # results are
        ([result_block()], "\n", ""),
        ([{"type": "text", "text": ""}, TEXT], ",", ",abc"),
    ],
)
def test_message_text(blocks: list[Json], sep: str, text: str) -> None:
    assert message_text({"id": "m", "role": "user", "content": blocks, "source": {"kind": "user"}}, sep=sep) == text
    if sep == "\n":
        assert message_text({"content": blocks}) == text
    assert message_text({"id": "m"}) == ""


@pytest.mark.parametrize(
    ("contents", "size"),
    [
        ([], 0),
        ([[]], 0),
        ([[TEXT]], 3),
        ([[CALL]], len("ls") + len('{"p": "/"}')),
        ([[TEXT, CALL]], 3 + 12),
        ([[result_block(TEXT, TEXT)]], 6),
        ([[TEXT], [TEXT, {"type": "text", "text": "12345"}], [result_block(TEXT)]], 3 + 8 + 3),
    ],
)
def test_size_counts_text_and_tool_call_characters(contents: list[list[Json]], size: int) -> None:
    surface = Surface()
    for seq, blocks in enumerate(contents):
        surface.add(seq, "user/message", {"id": f"m{seq}", "role": "user", "content": blocks, "source": {}})
    assert surface.size() == size


def test_size_follows_a_replace() -> None:
    surface = Surface.from_events(base_log())
    before = surface.size()
    replaced = sum(len(message_text(m)) for m in surface.messages()[1:4]) + len("ls") + len("{}")
    surface.apply(summary_ev(7, 1, 3, [1, 2, 3], text="xy"))
    assert surface.size() == before - replaced + 2


# =============================================================================================
# compaction
# =============================================================================================

KINDS = {"S": "system/message", "U": "user/message", "A": "assistant/message", "T": "tool/result"}


def nodes(spec: str) -> list[SurfaceNode]:
    """`"S U A T"` → surface nodes with seqs 0, 1, 2, ... of those types."""
    return [SurfaceNode(seq, KINDS[k], {"id": f"m{seq}", "content": []}) for seq, k in enumerate(spec.split())]


def planned(spec: str, keep_recent: int) -> list[int] | None:
    plan = plan_compaction(nodes(spec), keep_recent=keep_recent)
    return None if plan is None else [n.seq for n in plan.nodes]


PLANS: list[tuple[str, int, list[int] | None]] = [
    ("S U A U A U A", 2, [1, 2, 3, 4]),
    ("S U A U A U A", 4, [1, 2]),
    ("S U A U A U A", 5, None),  # one node is too small to summarize
    ("S U A U A U A", 0, [1, 2, 3, 4, 5, 6]),
    ("S S U A U A", 2, [2, 3]),  # every leading system message is kept
    ("U A U A", 2, [0, 1]),  # no system message at all
    ("S U A", 2, None),
    ("S U A U", 2, None),
    ("", 0, None),
    ("S", 0, None),
    ("S S S", 0, None),
    ("S U A", 10, None),  # keep_recent longer than the surface
    ("S U A T T U A", 2, [1, 2, 3, 4]),  # a call with both results
    ("S U A T T U A", 3, None),  # would end between the call and its second result: backs off to [U]
    ("S U A T U A T U A", 2, [1, 2, 3, 4, 5, 6]),
    ("S U A T U A T U A", 3, [1, 2, 3, 4]),  # backs off from T to end before its call
    ("S U A T U A T U A", 4, [1, 2, 3, 4]),
    ("S U A T U A T U A", 5, [1, 2, 3]),
    ("S U A T U A T U A", 6, None),  # [U A] | T: backs off to [U]
    ("S U U A T T T U A", 3, [1, 2]),  # backs off over three results
    ("S U A T", 0, [1, 2, 3]),  # nothing after the range
    ("S U A U S U A U A", 2, [1, 2, 3]),  # stops at a later system message
    ("S U S U A U A", 2, [3, 4]),  # the run before the new system prompt is down to one node
    ("S U S U A U A U", 2, [3, 4, 5]),
    ("S U S U S U A U A", 2, [5, 6]),  # past two changed prompts
    ("S U S U A", 2, None),  # [U] | S | [U] A kept
    ("S U A T S U A", 3, [1, 2, 3]),  # a call with its result right before a new prompt
    ("U S U A U", 1, [2, 3]),  # no leading system message, then a prompt
]


@pytest.mark.parametrize(("spec", "keep", "expected"), PLANS, ids=[f"{s or 'empty'}/{k}" for s, k, _ in PLANS])
def test_plan_compaction(spec: str, keep: int, expected: list[int] | None) -> None:
    assert planned(spec, keep) == expected
    plan = plan_compaction(nodes(spec), keep_recent=keep)
    if plan is not None:
        assert (plan.start_seq, plan.end_seq) == (expected[0], expected[-1])  # type: ignore[index]  # expected is not None on this row


def _runs(kinds: tuple[str, ...], end: int) -> list[tuple[int, int]]:
    """The (lo, hi) runs of non-system nodes among the first `end` nodes, oldest first."""
    runs, lo = [], 0
    while lo < end:
        while lo < end and kinds[lo] == "S":
            lo += 1
        hi = lo
        while hi < end and kinds[hi] != "S":
            hi += 1
        if hi > lo:
            runs.append((lo, hi))
        lo = hi
    return runs


@pytest.mark.slow
def test_plan_compaction_invariants_over_every_small_surface() -> None:
    """Exhaustive over surfaces of up to 7 nodes: the planner's promises hold for each one."""
    checked = 0
    for n in range(8):
        for kinds in itertools.product("SUAT", repeat=n):
            surface = nodes(" ".join(kinds))

            def fits(lo: int, hi: int) -> bool:
                """Whether the run still holds two nodes once it backs off from a split call."""
                while hi > lo and hi < n and kinds[hi] == "T":
                    hi -= 1
                return hi - lo >= 2

            for keep in range(4):
                plan = plan_compaction(surface, keep_recent=keep)
                runs = _runs(kinds, n - keep)
                if plan is None:
                    assert not any(fits(lo, hi) for lo, hi in runs)
                    continue
                checked += 1
                lo, hi = plan.nodes[0].seq, plan.nodes[-1].seq + 1
                assert list(plan.nodes) == surface[lo:hi]  # contiguous, in order
                assert hi - lo >= 2
                assert all(node.type != "system/message" for node in plan.nodes)
                assert n - hi >= keep  # the newest keep_recent nodes are left alone
                assert hi == n or surface[hi].type != "tool/result"  # never ends inside a call
                (run,) = [r for r in runs if r[0] <= lo < r[1]]
                assert lo == run[0]  # starts a run: right after a system message or at the start
                assert not any(fits(*r) for r in runs[: runs.index(run)])  # the oldest run that fits
    assert checked > 5000


def test_compaction_policy_validates() -> None:
    assert CompactionPolicy(max_chars=0).keep_recent == 4
    for kwargs in ({"max_chars": -1}, {"max_chars": 10, "keep_recent": -1}):
        with pytest.raises(ValueError):
            CompactionPolicy(**kwargs)
    plan = CompactionPlan(tuple(nodes("U A T")))
    assert (plan.start_seq, plan.end_seq) == (0, 2)


# --- plan → replace → surface, the way the loop uses them ----------------------------------------


def compact(events: list[Event], surface: Surface, keep_recent: int) -> CompactionPlan:
    """Plan, build the replacing `user/message` as the loop does (source seqs sorted, as the
    envelope requires), append and apply it."""
    plan = plan_compaction(surface.nodes, keep_recent=keep_recent)
    assert plan is not None
    event = summary_ev(len(events), plan.start_seq, plan.end_seq, [n.seq for n in plan.nodes])
    events.append(event)
    surface.apply(event)
    return plan


def test_a_first_compaction_replaces_its_planned_nodes() -> None:
    events = [system_ev(0), user_ev(1), assistant_ev(2, "c1"), result_ev(3, "c1"), user_ev(4), assistant_ev(5)]
    surface = Surface.from_events(events)
    plan = compact(events, surface, keep_recent=2)
    assert [n.seq for n in plan.nodes] == [1, 2, 3]
    assert seqs(surface) == [0, 6, 4, 5]
    assert Surface.from_events(events).nodes == surface.nodes


@pytest.mark.parametrize(("keep_recent", "expected"), [(2, [0, 8, 6, 7]), (0, [0, 8])])
def test_a_second_compaction_replaces_exactly_its_planned_nodes(keep_recent: int, expected: list[int]) -> None:
    # After one compaction the surface is no longer in seq order (summary 5 sits before 3 and 4),
    # so a seq range cannot name the nodes of the next plan.
    events = [system_ev(0), user_ev(1), assistant_ev(2), user_ev(3), assistant_ev(4)]
    surface = Surface.from_events(events)
    compact(events, surface, keep_recent=2)
    assert seqs(surface) == [0, 5, 3, 4]
    for event in (user_ev(6), assistant_ev(7)):
        events.append(event)
        surface.apply(event)
    plan = compact(events, surface, keep_recent=keep_recent)
    assert seqs(surface) == expected
    assert not {n.seq for n in plan.nodes} & set(seqs(surface))
    assert Surface.from_events(events).nodes == surface.nodes


def test_the_surface_skips_an_ignorable_event_of_a_later_format() -> None:
    """A later format's ignorable event may carry a surface_op; readers skip it (the log reads
    fine, so resuming it must too)."""
    from subagents.runtime.models.messages import Surface
    from subagents.storage._codec import decode_event

    user = make_event(
        0,
        "user/message",
        1,
        {
            "turn": 1,
            "step": 1,
            "message": {
                "id": "m0",
                "role": "user",
                "content": [{"type": "text", "text": "hi"}],
                "source": {"kind": "user"},
            },
        },
        surface_op="append",
    )
    future = decode_event(
        b'{"seq":1,"type":"future/note","time":1,"data":{"x":1},"ignorable":true,"surface_op":"append"}'
    )
    surface = Surface.from_events([user, future], session_id="s")
    assert [node.seq for node in surface.nodes] == [0]


def test_a_tool_failure_keeps_only_this_runtimes_codes() -> None:
    from subagents.runtime.tools.base import _failed

    class ThirdParty(Exception):
        code = "rate_limit_exceeded"
        message = "slow down"

    outcome = _failed(ThirdParty("from a library"))
    assert outcome.error == {"name": "ThirdParty", "code": "TOOL_FAILED"}
    assert outcome.content[0]["text"] == "Error: from a library"
    from subagents.storage import PersistenceFailed

    ours = _failed(PersistenceFailed("disk gone"))
    assert ours.error == {"name": "PersistenceFailed", "code": "STORAGE_PERSISTENCE_FAILED"}


async def test_a_put_waiting_for_room_under_an_abort_sees_a_claim_made_as_it_starts_waiting(
    autojump_clock: Any,
) -> None:
    """`put` waits for room under its abort in a `wait_any`, whose tasks start a checkpoint
    later: a claim made in between must still wake it (it hung until the next change)."""
    for n in range(40):  # the scheduler orders each batch at random: the window is hit often
        inbox = Inbox(capacity=1)
        inbox.put_nowait(dl("queued"), "follow-up")
        with trio.fail_after(60):  # virtual seconds: only a missed wake-up reaches it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(inbox.put, dl(f"waiting {n}"), "follow-up", Abort())
                await trio.lowlevel.checkpoint()  # the put parks in its wait_any...
                assert texts(inbox.claim_turn()) == ["queued"]  # ...and the room frees now
        assert texts(inbox.claim_turn()) == [f"waiting {n}"]
