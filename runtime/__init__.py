"""The runtime: the product surface (`open_runtime`, the CLI, the agent loop, subagents).

It may import `subagents.actors`, `subagents.storage`, httpx and rich.
"""

from .app import Runtime as Runtime
from .app import open_runtime as open_runtime
