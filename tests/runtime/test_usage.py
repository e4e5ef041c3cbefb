"""Token usage per turn, session and tree (issue 15 item 4; SPEC §8, runtime/usage.py).

Hand-written logs check the arithmetic (the own suffix only, reports missing or malformed), the
`usage` unit against the pure fold, and the cold path from checkpoint rows; scripted runs (the
script gives each response's usage) check the whole way: per turn and per session, a tree with a
spawned and a forked child (the fork's inherited prefix is not counted twice), a damaged child
skipped, `show` and `sessions --json`. Real IO: the real clock, `trio.fail_after` only as a hang
guard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from events import assistant_event, seed_marker, turn_end_event, turn_start_event
from log_lines import header, persist_log
from subagents.runtime import (
    SessionUsage,
    Tokens,
    TreeUsage,
    open_runtime,
    session_usage,
    tree_usage,
    usage_lines,
    usage_of,
)
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.hosts.cli import main
from subagents.runtime.query import SessionQuery
from subagents.runtime.testing.script_format import load_script
from subagents.runtime.testing.scripted_model import ScriptedModel
from subagents.runtime.usage import USAGE_UNIT
from subagents.runtime.usage_totals import own_totals, tree_totals
from subagents.storage import Event, FileLogStore, ProjectionRegistry, make_event
from subagents.storage._codec import decode_event  # a reader's decode: payloads unchecked

GUARD = 30.0  # seconds: a hang fails the test instead of blocking the suite


def tokens(i: int, o: int, calls: int, reported: int | None = None) -> Tokens:
    return Tokens(input_tokens=i, output_tokens=o, calls=calls, reported=calls if reported is None else reported)


# --- the pure fold and the unit -----------------------------------------------------------------


def _read_back(seq: int, data: object) -> Event:
    """An assistant message as a reader decodes it from a line (payloads are not checked there,
    so a hand-written log can hold any object)."""
    line = {"seq": seq, "type": "assistant/message", "time": 1, "surface_op": "append", "data": data}
    return decode_event(json.dumps(line).encode())


def _garbled(seq: int) -> Event:
    """An assistant message whose payload is an object of the wrong shape."""
    return _read_back(seq, {"turn": "one"})


def _mixed_log(k: int = 0) -> list[Event]:
    """Turn 1: two replies with usage and one without; turn 2: one with usage, one garbled."""
    return [
        turn_start_event(k, 1, 1),
        assistant_event(k + 1, 2, 1, usage=(100, 10)),
        assistant_event(k + 2, 3, 1, usage=(200, 20), step=2),
        assistant_event(k + 3, 4, 1, usage=None, step=3),
        turn_end_event(k + 4, 5, 1),
        turn_start_event(k + 5, 6, 2),
        assistant_event(k + 6, 7, 2, usage=(7, 3)),
        _garbled(k + 7),
        turn_end_event(k + 8, 9, 2),
    ]


def test_usage_per_turn_and_session() -> None:
    turns, total = usage_of(_mixed_log())
    assert turns == {1: tokens(300, 30, 3, reported=2), 2: tokens(7, 3, 1)}
    assert total == tokens(307, 33, 4, reported=3)


def test_usage_counts_only_the_own_suffix() -> None:
    # A fork's prefix (seq < K) is its parent's: its replies are counted there, not here.
    prefix = [turn_start_event(0, 1, 1), assistant_event(1, 2, 1, usage=(5000, 500)), turn_end_event(2, 3, 1)]
    events = [*prefix, seed_marker(3, 4), *_mixed_log(4)]
    turns, total = usage_of(events, inherited_event_count=4)
    assert total == tokens(307, 33, 4, reported=3)
    assert usage_of(events)[1] == tokens(5307, 533, 5, reported=4)  # what a fold without the cut would say


def test_a_negative_usage_record_is_a_reply_without_usage() -> None:
    bad = _read_back(0, {"turn": 1, "usage": {"input_tokens": -5, "output_tokens": 2}})
    assert usage_of([bad]) == ({1: tokens(0, 0, 1, reported=0)}, tokens(0, 0, 1, reported=0))


@pytest.mark.parametrize("k", [0, 4])
def test_the_unit_agrees_with_the_fold(k: int) -> None:
    prefix = [turn_start_event(0, 1, 1), assistant_event(1, 2, 1, usage=(5000, 500)), turn_end_event(2, 3, 1)]
    events = [*prefix, seed_marker(3, 4), *_mixed_log(4)]
    registry = ProjectionRegistry([USAGE_UNIT])
    cells = registry.cells(header("s"), k)
    cells.fold(events[:5])
    cells.fold(events[5:])  # in two runs, as an actor folds its batches
    assert Tokens.from_json(cells.snapshot()["usage"]) == usage_of(events, k)[1]
    one_by_one = USAGE_UNIT.initial(header("s"), k)
    for event in events:
        one_by_one = USAGE_UNIT.apply(one_by_one, event)
    assert one_by_one == USAGE_UNIT.fold(USAGE_UNIT.initial(header("s"), k), events)
    assert USAGE_UNIT.fold(one_by_one, [turn_end_event(20, 1)]) is one_by_one  # nothing to count: the same state
    # A checkpoint row seeds the next cells: they go on from where it stopped.
    rows = cells.checkpoint()
    more = [assistant_event(len(events), 10, 3, usage=(1, 1))]
    again = registry.cells(header("s"), k, rows)
    again.fold(more)
    assert Tokens.from_json(again.snapshot()["usage"]) == usage_of([*events, *more], k)[1]


def test_a_lost_model_call_counts_as_unknown_in_the_fold_and_the_unit() -> None:
    """Issue 27: a `turn/continue` that lost a model call counts one `unknown_calls` of its turn
    (never zero tokens); one that lost none counts nothing."""
    events = [
        turn_start_event(0, 1, 1),
        make_event(1, "turn/continue", 2, {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": True}),
        make_event(2, "turn/continue", 3, {"turn": 1, "step": 1, "attempt": 3, "lost_model_call": False}),
        assistant_event(3, 4, 1, usage=(10, 2)),
        turn_end_event(4, 5, 1),
    ]
    turns, total = usage_of(events)
    assert turns == {1: Tokens(input_tokens=10, output_tokens=2, calls=1, reported=1, unknown_calls=1)}
    assert total.to_json() == {"input_tokens": 10, "output_tokens": 2, "calls": 1, "reported": 1, "unknown_calls": 1}
    assert Tokens.from_json(total.to_json()) == total
    state = USAGE_UNIT.fold(USAGE_UNIT.initial(header("s"), 0), events)
    assert Tokens.from_json(USAGE_UNIT.view(state)) == total
    one_by_one = USAGE_UNIT.initial(header("s"), 0)
    for event in events:
        one_by_one = USAGE_UNIT.apply(one_by_one, event)
    assert one_by_one == state
    assert (tokens(1, 1, 1) + total).unknown_calls == 1


def test_the_unit_never_raises_on_a_tampered_state() -> None:
    for state in (None, [], {"own_from": "x"}, {"own_from": 0, "input_tokens": "many"}):
        after = USAGE_UNIT.apply(state, assistant_event(3, 1, usage=(1, 2)))  # type: ignore[arg-type]  # a tampered state, on purpose
        assert after is state or Tokens.from_json(after) == tokens(1, 2, 1)
        assert Tokens.from_json(USAGE_UNIT.view(state)) == Tokens()  # type: ignore[arg-type]  # a tampered state, on purpose


def test_tree_totals_sum_the_corpus_lineage() -> None:
    from subagents.runtime.query import SessionRecord

    def record(sid: str, parent: str | None) -> SessionRecord:
        h = header(sid, parent_session=parent, origin="subagent" if parent else None)
        return SessionRecord(
            id=sid,
            header=h,
            live=False,
            persisted=True,
            damage=None,
            inherited_event_count=0,
            revision=None,
            event_count=1,
        )

    records = [record("p", None), record("a", "p"), record("b", "p"), record("g", "a")]
    own = {"p": tokens(1, 1, 1), "a": tokens(10, 10, 1), "b": None, "g": tokens(100, 100, 1)}
    trees = tree_totals(records, own)
    assert (trees["p"].total, trees["p"].sessions, trees["p"].skipped) == (tokens(111, 111, 3), 3, ("b",))
    assert trees["a"].total == tokens(110, 110, 2)
    assert "b" not in trees  # no own totals: no tree either


# --- hand-written logs on disk ------------------------------------------------------------------


async def test_cold_totals_come_from_checkpoint_rows_without_reading_logs(tmp_path: Path, monkeypatch: Any) -> None:
    store = FileLogStore(str(tmp_path))
    persist_log(store, header("s1"), _mixed_log()[:7] + [turn_end_event(7, 9, 2)])  # (readers refuse a garbled payload)
    store.close_store()
    # A runtime folds it once (no checkpoint row yet: one observation) and, closing, leaves
    # its row behind ...
    async with open_runtime(tmp_path) as rt:
        records = await rt.query.list_sessions()
        assert await own_totals(rt.query, records) == {"s1": tokens(307, 33, 4, reported=3)}
        ref = await rt.sessions.open("s1")  # live: answered from its cell
        assert (await own_totals(rt.query, await rt.query.list_sessions()))["s1"] == tokens(307, 33, 4, reported=3)
        assert await ref.checkpoint()  # ... and its row written
        await rt.sessions.release("s1")

    async def no_reads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a log was read")

    monkeypatch.setattr(SessionQuery, "observe_session", no_reads)
    async with open_runtime(tmp_path) as rt:
        records = await rt.query.list_sessions()
        assert await own_totals(rt.query, records) == {"s1": tokens(307, 33, 4, reported=3)}


# --- scripted runs ------------------------------------------------------------------------------


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _script() -> dict[str, Any]:
    """Turn 1 answers; turn 2 spawns a helper and forks, both in the foreground, then answers.
    The fork inherits turn 1 (its reply's usage included)."""
    return {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    {"text": "T1", "usage": {"input_tokens": 10, "output_tokens": 1}},
                    {
                        "tool_calls": [_call("subagent", description="helper", prompt="help", run_in_background=False)],
                        "usage": {"input_tokens": 20, "output_tokens": 2},
                    },
                    {
                        "tool_calls": [
                            _call("subagent_fork", description="forked", prompt="think", run_in_background=False)
                        ],
                        "usage": {"input_tokens": 30, "output_tokens": 3},
                    },
                    {"text": "DONE", "usage": {"input_tokens": 40, "output_tokens": 4}},
                ],
            },
            {"label": "helper", "responses": [{"text": "HELPED", "usage": {"input_tokens": 100, "output_tokens": 10}}]},
            {
                "label": "forked",
                "responses": [{"text": "FORKED", "usage": {"input_tokens": 1000, "output_tokens": 100}}],
            },
        ]
    }


