"""No acknowledged event is lost at a crash (SPEC 3.3 publication and durability, SPEC 6).

Theory of operation. `durability_violations` is the one checker: given a store and a model of
what each session was told (`acked`: the events of every append that returned, in seq order)
and what it merely tried (`attempted`: seq → the events of appends that raised), it lists every
way the store's visible state breaks the contract — an acknowledged event missing or changed, an
event nobody attempted, a listed session nobody appended to, damage. It returns violations
instead of asserting, so the same function is asserted empty after random crash sequences and
asserted non-empty when a `CrashFs` drops fsyncs: if an fsync the store depends on were removed,
this file would fail.

`CrashMachine` drives a `FileLogStore` over a `CrashFs`, in both file forms, through five
sessions: create, append (several batches of varied sizes per call), close, reopen, crash (also in
the middle of an append), and appends with one injected failure (a partial write, a failed fsync
of the file, of the session folder or of `sessions/`, a failed link). Each fault is injected so
that the append it accompanies is certain to reach the faulted operation, and the error the
append raises must be caused by exactly that fault, so no fault lingers into a later step. A
crash may leave a torn tail on a log, as real disks can: part of the bytes it lost, NUL padding
after them, or the start of a record nobody finished; the next process must cut it.

Two fsyncs of the store cannot be caught by any CrashFs test, because the next acknowledged
fsync of the same file covers what they cover: the fsync after rolling back a failed write, and
the fsync after cutting a torn tail. Every other fsync is proved necessary below, one at a time.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

import attrs
import hypothesis
import pytest
import zstandard
from clocks import T
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from log_lines import events_of, header, header_line, rel_folder, rel_log, wire, zstd_frames
from subagents.storage import (
    AlreadyOwned,
    Batch,
    Event,
    FileLogStore,
    HandleDead,
    Offset,
    PersistenceFailed,
    SessionAlreadyExists,
    SessionHeader,
    SessionId,
    SessionNotFound,
    StorageError,
    WriteHandle,
    make_event,
)
from subagents.storage._codec import encode_event
from subagents.storage.forms import Compression
from subagents.storage.fs import File, OpenMode
from subagents.storage.testing import CrashFs

SIDS = ("s0", "s1", "s2", "s3", "s4")
FORMS: tuple[Compression, ...] = ("none", "zstd")
PUBLISH_TEMP = "publish.tmp"


# --- the model and the checker ------------------------------------------------------------------


@attrs.define
class SessionModel:
    """What the store told the caller about one session, and what the caller tried."""

    header: SessionHeader
    acked: list[bytes] = attrs.field(factory=list)  # encoded events, index == seq
    attempted: dict[int, set[bytes]] = attrs.field(factory=dict)  # seq → events of raised appends

    def attempt(self, events: Sequence[Event]) -> None:
        for event in events:
            self.attempted.setdefault(event.seq, set()).add(encode_event(event))

    def acknowledge(self, view: Sequence[bytes]) -> None:
        """An append through a handle whose log reads `view` returned: all of `view` is durable."""
        self.acked = list(view)
        self.attempted = {seq: evs for seq, evs in self.attempted.items() if seq >= len(self.acked)}


def durability_violations(store: FileLogStore, models: Mapping[str, SessionModel]) -> list[str]:
    """Every way the store's visible sessions break what `models` says was acknowledged.

    Per session: every acknowledged event is present, in order, byte-identical; every event after
    the acknowledged prefix was attempted at its seq by an append that raised; seqs are contiguous
    from 0; the log is undamaged; a session nobody appended to is not listed; and no session the
    models do not know is listed.
    """
    violations: list[str] = []
    try:
        rows = {info.id: info for info in store.list()}
    except StorageError as exc:
        return [f"list() failed: {exc}"]
    for sid in sorted(set(rows) - set(models)):
        violations.append(f"session {sid!r}: listed, but nothing ever created it")
    for sid, model in sorted(models.items()):
        row = rows.get(SessionId(sid))
        if row is None:
            if model.acked:
                violations.append(
                    f"session {sid!r}: not listed, so its {len(model.acked)} acknowledged events are lost"
                )
            continue
        if not model.acked and not model.attempted:
            violations.append(f"session {sid!r}: listed, but no append ever published it")
        if row.damage is not None:
            violations.append(f"session {sid!r}: listed as {row.damage}")
            continue
        try:
            handle = store.open_read(sid)
            try:
                events = store.read(handle)
            finally:
                store.close(handle)
        except StorageError as exc:
            violations.append(f"session {sid!r}: unreadable: {exc}")
            continue
        if handle.header != model.header:
            violations.append(f"session {sid!r}: header {handle.header!r} != {model.header!r}")
        if row.event_count != len(events):
            violations.append(f"session {sid!r}: listed with {row.event_count} events, reads {len(events)}")
        if not events:
            violations.append(f"session {sid!r}: published without a single event")
        if len(events) < len(model.acked):
            violations.append(f"session {sid!r}: acknowledged seqs {len(events)}..{len(model.acked) - 1} are lost")
        for i, event in enumerate(events):
            raw = encode_event(event)
            if event.seq != i:
                violations.append(f"session {sid!r}: position {i} holds seq {event.seq}")
            elif i < len(model.acked):
                if raw != model.acked[i]:
                    violations.append(f"session {sid!r}: acknowledged seq {i} changed to {raw!r}")
            elif raw not in model.attempted.get(i, ()):
                violations.append(f"session {sid!r}: seq {i} holds an event never attempted: {raw!r}")
    return violations


# --- helpers ------------------------------------------------------------------------------------


def make_test_event(sid: str, seq: int, attempt: int, size: int) -> Event:
    """An event whose bytes differ for every (session, seq, attempt): a substitution shows."""
    text = f"{sid} seq {seq} attempt {attempt} " + "abcdefgh"[seq % 8] * size
    return make_event(seq, "compaction/summary", T + attempt, {"text": text})


def batches_at(sid: str, first: int, attempt: int, sizes: Sequence[Sequence[int]]) -> list[Batch]:
    batches = []
    seq = first
    for batch_sizes in sizes:
        events = [make_test_event(sid, seq + i, attempt, size) for i, size in enumerate(batch_sizes)]
        batches.append(Batch(Offset(seq), events))
        seq += len(events)
    return batches


def file_bytes(fs: CrashFs, path: str) -> bytes | None:
    return fs.read_bytes(path) if fs.kind(path) == "file" else None


def plain_form(fs: CrashFs, sid: str, compression: Compression) -> bytes:
    """The log as plain lines; for zstd, decoded independently of the store, every frame whole
    and checksum-verified (a torn frame fails), the first frame exactly the header line."""
    data = fs.read_bytes(rel_log(sid, compression))
    if compression == "none":
        return data
    frames = zstd_frames(data)
    assert frames and frames[0] == header_line(sid), frames[:1]
    return b"".join(frames)


# --- the state machine --------------------------------------------------------------------------

BATCH_SIZES = st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=4), min_size=1, max_size=3)


class CrashMachine(RuleBasedStateMachine):
    compression: Compression = "none"

    def __init__(self) -> None:
        super().__init__()
        self.fs = CrashFs()
        self.store = self.new_store()
        self.models: dict[str, SessionModel] = {}
        self.handles: dict[str, WriteHandle] = {}
        self.views: dict[str, list[bytes]] = {}  # what each open handle's log reads
        self.attempts = 0

    def new_store(self) -> FileLogStore:
        return FileLogStore(fs=self.fs, compression=self.compression)

    def assert_log_is(self, sid: str, events: Sequence[bytes]) -> None:
        """The file holds exactly the header and `events`: no torn tail, no extra byte."""
        assert plain_form(self.fs, sid, self.compression) == header_line(sid) + b"".join(events)

    # --- claiming ---

    @initialize()
    def create_every_session(self) -> None:
        for sid in SIDS:
            self.create(sid)

    @rule(sid=st.sampled_from(SIDS))
    def create(self, sid: str) -> None:
        if sid in self.handles:
            with pytest.raises(AlreadyOwned):
                self.store.create(header(sid))
            return
        if self.store.stat(sid) is not None:
            with pytest.raises(SessionAlreadyExists):
                self.store.create(header(sid))
            return
        self.handles[sid] = self.store.create(header(sid))
        self.views[sid] = []
        self.models.setdefault(sid, SessionModel(header(sid)))

    @rule(sid=st.sampled_from(SIDS))
    def reopen(self, sid: str) -> None:
        if sid in self.handles:
            with pytest.raises(AlreadyOwned):
                self.store.open_write(sid)
            return
        self._reopen(sid)

    def _reopen(self, sid: str) -> None:
        if self.store.stat(sid) is None:
            with pytest.raises(SessionNotFound):
                self.store.open_write(sid)
            return
        handle = self.store.open_write(sid)
        view = wire(self.store.read(handle))
        assert handle.next_seq == len(view)
        self.assert_log_is(sid, view)  # a torn tail was cut (and a torn frame's lines re-framed)
        assert view[: len(self.models[sid].acked)] == self.models[sid].acked
        self.handles[sid] = handle
        self.views[sid] = view

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.handles)), label="sid")
        self.store.close(self.handles.pop(sid))
        del self.views[sid]

    # --- appending ---

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), sizes=BATCH_SIZES)
    def append(self, data: st.DataObject, sizes: list[list[int]]) -> None:
        sid = data.draw(st.sampled_from(sorted(self.handles)), label="sid")
        kinds = ["none", "none", "write", "fsync"]
        if not self.handles[sid].published:  # only publication links and fsyncs folders
            kinds += ["fsync_dir folder", "fsync_dir sessions", "link"]
        self._append(data, sid, sizes, data.draw(st.sampled_from(kinds), label="fault"))

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), sizes=BATCH_SIZES)
    def crash_inside_an_append(self, data: st.DataObject, sizes: list[list[int]]) -> None:
        """Power fails after an append wrote its bytes, before an fsync made them durable."""
        sid = data.draw(st.sampled_from(sorted(self.handles)), label="sid")
        kinds = ["fsync"]
        if not self.handles[sid].published:
            kinds += ["fsync_dir folder", "fsync_dir sessions"]
        self._append(data, sid, sizes, data.draw(st.sampled_from(kinds), label="fault"), reopen=False)
        self.crash(data)

    def _append(self, data: st.DataObject, sid: str, sizes: list[list[int]], kind: str, *, reopen: bool = True) -> None:
        """Append with one injected `kind` of fault (or "none") and check what the store did."""
        handle = self.handles[sid]
        model = self.models[sid]
        view = self.views[sid]
        self.attempts += 1
        batches = batches_at(sid, handle.next_seq, self.attempts, sizes)
        events = events_of(batches)
        publishing = not handle.published
        injected = OSError(errno.EIO, f"injected {kind} failure #{self.attempts}")
        if kind == "write":
            size = sum(len(e) for e in wire(events)) + (len(header_line(sid)) if publishing else 0)
            partial = data.draw(st.integers(0, size), label="bytes written before the failure")
            self.fs.inject("write", error=injected, partial=partial)
        elif kind == "fsync":
            self.fs.inject("fsync", error=injected)
        elif kind == "fsync_dir folder":
            self.fs.inject("fsync_dir", path_suffix=rel_folder(sid), error=injected)
        elif kind == "fsync_dir sessions":
            self.fs.inject("fsync_dir", path_suffix="sessions", error=injected)
        elif kind == "link":
            self.fs.inject("link", error=injected)
        hypothesis.event(f"append ({'publishing' if publishing else 'published'}) with fault: {kind}")

        try:
            nxt = self.store.append(handle, batches)
        except PersistenceFailed as exc:
            assert kind != "none", f"append raised without an injected fault: {exc!r}"
            assert exc.__cause__ is injected, f"the {kind} fault did not cause {exc!r}"
            model.attempt(events)
            assert handle.next_seq == len(view)
            if kind.startswith("fsync"):
                assert handle.dead is not None, "a failed fsync must kill the handle"
                before = file_bytes(self.fs, rel_log(sid, self.compression))
                with pytest.raises(HandleDead):
                    self.store.append(handle, batches_at(sid, handle.next_seq, self.attempts, [[1]]))
                assert file_bytes(self.fs, rel_log(sid, self.compression)) == before
                if reopen:  # no retry on a dead handle: close, reopen, validate what reached the log
                    self.store.close(self.handles.pop(sid))
                    del self.views[sid]
                    self._reopen(sid)
                return
            assert handle.dead is None, "a failed write or link must leave the handle usable"
            if handle.published:
                self.assert_log_is(sid, view)  # rolled back to exactly the acknowledged bytes
            else:
                assert self.store.stat(sid) is None
                assert self.fs.kind(f"{rel_folder(sid)}/{PUBLISH_TEMP}") is None
            return
        assert kind == "none", f"the injected {kind} fault did not fail the append"
        view.extend(wire(events))
        assert nxt == handle.next_seq == len(view)
        model.acknowledge(view)

    # --- crashes ---

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """Power loss: what no fsync covered is gone, except that a log may keep a torn tail —
        part of the bytes it lost (written back before the crash), NUL padding, or the start of a
        record nobody wrote (a crash inside a write) — as real disks can."""
        before = {sid: file_bytes(self.fs, rel_log(sid, self.compression)) for sid in self.models}
        self.fs.crash()
        self.handles.clear()
        self.views.clear()
        for sid in sorted(self.models):
            path = rel_log(sid, self.compression)
            after, was = file_bytes(self.fs, path), before[sid]
            if after is None:
                continue  # the log's folder entry was not durable
            lost = was[len(after) :] if was is not None and was.startswith(after) else b""
            kinds = ["clean", "nul padding", "the start of a foreign record"]
            if lost:
                kinds += ["part of the lost bytes", "part of the lost bytes, then nul padding"]
            kind = data.draw(st.sampled_from(kinds), label=f"tail of {sid}")
            hypothesis.event(f"crash leaves: {kind}")
            tail = b""
            if kind.startswith("part of the lost bytes"):
                tail += lost[: data.draw(st.integers(1, len(lost)), label="kept bytes")]
            if kind.endswith("nul padding"):
                tail += b"\0" * data.draw(st.integers(1, 64), label="nul bytes")
            if kind == "the start of a foreign record":
                record = encode_event(make_test_event(sid, 10**6, 0, 20))[:-1]  # no newline: no line
                if self.compression == "zstd":
                    record = zstandard.ZstdCompressor(write_checksum=True).compress(record)
                tail = record[: data.draw(st.integers(1, len(record) - 1), label="foreign bytes")]
            if tail:
                self.fs.write_bytes(path, after + tail)
        self.store = self.new_store()  # the next process
        assert durability_violations(self.store, self.models) == []
        for sid, model in self.models.items():
            if self.store.stat(sid) is None:
                model.acked, model.attempted = [], {}
                continue
            # The next process reopens every session (cutting torn tails) and carries on with it.
            self._reopen(sid)
            # What survived a crash is durable now: the next crash must keep all of it.
            model.acked, model.attempted = self.views[sid][:], {}

    @invariant()
    def nothing_acknowledged_is_missing(self) -> None:
        assert durability_violations(self.store, self.models) == []


class ZstdCrashMachine(CrashMachine):
    compression: Compression = "zstd"


_MACHINE_SETTINGS = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),  # no slow "explain" phase
)
CrashMachine.TestCase.settings = _MACHINE_SETTINGS
ZstdCrashMachine.TestCase.settings = _MACHINE_SETTINGS
test_random_crashes_lose_no_acknowledged_event_plain = pytest.mark.slow(CrashMachine.TestCase)
test_random_crashes_lose_no_acknowledged_event_zstd = pytest.mark.slow(ZstdCrashMachine.TestCase)


# --- the checker notices a missing fsync ----------------------------------------------------------


class _DroppingFile:
    """A `CrashFile` whose first fsync and/or later fsyncs do nothing."""

    def __init__(self, inner: File, *, drop_first: bool, drop_rest: bool) -> None:
        self._inner = inner
        self._drop_first = drop_first
        self._drop_rest = drop_rest
        self._synced = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def fsync(self) -> None:
        drop = self._drop_first if self._synced == 0 else self._drop_rest
        self._synced += 1
        if not drop:
            self._inner.fsync()


class SelectiveCrashFs(CrashFs):
    """A `CrashFs` that drops exactly one role of fsync the store performs.

    Roles: `publish` (the new log's fsync before it is linked), `append` (every later fsync of a
    log), and `folder`, `sessions`, `root` (the folder fsyncs after the link, and on a reopen).
    """

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def open(self, path: str, mode: OpenMode) -> File:  # type: ignore[override]  # a counting stand-in with a looser signature
        file = super().open(path, mode)
        if mode == "create":  # publication's temp file: fsync 1 publishes, later ones append
            return _DroppingFile(file, drop_first=self.role == "publish", drop_rest=self.role == "append")
        if mode == "append":  # a reopened log: every fsync is an append's (or a torn-tail cut's)
            return _DroppingFile(file, drop_first=self.role == "append", drop_rest=self.role == "append")
        return file

    def fsync_dir(self, path: str) -> None:
        dropped = {
            "root": path == "",
            "sessions": path == "sessions",
            "folder": path.startswith("sessions/"),
        }.get(self.role, False)
        if dropped:
            self.counts["fsync_dir"] += 1
            return
        super().fsync_dir(path)


def run_acknowledged_scenario(fs: CrashFs, compression: Compression) -> list[str]:
    """Acknowledge appends through created and reopened handles of two stores, crash, check."""
    store = FileLogStore(fs=fs, compression=compression)
    models: dict[str, SessionModel] = {}
    attempt = 0

    def append(store: FileLogStore, handle: WriteHandle, view: list[bytes], sizes: list[list[int]]) -> None:
        nonlocal attempt
        attempt += 1
        batches = batches_at(handle.session_id, handle.next_seq, attempt, sizes)
        store.append(handle, batches)
        view.extend(wire(events_of(batches)))
        models[handle.session_id].acknowledge(view)

    for sid in ("s0", "s1"):
        models[sid] = SessionModel(header(sid))
        handle = store.create(header(sid))
        view: list[bytes] = []
        append(store, handle, view, [[10, 200], [3]])
        append(store, handle, view, [[50]])
        store.close(handle)
    # s0: more through a reopened handle, still open at the crash; s1: more through another store.
    handle = store.open_write("s0")
    view = wire(store.read(handle))
    append(store, handle, view, [[7], [8, 9]])
    append(store, handle, view, [[120]])
    other = FileLogStore(fs=fs, compression=compression)
    handle = other.open_write("s1")
    view = wire(other.read(handle))
    append(other, handle, view, [[1, 2, 3]])
    other.close(handle)
    # s2: published by its only append, open at the crash.
    models["s2"] = SessionModel(header("s2"))
    append(store, store.create(header("s2")), [], [[60], [2]])
    fs.crash()
    return durability_violations(FileLogStore(fs=fs, compression=compression), models)


@pytest.mark.parametrize("compression", FORMS)
def test_the_scenario_passes_with_every_fsync(compression: Compression) -> None:
    assert run_acknowledged_scenario(CrashFs(), compression) == []


@pytest.mark.parametrize("compression", FORMS)
@pytest.mark.parametrize("drop", [{"file"}, {"dir"}, {"file", "dir"}], ids=["file", "dir", "both"])
def test_the_checker_notices_dropped_fsyncs(drop: set[str], compression: Compression) -> None:
    violations = run_acknowledged_scenario(CrashFs(drop_fsync=drop), compression)
    assert all(any(f"{sid!r}" in v for v in violations) for sid in ("s0", "s1", "s2")), violations


@pytest.mark.parametrize("compression", FORMS)
@pytest.mark.parametrize("role", ["publish", "append", "folder", "sessions", "root"])
def test_the_checker_notices_each_dropped_fsync_of_the_store(role: str, compression: Compression) -> None:
    """Each fsync the store performs on the acknowledged path is needed, one at a time."""
    assert run_acknowledged_scenario(SelectiveCrashFs(role), compression) != []


# --- the contract in fixed cases ----------------------------------------------------------------


def _published(store: FileLogStore, sid: str) -> tuple[WriteHandle, SessionModel, list[bytes]]:
    model = SessionModel(header(sid))
    handle = store.create(header(sid))
    batches = batches_at(sid, 0, 0, [[5, 6], [7]])
    store.append(handle, batches)
    view = wire(events_of(batches))
    model.acknowledge(view)
    return handle, model, view


@pytest.mark.parametrize("compression", FORMS)
@pytest.mark.parametrize("partial", [0, 1, 40, -4, None], ids=["0", "1", "40", "all-but-4", "all"])
def test_a_failed_write_rolls_back_to_the_acknowledged_prefix_and_the_handle_lives(
    partial: int | None, compression: Compression
) -> None:
    fs = CrashFs()
    store = FileLogStore(fs=fs, compression=compression)
    handle, model, view = _published(store, "s0")
    size_before = len(fs.read_bytes(rel_log("s0", compression)))
    batches = batches_at("s0", 3, 1, [[30], [4, 4]])
    fs.inject("write", partial=10**6 if partial is None else partial)  # -4: all but the last 4 bytes
    with pytest.raises(PersistenceFailed):
        store.append(handle, batches)
    model.attempt(events_of(batches))
    assert handle.dead is None and handle.next_seq == 3
    assert len(fs.read_bytes(rel_log("s0", compression))) == size_before
    assert plain_form(fs, "s0", compression) == header_line("s0") + b"".join(view)
    retry = batches_at("s0", 3, 2, [[9]])
    assert store.append(handle, retry) == 4
    view.extend(wire(events_of(retry)))
    model.acknowledge(view)
    fs.crash()
    assert durability_violations(FileLogStore(fs=fs, compression=compression), {"s0": model}) == []


@pytest.mark.parametrize("compression", FORMS)
@pytest.mark.parametrize("published", [False, True], ids=["publishing", "appending"])
def test_a_failed_fsync_kills_the_handle_and_a_reopen_carries_on(published: bool, compression: Compression) -> None:
    fs = CrashFs()
    store = FileLogStore(fs=fs, compression=compression)
    if published:
        handle, model, view = _published(store, "s0")
    else:
        handle, model, view = store.create(header("s0")), SessionModel(header("s0")), []
    batches = batches_at("s0", len(view), 1, [[11, 12]])
    fs.inject("fsync")
    with pytest.raises(PersistenceFailed):
        store.append(handle, batches)
    model.attempt(events_of(batches))
    assert handle.dead is not None
    with pytest.raises(HandleDead):
        store.append(handle, batches)
    store.close(handle)
    assert durability_violations(store, {"s0": model}) == []
    if published:
        handle = store.open_write("s0")
        view = wire(store.read(handle))
    else:
        assert store.list() == []  # the new log was never linked: nothing is visible
        handle = store.create(header("s0"))
        view = []
    more = batches_at("s0", handle.next_seq, 2, [[13]])
    store.append(handle, more)
    view.extend(wire(events_of(more)))
    model.acknowledge(view)
    fs.crash()
    assert durability_violations(FileLogStore(fs=fs, compression=compression), {"s0": model}) == []


def test_a_created_but_unpublished_session_is_invisible_and_reusable_after_a_crash() -> None:
    fs = CrashFs()
    store = FileLogStore(fs=fs)
    store.create(header("s0"))
    _handle, model1, _view = _published(store, "s1")
    assert [info.id for info in store.list()] == ["s1"]
    fs.crash()
    store = FileLogStore(fs=fs)
    assert [info.id for info in store.list()] == ["s1"]
    with pytest.raises(SessionNotFound):
        store.open_write("s0")
    handle, model0, _view = _published(store, "s0")
    store.close(handle)
    fs.crash()
    assert durability_violations(FileLogStore(fs=fs), {"s0": model0, "s1": model1}) == []


@pytest.mark.parametrize("compression", FORMS)
@pytest.mark.parametrize("failing", ["session folder", "sessions"])
def test_an_append_acknowledged_after_reopening_a_half_published_log_survives_a_crash(
    failing: str, compression: Compression
) -> None:
    """Publication links the log, then a folder fsync fails and the handle dies. The log is
    visible, so a reopen succeeds and its next append is acknowledged: that append must survive a
    crash, so a reopened log's directory entries must be durable before an append is acknowledged."""
    fs = CrashFs()
    store = FileLogStore(fs=fs, compression=compression)
    model = SessionModel(header("s0"))
    handle = store.create(header("s0"))
    batches = batches_at("s0", 0, 1, [[20]])
    fs.inject("fsync_dir", path_suffix=rel_folder("s0") if failing == "session folder" else "sessions")
    with pytest.raises(PersistenceFailed):
        store.append(handle, batches)
    model.attempt(events_of(batches))
    assert handle.dead is not None
    store.close(handle)
    handle = store.open_write("s0")
    view = wire(store.read(handle))
    more = batches_at("s0", handle.next_seq, 2, [[30]])
    store.append(handle, more)
    view.extend(wire(events_of(more)))
    model.acknowledge(view)
    store.close(handle)
    fs.crash()
    assert durability_violations(FileLogStore(fs=fs, compression=compression), {"s0": model}) == []


