"""Actors: live concurrency on Trio — session actors with group commit, the session store.

It may import `subagents.storage`, trio and trio-util (README, "Layout").
"""

from .abort import Abort as Abort
from .abort import cancelled_when as cancelled_when
from .cold_reader import ColdRead as ColdRead
from .cold_reader import ColdReader as ColdReader
from .cold_reader import ReadGroup as ReadGroup
from .continuation import Activation as Activation
from .continuation import ContinuationManager as ContinuationManager
from .continuation import open_continuation_manager as open_continuation_manager
from .durable_feed import DurableBatch as DurableBatch
from .durable_feed import DurableFeed as DurableFeed
from .durable_feed import FeedSubscription as FeedSubscription
from .errors import ActivationLimitReached as ActivationLimitReached
from .errors import ActorError as ActorError
from .errors import ActorStopped as ActorStopped
from .errors import AlreadyResident as AlreadyResident
from .errors import Draining as Draining
from .errors import ParentClosing as ParentClosing
from .errors import ReadAborted as ReadAborted
from .groups import raise_bare_cancelled as raise_bare_cancelled
from .session_actor import SessionActor as SessionActor
from .session_ref import AppendResult as AppendResult
from .session_ref import EventDraft as EventDraft
from .session_ref import SessionRef as SessionRef
from .session_ref import snapshot_all as snapshot_all
from .session_store import SessionStore as SessionStore
from .session_store import open_session_store as open_session_store
from .store_reader import StoreReader as StoreReader

__all__ = [
    "Abort",
    "Activation",
    "ActivationLimitReached",
    "ActorError",
    "ActorStopped",
    "AlreadyResident",
    "AppendResult",
    "ColdRead",
    "ColdReader",
    "ContinuationManager",
    "Draining",
    "DurableBatch",
    "DurableFeed",
    "EventDraft",
    "FeedSubscription",
    "ParentClosing",
    "ReadAborted",
    "ReadGroup",
    "SessionActor",
    "SessionRef",
    "SessionStore",
    "StoreReader",
    "cancelled_when",
    "open_continuation_manager",
    "open_session_store",
    "raise_bare_cancelled",
    "snapshot_all",
]
