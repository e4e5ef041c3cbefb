"""A delivery is recorded once: `user/message` data may carry the `delivery_id` of the envelope it
records (SPEC §9; docs/format.md, "The vocabulary"), an upper-case ULID; no other type takes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clocks import T
from log_lines import header, header_line, json_line, persist_log
from subagents.storage import (
    DeliveryIds,
    FileLogStore,
    InvalidEvent,
    InvalidPayload,
    SessionId,
    decode_payload,
    encode_session_id,
    make_event,
)

MESSAGE = {"id": "m1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}


def data(**extra: Any) -> dict[str, Any]:
    return {"turn": 1, "step": 1, "message": MESSAGE, **extra}


def test_a_user_message_records_its_delivery_id_and_reads_it_back(tmp_path: Path) -> None:
    delivery_id = DeliveryIds().next(T)
    store = FileLogStore(str(tmp_path), compression="none")
    event = make_event(0, "user/message", T, data(delivery_id=delivery_id), surface_op="append")
    persist_log(store, header("s1"), [event])
    handle = store.open_read("s1")
    (back,) = store.read(handle)
    assert decode_payload(back, session_id="s1").delivery_id == delivery_id
    plain = make_event(0, "user/message", T, data(), surface_op="append")  # still optional
    assert b"delivery_id" not in bytes(plain.data)


@pytest.mark.parametrize(
    ("type_", "payload"),
    [
        ("user/message", data(delivery_id="not-a-ulid")),
        ("user/message", data(delivery_id="01arz3ndektsv4rrffq69g5fav")),
        ("user/message", data(delivery_id=5)),
        ("system/message", data(delivery_id="01ARZ3NDEKTSV4RRFFQ69G5FAV")),
    ],
    ids=["not a ULID", "lower case", "an int", "on system/message"],
)
def test_a_bad_delivery_id_is_refused_on_write_and_corrupt_on_read(
    tmp_path: Path, type_: str, payload: dict[str, Any]
) -> None:
    with pytest.raises(InvalidEvent):
        make_event(0, type_, T, payload, surface_op="append")
    folder = tmp_path / "sessions" / encode_session_id(SessionId("s1"))
    folder.mkdir(parents=True)
    (folder / "session.jsonl").write_bytes(header_line("s1") + json_line(0, type_, payload, surface_op="append"))
    store = FileLogStore(str(tmp_path), compression="none")
    with pytest.raises(InvalidPayload):
        store.read(store.open_read("s1"))


SETTLED = {"child_id": "kid", "reason_kind": "completed"}


def test_a_settlement_records_its_delivery_id_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    """`subagent/settled` that came through the parent's mailbox carries its `delivery_id` too."""
    delivery_id = DeliveryIds().next(T)
    store = FileLogStore(str(tmp_path), compression="none")
    persist_log(store, header("s1"), [make_event(0, "subagent/settled", T, {**SETTLED, "delivery_id": delivery_id})])
    (back,) = store.read(store.open_read("s1"))
    assert decode_payload(back, session_id="s1").delivery_id == delivery_id
    for bad in ("not-a-ulid", "01arz3ndektsv4rrffq69g5fav", 5):
        with pytest.raises(InvalidEvent):
            make_event(0, "subagent/settled", T, {**SETTLED, "delivery_id": bad})
