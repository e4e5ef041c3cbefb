"""The web console (`subagents web`, SPEC §7): Starlette under Hypercorn's Trio worker, Jinja2
templates, no build step. Imported only by that command (the `web` extra)."""
