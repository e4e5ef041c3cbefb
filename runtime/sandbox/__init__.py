"""The command sandbox (README "Sandbox"): bubblewrap around `run_command` and stdio MCP servers."""
