"""The storage face (`subagents.storage`) holds what embedders and the upper layers use; the test
doubles live in `subagents.storage.testing`; the format's line codecs and file names stay private."""

from __future__ import annotations

import subagents.storage as face
import subagents.storage.testing as testing
from subagents.storage import file_store

TEST_DOUBLES = {"CrashFs", "MemoryLogStore", "FaultyLogStore"}
FORMAT_INTERNALS = {
    "LOG_NAMES",
    "HeaderRecord",
    "encode_header_line",
    "decode_header_line",
    "encode_event",
    "decode_event",
    "encode_events",
    "decode_events",
    "KNOWN_TYPES",
    "FORMAT_VERSION",
}


def _exported(module: object) -> set[str]:
    return {name for name in vars(module) if not name.startswith("_")}


def test_the_face_leaves_out_the_test_doubles_and_the_format_internals() -> None:
    assert _exported(face) & (TEST_DOUBLES | FORMAT_INTERNALS) == set()


def test_the_test_doubles_come_from_storage_testing() -> None:
    assert TEST_DOUBLES <= _exported(testing)
    assert issubclass(testing.MemoryLogStore, face.FileLogStore)


def test_the_read_poll_and_the_projection_checkpoint_have_different_names() -> None:
    assert "Checkpoint" not in _exported(face)
    assert {"AbortPoll", "CheckpointRow", "StoredCheckpoint"} <= _exported(face)


def test_the_log_file_names_are_private_to_the_file_store() -> None:
    assert "LOG_NAMES" not in vars(file_store)
    assert sorted(file_store._LOG_NAMES) == ["none", "zstd"]  # noqa: SLF001 - the private table itself
