"""The mailbox contract (SPEC §9; docs/format.md, "The mailbox"), for the file form, the memory
form and the PostgreSQL form alike: delivery order, acks, redelivery after a restart, concurrent
senders, and wake-ups; for the file forms (`file_harness`) also bad files moved aside without
stopping a drain and temp files of interrupted deliveries (the PostgreSQL form's bad rows and
cut connections: test_pg_mailbox.py).

A "restart" is a new mailbox instance on the same disk (same root, or same `CrashFs`; the same
database).
Crashes at every file-system step are in test_mailbox_crash.py; real processes in
test_mailbox_processes.py.
"""

from __future__ import annotations

import json
import os
import random
import select
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from clocks import T
from mailboxes import MailboxHarness, envelope, rel_mailbox, trio_owner_wakes
from subagents.storage import (
    DeliveryConflict,
    DeliveryIds,
    Envelope,
    FileMailbox,
    InvalidDeliveryId,
    InvalidEnvelope,
    InvalidSessionId,
    UnsafePath,
)
from subagents.storage.envelope import check_delivery_id, delivery_id_ms, encode_envelope, new_delivery_id

SID = "child-1"


@pytest.fixture(params=["file", "memory", pytest.param("pg", marks=pytest.mark.pg)])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MailboxHarness]:
    url = request.getfixturevalue("pg_url") if request.param == "pg" else None
    made = MailboxHarness(request.param, tmp_path, url)
    yield made
    made.close()


@pytest.fixture(params=["file", "memory"])
def file_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MailboxHarness]:
    """The forms that keep deliveries in files (temp files, folders, `rejected/`)."""
    yield MailboxHarness(request.param, tmp_path)


def readable(fd: int) -> bool:
    """Whether `fd` is readable right now (no waiting: a zero timeout)."""
    return bool(select.select([fd], [], [], 0)[0])


# --- delivery ids ---------------------------------------------------------------------------------


def test_delivery_ids_increase_strictly_even_when_the_clock_stands_still_or_steps_back() -> None:
    ids = DeliveryIds(random.Random(1).randbytes)
    made = [ids.next(at) for at in (T, T, T, T - 5, T + 1, T + 1, T)]
    assert made == sorted(made) and len(set(made)) == len(made)
    assert [delivery_id_ms(i) for i in made][:4] == [T] * 4  # the standing clock keeps its ms
    for made_id in made:
        assert check_delivery_id(made_id) == made_id


def test_new_delivery_id_is_a_pure_function_of_its_inputs() -> None:
    first = new_delivery_id(T, random.Random(7).randbytes)
    assert first == new_delivery_id(T, random.Random(7).randbytes)
    assert delivery_id_ms(first) == T
    assert new_delivery_id(T, previous=first) > first  # same ms: previous + 1
    carry = new_delivery_id(5, previous="000000000" + "5" + "Z" * 16)  # the random part is all ones
    assert delivery_id_ms(carry) == 6 and carry.endswith("0" * 16)


@pytest.mark.parametrize(
    "bad", ["", "01ARZ3NDEKTSV4RRFFQ69G5FA", "01arz3ndektsv4rrffq69g5fav", "81ARZ3NDEKTSV4RRFFQ69G5FAV", 5]
)
def test_a_delivery_id_is_a_canonical_ulid(bad: object) -> None:
    with pytest.raises(InvalidDeliveryId):
        check_delivery_id(bad)


# --- envelopes ------------------------------------------------------------------------------------

GOOD_ID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


