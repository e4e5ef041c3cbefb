"""The error tree's root and its storage branch.

Every error this project raises on purpose is a `SubagentsError`: a `message` and a fixed,
prefixed `code` per class (never passed in, never matched as a string: catch the class). Each
layer writes its branch out at the top of its own `errors.py`:

    SubagentsError                SUBAGENTS_ERROR
    ├── StorageError              STORAGE_*     storage/errors.py (below)
    ├── ActorError                ACTOR_*       actors/errors.py
    └── the runtime's branches    QUERY_*, SUBAGENT_*, MODEL_*, SCRIPT_*, CLI_*
                                                runtime/foundation/errors.py

A tool result that failed carries an error record `{name, code}` (docs/format.md, "tool/result")
whose names and codes are pinned by the vocabulary, older than this tree: `record()` gives it.
By default it is the class name and code; a branch whose pinned record differs (the subagent
service's `SubagentError` / `UNAUTHORIZED`, ...) sets `record_name` and `record_code`.

The storage branch. Foreign exceptions (OSError, msgspec and JSON errors) are mapped into it
once, where storage meets them; nothing else leaks out of the public API.

    StorageError                  STORAGE_ERROR
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
    ├── OwnershipLost             STORAGE_OWNERSHIP_LOST         (a stale writer's lease epoch: nothing written)
    ├── UnsafePath                STORAGE_UNSAFE_PATH            (a planted symlink, a non-folder)
    ├── PersistenceFailed         STORAGE_PERSISTENCE_FAILED     (an OSError)
    ├── CorruptLog                STORAGE_CORRUPT_LOG            (names session and seq or offset)
    │   └── InvalidPayload        STORAGE_INVALID_PAYLOAD        (a known type's data is malformed)
    ├── UnsupportedLog            STORAGE_UNSUPPORTED_FORMAT     (another format; a PostgreSQL store's newer schema)
    │   └── UnsupportedEvent      STORAGE_UNSUPPORTED_EVENT      (an event type this build lacks)
    ├── InvalidStoreUrl           STORAGE_INVALID_STORE_URL      (not a PostgreSQL URL psycopg accepts)
    ├── StoreUnreachable          STORAGE_STORE_UNREACHABLE      (no connection: refused, auth, no database; no answer in time)
    ├── StoreNotInitialized       STORAGE_STORE_NOT_INITIALIZED  (a PostgreSQL store without its schema, opened read-only)
    ├── UnknownProjection         STORAGE_UNKNOWN_PROJECTION     (also a KeyError)
    ├── ProjectionBroken          STORAGE_PROJECTION_BROKEN      (a unit's apply or view raised)
    ├── InvalidEnvelope           STORAGE_INVALID_ENVELOPE       (a mailbox envelope refused)
    ├── InvalidDeliveryId         STORAGE_INVALID_DELIVERY_ID    (not a canonical ULID)
    └── DeliveryConflict          STORAGE_DELIVERY_CONFLICT      (one delivery id, two envelopes)

Signals that never leave storage are not part of the tree: `records.HeaderError` (line 1 is no
format-1 header; always turned into `CorruptLog`/`UnsupportedLog`), `zstd_framing.FrameDamage`
(a frame to cut or refuse) and `fs.NotRegularFile` (an `OSError`, mapped like one).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AlreadyOwned",
    "CorruptLog",
    "DeliveryConflict",
    "HandleClosed",
    "HandleDead",
    "InvalidDeliveryId",
    "InvalidEnvelope",
    "InvalidEvent",
    "InvalidHeader",
    "InvalidPayload",
    "InvalidRange",
    "InvalidSessionId",
    "InvalidStoreUrl",
    "NonLosslessData",
    "OwnershipLost",
    "PersistenceFailed",
    "SequenceConflict",
    "SessionAlreadyExists",
    "ProjectionBroken",
    "SessionNotFound",
    "StorageError",
    "StoreNotInitialized",
    "StoreUnreachable",
    "SubagentsError",
    "UnknownProjection",
    "UnsafePath",
    "UnsupportedEvent",
    "UnsupportedLog",
]


class SubagentsError(Exception):
    """The root of every error this project raises on purpose."""

    code: ClassVar[str] = "SUBAGENTS_ERROR"
    record_name: ClassVar[str | None] = None  # None: the class name
    record_code: ClassVar[str | None] = None  # None: `code`

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def record(self) -> dict[str, str]:
        """The `{name, code}` a failed tool result records for this error."""
        return {"name": self.record_name or type(self).__name__, "code": self.record_code or self.code}


class StorageError(SubagentsError):
    code = "STORAGE_ERROR"


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


class _AboutSession(Exception):
    """Mixed into the errors about one session that need nothing else to say it: the message is
    `session <id> <says>`, and `session_id` is kept. (An `Exception` so that its `super()` is
    one to the type checker too; in the classes' order it still comes before their branch.)"""

    says: ClassVar[str]

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} {self.says}")
        self.session_id = session_id


