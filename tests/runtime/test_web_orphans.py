"""The overview's orphaned children whose timing row is missing or behind their log (issue 31):
read once each, the most recently active first, at most `OBSERVED` an overview (the rest counted
as unchecked), their rows written back so the next overview reads none of them. Real files,
through httpx's ASGI transport on Trio, as tests/runtime/test_web_data.py."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from descriptors import descriptor
from events import assistant_event, turn_end_event, turn_start_event
from subagents.runtime.hosts.web import stalled as stalled_module
from subagents.storage import make_event
from subagents.storage.index import INDEX_NAME
from web_console import T0, append_log, asgi_client, forget_checkpoints, session_header, write_log


def _child(root: Path, i: int, *, open_turn: bool = True) -> None:
    """A root `p<i>` nobody runs and its child `p<i>-c`, last active at T0 + i, whose turn is
    open (its runner died mid-turn) or closed."""
    write_log(root, session_header(f"p{i}"), [turn_start_event(0, T0), turn_end_event(1, T0 + 1)])
    events = [make_event(0, "subagent/descriptor", T0, descriptor(f"child {i}")), turn_start_event(1, T0 + 1 + i)]
    if not open_turn:
        events += [assistant_event(2, T0 + 2 + i, text="done"), turn_end_event(3, T0 + 3 + i)]
    write_log(root, session_header(f"p{i}-c", f"p{i}"), events)


def _timing_rows(root: Path) -> set[str]:
    with sqlite3.connect(root / INDEX_NAME) as db:
        return {sid for (sid,) in db.execute("SELECT session_id FROM checkpoints WHERE unit_key = 'subagent_timing'")}


async def _stalled(root: Path) -> str:
    async with asgi_client(root) as client:
        body = (await client.get("/")).text
    return body.split("<h2>Stalled</h2>")[1].split("<h2>")[0]


def _listed(stalled: str) -> list[str]:
    return [part.split('"')[0] for part in stalled.split('<a href="/session/')[1:]]


async def test_an_orphan_without_a_timing_row_is_read_and_listed(tmp_path: Path) -> None:
    _child(tmp_path, 1)
    _child(tmp_path, 2, open_turn=False)
    await _stalled(tmp_path)  # the index, with the rows its scan wrote
    forget_checkpoints(tmp_path, "subagent_timing")
    stalled = await _stalled(tmp_path)
    assert _listed(stalled) == ["p1-c"] and "orphaned" in stalled
    assert {"p1-c", "p2-c"} <= _timing_rows(tmp_path)  # written back: the next overview reads neither
    assert _listed(await _stalled(tmp_path)) == ["p1-c"]


async def test_an_orphan_whose_row_is_behind_its_log_is_read_and_listed(tmp_path: Path) -> None:
    """A child whose last turn closed (its row says so), then a turn opened by a runner that died
    before any row was written: its row is behind its log, and the overview reads it."""
    _child(tmp_path, 1, open_turn=False)
    async with asgi_client(tmp_path) as client:  # one console: what its first overview learned is
        before = (await client.get("/")).text  # forgotten for a log that grew since
        append_log(tmp_path, "p1-c", [turn_start_event(4, T0 + 10, turn=2)])
        after = (await client.get("/")).text
    assert _listed(before.split("<h2>Stalled</h2>")[1].split("<h2>")[0]) == []
    stalled = after.split("<h2>Stalled</h2>")[1].split("<h2>")[0]
    assert _listed(stalled) == ["p1-c"] and "orphaned" in stalled


async def test_at_most_observed_orphans_are_read_an_overview(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three orphans without rows and one read allowed: the most recently active is listed, two
    are counted as unchecked; each overview reads one more."""
    for i in (1, 2, 3):
        _child(tmp_path, i)
    await _stalled(tmp_path)
    forget_checkpoints(tmp_path, "subagent_timing")
    monkeypatch.setattr(stalled_module, "OBSERVED", 1)
    async with asgi_client(tmp_path) as client:
        first = (await client.get("/")).text
        second = (await client.get("/")).text
    assert _listed(first.split("<h2>Stalled</h2>")[1].split("<h2>")[0]) == ["p3-c"]
    assert "2 children nobody runs not checked" in first
    assert _listed(second.split("<h2>Stalled</h2>")[1].split("<h2>")[0]) == ["p2-c", "p3-c"]
    assert "1 children nobody runs not checked" in second
