"""The zstd form of a log, as bytes: independent checksummed frames, walked by hand.

Frame 1 holds exactly the header line; each later frame holds the lines of one durable append
(whole lines). Decompressing the file yields exactly the plain form.

Theory of operation. The walk reads each frame's header and block headers (RFC 8878) over a
`memoryview` to find where the frame ends without decompressing — linear in the file, unlike a
`decompressobj` per frame — then decompresses each complete frame in one call, which verifies
its content checksum (`FrameWalk`). The walk reads the file through a window from the current
frame on, so a streaming read (forms: `ZstdForm.stream`) holds one frame and a bounded read-ahead,
never the file; `walk_frames` walks bytes held whole and appends every content to one buffer
(`ZstdLayout.body`): the plain bytes once plus one frame's content, never the contents apart and
then their join (a 500 MB log peaked at 3.1x its plain size that way). What remains after the
last complete frame is the tail:
- nothing, or only NUL bytes: no torn data (NUL padding is what a crash can leave);
- the start of a frame (the walk ran out of bytes inside it): a torn last frame. Its complete
  blocks are decompressed without verification (the checksum is missing) and their complete
  lines are *recovered*; a writer re-appends them as a new checksummed frame.
Anything else — a bad magic number, a reserved block type, a checksum or decoding failure inside
a complete frame — is corruption at that frame's byte offset. A torn or damaged header frame is
corruption too: publication is atomic.

Each thread keeps one decompressor for its walks (`thread_decompressor`: making one costs about
15 µs, and a read walks a log once or twice); one is never shared between threads (a shared one
has crashed the interpreter here).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

import attrs
import zstandard

__all__ = [
    "Frame",
    "FrameDamage",
    "FrameWalk",
    "ZstdLayout",
    "compress_frame",
    "frame_end",
    "new_compressor",
    "walk_frames",
]

_MAGIC = b"\x28\xb5\x2f\xfd"
_FCS_SIZES = (0, 2, 4, 8)
_DICT_ID_SIZES = (0, 1, 2, 4)
_LEVEL = 3
_MAX_HEADER = 4 + 14  # magic number and the largest frame header
# The most content a frame can hold per byte: a block of at most 128 KiB takes at least 4 bytes
# (an RLE block). A header that claims more is hostile: refused before anything is allocated.
_MAX_RATIO = (128 << 10) // 4


class _PerThread(threading.local):
    # Each thread keeps one of each: making one costs several times what compressing a group
    # commit's frame does (issue 28 item 3), and zstd contexts are unsafe across threads.
    decompressor: zstandard.ZstdDecompressor | None = None
    compressor: zstandard.ZstdCompressor | None = None


_per_thread = _PerThread()


def thread_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor (each call of `decompress` starts afresh; never handed to
    another thread)."""
    decompressor = _per_thread.decompressor
    if decompressor is None:
        decompressor = _per_thread.decompressor = zstandard.ZstdDecompressor()
    return decompressor


class FrameDamage(Exception):
    """A complete frame that cannot be trusted; `offset` is where it starts in the file."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


@attrs.frozen(eq=False)
class ZstdLayout:
    frames: tuple[tuple[int, int], ...]  # (start, end) of every complete frame, in file order
    # The complete frames' contents end to end, then the recovered lines: one copy of the plain
    # form. Frame i's content is body[starts[i]:starts[i + 1]]. Decoded events reference it
    # (msgspec.Raw), so nothing may write to it after the walk.
    body: bytearray
    starts: tuple[int, ...]  # len(frames) + 1 offsets into `body`
    recovered: bytes  # complete lines of a torn last frame (unverified), else b""
    complete_end: int  # just after the last complete frame
    size: int

    def content(self, index: int) -> memoryview:
        """Frame `index`'s decompressed content (a view into `body`)."""
        return memoryview(self.body)[self.starts[index] : self.starts[index + 1]]

    @property
    def contents(self) -> tuple[bytes, ...]:
        """Every complete frame's content as bytes (copies: for logs of a few frames)."""
        return tuple(bytes(self.content(i)) for i in range(len(self.frames)))

    @property
    def torn(self) -> bool:
        return self.complete_end < self.size

    @property
    def header_end(self) -> int:
        """Just after the header frame (the first)."""
        return self.frames[0][1]


# A compressor keeps the memory of the largest input it compressed (~0.4 MB at 64 KB): the one
# a thread keeps takes inputs up to this size; a larger one gets a compressor of its own, for
# which making it is a small part of the work.
_KEEP_COMPRESSOR_UPTO = 64 << 10


def compress_frame(data: bytes, compressor: zstandard.ZstdCompressor | None = None) -> bytes:
    """One checksummed frame holding `data` (its content size in the header). Each `compress`
    is a whole frame, so a compressor is reused: this thread's (for inputs up to 64 KB),
    unless one is given."""
    if compressor is None:
        if len(data) > _KEEP_COMPRESSOR_UPTO:
            compressor = new_compressor()
        else:
            compressor = _per_thread.compressor
            if compressor is None:
                compressor = _per_thread.compressor = new_compressor()
    return compressor.compress(data)


