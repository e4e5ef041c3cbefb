"""The `subagents` command line (SPEC 5.7)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

__all__ = ["main"]


def _version() -> str:
    try:
        return version("trio-subagents")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="subagents",
        description=(
            "trio-subagents: a Trio runtime for LLM agents with durable background subagents. "
            "Every session is an append-only log under --root; children survive restarts."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--root",
        default="./.subagents",
        help="the store root (default: ./.subagents)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    # No command is implemented yet (SPEC 5.7 commands arrive with later issues): say so plainly.
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
