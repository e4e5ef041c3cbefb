"""Change notification for `list()` (storage/watch.py): a warm listing re-stats only the folders
the kernel names, and must list exactly what a stat pass lists.

Every listing of a watched store is compared with a fresh store that has no index and no watch
(`use_index=False, watch=False`): it stats and parses every log, so a watch that missed a change
cannot agree with it by accident. The changes are made the ways a user, a crash or another
process makes them: through a writer store, and by hand (bytes appended or cut in place, a log
replaced by a new inode, a second form planted, a folder renamed or removed, a touch, a write
through a hard link outside the root, the whole root replaced).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import pytest
from clocks import T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_lines import persist_log, rel_log, session_folder
from open_fds import inotify_fds
from subagents.storage import (
    Batch,
    FileLogStore,
    LogInfo,
    OsFs,
    SessionHeader,
    SessionId,
    StorageError,
    encode_session_id,
    make_event,
)
from subagents.storage.file_store import _LOG_NAMES
from subagents.storage.fs import FolderScan
from subagents.storage.watch import IN_Q_OVERFLOW, LOCAL_FILE_SYSTEMS, Watch

IDS = [f"s{i}" for i in range(6)]


def header(sid: str) -> SessionHeader:
    return SessionHeader(id=SessionId(sid), created_at=T + int(sid[1:]))


def events(first: int, count: int) -> list[Any]:
    return [make_event(seq, "turn/start", T + seq, {"turn": seq + 1}) for seq in range(first, first + count)]


def log_file(root: Path, sid: str) -> Path | None:
    for name in _LOG_NAMES.values():
        path = session_folder(root, sid) / name
        if path.is_file() and not path.is_symlink():
            return path
    return None


def publish(root: Path, sid: str, compression: Any = "zstd", count: int = 2) -> None:
    store = FileLogStore(str(root), compression=compression, watch=False, use_index=False)
    try:
        persist_log(store, header(sid), events(0, count))
    finally:
        store.close_store()


def grow(root: Path, sid: str, count: int = 1) -> None:
    store = FileLogStore(str(root), watch=False, use_index=False)
    try:
        handle = store.open_write(sid)
        try:
            store.append(handle, [Batch(handle.next_seq, events(handle.next_seq, count))])
        finally:
            store.close(handle)
    finally:
        store.close_store()


def rows(infos: Sequence[LogInfo]) -> list[tuple[Any, ...]]:
    return [(i.id, i.header, i.damage, i.inherited_event_count, i.revision, i.event_count) for i in infos]


def reference(root: Path) -> list[tuple[Any, ...]]:
    store = FileLogStore(str(root), use_index=False, watch=False)
    try:
        return rows(store.list())
    finally:
        store.close_store()


class ScanLog(OsFs):
    """The real file system, recording every `scan` (which folders, and whether watched)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.scans: list[tuple[frozenset[str] | None, bool]] = []

    def scan(
        self, path: str, names: Sequence[str], only: Collection[str] | None = None, watch: Watch | None = None
    ) -> list[FolderScan]:
        self.scans.append((None if only is None else frozenset(only), watch is not None))
        return super().scan(path, names, only, watch)


def warm_store(root: Path, fs: OsFs | None = None) -> FileLogStore:
    """A store past its first two listings, so its next listing is a warm one."""
    store = FileLogStore(fs=fs or OsFs(str(root)))
    store.list()
    assert not store.watching  # a store that lists once sets no watch up
    store.list()
    assert store.watching, "no inotify watch here (instances exhausted by leaked stores?)"
    return store


# --- the mutations ----------------------------------------------------------------------------


def m_publish(root: Path, sid: str, arg: int) -> None:
    if not session_folder(root, sid).exists():
        publish(root, sid, "zstd" if arg % 2 else "none", count=1 + arg % 3)


def m_grow(root: Path, sid: str, arg: int) -> None:
    try:
        grow(root, sid, 1 + arg % 3)
    except StorageError:
        pass  # missing, damaged or doubled: the writer refuses, nothing changes


def m_append_garbage(root: Path, sid: str, arg: int) -> None:
    path = log_file(root, sid)
    if path is not None:
        with open(path, "ab") as f:
            f.write(b'{"seq": x\n' if arg % 2 else b"\0" * (1 + arg))


