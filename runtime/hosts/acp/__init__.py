"""The Agent Client Protocol host (`subagents acp`): JSON-RPC 2.0 over stdio, on Trio."""