class SessionNotFound(_AboutSession, StorageError):
    code = "STORAGE_SESSION_NOT_FOUND"
    says = "not found"


class SessionAlreadyExists(_AboutSession, StorageError):
    code = "STORAGE_SESSION_ALREADY_EXISTS"
    says = "already exists"


class AlreadyOwned(_AboutSession, StorageError):
    code = "STORAGE_ALREADY_OWNED"
    says = "is already owned by an active write handle"


class SequenceConflict(StorageError):
    code = "STORAGE_SEQUENCE_CONFLICT"

    def __init__(self, session_id: str, *, expected: int, actual: int) -> None:
        super().__init__(f"session {session_id!r}: append expected next seq {expected}, but the log is at {actual}")
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


class OwnershipLost(StorageError):
    """The writer's lease on the session (PostgreSQL store, SPEC §9) is no longer its own: another
    host took it over, with a higher epoch. Nothing was written; the handle never writes again."""

    code = "STORAGE_OWNERSHIP_LOST"

    def __init__(self, session_id: str, epoch: int) -> None:
        super().__init__(
            f"session {session_id!r}: ownership lost: its lease (epoch {epoch}) was taken over by another "
            "writer; nothing was written"
        )
        self.session_id = session_id
        self.epoch = epoch


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
        where: list[str] = []
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
    """An intact log this build cannot interpret: another format. With `session_id` None, a
    whole store this build cannot interpret (a PostgreSQL store of a newer schema version)."""

    code = "STORAGE_UNSUPPORTED_FORMAT"

    def __init__(self, session_id: str | None, reason: str, *, seq: int | None = None) -> None:
        super().__init__(reason if session_id is None else f"session {session_id!r} is unsupported: {reason}")
        self.session_id = session_id
        self.reason = reason
        self.seq = seq


class UnsupportedEvent(UnsupportedLog):
    """An intact log holding an event type this build does not know (at `seq`)."""

    code = "STORAGE_UNSUPPORTED_EVENT"


class InvalidStoreUrl(StorageError, ValueError):
    """A store URL that is not a PostgreSQL connection URL (its password never in the message)."""

    code = "STORAGE_INVALID_STORE_URL"


class StoreUnreachable(StorageError):
    """No connection to the PostgreSQL store: refused, unknown host, failed authentication or no
    such database; or a read it did not answer within its statement timeout (pg_timeouts). One
    line, the URL without its password."""

    code = "STORAGE_STORE_UNREACHABLE"


class StoreNotInitialized(StorageError):
    """A PostgreSQL store opened without creating its schema (`create_schema=False`, what
    read-only commands do) holds no schema, or an older one not yet migrated. One line, the URL
    without its password, naming `subagents store init`."""

    code = "STORAGE_STORE_NOT_INITIALIZED"


class UnknownProjection(StorageError, KeyError):
    """A snapshot named a key no unit has, or a host-only unit (which has no view)."""

    code = "STORAGE_UNKNOWN_PROJECTION"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class ProjectionBroken(StorageError):
    """A unit's `apply` or `view` raised: its key cannot be served for this session."""

    code = "STORAGE_PROJECTION_BROKEN"

    def __init__(self, key: str, cause: BaseException) -> None:
        super().__init__(f"projection {key!r} is broken: {type(cause).__name__}: {cause}")
        self.key = key
        self.cause = cause


class InvalidEnvelope(StorageError, ValueError):
    """A mailbox envelope that cannot be delivered (or, read back, must be moved aside)."""

    code = "STORAGE_INVALID_ENVELOPE"


class InvalidDeliveryId(StorageError, ValueError):
    code = "STORAGE_INVALID_DELIVERY_ID"


class DeliveryConflict(StorageError):
    """A delivery id already delivered to the session with another envelope."""

    code = "STORAGE_DELIVERY_CONFLICT"

    def __init__(self, session_id: str, delivery_id: str) -> None:
        super().__init__(
            f"session {session_id!r}: delivery {delivery_id} is already in its mailbox with another envelope"
        )
        self.session_id = session_id
        self.delivery_id = delivery_id
