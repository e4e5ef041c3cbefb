"""The event vocabulary of format 1 and the payload of each type.

Payloads are strict msgspec Structs decoded from the envelope's raw `data` when they are used
(`decode_payload`). A payload that fails validation makes its session corrupt (docs/format.md,
"Payloads"), for every reader alike: a read of a log checks each known type's payload against
these Structs in the pass that checks its seqs (`framing.decode_event_lines`, through
`_codec.PAYLOAD_DECODERS`), once per revision of the log (a read the index vouches for skips it),
and writers refuse what readers would refuse (`make_event`, `Event(...)`). So listing, `show`
and resume give one verdict.

`subagent/descriptor` is deliberately only "an object" here: a malformed descriptor is a
listing-level fact (the identity unit resets to null), not a damaged log.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "KNOWN_TYPES",
    "PAYLOAD_TYPES",
    "SOURCE_SEQ_TYPES",
    "SURFACE_TYPES",
    "DELIVERY_ID_PATTERN",
    "AgentMessageSource",
    "AssistantMessageData",
    "Block",
    "CompactionEndData",
    "CompactionSource",
    "CompactionStartData",
    "CompactionSummaryData",
    "EndSeedData",
    "Message",
    "MessageData",
    "ModelSource",
    "RedactedThinkingBlock",
    "Source",
    "StepData",
    "SessionModelData",
    "SessionStoppedData",
    "SubagentCatalogData",
    "SubagentSettledData",
    "SubagentSettledSource",
    "TextBlock",
    "ThinkingBlock",
    "ToolCallBlock",
    "ToolCallData",
    "ToolError",
    "ToolResultBlock",
    "ToolResultData",
    "ToolSource",
    "TurnContinueData",
    "TurnEndData",
    "TurnEndReason",
    "TurnStartData",
    "TurnTrigger",
    "Usage",
    "UserMessageData",
    "UserSource",
]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, frozen=True, kw_only=True):
    pass


# --- content blocks ---------------------------------------------------------------------------


class TextBlock(_Strict, frozen=True, tag_field="type", tag="text"):
    text: str


class ToolCallBlock(_Strict, frozen=True, tag_field="type", tag="tool-call"):
    id: str
    name: str
    arguments: str


class ToolResultBlock(_Strict, frozen=True, tag_field="type", tag="tool-result"):
    call_id: str
    content: list[Block]
    is_error: bool


class ThinkingBlock(_Strict, frozen=True, tag_field="type", tag="thinking"):
    """A model's reasoning, kept with the provider's `signature` so it can be sent back (an
    Anthropic model with extended thinking needs it on the next call of a tool-use turn)."""

    thinking: str
    signature: str


class RedactedThinkingBlock(_Strict, frozen=True, tag_field="type", tag="redacted-thinking"):
    """Reasoning the provider encrypted: opaque `data`, only ever sent back as it came."""

    data: str


Block = TextBlock | ToolCallBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock

# --- message sources --------------------------------------------------------------------------


class UserSource(_Strict, frozen=True, tag_field="kind", tag="user"):
    pass


class ModelSource(_Strict, frozen=True, tag_field="kind", tag="model"):
    pass


class ToolSource(_Strict, frozen=True, tag_field="kind", tag="tool"):
    call_id: str


class SubagentSettledSource(_Strict, frozen=True, tag_field="kind", tag="subagent-settled"):
    sender_session_id: str


class AgentMessageSource(_Strict, frozen=True, tag_field="kind", tag="agent-message"):
    sender_session_id: str


class CompactionSource(_Strict, frozen=True, tag_field="kind", tag="compaction"):
    pass


Source = UserSource | ModelSource | ToolSource | SubagentSettledSource | AgentMessageSource | CompactionSource


class Message(_Strict, frozen=True):
    id: str
    role: Literal["system", "user", "assistant"]
    content: list[Block]
    source: Source


# --- payloads ---------------------------------------------------------------------------------


class MessageData(_Strict, frozen=True):
    """`system/message` and `user/message`."""

    turn: int
    step: int
    message: Message


# A delivery id (storage/envelope.py): a ULID in its canonical upper-case spelling.
DELIVERY_ID_PATTERN = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")


class UserMessageData(MessageData, frozen=True):
    """`user/message`: a message that came through the mailbox records its `delivery_id`, so a
    redelivered envelope is recognised and dropped (SPEC §9: at least once, recorded once)."""

    delivery_id: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.delivery_id is not UNSET and not DELIVERY_ID_PATTERN.fullmatch(self.delivery_id):
            raise ValueError(f"delivery_id must be an upper-case ULID, got {self.delivery_id!r}")


class Usage(_Strict, frozen=True):
    """A model call's tokens; the cache counts are absent (0) for a provider without a prompt
    cache, and in every log written before they were recorded. `reasoning_tokens` is the part of
    `output_tokens` a provider reports as reasoning (absent: not reported), not another count."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


class AssistantMessageData(_Strict, frozen=True):
    turn: int
    step: int
    message: Message
    finish: Literal["stop", "tool-calls", "max-tokens", "error", "aborted"]
    usage: Usage | UnsetType = UNSET
    interrupted: Literal[True] | UnsetType = UNSET
    # The reply of a model call issued again after its turn was continued (the lost call was
    # attempt 1): docs/format.md, "Continued turns".
    attempt: Annotated[int, msgspec.Meta(ge=2)] | UnsetType = UNSET


class ToolError(_Strict, frozen=True):
    name: str
    code: str


