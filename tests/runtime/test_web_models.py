"""The model and agent type the web console shows for a session before its first model call
(issue 31): from its `usage` checkpoint row's recorded model, else its log's head (`session/model`,
else its descriptor's model route), at most `HEAD_READS` heads a page; a root's agent type from
its header. Through httpx's ASGI transport on Trio, as tests/runtime/test_web_data.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from subagents.runtime.delegation.descriptor import SubagentDescriptor, snapshot_descriptor
from subagents.runtime.hosts.web import recorded_model
from subagents.runtime.read_side import open_read_side
from subagents.storage import Event, make_event
from web_console import T0, asgi_client, forget_checkpoints, session_header, table_row, write_log


def _descriptor(label: str, provider: str | None = None, model: str | None = None) -> Event:
    data = snapshot_descriptor(
        SubagentDescriptor(
            mode="continuable", provider="spawn", label=label, agent_provider=provider, agent_model=model
        )
    )
    return make_event(0, "subagent/descriptor", T0, data)


def _waiting(first: int) -> list[Event]:
    """A turn begun, its first model call not answered yet."""
    return [make_event(first, "turn/start", T0 + first, {"turn": 1})]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`lead` (a root an embedder made with agent type `planner`), waiting on its first call on
    openai:gpt-x; its children `kid` (waiting on anthropic:claude-y, from `session/model`), `typed`
    (its agent type names google:gemini-z; no `session/model` yet) and `scripted` (neither)."""
    monkeypatch.setenv("SUBAGENTS_CONFIG_DIR", str(tmp_path / "no-user-config"))
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "store"
    model = make_event(0, "session/model", T0, {"model": "openai:gpt-x"})
    write_log(root, session_header("lead", preset="planner"), [model, *_waiting(1)])
    kid_model = make_event(1, "session/model", T0 + 1, {"model": "anthropic:claude-y"})
    write_log(root, session_header("kid", "lead", "researcher"), [_descriptor("the kid"), kid_model, *_waiting(2)])
    write_log(
        root, session_header("typed", "lead", "coder"), [_descriptor("typed", "google", "gemini-z"), *_waiting(1)]
    )
    write_log(root, session_header("scripted", "lead"), [_descriptor("scripted"), *_waiting(1)])
    return root


def _row(body: str, sid: str) -> str:
    return table_row(body, f">{sid}</a>")


async def test_a_root_before_its_first_call_shows_its_model_and_agent_type(store: Path) -> None:
    async with asgi_client(store) as client:
        roots = (await client.get("/tree")).text
        page = (await client.get("/session/lead")).text
    assert "<td>planner</td><td>openai:gpt-x</td>" in _row(roots, "lead")
    assert "<dt>Type</dt><dd>planner</dd>" in page


@pytest.mark.parametrize("rows", ["kept", "dropped"])
async def test_children_before_their_first_call_show_the_model_they_recorded(store: Path, rows: str) -> None:
    """From the usage rows the index wrote as it listed, or (rows dropped) from each log's head:
    `session/model`, else the descriptor's route; a child that recorded neither shows none."""
    if rows == "dropped":
        async with asgi_client(store) as client:
            await client.get("/tree")  # the index, then without its rows
        forget_checkpoints(store)  # every row: only the logs' heads can say
    async with asgi_client(store) as client:
        body = (await client.get("/tree/lead")).text
    assert "<td>the kid</td><td>researcher</td><td>anthropic:claude-y</td>" in _row(body, "kid")
    assert "<td>typed</td><td>coder</td><td>google:gemini-z</td>" in _row(body, "typed")
    assert "<td>scripted</td><td>-</td><td>-</td>" in _row(body, "scripted")


async def test_at_most_head_reads_heads_are_read_a_page(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No row answers (the index forgot them) and one head may be read (HEAD_READS set to 1):
    one of the two children whose heads name a model is named, the other not."""
    async with asgi_client(store) as client:
        await client.get("/tree")
    forget_checkpoints(store)  # every row: only the logs' heads can say
    monkeypatch.setattr(recorded_model, "HEAD_READS", 1)
    async with open_read_side(str(store)) as side:
        records = [r for r in await side.query.list_sessions() if r.id in ("kid", "typed")]
        named = await recorded_model.models_recorded(side, records, {})
    assert len(records) == 2
    assert named in ({"kid": "anthropic:claude-y"}, {"typed": "google:gemini-z"})
