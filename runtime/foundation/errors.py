"""The runtime's branches of the error tree (its root: `subagents.storage.SubagentsError`).

Each class has one fixed code; callers catch the class, never compare codes. A failed tool
result records `record()`: the pinned `{name, code}` of docs/format.md ("tool/result"), which
for the query and the subagent service are the older unprefixed names (shown in brackets).

    SessionQueryError             QUERY_ERROR                       the session query
    ├── QuerySessionNotFound      QUERY_SESSION_NOT_FOUND           [SESSION_QUERY_SESSION_NOT_FOUND]
    ├── QueryCorruptSession       QUERY_CORRUPT_SESSION             [SESSION_QUERY_CORRUPT_SESSION]
    ├── QueryUnsupportedSession   QUERY_UNSUPPORTED_SESSION         [SESSION_QUERY_UNSUPPORTED_SESSION]
    ├── QuerySourceConflict       QUERY_SOURCE_CONFLICT             [SESSION_QUERY_SOURCE_CONFLICT]
    ├── QueryPersistenceFailed    QUERY_PERSISTENCE_FAILED          [SESSION_QUERY_PERSISTENCE_FAILED]
    └── QueryAborted              QUERY_ABORTED                     [SESSION_QUERY_ABORTED]
    SubagentError                 SUBAGENT_ERROR                    the subagent service and registry
    ├── Unauthorized              SUBAGENT_UNAUTHORIZED             [SubagentError UNAUTHORIZED]
    ├── NotResumable              SUBAGENT_NOT_RESUMABLE            [SubagentError NOT_RESUMABLE]
    ├── ParentUnavailable         SUBAGENT_PARENT_UNAVAILABLE       [SubagentError PARENT_UNAVAILABLE]
    ├── DepthExceeded             SUBAGENT_DEPTH_EXCEEDED           [SubagentError DEPTH_EXCEEDED]
    ├── BudgetExhausted           SUBAGENT_BUDGET_EXHAUSTED         [SubagentError BUDGET_EXHAUSTED]
    ├── ActivationLimit           SUBAGENT_ACTIVATION_LIMIT_REACHED [SubagentError ACTIVATION_LIMIT_REACHED]
    ├── FamilyDraining            SUBAGENT_DRAINING                 [SubagentError DRAINING]
    ├── SubagentCancelled         SUBAGENT_CANCELLED                [SubagentError CANCELLED]
    ├── RunNotCompleted           SUBAGENT_RUN_NOT_COMPLETED        [SubagentError RUN_NOT_COMPLETED]
    ├── NoProvider                SUBAGENT_NO_PROVIDER              [SubagentError NO_PROVIDER]
    ├── UnsupportedCapability     SUBAGENT_UNSUPPORTED_CAPABILITY   [SubagentError UNSUPPORTED_CAPABILITY]
    ├── NoCallingAgent            SUBAGENT_NO_AGENT                 [SubagentError NO_AGENT]
    ├── ProjectionsUnavailable    SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE
    ├── SessionStoreUnavailable   SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE
    ├── QueryUnavailable          SUBAGENT_CONTROL_QUERY_UNAVAILABLE
    ├── ListingParentNotFound     SUBAGENT_LISTING_PARENT_NOT_FOUND (a listing of a session no record is)
    ├── MalformedDescriptor       SUBAGENT_DESCRIPTOR_MALFORMED     (also a ValueError)
    └── AgentError                SUBAGENT_AGENT_ERROR              the agent registry [AgentError]
        ├── IdsExhausted          SUBAGENT_ID_EXHAUSTED             [AgentError ID_EXHAUSTED]
        ├── NoModel               SUBAGENT_NO_MODEL                 [AgentError NO_MODEL]
        ├── OptionsNotReapplied   SUBAGENT_OPTIONS_NOT_REAPPLIED    [AgentError NOT_RESUMABLE]
        └── AgentStopped          SUBAGENT_AGENT_STOPPED            (the agent's loop has ended)
    ToolFailure                   SUBAGENT_TOOL_FAILED              a tool's own failure [its name, code]
    ModelError                    MODEL_ERROR                       a model call failed
    ├── ModelSpecError            MODEL_SPEC_INVALID                (also a ValueError)
    ├── ModelUnavailable          MODEL_UNAVAILABLE                 (connect errors, 429/5xx after retries)
    ├── ModelHttpError            MODEL_HTTP_ERROR                  (another HTTP status)
    ├── ModelAuthFailed           MODEL_AUTH                        (401, 403)
    ├── ModelNotFound             MODEL_NOT_FOUND                   (404)
    ├── ModelBadResponse          MODEL_BAD_RESPONSE                (not an event stream)
    ├── ModelBadStream            MODEL_BAD_STREAM                  (a malformed chunk)
    ├── ModelStreamInterrupted    MODEL_STREAM_INTERRUPTED          (the stream broke off)
    ├── ModelContentFiltered      MODEL_CONTENT_FILTERED
    ├── ScriptedFailure           MODEL_SCRIPTED_ERROR              (a script's `error` entry)
    ├── ScriptExhausted           MODEL_SCRIPT_EXHAUSTED
    ├── ScriptNoMatch             MODEL_SCRIPT_NO_MATCH
    ├── ScriptNoAgent             MODEL_SCRIPT_NO_AGENT
    ├── ScriptNoWaits             MODEL_SCRIPT_NO_WAITS
    ├── ScriptWaitUnavailable     MODEL_SCRIPT_WAIT
    └── ScriptStalled             MODEL_SCRIPT_STALLED
    ScriptError                   SCRIPT_INVALID                    a script file that cannot load (a ValueError)
    └── ScriptUnreadable          SCRIPT_UNREADABLE
    ScenarioError                 SCRIPT_SCENARIO_FAILED            bad scenario files, or goldens differ
    CliError                      CLI_ERROR
    ├── UsageError                CLI_USAGE                         (bad input: exit status 2)
    │   └── ConfigInvalid         CLI_CONFIG_INVALID                (a subagents.toml that cannot be used)
    ├── CommandFailed             CLI_COMMAND_FAILED                (the work could not be done: exit 1)
    └── AcpRequestError           CLI_ACP_REQUEST                   (an ACP request refused, with its JSON-RPC code)

Signals that never leave their module stay out of the tree: the inbox's `DeliveryCancelled`,
the SSE parser's `SSEError` and the wire's `StreamFault` (both turned into `ModelError`s), the
tool-argument parser's `_ArgumentsError` (an `Error:` result).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from subagents.storage import SubagentsError

__all__ = [
    "AcpRequestError",
    "ActivationLimit",
    "BudgetExhausted",
    "AgentError",
    "AgentStopped",
    "CliError",
    "CommandFailed",
    "ConfigInvalid",
    "DepthExceeded",
    "FamilyDraining",
    "IdsExhausted",
    "ListingParentNotFound",
    "MalformedDescriptor",
    "ModelAuthFailed",
    "ModelBadResponse",
    "ModelBadStream",
    "ModelContentFiltered",
    "ModelError",
    "ModelHttpError",
    "ModelNotFound",
    "ModelSpecError",
    "ModelStreamInterrupted",
    "ModelUnavailable",
    "NoCallingAgent",
    "NoModel",
    "NoProvider",
    "NotResumable",
    "OptionsNotReapplied",
    "ParentUnavailable",
    "ProjectionsUnavailable",
    "QueryAborted",
    "QueryCorruptSession",
    "QueryPersistenceFailed",
    "QuerySessionNotFound",
    "QuerySourceConflict",
    "QueryUnavailable",
    "QueryUnsupportedSession",
    "RunNotCompleted",
    "ScenarioError",
    "ScriptError",
    "ScriptExhausted",
    "ScriptNoAgent",
    "ScriptNoMatch",
    "ScriptNoWaits",
    "ScriptStalled",
    "ScriptUnreadable",
    "ScriptWaitUnavailable",
    "ScriptedFailure",
    "SessionQueryError",
    "SessionStoreUnavailable",
    "SubagentCancelled",
    "SubagentError",
    "SubagentsError",
    "ToolFailure",
    "Unauthorized",
    "UnsupportedCapability",
]


# ---- the session query --------------------------------------------------------------------


class SessionQueryError(SubagentsError):
    code = "QUERY_ERROR"
    record_name = "SessionQueryError"
    # How listing shows a child whose observation failed this way (None: the listing fails).
    diagnostic: ClassVar[Literal["corrupt", "unsupported", "unavailable"] | None] = None


class QuerySessionNotFound(SessionQueryError):
    code = "QUERY_SESSION_NOT_FOUND"
    record_code = "SESSION_QUERY_SESSION_NOT_FOUND"
    diagnostic = "unavailable"


class QueryCorruptSession(SessionQueryError):
    code = "QUERY_CORRUPT_SESSION"
    record_code = "SESSION_QUERY_CORRUPT_SESSION"
    diagnostic = "corrupt"


class QueryUnsupportedSession(SessionQueryError):
    code = "QUERY_UNSUPPORTED_SESSION"
    record_code = "SESSION_QUERY_UNSUPPORTED_SESSION"
    diagnostic = "unsupported"


class QuerySourceConflict(SessionQueryError):
    code = "QUERY_SOURCE_CONFLICT"
    record_code = "SESSION_QUERY_SOURCE_CONFLICT"
    diagnostic = "corrupt"  # two sources disagree: neither can be trusted


class QueryPersistenceFailed(SessionQueryError):
    code = "QUERY_PERSISTENCE_FAILED"
    record_code = "SESSION_QUERY_PERSISTENCE_FAILED"
    diagnostic = "unavailable"


class QueryAborted(SessionQueryError):
    code = "QUERY_ABORTED"
    record_code = "SESSION_QUERY_ABORTED"

    def __init__(self, message: str = "session observation was aborted") -> None:
        super().__init__(message)


# ---- the subagent service and the agent registry ------------------------------------------


class SubagentError(SubagentsError):
    code = "SUBAGENT_ERROR"
    record_name = "SubagentError"


class Unauthorized(SubagentError):
    code = "SUBAGENT_UNAUTHORIZED"
    record_code = "UNAUTHORIZED"


class NotResumable(SubagentError):
    code = "SUBAGENT_NOT_RESUMABLE"
    record_code = "NOT_RESUMABLE"


class ParentUnavailable(SubagentError):
    code = "SUBAGENT_PARENT_UNAVAILABLE"
    record_code = "PARENT_UNAVAILABLE"


class DepthExceeded(SubagentError):
    code = "SUBAGENT_DEPTH_EXCEEDED"
    record_code = "DEPTH_EXCEEDED"


class BudgetExhausted(SubagentError):
    """A child was not started: its parent's (or an ancestor's) `max_descendants` is used up."""

    code = "SUBAGENT_BUDGET_EXHAUSTED"
    record_code = "BUDGET_EXHAUSTED"


class ActivationLimit(SubagentError):
    code = "SUBAGENT_ACTIVATION_LIMIT_REACHED"
    record_code = "ACTIVATION_LIMIT_REACHED"


class FamilyDraining(SubagentError):
    code = "SUBAGENT_DRAINING"
    record_code = "DRAINING"


class SubagentCancelled(SubagentError):
    code = "SUBAGENT_CANCELLED"
    record_code = "CANCELLED"


class RunNotCompleted(SubagentError):
    code = "SUBAGENT_RUN_NOT_COMPLETED"
    record_code = "RUN_NOT_COMPLETED"


class NoProvider(SubagentError):
    code = "SUBAGENT_NO_PROVIDER"
    record_code = "NO_PROVIDER"


class UnsupportedCapability(SubagentError):
    code = "SUBAGENT_UNSUPPORTED_CAPABILITY"
    record_code = "UNSUPPORTED_CAPABILITY"


class NoCallingAgent(SubagentError):
    code = "SUBAGENT_NO_AGENT"
    record_code = "NO_AGENT"


class ProjectionsUnavailable(SubagentError):
    code = "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"


class SessionStoreUnavailable(SubagentError):
    code = "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"


class QueryUnavailable(SubagentError):
    code = "SUBAGENT_CONTROL_QUERY_UNAVAILABLE"


class ListingParentNotFound(SubagentError):
    """`list_children` / `list_descendants` of a session the corpus has no record of."""

    code = "SUBAGENT_LISTING_PARENT_NOT_FOUND"


class MalformedDescriptor(SubagentError, ValueError):
    """A `subagent/descriptor` payload that is not a valid descriptor of a known shape.

    Another integer version is *not* malformed (it is unsupported: `parse_descriptor` returns
    `None`); everything else that is wrong raises this, with a message naming the field.
    """

    code = "SUBAGENT_DESCRIPTOR_MALFORMED"


class AgentError(SubagentError):
    code = "SUBAGENT_AGENT_ERROR"
    record_name = "AgentError"


class IdsExhausted(AgentError):
    code = "SUBAGENT_ID_EXHAUSTED"
    record_code = "ID_EXHAUSTED"


class NoModel(AgentError):
    code = "SUBAGENT_NO_MODEL"
    record_code = "NO_MODEL"


class OptionsNotReapplied(AgentError):
    """A resumed child's recorded options (model route, persona, tools) cannot be given again."""

    code = "SUBAGENT_OPTIONS_NOT_REAPPLIED"
    record_code = "NOT_RESUMABLE"


