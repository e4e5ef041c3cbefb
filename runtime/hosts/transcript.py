"""A readable transcript of one session (`subagents show`): turns, messages, tool calls and
results, subagent records and notices, and token usage (per turn at its end, and the session's
own total as the last entry).

Pure: events in, entries out. Each entry is a small JSON object (`--json` prints them as they
are); `render` turns them into lines for a terminal. Payloads are decoded as they are used, so a
malformed one raises `InvalidPayload` like any other reader of the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec
from subagents.storage import Event, decode_payload

from ..foundation.budgets import TurnCount, count_turns
from ..foundation.json_values import JsonObject as Json
from ..foundation.json_values import JsonValue
from ..foundation.pricing import PriceTable, format_cost
from ..usage import MODEL, Tokens, TreeUsage, cost_of, describe, recorded_model, usage_of

__all__ = ["render", "transcript", "tree_entry"]


def _text(content: Iterable[Mapping[str, JsonValue]]) -> str:
    parts = []
    for block in content:
        if block.get("type") == "text":
            parts.append(block["text"])
        elif block.get("type") == "tool-result":
            parts.append(_text(block.get("content", ())))
    return "\n".join(parts)


def transcript(
    events: Sequence[Event],
    *,
    session_id: str = "",
    inherited_event_count: int = 0,
    inherited_from: str | None = None,
    held: bool = False,
    prices: PriceTable | None = None,
) -> list[Json]:
    """The entries of a session's events. A fork's inherited prefix (seq `0..K-1`, K =
    `inherited_event_count`) is framed by an `inherited` entry (naming `inherited_from`, the
    session it came from, when known) and an `own` entry where its own events start; `held`
    (another process writes the session now) puts a `live-elsewhere` entry first. A `turn/end` of
    the own suffix whose turn made model calls carries that turn's `usage`, one a budget ended
    before any model call `counted: false` (it does not count toward `max_turns`: budgets.py
    `turn_counted`); the last entry is
    `{"type": "usage", "turns": [...], "total": {...}}`, the own suffix's usage (runtime/usage.py).
    With `prices` (a non-empty table), each usage object — a call's, a turn's, the total — gains
    `cost` (a number, or null when unknown), derived from the usage and the model recorded then."""
    out: list[Json] = []
    per_turn, total = usage_of(events, inherited_event_count)
    model = ""  # the model in force (`session/model`), for a call's cost
    counted = TurnCount()  # the own turns that count toward `max_turns` (budgets.py)

    def priced(tokens: Tokens) -> Json:
        usage: Json = dict(tokens.to_json())
        if prices:
            usage["cost"] = cost_of(tokens, prices)
        return usage

    if held:
        out.append({"type": "live-elsewhere"})
    own_marked = inherited_event_count <= 0
    if not own_marked:
        out.append({"type": "inherited", "from": inherited_from, "first_seq": 0, "last_seq": inherited_event_count - 1})
    for event in events:
        if not own_marked and event.seq >= inherited_event_count:
            out.append({"type": "own", "first_seq": inherited_event_count})
            own_marked = True
        kind = event.type
        if kind == MODEL:
            model = recorded_model(event)
        before, counted = counted, count_turns((event,), inherited_event_count, counted)
        if kind not in _SHOWN:
            continue
        data = msgspec.to_builtins(decode_payload(event, session_id=session_id))
        entry: Json = {"seq": event.seq, "type": kind}
        if kind in ("turn/start", "turn/end"):
            entry["turn"] = data["turn"]
            if kind == "turn/end":
                entry["reason"] = data["reason"]
                turn_usage = per_turn.get(data["turn"]) if event.seq >= inherited_event_count else None
                if turn_usage is not None:
                    entry["usage"] = priced(turn_usage)
                if counted.turns < before.turns:  # a budget ended it before any model call
                    entry["counted"] = False
            elif "trigger" in data:
                entry["trigger"] = data["trigger"]["kind"]
        elif kind == "turn/continue":
            entry |= {k: data[k] for k in ("turn", "step", "attempt", "lost_model_call")}
        elif kind == "tool/call":
            entry |= {"call_id": data["call_id"], "name": data["name"], "arguments": data["arguments"]}
        elif kind in ("system/message", "user/message", "assistant/message", "tool/result"):
            message = data["message"]
            entry |= {"role": message["role"], "source": message["source"]["kind"], "text": _text(message["content"])}
            calls = [b for b in message["content"] if b.get("type") == "tool-call"]
            if calls:
                entry["tool_calls"] = [{"id": b["id"], "name": b["name"]} for b in calls]
            for key in ("finish", "usage", "interrupted", "error", "attempt", "in_doubt"):
                if key in data:
                    entry[key] = data[key]
            if prices and isinstance(data.get("usage"), dict) and event.seq >= inherited_event_count:
                call = _call_tokens(data["usage"], model)
                if call is not None:
                    entry["usage"] = {**data["usage"], "cost": cost_of(call, prices)}
            if message["content"] and message["content"][0].get("type") == "tool-result":
                entry["is_error"] = message["content"][0]["is_error"]
        else:  # subagent/*, compaction/* and session/stopped records
            entry["data"] = data
        out.append(entry)
    turns = [{"turn": turn, **priced(tokens)} for turn, tokens in per_turn.items()]
    out.append({"type": "usage", "turns": turns, "total": priced(total)})
    return out


def tree_entry(tree: TreeUsage | str, prices: PriceTable | None = None) -> Json:
    """The entry `show` ends with for a session that has subagents: `{"type": "tree-usage",
    "sessions", "skipped", "total"}` — the session and all its descendants, as `sessions --json`
    and chat `/usage` sum them (with prices, `total.cost`: null when unknown or a descendant was
    skipped) — or `{"type": "tree-usage", "error"}` when the tree could not be listed."""
    if isinstance(tree, str):
        return {"type": "tree-usage", "error": tree}
    total: Json = dict(tree.total.to_json())
    if prices:
        total["cost"] = None if tree.skipped else cost_of(tree.total, prices)
    return {"type": "tree-usage", "sessions": tree.sessions, "skipped": list(tree.skipped), "total": total}


def _call_tokens(usage: Json, model: str) -> Tokens | None:
    """One call's recorded usage as `Tokens` of `model` (None when it is not counts)."""
    counts = [usage.get(k, 0) for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")]
    if any(type(c) is not int or c < 0 for c in counts):
        return None
    n_in, n_out, n_read, n_write = (int(c) for c in counts)
    return Tokens(
        input_tokens=n_in,
        output_tokens=n_out,
        cache_read_tokens=n_read,
        cache_write_tokens=n_write,
        calls=1,
        reported=1,
        models=((model, n_in, n_out, n_read, n_write),),
    )


def _usage_line(usage: Json) -> str | None:
    tokens = Tokens.from_json(usage)
    if tokens is None or (tokens.calls == 0 and tokens.unknown_calls == 0):
        return None
    cost = usage.get("cost", ...)
    priced = "" if cost is ... else f", cost {format_cost(cost if isinstance(cost, (int, float)) else None)}"
    return f"usage: {describe(tokens)}{priced}"


_SHOWN = frozenset(
    {
        "turn/start",
        "turn/end",
        "turn/continue",
        "system/message",
        "user/message",
        "assistant/message",
        "tool/call",
        "tool/result",
        "subagent/descriptor",
        "subagent/catalog",
        "subagent/settled",
        "compaction/summary",
        "compaction/end",
        "session/stopped",  # issue 27: the durable stopped marker
    }
)


def render(entries: Sequence[Json]) -> list[str]:
    lines: list[str] = []
    for e in entries:
        kind = e["type"]
        if kind == "live-elsewhere":
            lines.append("── live in another process (its last turn may still be running)")
        elif kind == "inherited":
            source = f" from {e['from']}" if e["from"] is not None else ""
            lines.append(f"--- inherited{source} (events {e['first_seq']}..{e['last_seq']}) ---")
        elif kind == "own":
            lines.append(f"--- own (from event {e['first_seq']}) ---")
        elif kind == "turn/start":
            trigger = f" ({e['trigger']})" if "trigger" in e else ""
            lines.append(f"── turn {e['turn']}{trigger}")
        elif kind == "turn/end":
            reason = e["reason"]
            more = "".join(f" {reason[k]}" for k in ("cause", "message") if k in reason)
            uncounted = " (no model call: not counted as started)" if e.get("counted") is False else ""
            lines.append(f"── end of turn {e['turn']}: {reason['kind']}{more}{uncounted}")
            line = _usage_line(e["usage"]) if "usage" in e else None
            if line is not None:
                lines.append(f"   {line}")
        elif kind == "turn/continue":
            lost = ": the model call in flight was lost and is issued again" if e["lost_model_call"] else ""
            lines.append(f"── turn {e['turn']} continued (attempt {e['attempt']}){lost}")
        elif kind == "usage":
            line = _usage_line(e["total"])
            if line is not None:
                lines.append(f"── total {line}")
        elif kind == "tree-usage":
            tree_line = _tree_line(e)
            if tree_line is not None:
                lines.append(tree_line)
        elif kind == "tool/call":
            lines.append(f"  → {e['name']}({e['arguments']})  [{e['call_id']}]")
        elif kind == "tool/result":
            doubt = "in doubt: " if e.get("in_doubt") else ""
            lines.append(f"  ← {doubt}{_indent(e['text'])}")
        elif kind in ("system/message", "user/message", "assistant/message"):
            who = {"system": "system", "user": "user", "assistant": "assistant"}[e["role"]]
            if e["source"] not in ("user", "model"):
                who += f" [{e['source']}]"
            if e.get("interrupted"):
                who += " [interrupted]"
            if "attempt" in e:
                who += f" [attempt {e['attempt']}]"
            if e["text"]:
                lines.append(f"{who}: {_indent(e['text'])}")
            if isinstance(e.get("usage"), dict) and "cost" in e["usage"]:  # priced: each call's cost
                call = _call_tokens(e["usage"], "")
                if call is not None:
                    cost = e["usage"]["cost"]
                    shown = format_cost(cost if isinstance(cost, (int, float)) else None)
                    lines.append(f"   call: {describe(call)}, cost {shown}")
        elif kind == "subagent/catalog":
            d = e["data"]
            label = f" — {d['label']}" if "label" in d else ""
            lines.append(f"  ⋯ started {d['mode']} subagent {d['child_id']}{label}")
        elif kind == "subagent/settled":
            d = e["data"]
            lines.append(f"  ⋯ subagent {d['child_id']} settled: {d['reason_kind']}")
        elif kind == "subagent/descriptor":
            d = e["data"]
            label = f" — {d['label']}" if isinstance(d, dict) and "label" in d else ""
            mode = d.get("mode", "?") if isinstance(d, dict) else "?"
            lines.append(
                f"  ⋯ {mode} subagent of provider {d.get('provider', '?') if isinstance(d, dict) else '?'}{label}"
            )
        elif kind == "compaction/summary":
            lines.append(f"  ⋯ compacted: {_indent(e['data']['text'])}")
        elif kind == "session/stopped":
            d = e["data"]
            tree = " with its tree" if d["tree"] else ""
            lines.append(f"── stopped by {d['by']}{tree}: nothing resumes it until a new message")
    return lines


def _tree_line(e: Json) -> str | None:
    """The subtree's line (none when the tree made no model call and skipped nothing, as for
    the session's own total)."""
    if "error" in e:
        return f"── with its subagents: usage unknown ({e['error']})"
    others = e["sessions"] - 1
    usage = _usage_line(e["total"])
    if usage is None and not e["skipped"]:
        return None
    line = (usage or "usage: none").removeprefix("usage: ")
    line = f"── with {others} subagent{'s' if others != 1 else ''}: {line}"  # as chat /usage says it
    if e["skipped"]:
        line += f"; skipped (unreadable): {', '.join(e['skipped'])}"
    return line


def _indent(text: str) -> str:
    return text.replace("\n", "\n    ")
