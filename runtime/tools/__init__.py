"""Model-facing tools that act on the subagent service (README, "Model-facing tools")."""