class AgentStopped(AgentError):
    """The agent cannot go on: its session actor stopped or its log could not be written."""

    code = "SUBAGENT_AGENT_STOPPED"


# ---- tools ------------------------------------------------------------------------------------


class ToolFailure(SubagentsError):
    """Raised by a tool to fail its call with a readable message: the result records `name`
    (default "ToolFailure") and the tool's own `code`."""

    code = "SUBAGENT_TOOL_FAILED"

    def __init__(self, message: str, *, code: str, name: str | None = None) -> None:
        super().__init__(message)
        self.tool_code = code
        self.error_name = name or type(self).__name__

    def record(self) -> dict[str, str]:
        return {"name": self.error_name, "code": self.tool_code}


# ---- models -----------------------------------------------------------------------------------


class ModelError(SubagentsError):
    """A model call failed; the text never holds an API key. `status` is the HTTP status (or a
    script's) when there was one."""

    code = "MODEL_ERROR"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ModelSpecError(ModelError, ValueError):
    code = "MODEL_SPEC_INVALID"


class ModelUnavailable(ModelError):
    code = "MODEL_UNAVAILABLE"


class ModelHttpError(ModelError):
    code = "MODEL_HTTP_ERROR"


class ModelAuthFailed(ModelError):
    code = "MODEL_AUTH"