@pytest.mark.parametrize(
    "changes",
    [
        {"delivery_id": "x"},
        {"kind": "shout"},
        {"sender": 5},
        {"body": ["not", "an", "object"]},
        {"body": {"x": float("nan")}},
        {"body": {1: "non-str key"}},
        {"created_at": True},
        {"created_at": 1.5},
        {"created_at": -1},
    ],
    ids=repr,
)
def test_an_envelope_is_checked_when_built(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {"delivery_id": GOOD_ID, "kind": "message", "sender": None, "body": {}, "created_at": T}
    with pytest.raises(InvalidEnvelope):
        Envelope(**{**fields, **changes})  # type: ignore[arg-type]  # wrong values under test


def test_the_file_holds_exactly_the_documented_keys_in_order() -> None:
    env = Envelope(delivery_id=GOOD_ID, kind="stop", sender=None, body={"why": "operator"}, created_at=T)
    assert encode_envelope(env) == (
        b'{"delivery_id":"01ARZ3NDEKTSV4RRFFQ69G5FAV","kind":"stop","sender":null,'
        b'"body":{"why":"operator"},"created_at":1789000000000}\n'
    )


# --- deliver, drain, ack --------------------------------------------------------------------------


def test_drain_returns_every_delivery_in_delivery_order_until_it_is_acked(harness: MailboxHarness) -> None:
    sender = harness.new()
    sent = [envelope(sender.ids, n, at=T) for n in range(5)]  # one millisecond: ties
    for env in sent:
        sender.deliver(SID, env)
    owner = harness.new()
    assert owner.drain(SID) == sent
    assert owner.drain(SID) == sent  # draining takes nothing away: only an ack does
    owner.ack(SID, sent[1].delivery_id)
    owner.ack(SID, sent[3].delivery_id)
    assert owner.drain(SID) == [sent[0], sent[2], sent[4]]


def test_delivery_order_is_delivery_id_order_whatever_order_the_files_arrived_in(harness: MailboxHarness) -> None:
    ids = DeliveryIds()
    sent = [envelope(ids, n, at=T + n) for n in range(6)]
    mailbox = harness.new()
    for env in random.Random(3).sample(sent, len(sent)):
        mailbox.deliver(SID, env)
    assert mailbox.drain(SID) == sent


def test_everything_not_acked_is_delivered_again_after_a_restart(harness: MailboxHarness) -> None:
    first = harness.new()
    sent = [envelope(first.ids, n) for n in range(4)]
    for env in sent:
        first.deliver(SID, env)
    assert first.drain(SID) == sent
    first.ack(SID, sent[0].delivery_id)
    restarted = harness.new()
    assert restarted.drain(SID) == sent[1:]


def test_ack_is_idempotent_and_ignores_what_was_never_delivered(harness: MailboxHarness) -> None:
    mailbox = harness.new()
    env = envelope(mailbox.ids)
    mailbox.ack("never-delivered-to", GOOD_ID)  # no folder at all
    mailbox.deliver(SID, env)
    mailbox.ack(SID, env.delivery_id)
    mailbox.ack(SID, env.delivery_id)
    mailbox.ack(SID, GOOD_ID)
    assert mailbox.drain(SID) == []
    assert harness.names(SID) == []


def test_mailboxes_of_different_sessions_are_separate(harness: MailboxHarness) -> None:
    mailbox = harness.new()
    a, b = envelope(mailbox.ids, 1), envelope(mailbox.ids, 2)
    mailbox.deliver("a/b", a)  # an id that needs encoding
    mailbox.deliver("ab", b)
    assert mailbox.drain("a/b") == [a]
    assert mailbox.drain("ab") == [b]


def test_delivering_the_same_envelope_again_is_idempotent_and_another_under_its_id_conflicts(
    harness: MailboxHarness,
) -> None:
    mailbox = harness.new()
    env = envelope(mailbox.ids)
    mailbox.deliver(SID, env)
    harness.new().deliver(SID, env)  # a sender retrying after a failure it could not judge
    assert mailbox.drain(SID) == [env]
    other = Envelope(delivery_id=env.delivery_id, kind="message", sender="parent", body={"n": 99}, created_at=T)
    with pytest.raises(DeliveryConflict) as caught:
        mailbox.deliver(SID, other)
    assert caught.value.code == "STORAGE_DELIVERY_CONFLICT" and env.delivery_id in caught.value.message
    assert mailbox.drain(SID) == [env]
    assert [n for n in harness.names(SID) if n.endswith(".tmp")] == []  # the conflict left no temp file


def test_bad_arguments_are_typed_errors_before_the_disk_is_touched(harness: MailboxHarness) -> None:
    mailbox = harness.new()
    env = envelope(mailbox.ids)
    with pytest.raises(InvalidSessionId):
        mailbox.deliver("", env)
    with pytest.raises(InvalidSessionId):
        mailbox.drain("a\x00b")
    with pytest.raises(InvalidEnvelope):
        mailbox.deliver(SID, {"delivery_id": env.delivery_id})  # type: ignore[arg-type]  # not an Envelope: under test
    with pytest.raises(InvalidDeliveryId):
        mailbox.ack(SID, "not-an-id")
    assert harness.names(SID) == []


def test_a_delivery_may_come_before_the_session_exists_and_the_session_is_created_after(
    harness: MailboxHarness,
) -> None:
    from log_lines import header
    from subagents.storage import Batch, Offset, make_event

    mailbox = harness.new()
    env = envelope(mailbox.ids)
    mailbox.deliver("later", env)  # no sessions/ folder at all yet
    store = harness.log_store()
    assert [info.id for info in store.list()] == []  # a folder without a log is no session
    assert store.stat("later") is None
    handle = store.create(header("later"))
    store.append(handle, [Batch(expected_seq=Offset(0), events=[make_event(0, "turn/start", T, {"turn": 1})])])
    store.close(handle)
    assert [(info.id, info.damage) for info in harness.log_store().list()] == [("later", None)]
    assert harness.new().drain("later") == [env]


# --- bad files ------------------------------------------------------------------------------------


def _good_bytes(delivery_id: str, **changes: object) -> bytes:
    record = {"delivery_id": delivery_id, "kind": "message", "sender": None, "body": {}, "created_at": T, **changes}
    return json.dumps(record).encode()


BAD_ID = "01ARZ3NDEKTSV4RRFFQ69G5FB0"
BAD_FILES = {
    "junk bytes": (f"{BAD_ID}.json", b"\x00\xff\xfejunk"),
    "empty": (f"{BAD_ID}.json", b""),
    "torn JSON": (f"{BAD_ID}.json", _good_bytes(BAD_ID)[:-9]),
    "unknown kind": (f"{BAD_ID}.json", _good_bytes(BAD_ID, kind="shout")),
    "a str for an int": (f"{BAD_ID}.json", _good_bytes(BAD_ID, created_at=str(T))),
    "a float for an int": (f"{BAD_ID}.json", _good_bytes(BAD_ID, created_at=T + 0.5)),
    "a list body": (f"{BAD_ID}.json", _good_bytes(BAD_ID, body=[1])),
    "an unknown key": (f"{BAD_ID}.json", _good_bytes(BAD_ID, extra=1)),
    "a missing key": (f"{BAD_ID}.json", b'{"delivery_id":"%s","kind":"stop"}' % BAD_ID.encode()),
    "another id inside": (f"{BAD_ID}.json", _good_bytes(GOOD_ID)),
    "not a ULID name": ("hello.txt", _good_bytes(BAD_ID)),
    "a lower-case ULID name": (f"{BAD_ID.lower()}.json", _good_bytes(BAD_ID.lower())),
    "a dotfile that is no temp": (".hidden", b"x"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_moved_aside_with_its_reason_and_never_stops_a_drain(
    file_harness: MailboxHarness, case: str
) -> None:
    name, data = BAD_FILES[case]
    mailbox = file_harness.new()
    before, after = envelope(mailbox.ids, 1, at=T - 1), envelope(mailbox.ids, 2, at=T + 1)
    mailbox.deliver(SID, before)
    file_harness.plant(SID, name, data)
    mailbox.deliver(SID, after)
    report = mailbox.drain_report(SID)
    assert report.envelopes == [before, after]
    assert [(r.name, r.moved_to) for r in report.rejected] == [(name, name)]
    assert report.rejected[0].reason
    assert file_harness.names(SID, "rejected") == sorted([name, f"{name}.reason"])
    assert file_harness.read(SID, f"rejected/{name}") == data  # the evidence is kept byte for byte
    assert file_harness.read(SID, f"rejected/{name}.reason") == report.rejected[0].reason.encode() + b"\n"
    again = file_harness.new().drain_report(SID)
    assert again.envelopes == [before, after] and again.rejected == []


def test_a_name_rejected_twice_is_kept_twice(file_harness: MailboxHarness) -> None:
    mailbox = file_harness.new()
    file_harness.plant(SID, "junk", b"1")
    mailbox.drain(SID)
    file_harness.plant(SID, "junk", b"2")
    assert [r.moved_to for r in mailbox.drain_report(SID).rejected] == ["junk~1"]
    assert file_harness.read(SID, "rejected/junk") == b"1" and file_harness.read(SID, "rejected/junk~1") == b"2"


def test_a_folder_under_an_envelope_name_is_reported_by_every_drain_and_stops_none(
    file_harness: MailboxHarness,
) -> None:
    mailbox = file_harness.new()
    env = envelope(mailbox.ids)
    mailbox.deliver(SID, env)
    file_harness.plant_dir(SID, f"{BAD_ID}.json")
    for _ in range(2):
        report = mailbox.drain_report(SID)
        assert report.envelopes == [env]
        assert [(r.name, r.reason) for r in report.rejected] == [(f"{BAD_ID}.json", "not a regular file")]
        assert report.rejected[0].moved_to is None  # a folder cannot be hard-linked aside


def test_a_symlink_under_an_envelope_name_is_moved_aside_unfollowed(tmp_path: Path) -> None:
    harness = MailboxHarness("file", tmp_path)
    mailbox = harness.new()
    secret = tmp_path / "secret.json"
    secret.write_bytes(_good_bytes(BAD_ID))
    harness.plant(SID, "x", b"")  # makes the folder
    os.symlink(secret, tmp_path / rel_mailbox(SID) / f"{BAD_ID}.json")
    report = mailbox.drain_report(SID)
    assert report.envelopes == []
    assert [(r.name, r.moved_to) for r in report.rejected] == [(f"{BAD_ID}.json", f"{BAD_ID}.json"), ("x", "x")]
    assert (tmp_path / rel_mailbox(SID) / "rejected" / f"{BAD_ID}.json").is_symlink()
    assert secret.read_bytes() == _good_bytes(BAD_ID)


# --- temp files -----------------------------------------------------------------------------------


def test_temp_files_of_interrupted_deliveries_are_ignored_and_removed_once_stale(file_harness: MailboxHarness) -> None:
    mailbox = file_harness.new()
    env = envelope(mailbox.ids)
    mailbox.deliver(SID, env)
    temp = f".{GOOD_ID}.{'0' * 16}.tmp"
    file_harness.plant(SID, temp, encode_envelope(env)[:10])  # a delivery that died before its link
    fresh = file_harness.new(now_ns=lambda: 0)  # nothing is old yet
    assert fresh.drain_report(SID) == ([env], [])
    assert temp in file_harness.names(SID)
    late = file_harness.new(now_ns=lambda: 2**62, stale_after=600.0)  # long after: the delivery is dead
    assert late.drain_report(SID) == ([env], [])
    assert file_harness.names(SID) == [f"{env.delivery_id}.json"]


# --- concurrency ----------------------------------------------------------------------------------


def test_concurrent_senders_in_threads_lose_and_duplicate_nothing(harness: MailboxHarness) -> None:
    shared = harness.new()
    sent: dict[int, list[Envelope]] = {}

    def sender(k: int) -> None:
        mailbox = shared if k % 2 else harness.new()  # threads sharing an instance, and not
        own = sent[k] = []
        for n in range(20):
            env = envelope(mailbox.ids, n, at=T, sender_thread=k)
            mailbox.deliver(SID, env)
            own.append(env)

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    drained = harness.new().drain(SID)
    assert sorted(e.delivery_id for e in drained) == sorted(e.delivery_id for es in sent.values() for e in es)
    assert len({e.delivery_id for e in drained}) == len(drained) == 80
    for k, own in sent.items():  # one sender's deliveries keep its order
        assert [e for e in drained if e.body["sender_thread"] == k] == own


# --- wake-ups -------------------------------------------------------------------------------------


def test_a_watch_wakes_on_a_delivery_from_another_mailbox_and_clear_forgets_it(harness: MailboxHarness) -> None:
    owner = harness.new()
    with owner.watch(SID) as watch:
        fd = watch.fileno()
        assert not readable(fd)
        harness.new().deliver(SID, envelope(owner.ids))  # another instance: another "process"
        assert harness.woken(fd)
        assert watch.clear()
        assert not readable(fd)
        assert not watch.clear()
        if harness.kind == "file":
            assert watch.inotify and watch.poll_interval is None  # the kernel vouches: no polling
        elif harness.kind == "pg":
            assert watch.listening and watch.poll_interval is None  # the server vouches: no polling
        else:
            assert not watch.inotify and watch.poll_interval is not None


def test_a_watch_made_before_the_first_delivery_sees_it(harness: MailboxHarness) -> None:
    owner = harness.new()
    watch = owner.watch("fresh")  # the mailbox folder does not exist yet
    try:
        harness.new().deliver("fresh", envelope(owner.ids))
        assert harness.woken(watch.fileno())
    finally:
        watch.close()
    with pytest.raises(ValueError):
        watch.fileno()


def test_a_watch_ignores_other_sessions_and_acks(harness: MailboxHarness) -> None:
    owner = harness.new()
    env = envelope(owner.ids)
    owner.deliver(SID, env)
    with owner.watch(SID) as watch, owner.watch("someone-else") as other:
        owner.deliver("someone-else", envelope(owner.ids))
        owner.ack(SID, env.delivery_id)
        # The other session's watch woke, so the wake-up was handed out; this one's did not.
        # (PostgreSQL: one channel carries every session, and the mailbox's one listener
        # signals only the watches of the session a notification names.)
        assert harness.woken(other.fileno())
        assert not readable(watch.fileno())
        assert not watch.clear()


def test_an_inotify_watch_whose_folder_is_removed_falls_back_to_polling(tmp_path: Path) -> None:
    harness = MailboxHarness("file", tmp_path)
    owner = harness.new()
    with owner.watch(SID) as watch:
        assert watch.poll_interval is None
        folder = tmp_path / rel_mailbox(SID)
        folder.rename(tmp_path / "moved")
        assert readable(watch.fileno())
        watch.clear()
        assert watch.poll_interval is not None and not watch.inotify


def test_file_mailbox_needs_a_root_or_an_fs() -> None:
    with pytest.raises(TypeError):
        FileMailbox()


def test_a_delivery_reaches_the_disk_whole(harness: MailboxHarness) -> None:
    mailbox = harness.new()
    env = envelope(mailbox.ids, 7)
    mailbox.deliver(SID, env)
    assert harness.names(SID) == [f"{env.delivery_id}.json"]
    assert harness.read(SID, f"{env.delivery_id}.json") == encode_envelope(env)
    assert os.fsdecode(rel_mailbox(SID)).endswith("/mailbox")


def test_a_mailbox_folder_removed_by_hand_is_made_again(file_harness: MailboxHarness) -> None:
    mailbox = file_harness.new()
    first = envelope(mailbox.ids, 1)
    mailbox.deliver(SID, first)
    mailbox.ack(SID, first.delivery_id)
    if file_harness.kind == "file":
        (file_harness.root / rel_mailbox(SID)).rmdir()
    else:
        file_harness.crash_fs.unlink(rel_mailbox(SID))  # CrashFs unlinks folders too
    second = envelope(mailbox.ids, 2)
    mailbox.deliver(SID, second)
    assert file_harness.new().drain(SID) == [second]


def test_a_planted_symlink_in_place_of_the_mailbox_folder_is_refused_unfollowed(tmp_path: Path) -> None:
    harness = MailboxHarness("file", tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / rel_mailbox(SID)).parent.mkdir(parents=True)
    os.symlink(elsewhere, tmp_path / rel_mailbox(SID))
    mailbox = harness.new()
    with pytest.raises(UnsafePath):
        mailbox.deliver(SID, envelope(mailbox.ids))
    with pytest.raises(UnsafePath):
        mailbox.drain(SID)
    with pytest.raises(UnsafePath):
        mailbox.ack(SID, GOOD_ID)
    assert list(elsewhere.iterdir()) == []


def test_the_documented_envelope_is_read_as_documented(harness: MailboxHarness) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()
    (line,) = [line for line in doc.splitlines() if line.startswith('{"delivery_id":')]
    env = Envelope(
        delivery_id="01M24BB8G0041061050R3GG28A", kind="message", sender="parent-1", body={"text": "hi"}, created_at=T
    )
    assert delivery_id_ms(env.delivery_id) == env.created_at
    assert encode_envelope(env) == line.encode() + b"\n"  # what a writer writes, byte for byte
    harness.plant(SID, f"{env.delivery_id}.json", line.encode())  # and a hand-written file is read
    assert harness.new().drain_report(SID) == ([env], [])


def test_trio_waits_on_the_watch_without_a_thread_and_wakes_on_a_delivery(harness: MailboxHarness) -> None:
    owner = harness.new()
    sender = harness.new()
    env = envelope(sender.ids)
    assert trio_owner_wakes(owner, SID, lambda watch: sender.deliver(SID, env)) == [[env]]