def new_compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=_LEVEL, write_checksum=True, write_content_size=True)


def frame_end(view: memoryview, start: int) -> int | None:
    """Where the frame starting at `start` ends, or `None` if the bytes run out first.

    Raises `FrameDamage` for something that is not the start of a frame we write.
    """
    size = len(view)
    if start + 5 > size:
        if bytes(view[start:]) != _MAGIC[: size - start]:
            raise FrameDamage("not a zstd frame (bad magic number)", start)
        return None
    if view[start : start + 4] != _MAGIC:  # pyright: ignore[reportUnnecessaryComparison]  # a memoryview equals the bytes it holds
        raise FrameDamage("not a zstd frame (bad magic number)", start)
    descriptor = view[start + 4]
    fcs_flag = descriptor >> 6
    single_segment = (descriptor >> 5) & 1
    if (descriptor >> 3) & 1:
        raise FrameDamage("reserved bit set in the frame header", start)
    if not (descriptor >> 2) & 1:
        # Format 1 frames carry content checksums; without one, the 4 bytes after the last
        # block would be taken for the next frame.
        raise FrameDamage("the frame has no content checksum", start)
    header = 1 + (0 if single_segment else 1) + _DICT_ID_SIZES[descriptor & 3]
    header += _FCS_SIZES[fcs_flag] if (fcs_flag or not single_segment) else 1
    pos = start + 4 + header
    while True:
        if pos + 3 > size:
            return None
        block = view[pos] | (view[pos + 1] << 8) | (view[pos + 2] << 16)
        last = block & 1
        kind = (block >> 1) & 3
        length = block >> 3
        if kind == 3:
            raise FrameDamage("reserved block type", start)
        pos += 3 + (1 if kind == 1 else length)
        if last:
            break
    pos += 4
    return pos if pos <= size else None


def walk_frames(data: bytes) -> ZstdLayout:
    """Split a zstd log held whole into its complete frames, their contents and a torn tail.

    Raises `FrameDamage` for damage inside a complete frame or a frame-level mess.
    """
    walk = FrameWalk.over(data)
    frames: list[tuple[int, int]] = []
    body = bytearray()
    starts = [0]
    for frame in walk:
        frames.append((frame.start, frame.end))
        body += frame.content  # grown in place (realloc): one frame's content is held apart at a time
        starts.append(len(body))
    body += walk.recovered
    return ZstdLayout(
        frames=tuple(frames),
        body=body,
        starts=tuple(starts),
        recovered=walk.recovered,
        complete_end=walk.complete_end,
        size=walk.size,
    )


Read = Callable[[int, int], "bytes | memoryview"]  # (offset, length) -> at most that many bytes


class Frame(NamedTuple):
    """A complete frame met by a walk: where it lies in the file, its bytes and its content.
    (A named tuple: a walk makes one per frame, and a log may hold one frame per event.)"""

    start: int
    end: int
    raw: memoryview  # the frame as stored (a view into the walk's window: use it before the next)
    content: bytes  # decompressed, checksum verified


