"""`subagents acp` over a model the test holds: run as `python acp_gated_agent.py ROOT FIFO`.

Every model call streams "Hel", then waits for a byte on the FIFO (written by the test once it
has seen "Hel" arrive), then streams "lo" and stops — so a test can tell text streamed while
the model writes from text sent when the reply is durable, with no timing involved."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator

import trio
from subagents.runtime.hosts.acp.host import run_acp
from subagents.runtime.models.base import Chunk, Finish, ModelRequest, TextDelta


class FifoGatedModel:
    def __init__(self, fifo: str) -> None:
        self.fifo = fifo

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        yield TextDelta("Hel")
        # Read and write: the FIFO never reads as ended while the test has not opened it yet.
        async with trio.lowlevel.FdStream(os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)) as gate:
            await gate.receive_some(1)
        yield TextDelta("lo")
        yield Finish("stop")


if __name__ == "__main__":
    sys.exit(trio.run(run_acp, sys.argv[1], FifoGatedModel(sys.argv[2]), "test"))
