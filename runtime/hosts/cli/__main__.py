"""`python -m subagents.runtime.hosts.cli`: the `subagents` command."""

import sys

from .entry import main

if __name__ == "__main__":
    sys.exit(main())
