"""Checkpoint rows on PostgreSQL answer only for the batches they were written from (schema
version 4): the store only ever INSERTs batches, so an UPDATE or DELETE of one — a hand edit, a
repair — forgets that session's checkpoint rows in the same transaction, and nobody else's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from events import turn_batch as batch
from log_lines import header
from subagents.storage import CheckpointRow, PostgresLogStore

pytestmark = pytest.mark.pg


@pytest.fixture
def db(pg_url: str, pg_store_factory: Callable[..., Any]) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def checkpointed(store: PostgresLogStore, sid: str) -> None:
    handle = store.create(header(sid))
    store.append(handle, [batch(0, 2)])
    assert store.write_checkpoint(handle, {"unit": CheckpointRow(ver=1, seq=1, val={"label": "one"})})
    store.close(handle)


def stored(store: PostgresLogStore, sid: str) -> int:
    return len((store.read_checkpoint_rows([sid]) or {}).get(sid, []))


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE batches SET data = data WHERE session_id = 'edited'",  # bytes rewritten in place
        "DELETE FROM batches WHERE session_id = 'edited' AND first_seq = 0",
    ],
)
def test_an_edited_batch_forgets_its_sessions_checkpoint_rows_only(
    pg_store_factory: Callable[..., Any], db: psycopg.Connection[Any], edit: str
) -> None:
    store = pg_store_factory()
    checkpointed(store, "edited")
    checkpointed(store, "untouched")
    assert stored(store, "edited") == stored(store, "untouched") == 1
    db.execute(edit)
    assert stored(store, "edited") == 0  # the next listing or open reads the log again
    assert stored(store, "untouched") == 1


def test_appends_keep_the_rows_they_do_not_cover(pg_store_factory: Callable[..., Any]) -> None:
    store = pg_store_factory()
    checkpointed(store, "grown")
    handle = store.open_write("grown")
    store.append(handle, [batch(2, 3)])  # an INSERT: the rows stay (a read folds the tail)
    store.close(handle)
    assert stored(store, "grown") == 1
