"""zstd frames are compressed with one compressor per thread (issue 28 item 3): making a
compressor costs several times what compressing one group commit's frame does, so a writer
thread keeps its own, and no compressor is ever used by two threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from log_lines import header
from subagents.storage import Batch, FileLogStore, Offset, make_event, zstd_framing


def _in_new_thread(fn: Callable[[], Any]) -> Any:
    """`fn()` in a thread of its own (a thread starts with no compressor)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    assert out, "the thread failed"
    return out[0]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """The threads that made a compressor, one entry per compressor made."""
    real = zstandard.ZstdCompressor
    makers: list[threading.Thread] = []

    def counting(*args: Any, **kwargs: Any) -> zstandard.ZstdCompressor:
        makers.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(zstandard, "ZstdCompressor", counting)
    return makers


def test_a_writer_thread_makes_one_compressor_for_all_its_appends(tmp_path: Path, made: list[threading.Thread]) -> None:
    store = FileLogStore(str(tmp_path))

    def write(sid: str) -> list[bytes]:
        handle = store.create(header(sid))
        try:
            for seq in range(5):
                store.append(handle, [Batch(Offset(seq), [make_event(seq, "step/start", 1, {"turn": 1, "step": seq})])])
            reader = store.open_read(sid)
            try:
                return [bytes(e.data) for e in store.read(reader)]
            finally:
                store.close(reader)
        finally:
            store.close(handle)

    try:
        first = _in_new_thread(lambda: write("a"))
        second = _in_new_thread(lambda: write("b"))
    finally:
        store.close_store()
    want = [b'{"turn":1,"step":%d}' % seq for seq in range(5)]
    assert first == want and second == want
    # A header frame and five append frames per session: one compressor per writer thread.
    assert len(made) == 2 and made[0] is not made[1]


def test_a_reused_compressor_writes_the_frame_a_fresh_one_writes(made: list[threading.Thread]) -> None:
    payloads = [b"", b"x\n", b'{"seq":0}\n' * 500, bytes(range(256)) * 64]

    def frames() -> list[bytes]:
        return [zstd_framing.compress_frame(p) for p in payloads]

    reused = _in_new_thread(frames)
    assert len(made) == 1
    fresh = [zstd_framing.compress_frame(p, zstd_framing.new_compressor()) for p in payloads]
    assert reused == fresh
    assert [zstandard.ZstdDecompressor().decompress(f) for f in reused] == payloads
