"""No acknowledged delivery lost, none drained twice, none recorded twice: a power cut (CrashFs)
or an IO error at every file-system step of deliver, ack and a drain that moves a bad file aside.

Theory of operation. `StepFs` shows a `CrashFs` to the mailbox as a numbered sequence of calls
(every `Fs` and `File` method is one step). A dry run counts the steps of the operation under
test; then for each step k a fresh disk runs the same story with the operation cut at step k:
the call raises `PowerCut` instead of running (and so does every later call, as a dead process
makes none), then `CrashFs.crash()` drops whatever no fsync covered, and a new mailbox on the
same disk (a restart) is checked by `violations`: every delivery whose `deliver` returned and
that was not acked must be drained, exactly once, with its bytes; a drained envelope that nobody
delivered (or tried to) is a violation too. `violations` returns a list instead of asserting so
the same checker is shown to catch a mailbox whose fsyncs are dropped.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

import pytest
from clocks import T
from mailboxes import rel_mailbox
from subagents.storage import DeliveryIds, Envelope, PersistenceFailed
from subagents.storage.testing import CrashFs, MemoryMailbox

SID = "child-1"


class PowerCut(Exception):
    """The process died at this step (not an OSError: nothing in storage may catch it)."""


class StepFs:
    """`inner` with every call numbered; at step `cut_at` (and after) calls raise `fault()`."""

    def __init__(self, inner: CrashFs, cut_at: int | None = None, fault: Callable[[], Exception] = PowerCut) -> None:
        self.inner = inner
        self.cut_at = cut_at
        self.fault = fault
        self.steps: list[str] = []
        self.sticky = fault is PowerCut  # a dead process makes no further calls; an IO error is one call

    def step(self, name: str, target: Callable[..., Any], *args: Any) -> Any:
        index = len(self.steps)
        self.steps.append(f"{name} {args[0] if args else ''}".strip())
        if self.cut_at is not None and (index == self.cut_at or (self.sticky and index > self.cut_at)):
            raise self.fault()
        return target(*args)

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)

        def call(*args: Any) -> Any:
            result = self.step(name, target, *args)
            return StepFile(self, result) if name == "open" else result

        return call


class StepFile:
    def __init__(self, fs: StepFs, inner: Any) -> None:
        self._fs = fs
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        return lambda *args: self._fs.step(f"file.{name}", target, *args)


def mailbox_on(disk: CrashFs, fs: Any = None, **options: Any) -> MemoryMailbox:
    mailbox = MemoryMailbox(fs=disk, **options)
    if fs is not None:
        mailbox.fs = fs  # the same code, seeing the disk through the step counter
    return mailbox


def envelope(ids: DeliveryIds, n: int) -> Envelope:
    return Envelope.new(ids, T + n, "message", {"n": n}, sender="parent")


def violations(disk: CrashFs, must: list[Envelope], may: list[Envelope]) -> list[str]:
    """What a restarted mailbox on `disk` drains, against what it must (returned deliveries not
    acked) and may (deliveries or acks that were cut) hold."""
    found: list[str] = []
    report = MemoryMailbox(fs=disk).drain_report(SID)
    if report.rejected:
        found.append(f"rejected after the crash: {report.rejected}")
    ids = [e.delivery_id for e in report.envelopes]
    if len(ids) != len(set(ids)):
        found.append(f"drained twice: {ids}")
    if ids != sorted(ids):
        found.append(f"out of order: {ids}")
    known = {e.delivery_id: e for e in must + may}
    for env in must:
        if env not in report.envelopes:
            found.append(f"lost: {env.body}")
    for env in report.envelopes:
        if known.get(env.delivery_id) != env:
            found.append(f"never delivered: {env}")
    return found


def _count_steps(story: Callable[[CrashFs, Any], None]) -> int:
    disk = CrashFs()
    fs = StepFs(disk)
    story(disk, fs)
    return len(fs.steps)


# --- the stories: a setup on a clean disk, then the operation under test through `fs` -----------


def _setup(disk: CrashFs, fresh: bool) -> tuple[DeliveryIds, list[Envelope]]:
    ids = DeliveryIds()
    if fresh:
        return ids, []
    mailbox = MemoryMailbox(fs=disk)
    a, b = envelope(ids, 0), envelope(ids, 1)
    mailbox.deliver(SID, a)
    mailbox.deliver(SID, b)
    mailbox.ack(SID, a.delivery_id)
    return ids, [b]


def _deliver_story(fresh: bool, cut_at: int | None, fault: Callable[[], Exception] = PowerCut) -> None:
    disk = CrashFs()
    ids, pending = _setup(disk, fresh)
    c = envelope(ids, 2)
    fs = StepFs(disk, cut_at, fault)
    try:
        mailbox_on(disk, fs).deliver(SID, c)
        returned = True
    except (PowerCut, PersistenceFailed):
        returned = False
    if fault is PowerCut:
        disk.crash()
        assert violations(disk, pending + [c] if returned else pending, [] if returned else [c]) == []
    else:
        assert returned == (cut_at is None or fs.steps[cut_at].startswith("unlink")), fs.steps[cut_at or 0]
        MemoryMailbox(fs=disk).deliver(SID, c)  # the sender retries: idempotent
        disk.crash()
        assert violations(disk, pending + [c], []) == []
    # The mailbox goes on: a later delivery, then acks of everything, leave no file but stale temps,
    # which a drain long after removes.
    after = MemoryMailbox(fs=disk)
    d = envelope(ids, 3)
    after.deliver(SID, d)
    drained = after.drain(SID)
    assert drained[-1] == d and drained[: len(pending)] == pending
    for env in drained:
        after.ack(SID, env.delivery_id)
    MemoryMailbox(fs=disk, now_ns=lambda: 2**62).drain(SID)
    disk.crash()
    assert disk.listdir(rel_mailbox(SID)) == []


@pytest.mark.parametrize("fresh", [True, False], ids=["first-delivery", "existing-mailbox"])
def test_a_power_cut_at_every_step_of_deliver(fresh: bool) -> None:
    def story(disk: CrashFs, fs: StepFs) -> None:
        ids, _ = _setup(disk, fresh)
        mailbox_on(disk, fs).deliver(SID, envelope(ids, 2))

    steps = _count_steps(story)
    assert steps >= 8  # mkdirs and folder fsyncs (first delivery), open, write, fsync, link, unlink, fsync_dir
    for cut_at in [*range(steps), None]:
        _deliver_story(fresh, cut_at)


@pytest.mark.parametrize("fresh", [True, False], ids=["first-delivery", "existing-mailbox"])
def test_an_io_error_at_every_step_of_deliver_then_a_retry(fresh: bool) -> None:
    def story(disk: CrashFs, fs: StepFs) -> None:
        ids, _ = _setup(disk, fresh)
        mailbox_on(disk, fs).deliver(SID, envelope(ids, 2))

    for cut_at in range(_count_steps(story)):
        _deliver_story(fresh, cut_at, fault=lambda: OSError(errno.EIO, "injected"))


def test_a_power_cut_at_every_step_of_ack() -> None:
    def story(disk: CrashFs, fs: StepFs | None, cut_at: int | None = None) -> None:
        ids, _ = _setup(disk, fresh=False)
        mailbox = MemoryMailbox(fs=disk)
        c, d = envelope(ids, 2), envelope(ids, 3)
        mailbox.deliver(SID, c)
        mailbox.deliver(SID, d)
        b = mailbox.drain(SID)[0]
        cut = StepFs(disk, cut_at)
        try:
            mailbox_on(disk, cut if fs is None else fs).ack(SID, c.delivery_id)
            returned = True
        except PowerCut:
            returned = False
        disk.crash()
        assert violations(disk, [b, d], [] if returned else [c]) == []

    steps = _count_steps(lambda disk, fs: story(disk, fs))
    assert steps >= 3  # stat, unlink, fsync_dir
    for cut_at in [*range(steps), None]:
        story(CrashFs(), None, cut_at)


def test_a_power_cut_at_every_step_of_moving_a_bad_file_aside_keeps_it_and_the_good_ones() -> None:
    def plant(disk: CrashFs) -> Envelope:
        mailbox = MemoryMailbox(fs=disk)
        good = envelope(DeliveryIds(), 0)
        mailbox.deliver(SID, good)
        disk.write_bytes(f"{rel_mailbox(SID)}/junk", b"evidence")
        return good

    def story(disk: CrashFs, fs: StepFs) -> None:
        plant(disk)
        mailbox_on(disk, fs).drain(SID)

    steps = _count_steps(story)
    for cut_at in [*range(steps), None]:
        disk = CrashFs()
        good = plant(disk)
        try:
            assert mailbox_on(disk, StepFs(disk, cut_at)).drain(SID) == [good]
        except PowerCut:
            pass
        disk.crash()
        report = MemoryMailbox(fs=disk).drain_report(SID)
        assert report.envelopes == [good]
        kept = [n for n in disk.listdir(f"{rel_mailbox(SID)}/rejected") if not n.endswith(".reason")]
        assert kept and all(disk.read_bytes(f"{rel_mailbox(SID)}/rejected/{n}") == b"evidence" for n in kept)
        assert disk.listdir(rel_mailbox(SID)) == ["rejected"] or sorted(disk.listdir(rel_mailbox(SID))) == sorted(
            [f"{good.delivery_id}.json", "rejected"]
        )


def test_an_owner_cut_anywhere_records_every_delivery_exactly_once() -> None:
    """The owner's side of the contract: drain, record each new delivery id durably, then ack;
    after any cut, a restarted owner drops the ids it recorded (the projection of recorded ids)."""

    def owner(disk: CrashFs, recorded: list[str], fs: Any = None) -> None:
        mailbox = mailbox_on(disk, fs)
        for env in mailbox.drain(SID):
            if env.delivery_id not in recorded:
                recorded.append(env.delivery_id)  # stands for the durable user/message event
            mailbox.ack(SID, env.delivery_id)

    def deliveries(disk: CrashFs) -> list[str]:
        mailbox = MemoryMailbox(fs=disk)
        sent = [envelope(mailbox.ids, n) for n in range(3)]
        for env in sent:
            mailbox.deliver(SID, env)
        return [e.delivery_id for e in sent]

    probe = CrashFs()
    deliveries(probe)
    fs = StepFs(probe)
    owner(probe, [], fs)
    for cut_at in [*range(len(fs.steps)), None]:
        disk = CrashFs()
        sent = deliveries(disk)
        recorded: list[str] = []
        try:
            owner(disk, recorded, StepFs(disk, cut_at))
        except PowerCut:
            pass
        disk.crash()
        owner(disk, recorded)  # the restarted owner
        assert recorded == sent
        assert MemoryMailbox(fs=disk).drain(SID) == []


# --- the checker notices a mailbox that skips an fsync ----------------------------------------------


@pytest.mark.parametrize("dropped", ["file", "dir"])
def test_without_its_fsyncs_a_returned_delivery_would_be_lost(dropped: str) -> None:
    disk = CrashFs(drop_fsync={dropped})
    mailbox = MemoryMailbox(fs=disk)
    env = envelope(mailbox.ids, 0)
    mailbox.deliver(SID, env)
    disk.crash()
    assert violations(disk, [env], []) != []