async def _scripted_tree(root: Path) -> None:
    model = ScriptedModel(load_script(json.dumps(_script())))
    with trio.fail_after(GUARD):
        async with open_runtime(root, model=model, id_factory=CountingIds("child")) as rt:
            parent = await rt.agents.create(session_id="parent")
            await parent.send("one")
            await rt.subagents.wait_tree_idle(parent)
            await parent.send("two")
            await rt.subagents.wait_tree_idle(parent)
            # Live: the session's own usage per turn, and the tree from live cells.
            live = await session_usage(rt.query, "parent")
            assert live.turns == ((1, tokens(10, 1, 1)), (2, tokens(90, 9, 3)))
            assert (await tree_usage(rt.query, rt.listing, "parent")).total == tokens(1200, 120, 6)


PARENT = tokens(100, 10, 4)
HELPER = tokens(100, 10, 1)
FORK = tokens(1000, 100, 1)  # its inherited turn-1 reply (10 in, 1 out) is the parent's


async def test_scripted_usage_per_turn_session_and_tree(tmp_path: Path) -> None:
    await _scripted_tree(tmp_path)
    async with open_runtime(tmp_path) as rt:
        parent = await session_usage(rt.query, "parent")
        assert parent == SessionUsage(
            session_id="parent", turns=((1, tokens(10, 1, 1)), (2, tokens(90, 9, 3))), total=PARENT
        )
        helper = await session_usage(rt.query, "child-1")
        fork = await session_usage(rt.query, "child-2")
        seen = await rt.query.list_sessions()
        assert {r.id: r.inherited_event_count > 0 for r in seen} == {"parent": False, "child-1": False, "child-2": True}
        assert (helper.total, fork.total) == (HELPER, FORK)
        tree = await tree_usage(rt.query, rt.listing, "parent")
        assert tree == TreeUsage(session_id="parent", own=PARENT, total=PARENT + HELPER + FORK, sessions=3)
        assert tree.to_json()["total"] == {"input_tokens": 1200, "output_tokens": 120, "calls": 6, "reported": 6}