class ToolResultData(_Strict, frozen=True):
    turn: int
    step: int
    message: Message
    error: ToolError | UnsetType = UNSET
    # A call that had started and had no result when its process died, not run again because
    # its tool is not idempotent: it may or may not have taken effect.
    in_doubt: Literal[True] | UnsetType = UNSET

    def __post_init__(self) -> None:
        # docs/format.md, "The vocabulary": a tool-result message has role user, source {kind:
        # tool, call_id}, and holds one tool-result block — of that same call.
        message = self.message
        if message.role != "user":
            raise ValueError(f"a tool/result message has role user, not {message.role!r}")
        if type(message.source) is not ToolSource:
            raise ValueError("a tool/result message has source {kind: tool, call_id}")
        content = message.content
        if len(content) != 1 or type(content[0]) is not ToolResultBlock:
            raise ValueError("a tool/result message holds exactly one tool-result block")
        if content[0].call_id != message.source.call_id:
            raise ValueError("a tool/result message's block and source name different calls")


class TurnTrigger(_Strict, frozen=True):
    kind: Literal["message", "notice", "resume"]


class TurnStartData(_Strict, frozen=True):
    turn: int
    trigger: TurnTrigger | UnsetType = UNSET


class TurnContinueData(_Strict, frozen=True):
    """`turn/continue`: a turn a crash left open goes on (docs/format.md, "Continued turns")."""

    turn: int
    step: int  # the step open at the crash, else the turn's last step (0: none had started)
    attempt: Annotated[int, msgspec.Meta(ge=2)]  # 2 for the turn's first continuation
    lost_model_call: bool  # the open step's model call was in flight: its usage is unknown


class TurnEndReason(_Strict, frozen=True):
    # "completed" | "aborted" | "blocked" | "error" | "max-tokens" | "interrupted" | "budget";
    # any other string is read too and treated as "error" by what interprets it (docs/format.md):
    # format 1 may grow reason kinds without making older logs' readers call them corrupt.
    kind: str
    cause: Literal["user", "parent", "disposed"] | UnsetType = UNSET
    message: str | UnsetType = UNSET


class TurnEndData(_Strict, frozen=True):
    turn: int
    reason: TurnEndReason


class StepData(_Strict, frozen=True):
    turn: int
    step: int


class ToolCallData(_Strict, frozen=True):
    turn: int
    step: int
    call_id: str
    name: str
    arguments: str


class EndSeedData(_Strict, frozen=True):
    inherited: Literal[True] | UnsetType = UNSET


class SubagentCatalogData(_Strict, frozen=True):
    version: Literal[1]
    child_id: str
    child_created_at: int
    mode: Literal["one-shot", "continuable"]
    label: str | UnsetType = UNSET
    call_id: str | UnsetType = UNSET  # the `subagent` tool call that started the child


class SubagentSettledData(_Strict, frozen=True):
    child_id: str
    reason_kind: str
    closing_text: str | UnsetType = UNSET
    reason_message: str | UnsetType = UNSET  # the child's turn/end reason message (written for "budget")
    # Set when the settlement came through the parent's mailbox (a child hosted by another
    # process): its envelope's id, so a redelivery is recorded once (SPEC §9).
    delivery_id: str | UnsetType = UNSET
    # The child's run it settles (`<child_id>@<seq of the child's last turn/end>`): a second
    # settlement of the same run (another host's claim of the same work) is not recorded.
    run_key: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.delivery_id is not UNSET and not DELIVERY_ID_PATTERN.fullmatch(self.delivery_id):
            raise ValueError(f"delivery_id must be an upper-case ULID, got {self.delivery_id!r}")


class SessionModelData(_Strict, frozen=True):
    """`session/model`: the model a session runs, so any host resumes it with the same one
    (never a key; a base URL without userinfo or secret-bearing query parameters)."""

    model: str  # "scheme:name"
    base_url: str | UnsetType = UNSET


class SessionStoppedData(_Strict, frozen=True):
    """`session/stopped`: the durable stopped marker; only a later explicit message clears it."""

    by: str  # the session or operator that stopped it
    tree: bool  # stopped as part of a tree (`stop --tree`)
    delivery_id: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.delivery_id is not UNSET and not DELIVERY_ID_PATTERN.fullmatch(self.delivery_id):
            raise ValueError(f"delivery_id must be an upper-case ULID, got {self.delivery_id!r}")


class CompactionStartData(_Strict, frozen=True):
    turn: int


class CompactionSummaryData(_Strict, frozen=True):
    text: str
    usage: Usage | UnsetType = UNSET  # the summary call's tokens (counted like a step's call)


class CompactionEndData(_Strict, frozen=True):
    start_seq: int
    end_seq: int


SURFACE_TYPES = frozenset({"system/message", "user/message", "assistant/message", "tool/result"})
SOURCE_SEQ_TYPES = frozenset({"user/message", "tool/result"})

# `dict` means "any JSON object": the type's own domain validates it.
PAYLOAD_TYPES: dict[str, type] = {
    "system/message": MessageData,
    "user/message": UserMessageData,
    "assistant/message": AssistantMessageData,
    "tool/result": ToolResultData,
    "turn/start": TurnStartData,
    "turn/end": TurnEndData,
    "turn/continue": TurnContinueData,
    "step/start": StepData,
    "step/end": StepData,
    "tool/call": ToolCallData,
    "session/end-seed": EndSeedData,
    "subagent/descriptor": dict,
    "subagent/catalog": SubagentCatalogData,
    "subagent/settled": SubagentSettledData,
    "session/model": SessionModelData,
    "session/stopped": SessionStoppedData,
    "compaction/start": CompactionStartData,
    "compaction/summary": CompactionSummaryData,
    "compaction/end": CompactionEndData,
}

KNOWN_TYPES = frozenset(PAYLOAD_TYPES)
