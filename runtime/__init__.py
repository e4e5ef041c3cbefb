"""The runtime: the product surface (`open_runtime`, the CLI, the agent loop, subagents).

It may import `subagents.actors`, `subagents.storage`, httpx and rich.
"""