async def test_a_damaged_child_is_skipped_and_named(tmp_path: Path) -> None:
    await _scripted_tree(tmp_path)
    [log] = (tmp_path / "sessions" / "child-1").glob("session.jsonl*")
    log.write_bytes(log.read_bytes()[:-3] + b"xyz")  # a checksum failure inside a complete frame
    async with open_runtime(tmp_path) as rt:
        tree = await tree_usage(rt.query, rt.listing, "parent")
    assert tree == TreeUsage(session_id="parent", own=PARENT, total=PARENT + FORK, sessions=2, skipped=("child-1",))


def test_show_names_a_damaged_descendant_its_subtree_total_skipped(tmp_path: Path, capsys: Any) -> None:
    trio.run(_scripted_tree, tmp_path)
    [log] = (tmp_path / "sessions" / "child-1").glob("session.jsonl*")
    log.write_bytes(log.read_bytes()[:-3] + b"xyz")  # a checksum failure inside a complete frame
    assert main(["show", "parent", "--root", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == ("── with 1 subagent: 1100 in, 110 out tokens (5 model calls); skipped (unreadable): child-1")


def test_show_prints_usage_per_turn_and_in_total(tmp_path: Path, capsys: Any) -> None:
    trio.run(_scripted_tree, tmp_path)
    assert main(["show", "parent", "--root", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    end_1 = lines.index("── end of turn 1: completed")
    assert lines[end_1 + 1] == "   usage: 10 in, 1 out tokens (1 model call)"
    end_2 = lines.index("── end of turn 2: completed")
    assert lines[end_2 + 1] == "   usage: 90 in, 9 out tokens (3 model calls)"
    assert lines[-2] == "── total usage: 100 in, 10 out tokens (4 model calls)"
    # Then the subtree's: the session and its two subagents (a helper and a fork).
    assert lines[-1] == "── with 2 subagents: 1200 in, 120 out tokens (6 model calls)"

    assert main(["show", "child-2", "--root", str(tmp_path)]) == 0
    fork_lines = capsys.readouterr().out.splitlines()
    # The inherited turn shows its reply but no usage line: it is counted in the parent.
    assert "   usage: 10 in, 1 out tokens (1 model call)" not in fork_lines
    assert fork_lines[-1] == "── total usage: 1000 in, 100 out tokens (1 model call)"

    assert main(["show", "parent", "--json", "--root", str(tmp_path)]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert entries[-1] == {
        "type": "tree-usage",
        "sessions": 3,
        "skipped": [],
        "total": {"input_tokens": 1200, "output_tokens": 120, "calls": 6, "reported": 6},
    }
    assert entries[-2] == {
        "type": "usage",
        "turns": [
            {"turn": 1, "input_tokens": 10, "output_tokens": 1, "calls": 1, "reported": 1},
            {"turn": 2, "input_tokens": 90, "output_tokens": 9, "calls": 3, "reported": 3},
        ],
        "total": {"input_tokens": 100, "output_tokens": 10, "calls": 4, "reported": 4},
    }
    ends = [e for e in entries if e["type"] == "turn/end"]
    assert [e["usage"]["input_tokens"] for e in ends] == [10, 90]
    replies = [e for e in entries if e["type"] == "assistant/message"]
    assert replies[0]["usage"] == {"input_tokens": 10, "output_tokens": 1}


def test_show_says_when_the_model_reported_no_usage(tmp_path: Path, capsys: Any) -> None:
    store = FileLogStore(str(tmp_path))
    persist_log(store, header("quiet"), [turn_start_event(0, 1), assistant_event(1, 2), turn_end_event(2, 3)])
    store.close_store()
    assert main(["show", "quiet", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "   usage: not reported (1 model call)",
        "── total usage: not reported (1 model call)",
    ]


def test_sessions_json_has_own_and_tree_usage(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    trio.run(_scripted_tree, tmp_path)

    def no_reads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a log was read")

    # Each session's last event is a turn/end, where its actor wrote its checkpoint row: the
    # listing answers from the rows alone.
    monkeypatch.setattr(SessionQuery, "observe_session", no_reads)
    assert main(["sessions", "--json", "--root", str(tmp_path)]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["parent"]["usage"] == PARENT.to_json()
    assert rows["child-2"]["usage"] == FORK.to_json()
    assert rows["parent"]["tree_usage"] == {**(PARENT + HELPER + FORK).to_json(), "sessions": 3, "skipped": []}
    assert rows["child-1"]["tree_usage"] == {**HELPER.to_json(), "sessions": 1, "skipped": []}
    # A damaged child: no usage of its own, skipped (and named) in its parent's tree.
    [log] = (tmp_path / "sessions" / "child-1").glob("session.jsonl*")
    log.write_bytes(log.read_bytes()[:-3] + b"xyz")
    assert main(["sessions", "--json", "--root", str(tmp_path)]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["child-1"]["usage"] is None and rows["child-1"]["tree_usage"] is None
    assert rows["parent"]["tree_usage"] == {**(PARENT + FORK).to_json(), "sessions": 2, "skipped": ["child-1"]}


def test_usage_lines_for_a_host() -> None:
    session = SessionUsage(
        session_id="p",
        turns=((1, tokens(10, 1, 1)), (2, tokens(0, 0, 2, reported=0))),
        total=tokens(10, 1, 3, reported=1),
    )
    tree = TreeUsage(
        session_id="p", own=session.total, total=tokens(110, 11, 4, reported=2), sessions=2, skipped=("bad",)
    )
    assert usage_lines(session, tree) == [
        "turn 1: 10 in, 1 out tokens (1 model call)",
        "turn 2: not reported (2 model calls)",
        "session p: 10 in, 1 out tokens (3 model calls, 1 reporting)",
        "with 1 subagent: 110 in, 11 out tokens (4 model calls, 2 reporting); skipped (unreadable): bad",
    ]


def test_cache_counts_are_summed_shown_and_kept_by_the_unit() -> None:
    # Issue 30: a call's usage may count prompt-cache reads and writes apart from its input.
    cached = _read_back(
        1,
        {
            "turn": 1,
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 900, "cache_write_tokens": 40},
        },
    )
    plain = _read_back(2, {"turn": 1, "usage": {"input_tokens": 3, "output_tokens": 2}})
    negative = _read_back(3, {"turn": 2, "usage": {"input_tokens": 1, "output_tokens": 1, "cache_read_tokens": -7}})
    turns, total = usage_of([cached, plain, negative])
    assert total == Tokens(
        input_tokens=14, output_tokens=8, calls=3, reported=3, cache_read_tokens=900, cache_write_tokens=40
    )
    assert turns[2] == tokens(1, 1, 1)  # a negative cache count is not counted
    assert total.to_json() == {
        "input_tokens": 14,
        "output_tokens": 8,
        "calls": 3,
        "reported": 3,
        "cache_read_tokens": 900,
        "cache_write_tokens": 40,
    }
    assert Tokens.from_json(total.to_json()) == total
    assert Tokens.from_json({**total.to_json(), "cache_read_tokens": "900"}) is None  # a tampered row: a miss
    assert "cache_read_tokens" not in tokens(1, 1, 1).to_json()  # the old shape stays as it was
    assert usage_lines(SessionUsage(session_id="s", turns=(), total=total)) == [
        "session s: 14 in, 8 out tokens, cache 900 read, 40 written (3 model calls)"
    ]
    state = USAGE_UNIT.fold(USAGE_UNIT.initial(header("s"), 0), [cached, plain, negative])
    assert Tokens.from_json(USAGE_UNIT.view(state)) == total