class FrameWalk:
    """The walk of a zstd log's frames, in file order, reading through `read(offset, length)`.

    Iterating yields every complete `Frame`; when it ends, `recovered` holds the complete lines of
    a torn last frame and `complete_end` where the last complete frame ends. It holds a window of
    the file from the current frame on: at least `ahead` bytes (or up to the end), grown to hold
    one whole frame when a frame is longer — so a streaming read holds one frame's raw bytes
    and content, plus `ahead`, never the file. Over bytes held whole (`over`) the window is
    those bytes and nothing is copied.
    """

    def __init__(self, read: Read, size: int, *, ahead: int = 1 << 20) -> None:
        self._read = read
        self.size = size
        self._ahead = ahead
        self.padding = _nul_run_start(read, size)
        self.recovered = b""
        self.complete_end = 0
        self._window: bytes | memoryview = b""
        self._base = 0  # the file offset of the window's first byte

    @classmethod
    def over(cls, data: bytes) -> FrameWalk:
        """A walk of bytes held whole."""
        view = memoryview(data)
        walk = cls(lambda offset, length: view[offset : offset + length], len(data))
        walk._window = data
        return walk

    def _hold(self, pos: int, need: int) -> tuple[memoryview, int]:
        """The window as a view of all of it, holding at least `[pos, pos + need)` of the file
        (or up to its end), and where `pos` is in it. A window that falls short is read anew
        from `pos`, `ahead` bytes beyond what is needed: the bytes kept (less than a frame)
        are copied once per window, not once per frame."""
        stop = min(self.size, pos + need)
        window, base = self._window, self._base
        if pos < base or stop > base + len(window):
            kept = bytes(window[pos - base :]) if base <= pos < base + len(window) else b""
            stop = min(self.size, pos + need + self._ahead)
            more = self._read(pos + len(kept), stop - pos - len(kept))
            window = kept + bytes(more) if kept else bytes(more)
            if len(window) < stop - pos:
                raise OSError(f"the log ended at byte {pos + len(window)}, before byte {stop}")
            self._window, self._base = window, base = window, pos
        # `_complete_frame_after` searches `view.obj`: the view must span its whole object.
        return memoryview(window), pos - base

    def __iter__(self) -> Iterator[Frame]:
        padding, size = self.padding, self.size
        decompressor = thread_decompressor()
        pos = 0
        need = 2 * _MAX_HEADER  # enough to tell a header torn into the padding from damage
        view, base = memoryview(self._window), self._base
        while pos < padding:
            if pos + need > base + len(view) and base + len(view) < size:
                view, at = self._hold(pos, need)
                base = pos - at
            at = pos - base
            held = len(view) - at  # bytes from `pos` in the window
            try:
                end = frame_end(view, at)
            except FrameDamage as exc:
                if _header_torn_into_padding(view, at, padding - pos + at, size - pos + at):
                    break  # the start of a frame header, then the zeros a crash left
                raise FrameDamage(exc.reason, pos) from None
            if end is None:
                if pos + held < size:
                    need = 2 * held  # a frame longer than the window: hold all of it
                    continue
                # Only the last frame can be torn: a frame that seems to run past the end while a
                # complete frame follows it had its sizes damaged.
                if _complete_frame_after(view, at + 4, padding - pos + at):
                    raise FrameDamage("the frame's sizes run past later frames", pos)
                self.recovered = _recover(view[at : padding - pos + at])
                break
            frame = view[at:end]
            try:
                content = _decompress(decompressor, frame)
            except MemoryError:
                raise FrameDamage("the frame's content does not fit in memory", pos) from None
            except zstandard.ZstdError as exc:
                # A last frame that runs into the zeros a crash left at the end of the file (it
                # grew, its last pages never reached the disk) is torn, not damaged.
                if padding < pos + end - at:
                    self.recovered = _recover(view[at : padding - pos + at])
                    break
                raise FrameDamage(f"the frame does not decompress ({exc})", pos) from None
            start, pos = pos, pos + end - at
            self.complete_end = pos
            need = 2 * _MAX_HEADER
            yield Frame(start, pos, frame, content)
            del frame, content


def _nul_run_start(read: Read, size: int) -> int:
    """Where the run of NUL bytes that ends the file starts (`size` if there is none)."""
    end = size
    window = 1 << 16
    while end > 0:
        start = max(0, end - window)
        kept = len(bytes(read(start, end - start)).rstrip(b"\x00"))
        if kept:
            return start + kept
        end = start
    return 0


def _header_torn_into_padding(view: memoryview, pos: int, padding: int, size: int) -> bool:
    if padding == size or pos + _MAX_HEADER < padding:
        return False
    kept = bytes(view[pos:padding])
    return _MAGIC.startswith(kept) or kept.startswith(_MAGIC)


def _decompress(decompressor: zstandard.ZstdDecompressor, frame: memoryview) -> bytes:
    """One whole frame, checksum verified; frames whose header omits the content size (what
    streaming compressors write) go through a one-frame decompressobj."""
    size = zstandard.frame_content_size(frame)
    if size > _MAX_RATIO * len(frame):
        raise zstandard.ZstdError(f"the frame claims {size} bytes of content, more than it can hold")
    if size >= 0:
        return decompressor.decompress(frame)
    stream = decompressor.decompressobj()
    content = stream.decompress(frame)
    if not stream.eof:
        raise zstandard.ZstdError("the frame ended early")
    return content


def _complete_frame_after(view: memoryview, start: int, stop: int, tries: int = 64) -> bool:
    """Whether a frame that parses and decompresses starts somewhere in `view[start:stop]`."""
    obj = view.obj
    data = obj if isinstance(obj, bytes) and len(obj) == view.nbytes else bytes(view)  # offsets agree
    pos = start
    for _ in range(tries):
        pos = data.find(_MAGIC, pos, stop)
        if pos < 0:
            return False
        try:
            end = frame_end(view, pos)
            if end is not None and end <= stop:
                _decompress(zstandard.ZstdDecompressor(), view[pos:end])
                return True
        except (FrameDamage, zstandard.ZstdError, MemoryError):
            pass  # not a frame here (magic bytes inside data): try the next occurrence
        pos += 1
    return False


def _recover(torn: memoryview) -> bytes:
    """The complete lines that the complete blocks of a torn frame hold (unverified)."""
    try:
        partial = zstandard.ZstdDecompressor().decompressobj().decompress(torn)
    except (zstandard.ZstdError, MemoryError):
        return b""  # a torn frame whose blocks do not decode recovers nothing
    cut = partial.rfind(b"\n") + 1
    return partial[:cut]
