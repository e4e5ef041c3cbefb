"""The zstd form of a log, as bytes: independent checksummed frames, walked by hand.

Frame 1 holds exactly the header line; each later frame holds the lines of one durable append
(whole lines). Decompressing the file yields exactly the plain form.

Theory of operation. The walk reads each frame's header and block headers (RFC 8878) over a
`memoryview` to find where the frame ends without decompressing — linear in the file, unlike a
`decompressobj` per frame — then decompresses each complete frame in one call, which verifies
its content checksum, and appends its content to one buffer (`ZstdLayout.body`): a walk holds the
plain bytes once plus one frame's content, never the contents apart and then their join (a
500 MB log peaked at 3.1x its plain size that way). What remains after the last complete frame is the tail:
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

import attrs
import zstandard

__all__ = ["FrameDamage", "ZstdLayout", "compress_frame", "frame_end", "new_compressor", "walk_frames"]

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
    """Split a zstd log into its complete frames, their contents and a torn tail.

    Raises `FrameDamage` for damage inside a complete frame or a frame-level mess.
    """
    view = memoryview(data)
    size = len(data)
    padding = _nul_run_start(data)
    decompressor = thread_decompressor()
    frames: list[tuple[int, int]] = []
    body = bytearray()
    starts = [0]
    pos = 0
    recovered = b""
    while pos < padding:
        try:
            end = frame_end(view, pos)
        except FrameDamage:
            if _header_torn_into_padding(data, pos, padding, size):
                break  # the start of a frame header, then the zeros a crash left
            raise
        if end is None:
            # Only the last frame can be torn: a frame that seems to run past the end while a
            # complete frame follows it had its sizes damaged.
            if _complete_frame_after(view, pos + 4, padding):
                raise FrameDamage("the frame's sizes run past later frames", pos)
            recovered = _recover(view[pos:padding])
            break
        try:
            content = _decompress(decompressor, view[pos:end])
        except MemoryError:
            raise FrameDamage("the frame's content does not fit in memory", pos) from None
        except zstandard.ZstdError as exc:
            # A last frame that runs into the zeros a crash left at the end of the file (it
            # grew, its last pages never reached the disk) is torn, not damaged.
            if padding < end:
                recovered = _recover(view[pos:padding])
                break
            raise FrameDamage(f"the frame does not decompress ({exc})", pos) from None
        frames.append((pos, end))
        body += content  # grown in place (realloc): one frame's content is held apart at a time
        del content
        starts.append(len(body))
        pos = end
    complete_end = frames[-1][1] if frames else 0
    body += recovered
    return ZstdLayout(
        frames=tuple(frames),
        body=body,
        starts=tuple(starts),
        recovered=recovered,
        complete_end=complete_end,
        size=size,
    )


def _nul_run_start(data: bytes) -> int:
    """Where the run of NUL bytes that ends the file starts (`len(data)` if there is none)."""
    end = len(data)
    window = 1 << 16
    while end > 0:
        start = max(0, end - window)
        kept = len(data[start:end].rstrip(b"\x00"))
        if kept:
            return start + kept
        end = start
    return 0


def _header_torn_into_padding(data: bytes, pos: int, padding: int, size: int) -> bool:
    if padding == size or pos + _MAX_HEADER < padding:
        return False
    kept = data[pos:padding]
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
    data = view.obj if isinstance(view.obj, bytes) else bytes(view)
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
