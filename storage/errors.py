"""The storage error tree.

Every error the storage layer raises on purpose is a `StorageError` with a stable `code`.
Foreign exceptions (OSError, msgspec and JSON errors) are mapped into this tree once, where
storage meets them; nothing else leaks out of the public API.

    StorageError
    ├── InvalidSessionId          STORAGE_INVALID_SESSION_ID
    ├── InvalidHeader             STORAGE_INVALID_HEADER         (refused at create)
    ├── InvalidEvent              STORAGE_INVALID_EVENT          (refused at append)
    │   └── NonLosslessData       STORAGE_NON_LOSSLESS_DATA
    ├── InvalidRange              STORAGE_INVALID_RANGE          (a read range or offset)
    ├── SessionNotFound           STORAGE_SESSION_NOT_FOUND
    ├── SessionAlreadyExists      STORAGE_SESSION_ALREADY_EXISTS
    ├── AlreadyOwned              STORAGE_ALREADY_OWNED
    ├── SequenceConflict          STORAGE_SEQUENCE_CONFLICT
    ├── HandleClosed              STORAGE_HANDLE_CLOSED
    ├── HandleDead                STORAGE_HANDLE_DEAD
    ├── UnsafePath                STORAGE_UNSAFE_PATH            (a planted symlink, a non-folder)
    ├── PersistenceFailed         STORAGE_PERSISTENCE_FAILED     (an OSError)
    ├── CorruptLog                STORAGE_CORRUPT_LOG            (names session and seq or offset)
    │   └── InvalidPayload        STORAGE_INVALID_PAYLOAD        (a known type's data is malformed)
    └── UnsupportedLog            STORAGE_UNSUPPORTED_FORMAT | STORAGE_UNSUPPORTED_EVENT
"""

from __future__ import annotations

__all__ = [
    "AlreadyOwned",
    "CorruptLog",
    "HandleClosed",
    "HandleDead",
    "InvalidEvent",
    "InvalidHeader",
    "InvalidPayload",
    "InvalidRange",
    "InvalidSessionId",
    "NonLosslessData",
    "PersistenceFailed",
    "SequenceConflict",
    "SessionAlreadyExists",
    "SessionNotFound",
    "StorageError",
    "UnsafePath",
    "UnsupportedLog",
]


class StorageError(Exception):
    code: str = "STORAGE_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidSessionId(StorageError, ValueError):
    code = "STORAGE_INVALID_SESSION_ID"


class InvalidHeader(StorageError, ValueError):
    code = "STORAGE_INVALID_HEADER"


class InvalidEvent(StorageError, ValueError):
    code = "STORAGE_INVALID_EVENT"


class NonLosslessData(InvalidEvent):
    code = "STORAGE_NON_LOSSLESS_DATA"


class InvalidRange(StorageError, ValueError):
    code = "STORAGE_INVALID_RANGE"


class SessionNotFound(StorageError):
    code = "STORAGE_SESSION_NOT_FOUND"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found")
        self.session_id = session_id


class SessionAlreadyExists(StorageError):
    code = "STORAGE_SESSION_ALREADY_EXISTS"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists")
        self.session_id = session_id


class AlreadyOwned(StorageError):
    code = "STORAGE_ALREADY_OWNED"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} is already owned by an active write handle")
        self.session_id = session_id


class SequenceConflict(StorageError):
    code = "STORAGE_SEQUENCE_CONFLICT"

    def __init__(self, session_id: str, *, expected: int, actual: int) -> None:
        super().__init__(
            f"session {session_id!r}: append expected next seq {expected}, but the log is at {actual}"
        )
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class HandleClosed(StorageError):
    code = "STORAGE_HANDLE_CLOSED"

    def __init__(self, session_id: str, op: str) -> None:
        super().__init__(f"session {session_id!r}: {op} on a closed handle")
        self.session_id = session_id


class HandleDead(StorageError):
    code = "STORAGE_HANDLE_DEAD"

    def __init__(self, session_id: str, cause: str) -> None:
        super().__init__(
            f"session {session_id!r}: write handle is dead after a failed fsync ({cause}); "
            "reopen the session to validate what reached the disk"
        )
        self.session_id = session_id


class UnsafePath(StorageError):
    code = "STORAGE_UNSAFE_PATH"


class PersistenceFailed(StorageError):
    code = "STORAGE_PERSISTENCE_FAILED"


class CorruptLog(StorageError):
    """A log that cannot be trusted: never silently truncated, always located."""

    code = "STORAGE_CORRUPT_LOG"

    def __init__(
        self,
        session_id: str,
        reason: str,
        *,
        seq: int | None = None,
        offset: int | None = None,
    ) -> None:
        where = []
        if seq is not None:
            where.append(f"seq {seq}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        at = f" at {', '.join(where)}" if where else ""
        super().__init__(f"session {session_id!r} is corrupt{at}: {reason}")
        self.session_id = session_id
        self.reason = reason
        self.seq = seq
        self.offset = offset


class InvalidPayload(CorruptLog):
    code = "STORAGE_INVALID_PAYLOAD"


class UnsupportedLog(StorageError):
    """An intact log this build cannot interpret (another format, an unknown event type)."""

    code = "STORAGE_UNSUPPORTED_FORMAT"

    def __init__(
        self,
        session_id: str,
        reason: str,
        *,
        code: str = "STORAGE_UNSUPPORTED_FORMAT",
        seq: int | None = None,
    ) -> None:
        super().__init__(f"session {session_id!r} is unsupported: {reason}")
        self.code = code
        self.session_id = session_id
        self.reason = reason
        self.seq = seq