def m_cut(root: Path, sid: str, arg: int) -> None:
    path = log_file(root, sid)
    if path is not None:
        size = path.stat().st_size
        os.truncate(path, max(0, size - 1 - arg * 7))


def m_replace(root: Path, sid: str, arg: int) -> None:
    """The same bytes under a new inode (a copy renamed over the log)."""
    path = log_file(root, sid)
    if path is not None:
        tmp = path.with_name("copy.tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, path)


def m_plant_other_form(root: Path, sid: str, arg: int) -> None:
    path = log_file(root, sid)
    if path is not None:
        other = [name for name in _LOG_NAMES.values() if name != path.name][0]
        shutil.copyfile(path, path.with_name(other))


def m_remove_a_form(root: Path, sid: str, arg: int) -> None:
    names = sorted(_LOG_NAMES.values())
    path = session_folder(root, sid) / names[arg % 2]
    if path.exists() or path.is_symlink():
        path.unlink()


def m_remove_folder(root: Path, sid: str, arg: int) -> None:
    if session_folder(root, sid).exists():
        shutil.rmtree(session_folder(root, sid))


def m_rename_folder(root: Path, sid: str, arg: int) -> None:
    """To another session's name (if free) or to a name that is no session id."""
    source = session_folder(root, sid)
    target = session_folder(root, IDS[arg % len(IDS)]) if arg % 3 else root / "sessions" / ".not-an-id"
    if source.exists() and not target.exists():
        os.rename(source, target)


def m_touch(root: Path, sid: str, arg: int) -> None:
    path = log_file(root, sid)
    if path is not None:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000 * (1 + arg)))


def m_write_through_hard_link(root: Path, sid: str, arg: int) -> None:
    """Bytes appended through a second name outside the root: only the file's own watch sees it."""
    path = log_file(root, sid)
    if path is not None:
        outside = root.parent / f"{root.name}-link"
        os.link(path, outside)
        try:
            with open(outside, "ab") as f:
                f.write(b"\n" if arg % 2 else b"garbage")
        finally:
            outside.unlink()


def m_symlink_log(root: Path, sid: str, arg: int) -> None:
    path = log_file(root, sid)
    if path is not None:
        path.unlink()
        path.symlink_to("/dev/null")


def m_stray_entries(root: Path, sid: str, arg: int) -> None:
    sessions = root / "sessions"
    if sessions.is_dir():
        (sessions / f"stray-{arg}").write_bytes(b"x")  # a file, not a folder
        (sessions / encode_session_id(f"empty{arg}")).mkdir(exist_ok=True)  # unpublished


def m_replace_root(root: Path, sid: str, arg: int) -> None:
    """The root moved aside (kept, so its sessions/ sees no event) and a copy put in its place:
    the same bytes under new inodes, found only by checking what the root's path now holds."""
    if (root / "sessions").is_dir():
        aside = Path(tempfile.mkdtemp(dir=root.parent, prefix="old-root-"))
        os.rename(root, aside / "root")
        shutil.copytree(aside / "root", root, symlinks=True)


MUTATIONS: list[Callable[[Path, str, int], None]] = [
    m_publish,
    m_publish,
    m_grow,
    m_grow,
    m_append_garbage,
    m_cut,
    m_replace,
    m_plant_other_form,
    m_remove_a_form,
    m_remove_folder,
    m_rename_folder,
    m_touch,
    m_write_through_hard_link,
    m_symlink_log,
    m_stray_entries,
    m_replace_root,
]


# --- property: a warm listing equals a stat pass, whatever happened -------------------------------


