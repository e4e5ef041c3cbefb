"""Subagents: the durable descriptor of a child session and the projection units that read it."""
