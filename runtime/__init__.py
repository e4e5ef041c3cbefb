"""The runtime: the product surface (`open_runtime`, the CLI, the agent loop, subagents).

What an embedder needs is re-exported here, so one import block serves (`from subagents.runtime
import open_runtime, ScriptedModel, load_script, ...`). It may import `subagents.actors`,
`subagents.storage`, httpx and rich. The whole error tree is in `subagents.runtime.foundation.errors`
(its root, `SubagentsError`, and the branch bases are here too).

The names load on first use (module `__getattr__`): a read-only command that imports one
submodule (the CLI, the query, the listing) does not pay for the agent loop, the model
transports and the tools it never runs (issue 20, start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .foundation.lazy_face import lazy_face

if TYPE_CHECKING:
    from .agent.compaction import CompactionPolicy as CompactionPolicy
    from .agent.loop import Agent as Agent
    from .agent.loop import AgentConfig as AgentConfig
    from .agent.loop import TurnResult as TurnResult
    from .app import Runtime as Runtime
    from .app import open_runtime as open_runtime
    from .delegation.descriptor import ToolFilter as ToolFilter
    from .delegation.listing import ChildRow as ChildRow
    from .delegation.listing import DiagnosticRow as DiagnosticRow
    from .delegation.options import ChildOptions as ChildOptions
    from .delegation.units import SUBAGENT_UNITS as SUBAGENT_UNITS
    from .event_stream import StreamEvent as StreamEvent
    from .event_stream import open_event_stream as open_event_stream
    from .foundation.budgets import Budget as Budget
    from .foundation.clock import RealClock as RealClock
    from .foundation.clock import ScenarioClock as ScenarioClock
    from .foundation.errors import AgentError as AgentError
    from .foundation.errors import AgentStopped as AgentStopped
    from .foundation.errors import ModelError as ModelError
    from .foundation.errors import ScriptError as ScriptError
    from .foundation.errors import SessionQueryError as SessionQueryError
    from .foundation.errors import SubagentError as SubagentError
    from .foundation.errors import SubagentsError as SubagentsError
    from .foundation.errors import ToolFailure as ToolFailure
    from .foundation.ids import CountingIds as CountingIds
    from .foundation.ids import RandomIds as RandomIds
    from .foundation.pricing import Price as Price
    from .foundation.pricing import PriceTable as PriceTable
    from .models.anthropic import AnthropicModel as AnthropicModel
    from .models.anthropic_wire import AnthropicOptions as AnthropicOptions
    from .models.base import Chunk as Chunk
    from .models.base import Finish as Finish
    from .models.base import Model as Model
    from .models.base import ModelRequest as ModelRequest
    from .models.base import SessionBinding as SessionBinding
    from .models.base import SessionModel as SessionModel
    from .models.base import SessionWaits as SessionWaits
    from .models.base import TextDelta as TextDelta
    from .models.base import Thinking as Thinking
    from .models.base import ToolCallDelta as ToolCallDelta
    from .models.base import ToolSpec as ToolSpec
    from .models.base import Usage as Usage
    from .models.openai import OpenAIChatModel as OpenAIChatModel
    from .sandbox.policy import SandboxPolicy as SandboxPolicy
    from .telemetry.gen_ai import OtelTelemetry as OtelTelemetry
    from .telemetry.seam import Telemetry as Telemetry
    from .telemetry.settings import TelemetrySettings as TelemetrySettings
    from .testing.script_format import load_script as load_script
    from .testing.scripted_model import ScriptedModel as ScriptedModel
    from .tools.base import FunctionTool as FunctionTool
    from .tools.base import Tool as Tool
    from .tools.base import ToolContext as ToolContext
    from .tools.mcp_spec import McpServerSpec as McpServerSpec
    from .tools.permissions import DEFAULT_PERMISSIONS as DEFAULT_PERMISSIONS
    from .tools.permissions import PermissionAnswer as PermissionAnswer
    from .tools.permissions import PermissionRequest as PermissionRequest
    from .tools.permissions import Permissions as Permissions
    from .tools.workspace_tools import WorkspaceLimits as WorkspaceLimits
    from .tools.workspace_tools import workspace_tools as workspace_tools
    from .usage import SessionUsage as SessionUsage
    from .usage import Tokens as Tokens
    from .usage import TreeUsage as TreeUsage
    from .usage import cost_of as cost_of
    from .usage import usage_lines as usage_lines
    from .usage import usage_of as usage_of
    from .usage_totals import session_usage as session_usage
    from .usage_totals import tree_usage as tree_usage

# Each public name and the submodule that defines it.
_WHERE: dict[str, str] = {
    "CompactionPolicy": ".agent.compaction",
    "Agent": ".agent.loop",
    "AgentConfig": ".agent.loop",
    "TurnResult": ".agent.loop",
    "FunctionTool": ".tools.base",
    "Tool": ".tools.base",
    "ToolContext": ".tools.base",
    "Runtime": ".app",
    "open_runtime": ".app",
    "Budget": ".foundation.budgets",
    "Price": ".foundation.pricing",
    "PriceTable": ".foundation.pricing",
    "RealClock": ".foundation.clock",
    "ScenarioClock": ".foundation.clock",
    "ToolFilter": ".delegation.descriptor",
    "ChildRow": ".delegation.listing",
    "DiagnosticRow": ".delegation.listing",
    "ChildOptions": ".delegation.options",
    "SUBAGENT_UNITS": ".delegation.units",
    "AgentError": ".foundation.errors",
    "AgentStopped": ".foundation.errors",
    "ModelError": ".foundation.errors",
    "ScriptError": ".foundation.errors",
    "SessionQueryError": ".foundation.errors",
    "SubagentError": ".foundation.errors",
    "SubagentsError": ".foundation.errors",
    "ToolFailure": ".foundation.errors",
    "StreamEvent": ".event_stream",
    "open_event_stream": ".event_stream",
    "CountingIds": ".foundation.ids",
    "RandomIds": ".foundation.ids",
    "Chunk": ".models.base",
    "Finish": ".models.base",
    "Model": ".models.base",
    "ModelRequest": ".models.base",
    "SessionBinding": ".models.base",
    "SessionModel": ".models.base",
    "SessionWaits": ".models.base",
    "TextDelta": ".models.base",
    "Thinking": ".models.base",
    "ToolCallDelta": ".models.base",
    "ToolSpec": ".models.base",
    "Usage": ".models.base",
    "OpenAIChatModel": ".models.openai",
    "AnthropicModel": ".models.anthropic",
    "AnthropicOptions": ".models.anthropic_wire",
    "OtelTelemetry": ".telemetry.gen_ai",  # the `otel` extra: imported on first use only
    "Telemetry": ".telemetry.seam",
    "TelemetrySettings": ".telemetry.settings",
    "SandboxPolicy": ".sandbox.policy",
    "load_script": ".testing.script_format",
    "ScriptedModel": ".testing.scripted_model",
    "McpServerSpec": ".tools.mcp_spec",
    "DEFAULT_PERMISSIONS": ".tools.permissions",
    "PermissionAnswer": ".tools.permissions",
    "PermissionRequest": ".tools.permissions",
    "Permissions": ".tools.permissions",
    "WorkspaceLimits": ".tools.workspace_tools",
    "workspace_tools": ".tools.workspace_tools",
    "SessionUsage": ".usage",
    "Tokens": ".usage",
    "TreeUsage": ".usage",
    "session_usage": ".usage_totals",
    "tree_usage": ".usage_totals",
    "usage_lines": ".usage",
    "cost_of": ".usage",
    "usage_of": ".usage",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_face(__name__, _WHERE, globals())