steps = st.lists(
    st.tuples(st.integers(0, len(MUTATIONS) - 1), st.sampled_from(IDS[:4]), st.integers(0, 5)),
    min_size=1,
    max_size=14,
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_a_watched_listing_equals_a_stat_pass_after_any_changes(
    tmp_path: Path, steps: list[tuple[int, str, int]]
) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "root"
    publish(root, "s0")
    publish(root, "s1", "none")
    store = warm_store(root)
    try:
        for op, sid, arg in steps:
            MUTATIONS[op](root, sid, arg)
            assert rows(store.list()) == reference(root), (MUTATIONS[op].__name__, sid, arg)
    finally:
        store.close_store()


@pytest.mark.parametrize("mutation", list(dict.fromkeys(MUTATIONS)), ids=lambda m: m.__name__)
def test_each_change_is_noticed_by_a_warm_listing(tmp_path: Path, mutation: Callable[[Path, str, int], None]) -> None:
    root = tmp_path / "root"
    for sid in IDS[:3]:
        publish(root, sid, "none" if sid == "s1" else "zstd")
    store = warm_store(root)
    try:
        before = reference(root)
        for arg in range(3):
            mutation(root, f"s{3 + arg}" if mutation is m_publish else "s1", arg)
            assert rows(store.list()) == reference(root)
        assert mutation in (m_stray_entries, m_rename_folder, m_replace_root) or reference(root) != before
    finally:
        store.close_store()


# --- what a warm listing touches ------------------------------------------------------------------


def test_a_warm_listing_stats_only_the_folders_that_changed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for sid in IDS:
        publish(root, sid)
    fs = ScanLog(str(root))
    store = warm_store(root, fs)
    try:
        assert fs.scans == [(None, False), (None, True)]  # a stat pass, then a watched full pass
        fs.scans.clear()
        assert rows(store.list()) == reference(root)
        assert fs.scans == []  # nothing changed: not one stat
        grow(root, "s2")
        assert rows(store.list()) == reference(root)
        assert fs.scans == [(frozenset({encode_session_id("s2")}), True)]
        fs.scans.clear()
        m_plant_other_form(root, "s4", 0)
        infos = {i.id: i for i in store.list()}
        assert infos[SessionId("s4")].damage == "corrupt"
        assert fs.scans == [(frozenset({encode_session_id("s4")}), True)]
    finally:
        store.close_store()


def test_a_store_that_lists_once_sets_no_watch_up(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    before = inotify_fds()
    store = FileLogStore(str(root))
    store.list()
    assert not store.watching
    assert inotify_fds() == before
    store.close_store()


def test_close_store_frees_the_inotify_instance(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    before = inotify_fds()
    store = warm_store(root)
    assert inotify_fds() == before + 1
    store.close_store()
    assert inotify_fds() == before
    assert not store.watching


def test_a_store_without_watch_makes_stat_passes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    fs = ScanLog(str(root))
    store = FileLogStore(fs=fs, watch=False)
    try:
        for _ in range(3):
            store.list()
        assert fs.scans == [(None, False)] * 3
        assert not store.watching
    finally:
        store.close_store()


# --- what the watch cannot vouch for ----------------------------------------------------------------


def test_a_queue_overflow_makes_the_next_listing_a_full_pass(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    fs = ScanLog(str(root))
    store = warm_store(root, fs)
    try:
        watch = store._catalog._watch  # the overflow cannot be provoked without root's sysctl
        assert watch is not None
        watch.take(bytes(16))  # an event for no known watch: ignored
        fs.scans.clear()
        store.list()
        assert fs.scans == []
        watch.take(int.to_bytes(2**32 - 1, 4, "little") + IN_Q_OVERFLOW.to_bytes(4, "little") + bytes(8))
        grow(root, "s0")
        assert rows(store.list()) == reference(root)
        assert fs.scans == [(None, True)]
        fs.scans.clear()
        store.list()
        assert fs.scans == []  # vouched for again
    finally:
        store.close_store()


def test_folders_whose_watch_cannot_be_added_are_stat_ed_every_time(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for sid in IDS[:3]:
        publish(root, sid)
    fs = ScanLog(str(root))
    denied = encode_session_id("s1").encode()

    def open_watch(path: str) -> Watch | None:
        watch = Watch.open(str(root / path))
        assert watch is not None
        real = watch._add_watch

        def add_watch(fd: int, target: bytes, mask: int) -> int:
            if f"/{denied.decode()}".encode() in target:
                ctypes.set_errno(errno.ENOSPC)  # the per-user watch limit
                return -1
            return real(fd, target, mask)

        watch._add_watch = add_watch
        return watch

    fs.watch = open_watch  # type: ignore[method-assign]  # the seam under test, replaced per instance
    store = warm_store(root, fs)
    try:
        for step in range(3):
            fs.scans.clear()
            if step:
                grow(root, "s1")
            assert rows(store.list()) == reference(root)
            assert fs.scans == [(frozenset({"s1"}), True)]
    finally:
        store.close_store()


def test_a_file_system_not_known_to_be_local_is_not_watched(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()
    assert Watch.open(str(tmp_path / "sessions"), local=frozenset()) is None
    watch = Watch.open(str(tmp_path / "sessions"), local=LOCAL_FILE_SYSTEMS)
    if watch is None:
        pytest.fail(f"{tmp_path} is not on a local file system this test knows: {os.statvfs(tmp_path)}")
    watch.close()
    assert Watch.open(str(tmp_path / "missing")) is None


def test_without_change_notification_the_store_lists_with_stat_passes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    fs = ScanLog(str(root))
    fs.watch = lambda path: None  # type: ignore[method-assign]  # as on a network file system
    store = FileLogStore(fs=fs)
    try:
        for _ in range(3):
            grow(root, "s0")
            assert rows(store.list()) == reference(root)
        assert fs.scans == [(None, False)] * 3
    finally:
        store.close_store()


def test_a_sessions_folder_that_appears_later_is_watched_then(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    fs = ScanLog(str(root))
    store = FileLogStore(fs=fs)
    try:
        assert store.list() == []
        assert store.list() == []
        assert not store.watching
        publish(root, "s0")
        assert rows(store.list()) == reference(root)
        assert store.watching
        publish(root, "s1")
        assert rows(store.list()) == reference(root)
        assert len(rows(store.list())) == 2
    finally:
        store.close_store()


def test_watches_of_removed_folders_are_forgotten(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for sid in IDS:
        publish(root, sid)
    store = warm_store(root)
    try:
        watch = store._catalog._watch  # internal: the wd map is what would leak
        assert watch is not None
        watched = len(watch._folders)
        assert watched == 2 * len(IDS)  # each folder and its log
        for sid in IDS[1:]:
            m_remove_folder(root, sid, 0)
        store.list()
        store.list()  # the IN_IGNORED of the removed inodes may come after the removal's events
        assert len(watch._folders) == 2
    finally:
        store.close_store()


def test_a_sessions_folder_swapped_for_a_link_is_refused_when_warm(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    store = warm_store(root)
    try:
        elsewhere = tmp_path / "elsewhere"
        os.rename(root / "sessions", elsewhere)
        (root / "sessions").symlink_to(elsewhere)
        from subagents.storage import UnsafePath

        with pytest.raises(UnsafePath):
            store.list()
    finally:
        store.close_store()


def test_the_store_s_own_writes_show_in_its_warm_listings(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    store = warm_store(root)
    try:
        handle = store.create(header("s1"))
        assert rows(store.list()) == reference(root)  # created, not published: invisible
        for n in range(3):
            store.append(handle, [Batch(handle.next_seq, events(handle.next_seq, 1 + n))])
            assert rows(store.list()) == reference(root)
            assert store.stat("s1") == {i.id: i for i in store.list()}[SessionId("s1")]
        store.close(handle)
        assert {i.id: i.event_count for i in store.list()}[SessionId("s1")] == 6
    finally:
        store.close_store()


def test_listings_in_threads_beside_a_writer_end_with_what_is_on_disk(tmp_path: Path) -> None:
    import threading

    root = tmp_path / "root"
    for sid in IDS[:3]:
        publish(root, sid)
    store = warm_store(root)
    stop = threading.Event()
    failures: list[BaseException] = []

    def lister() -> None:
        try:
            while not stop.is_set():
                store.list()
        except BaseException as exc:  # reported below: a thread must not swallow it
            failures.append(exc)

    threads = [threading.Thread(target=lister) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for n in range(30):
            grow(root, IDS[n % 3])
            if n % 10 == 0:
                publish(root, f"s{3 + n // 10}")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    try:
        assert failures == []
        assert rows(store.list()) == reference(root)
    finally:
        store.close_store()


def test_a_log_skipped_after_an_io_error_is_retried_by_the_next_warm_listing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    publish(root, "s1")
    failing: set[str] = set()

    class FlakyFs(OsFs):
        def open(self, path: str, mode: Any) -> Any:
            if path in failing:
                failing.discard(path)
                raise OSError(errno.EIO, "input/output error", path)
            return super().open(path, mode)

    store = warm_store(root, FlakyFs(str(root)))
    try:
        grow(root, "s1")  # s1 must be read again by the next listing, which fails once
        failing.add(rel_log("s1", "zstd"))
        assert [i.id for i in store.list()] == ["s0"]  # skipped (and logged)
        assert rows(store.list()) == reference(root)  # no change since, and yet retried
    finally:
        store.close_store()


# --- review findings: races and leaks -------------------------------------------------------------


def kernel_watches(watch: Watch) -> int:
    with open(f"/proc/self/fdinfo/{watch._fd}") as info:
        return sum(1 for line in info if line.startswith("inotify wd:"))


def test_a_root_swapped_while_the_watch_is_set_up_is_noticed(tmp_path: Path) -> None:
    """The root replaced right after sessions/ is watched: the watch and the identity it keeps
    must be of the same folder, so the next listing sees the swap and makes a full pass."""
    root = tmp_path / "root"
    publish(root, "s0")
    armed = [False]

    class SwapFs(OsFs):
        def watch(self, path: str) -> Watch | None:
            watch = super().watch(path)
            assert watch is not None
            add = watch._add_watch

            def add_then_swap(fd: int, target: bytes, mask: int) -> int:
                wd = add(fd, target, mask)
                if armed[0] and (target.startswith(b"/proc/self/fd/") or target == os.fsencode(root / "sessions")):
                    armed[0] = False
                    m_replace_root(root, "s0", 0)
                return wd

            watch._add_watch = add_then_swap
            return watch

    store = FileLogStore(fs=SwapFs(str(root)))
    try:
        store.list()
        armed[0] = True
        store.list()  # sets the watch up; the root is swapped inside
        assert not armed[0]
        publish(root, "s1")  # in the root that is there now
        for _ in range(2):
            assert rows(store.list()) == reference(root)
    finally:
        store.close_store()


def test_watches_do_not_pile_up_when_roots_and_folders_come_and_go(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for sid in IDS[:5]:
        publish(root, sid)
    store = warm_store(root)
    try:
        watch = store._catalog._watch
        assert watch is not None
        for _ in range(4):
            m_replace_root(root, "s0", 0)  # full passes: each one starts a new instance
            assert rows(store.list()) == reference(root)
            watch = store._catalog._watch
            assert watch is not None and kernel_watches(watch) == 1 + 2 * 5
        for arg in (1, 1, 4, 2):  # folders renamed to free names and back
            for sid in IDS[:5]:
                m_rename_folder(root, sid, arg)
            assert rows(store.list()) == reference(root)
        aside = tmp_path / "aside"
        aside.mkdir()
        moved = [sid for sid in IDS if session_folder(root, sid).exists()][:3]
        for sid in moved:  # folders moved out of the root (kept alive elsewhere)
            os.rename(session_folder(root, sid), aside / sid)
        assert rows(store.list()) == reference(root) and 0 < len(reference(root)) < 5
        assert kernel_watches(watch) == 1 + 2 * len(reference(root))
        assert len(watch._folders) == 2 * len(reference(root))
    finally:
        store.close_store()


def test_each_full_pass_checks_the_file_system_again(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()
    watch = Watch.open(str(tmp_path / "sessions"))
    assert watch is not None
    assert watch.reset()
    watch._local = frozenset()  # as if the path now led to a file system not known to be local
    assert not watch.reset() and not watch.vouches
    watch.close()


def test_a_closed_store_lists_with_stat_passes_and_opens_no_instance(tmp_path: Path) -> None:
    root = tmp_path / "root"
    publish(root, "s0")
    before = inotify_fds()
    store = warm_store(root)
    store.close_store()
    assert inotify_fds() == before
    grow(root, "s0")
    assert rows(store.list()) == reference(root)
    assert rows(store.list()) == reference(root)
    assert inotify_fds() == before and not store.watching
