"""The `subagents` command line (README, "The CLI"): `main` is the console script."""

from __future__ import annotations

from .entry import build_parser as build_parser
from .entry import iso_time as iso_time
from .entry import main as main

__all__ = ["build_parser", "iso_time", "main"]