@pytest.mark.parametrize("compression", FORMS)
def test_a_torn_last_record_padded_with_nuls_is_a_torn_tail(compression: Compression) -> None:
    """A crash inside an append can keep the start of the new record and zeros after it (the file
    grew, the rest of its data never reached the disk). Wherever the record was cut, that is a
    torn tail: acknowledged events stay readable, the writer cuts it and carries on."""
    fs = CrashFs()
    store = FileLogStore(fs=fs, compression=compression)
    handle, model, view = _published(store, "s0")
    store.close(handle)
    path = rel_log("s0", compression)
    durable = fs.read_bytes(path)
    handle = store.open_write("s0")
    lost_batches = batches_at("s0", 3, 1, [[40, 3], [90]])
    fs.inject("fsync")
    with pytest.raises(PersistenceFailed):
        store.append(handle, lost_batches)
    model.attempt(events_of(lost_batches))
    lost = fs.read_bytes(path)[len(durable) :]
    assert lost
    failures = []
    for cut in range(1, len(lost)):
        fs.crash()
        fs.write_bytes(path, durable + lost[:cut] + b"\0" * 16)
        store = FileLogStore(fs=fs, compression=compression)
        violations = durability_violations(store, {"s0": model})
        if violations:
            failures.append((cut, violations[0]))
            continue
        handle = store.open_write("s0")
        events = wire(store.read(handle))
        assert plain_form(fs, "s0", compression) == header_line("s0") + b"".join(events)
        store.close(handle)
    cuts = [cut for cut, _violation in failures]
    assert failures == [], f"cuts {cuts} of a {len(lost)}-byte append: {failures[0][1]}"
