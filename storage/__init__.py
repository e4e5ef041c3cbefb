"""Storage: values, the event codec, log format 1 and the synchronous log stores.

The bottom layer: imports only the stdlib, attrs, cattrs, msgspec and zstandard, never trio.
"""

from .closers import TOOL_NOT_STARTED_TEXT as TOOL_NOT_STARTED_TEXT
from .closers import TOOL_OUTCOME_UNKNOWN_TEXT as TOOL_OUTCOME_UNKNOWN_TEXT
from .closers import interrupted_closers as interrupted_closers
from .codec import Event as Event
from .codec import ReplaceOp as ReplaceOp
from .codec import SurfaceOp as SurfaceOp
from .codec import check_lossless as check_lossless
from .codec import decode_event as decode_event
from .codec import decode_payload as decode_payload
from .codec import encode_event as encode_event
from .codec import make_event as make_event
from .crashfs import CrashFs as CrashFs
from .errors import AlreadyOwned as AlreadyOwned
from .errors import CorruptLog as CorruptLog
from .errors import HandleClosed as HandleClosed
from .errors import HandleDead as HandleDead
from .errors import InvalidEvent as InvalidEvent
from .errors import InvalidPayload as InvalidPayload
from .errors import InvalidSessionId as InvalidSessionId
from .errors import NonLosslessData as NonLosslessData
from .errors import PersistenceFailed as PersistenceFailed
from .errors import SequenceConflict as SequenceConflict
from .errors import SessionAlreadyExists as SessionAlreadyExists
from .errors import SessionNotFound as SessionNotFound
from .errors import StorageError as StorageError
from .errors import UnsafePath as UnsafePath
from .errors import UnsupportedLog as UnsupportedLog
from .events import KNOWN_TYPES as KNOWN_TYPES
from .events import SURFACE_TYPES as SURFACE_TYPES
from .faulty_store import FaultyLogStore as FaultyLogStore
from .file_store import LOG_NAMES as LOG_NAMES
from .file_store import FileLogStore as FileLogStore
from .fs import Fs as Fs
from .fs import OsFs as OsFs
from .log_store import Batch as Batch
from .log_store import LogStore as LogStore
from .log_store import ReadHandle as ReadHandle
from .log_store import WriteHandle as WriteHandle
from .memory_store import MemoryLogStore as MemoryLogStore
from .records import HeaderRecord as HeaderRecord
from .records import decode_header_line as decode_header_line
from .records import encode_header_line as encode_header_line
from .values import FORMAT_VERSION as FORMAT_VERSION
from .values import Checkpoint as Checkpoint
from .values import LogInfo as LogInfo
from .values import Offset as Offset
from .values import Revision as Revision
from .values import Seq as Seq
from .values import SessionHeader as SessionHeader
from .values import SessionId as SessionId
from .values import check_session_id as check_session_id
from .values import decode_session_id as decode_session_id
from .values import encode_session_id as encode_session_id
