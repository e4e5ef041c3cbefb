"""Storage: values, the event codec, log format 1, the synchronous log stores and the mailbox.

The bottom layer: imports only the stdlib, attrs, cattrs, msgspec and zstandard, never trio;
psycopg only when a `PostgresLogStore` or `PostgresMailbox` is opened.
This module is its face: the upper layers and embedders import only from here (tests/test_layers.py
checks it). The test doubles (`CrashFs`, `MemoryLogStore`, `MemoryMailbox`, `FaultyLogStore`) are in
`subagents.storage.testing`; the format's line codecs (`_codec`, `_records`) and file names
(`file_store._LOG_NAMES`) are private to storage and its tests.
"""

from ._codec import UNSET as UNSET
from ._codec import Event as Event
from ._codec import ReplaceOp as ReplaceOp
from ._codec import SurfaceOp as SurfaceOp
from ._codec import check_lossless as check_lossless
from ._codec import decode_payload as decode_payload
from ._codec import make_event as make_event
from .closers import TOOL_OUTCOME_UNKNOWN_TEXT as TOOL_OUTCOME_UNKNOWN_TEXT
from .closers import interrupted_closers as interrupted_closers
from .continuation import CatalogedChild as CatalogedChild
from .continuation import Continuation as Continuation
from .continuation import PendingCall as PendingCall
from .continuation import plan_continuation as plan_continuation
from .envelope import DeliveryIds as DeliveryIds
from .envelope import Envelope as Envelope
from .envelope import EnvelopeKind as EnvelopeKind
from .errors import AlreadyOwned as AlreadyOwned
from .errors import CorruptLog as CorruptLog
from .errors import DeliveryConflict as DeliveryConflict
from .errors import HandleClosed as HandleClosed
from .errors import HandleDead as HandleDead
from .errors import InvalidDeliveryId as InvalidDeliveryId
from .errors import InvalidEnvelope as InvalidEnvelope
from .errors import InvalidEvent as InvalidEvent
from .errors import InvalidHeader as InvalidHeader
from .errors import InvalidPayload as InvalidPayload
from .errors import InvalidRange as InvalidRange
from .errors import InvalidSessionId as InvalidSessionId
from .errors import InvalidStoreUrl as InvalidStoreUrl
from .errors import NonLosslessData as NonLosslessData
from .errors import OwnershipLost as OwnershipLost
from .errors import PersistenceFailed as PersistenceFailed
from .errors import ProjectionBroken as ProjectionBroken
from .errors import SequenceConflict as SequenceConflict
from .errors import SessionAlreadyExists as SessionAlreadyExists
from .errors import SessionNotFound as SessionNotFound
from .errors import StorageError as StorageError
from .errors import StoreNotInitialized as StoreNotInitialized
from .errors import StoreUnreachable as StoreUnreachable
from .errors import SubagentsError as SubagentsError
from .errors import UnknownProjection as UnknownProjection
from .errors import UnsafePath as UnsafePath
from .errors import UnsupportedEvent as UnsupportedEvent
from .errors import UnsupportedLog as UnsupportedLog
from .events import SURFACE_TYPES as SURFACE_TYPES
from .events import SubagentCatalogData as SubagentCatalogData
from .file_store import FileLogStore as FileLogStore
from .fs import Fs as Fs
from .fs import OsFs as OsFs
from .index_rows import StoredCheckpoint as StoredCheckpoint
from .log_store import Batch as Batch
from .log_store import CheckpointRows as CheckpointRows
from .log_store import LeasedStore as LeasedStore
from .log_store import LogReader as LogReader
from .log_store import LogStore as LogStore
from .log_store import LogWriter as LogWriter
from .log_store import WriteHandle as WriteHandle
from .log_watch import LogWatch as LogWatch
from .mailbox import FileMailbox as FileMailbox
from .mailbox import Mailbox as Mailbox
from .mailbox_watch import LocalWakeups as LocalWakeups
from .mailbox_watch import MailboxWatch as MailboxWatch
from .pg_connect import redact_url as redact_url
from .pg_mailbox import PostgresMailbox as PostgresMailbox
from .pg_mailbox_watch import PgMailboxWatch as PgMailboxWatch
from .pg_store import PostgresLogStore as PostgresLogStore
from .placements import Claim as Claim
from .placements import HostRow as HostRow
from .placements import Placements as Placements
from .projection import CheckpointRow as CheckpointRow
from .projection import Lifecycle as Lifecycle
from .projection import ObservedCheckpoint as ObservedCheckpoint
from .projection import ProjectionCells as ProjectionCells
from .projection import ProjectionRegistry as ProjectionRegistry
from .projection import ProjectionUnit as ProjectionUnit
from .stop_verdict import is_explicit_message as is_explicit_message
from .stop_verdict import stop_marker as stop_marker
from .stop_verdict import stopped as stopped
from .values import ANOTHER_PROCESS as ANOTHER_PROCESS
from .values import AbortPoll as AbortPoll
from .values import HeaderClaim as HeaderClaim
from .values import LogInfo as LogInfo
from .values import Offset as Offset
from .values import Revision as Revision
from .values import SessionHeader as SessionHeader
from .values import SessionId as SessionId
from .values import check_session_id as check_session_id
from .values import decode_session_id as decode_session_id
from .values import encode_session_id as encode_session_id

__all__ = [
    "ANOTHER_PROCESS",
    "AbortPoll",
    "AlreadyOwned",
    "Batch",
    "CatalogedChild",
    "CheckpointRow",
    "CheckpointRows",
    "Claim",
    "Continuation",
    "CorruptLog",
    "DeliveryConflict",
    "DeliveryIds",
    "Envelope",
    "EnvelopeKind",
    "Event",
    "FileLogStore",
    "FileMailbox",
    "Fs",
    "HandleClosed",
    "HandleDead",
    "HeaderClaim",
    "HostRow",
    "InvalidDeliveryId",
    "InvalidEnvelope",
    "InvalidEvent",
    "InvalidHeader",
    "InvalidPayload",
    "InvalidRange",
    "InvalidSessionId",
    "InvalidStoreUrl",
    "LeasedStore",
    "Lifecycle",
    "LocalWakeups",
    "LogInfo",
    "LogReader",
    "LogStore",
    "LogWatch",
    "LogWriter",
    "Mailbox",
    "MailboxWatch",
    "NonLosslessData",
    "ObservedCheckpoint",
    "Offset",
    "OsFs",
    "OwnershipLost",
    "PendingCall",
    "PersistenceFailed",
    "PgMailboxWatch",
    "Placements",
    "PostgresLogStore",
    "PostgresMailbox",
    "ProjectionBroken",
    "ProjectionCells",
    "ProjectionRegistry",
    "ProjectionUnit",
    "ReplaceOp",
    "Revision",
    "SURFACE_TYPES",
    "SequenceConflict",
    "SessionAlreadyExists",
    "SessionHeader",
    "SessionId",
    "SessionNotFound",
    "StorageError",
    "StoreNotInitialized",
    "StoreUnreachable",
    "StoredCheckpoint",
    "SubagentCatalogData",
    "SubagentsError",
    "SurfaceOp",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
    "UNSET",
    "UnknownProjection",
    "UnsafePath",
    "UnsupportedEvent",
    "UnsupportedLog",
    "WriteHandle",
    "check_lossless",
    "check_session_id",
    "decode_payload",
    "decode_session_id",
    "encode_session_id",
    "interrupted_closers",
    "is_explicit_message",
    "make_event",
    "plan_continuation",
    "redact_url",
    "stop_marker",
    "stopped",
]
