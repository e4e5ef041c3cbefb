"""Rendering a scripted response (runtime/testing/scripted_model.py): its `{{from_request:...}}`
templates expanded against the request's text, default call ids numbered from the session's
assistant messages, its text and arguments cut into the pieces it streams, and its wait
described for a stall message. Pure functions: no Trio, no model state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence

import attrs

from ..foundation.errors import ScriptNoMatch
from ..models.base import ModelRequest, SessionBinding
from .script_format import (
    ScriptedResponse,
    WaitFor,
    WaitForSettled,
    WaitForWaiting,
    expand_templates,
    render_arguments,
)

__all__ = [
    "Rendered",
    "describe_wait",
    "dump_wait",
    "render_response",
    "request_text",
    "split_arguments",
    "split_text",
]

_WORD_START = re.compile(r"(?<=\s)(?=\S)")
_TEXT_PIECES = 3


@attrs.frozen(kw_only=True)
class Rendered:
    """A response with its templates expanded against the request: what it streams."""

    text: str
    calls: tuple[tuple[str, str, str], ...]  # (id, name, arguments)
    error_message: str | None
    settled: str | None


def split_text(text: str) -> list[str]:
    """`text` cut at word starts into at most three pieces of about equal word counts (none for
    empty text); the pieces concatenate back to `text`."""
    if not text:
        return []
    words = _WORD_START.split(text)
    if len(words) > 1 and words[0].isspace():
        words[:2] = [words[0] + words[1]]  # leading blanks belong to the first word
    count = min(_TEXT_PIECES, len(words))
    bounds = [round(j * len(words) / count) for j in range(count + 1)]
    return ["".join(words[bounds[j] : bounds[j + 1]]) for j in range(count)]


def split_arguments(arguments: str) -> list[str]:
    """A tool call's arguments in the two fragments it streams (one when shorter than two)."""
    if len(arguments) < 2:
        return [arguments]
    middle = len(arguments) // 2
    return [arguments[:middle], arguments[middle:]]


def request_text(messages: Sequence[Mapping[str, object]]) -> str:
    """The text `{{from_request:...}}` searches: every text block of every message, including
    text inside tool-result blocks, in order, joined with newlines."""
    texts: list[str] = []
    for message in messages:
        _collect_text(message.get("content"), texts)
    return "\n".join(texts)


def _collect_text(content: object, out: list[str]) -> None:
    if not isinstance(content, list | tuple):
        return
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            out.append(block["text"])
        elif kind == "tool-result":
            _collect_text(block.get("content"), out)


def _resolver(session: SessionBinding, request: ModelRequest) -> Callable[[str], str]:
    text: str | None = None

    def resolve(source: str) -> str:
        nonlocal text
        if text is None:
            text = request_text(request.messages)
        matches = list(re.finditer(source, text))
        last = matches[-1] if matches else None
        if last is None or last.group(1) is None:
            raise ScriptNoMatch(
                f"{{{{from_request:{source}}}}} found no match in the request messages of"
                f' session "{session.session_id}"',
            )
        return last.group(1)

    return resolve


def render_response(
    response: ScriptedResponse, session: SessionBinding, request: ModelRequest, assistant_count: int
) -> Rendered:
    resolve = _resolver(session, request)
    n = assistant_count + 1
    calls = tuple(
        (
            expand_templates(call.id, resolve) if call.id is not None else f"call_{n}_{i}",
            expand_templates(call.name, resolve),
            render_arguments(call.arguments, resolve),
        )
        for i, call in enumerate(response.tool_calls, start=1)
    )
    wait = response.wait_for
    return Rendered(
        text=expand_templates(response.text, resolve),
        calls=calls,
        error_message=(expand_templates(response.error.message, resolve) if response.error is not None else None),
        settled=(
            expand_templates(wait.child, resolve)
            if isinstance(wait, WaitForSettled)
            else expand_templates(wait.session, resolve)
            if isinstance(wait, WaitForWaiting)
            else None
        ),
    )


def describe_wait(wait: WaitFor, settled: str | None) -> str:
    """The wait as the script writes it, its templates expanded (for the stall message)."""
    if isinstance(wait, WaitForSettled):
        shown: dict[str, object] = {"settled": settled if settled is not None else wait.child}
        if wait.count != 1:
            shown["count"] = wait.count
        return dump_wait(shown)
    return dump_wait({"steered": True})


def dump_wait(value: object) -> str:
    """A wait as one line of JSON (for the stall message)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