class ModelNotFound(ModelError):
    code = "MODEL_NOT_FOUND"


class ModelBadResponse(ModelError):
    code = "MODEL_BAD_RESPONSE"


class ModelBadStream(ModelError):
    code = "MODEL_BAD_STREAM"


class ModelStreamInterrupted(ModelError):
    code = "MODEL_STREAM_INTERRUPTED"


class ModelContentFiltered(ModelError):
    code = "MODEL_CONTENT_FILTERED"


class ScriptedFailure(ModelError):
    code = "MODEL_SCRIPTED_ERROR"


class ScriptExhausted(ModelError):
    code = "MODEL_SCRIPT_EXHAUSTED"


class ScriptNoMatch(ModelError):
    code = "MODEL_SCRIPT_NO_MATCH"


class ScriptNoAgent(ModelError):
    code = "MODEL_SCRIPT_NO_AGENT"


class ScriptNoWaits(ModelError):
    code = "MODEL_SCRIPT_NO_WAITS"


class ScriptWaitUnavailable(ModelError):
    code = "MODEL_SCRIPT_WAIT"


class ScriptStalled(ModelError):
    code = "MODEL_SCRIPT_STALLED"


# ---- scripts and scenarios --------------------------------------------------------------------


class ScriptError(SubagentsError, ValueError):
    """A script that cannot be loaded. `path` is the JSON path of the problem (`$` for the whole
    document), `problem` says what is wrong there, `source` names the file when there is one."""

    code = "SCRIPT_INVALID"

    def __init__(self, path: str, problem: str, *, source: str | None = None) -> None:
        where = f"invalid script {source}" if source else "invalid script"
        super().__init__(f"{where} at {path}: {problem}")
        self.path = path
        self.problem = problem
        self.source = source


class ScriptUnreadable(ScriptError):
    code = "SCRIPT_UNREADABLE"


class ScenarioError(SubagentsError):
    """A scenario that cannot run (bad files) or does not match its goldens."""

    code = "SCRIPT_SCENARIO_FAILED"


# ---- the command line -------------------------------------------------------------------------


class CliError(SubagentsError):
    code = "CLI_ERROR"


class UsageError(CliError):
    """Bad input: printed as one line, exit status 2."""

    code = "CLI_USAGE"


class ConfigInvalid(UsageError):
    """A configuration file that cannot be used: the message names the file and the key."""

    code = "CLI_CONFIG_INVALID"


class CommandFailed(CliError):
    """The input was fine but the command could not do its work (a damaged log): one line,
    exit status 1."""

    code = "CLI_COMMAND_FAILED"


class AcpRequestError(CliError):
    """An Agent Client Protocol request refused: answered as a JSON-RPC error with `rpc_code`
    (-32602 bad params, -32002 unknown session, -32603 a turn that ended in error), never
    logged, never fatal to the `subagents acp` process."""

    code = "CLI_ACP_REQUEST"

    def __init__(self, rpc_code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code
        self.data = data
