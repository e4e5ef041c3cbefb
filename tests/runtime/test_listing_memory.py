"""Listing memory (SPEC 4 cold reader, 5.4): a listing's memory is bounded by the reads in flight,
not by the number of children — apart from what is O(n) by nature, the corpus, the rows and
the checkpoint rows its observations proved, kept for its one write-back at the end (issue 20).

The target: the tracemalloc peak of listing 2,000 persisted children is at most 1.2× that of
listing 1,000, once the O(n) part is taken out of both. Real worker threads, no sleeping.
"""

from __future__ import annotations

import gc
import pickle
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs
import pytest
from descriptors import descriptor
from log_lines import header, persist_log
from subagents.actors import open_session_store
from subagents.runtime.delegation.listing import ListingService
from subagents.runtime.delegation.units import SUBAGENT_UNITS
from subagents.runtime.query import SessionQuery
from subagents.storage import make_event
from subagents.storage.projection import ProjectionRegistry
from subagents.storage.testing import MemoryLogStore

SIZES = (1_000, 2_000)
WARM_UP = 50
RATIO = 1.2
# Slack on top of the ratio, for what is O(n) in the listing's own bookkeeping (candidate and
# result lists, index lists, the parents set: well under 100 B per child; `list_descendants` also
# holds its rows twice at the end, before and after adding parent and depth: about 200 B per
# child; so at most about 300 KB for the extra 1,000 children) and for the timing of the cyclic
# garbage collector. One task per child
# costs about 6 KB per child, and keeping every observation alive about 3 KB: 3–6 MB here.
SLACK = 512 << 10


def family(n: int) -> MemoryLogStore:
    """`n` persisted children of "p" (descriptor + open turn), written straight to storage, no
    checkpoint rows: every child is listed through an observation."""
    store = MemoryLogStore(compression="none")
    for i in range(n):
        sid = f"c{i:05d}"
        data = descriptor(f"child {i}")
        events = [make_event(0, "subagent/descriptor", 1, data), make_event(1, "turn/start", 2, {"turn": 1})]
        persist_log(store, header(sid, 1_000 + i, origin="subagent", parent_session="p"), events)
    return store


@pytest.fixture(scope="module")
def stores() -> dict[int, MemoryLogStore]:
    return {n: family(n) for n in (WARM_UP, *SIZES)}


@pytest.fixture
def tracing() -> Iterator[None]:
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        yield
    finally:
        if not was_tracing:
            tracemalloc.stop()


@attrs.frozen
class Measured:
    corpus_peak: int  # peak while building the corpus (`list_sessions`)
    corpus: int  # the corpus, as kept
    rows: int  # the returned rows, as kept
    peak: int  # peak of the whole listing
    proved: int = 0  # the write-back batch (the proved checkpoint rows), as kept

    @property
    def floor(self) -> int:
        """The O(n) part every listing reaches: building its corpus, and at its end the corpus,
        the rows and the write-back batch side by side."""
        return max(self.corpus_peak, self.corpus + self.rows + self.proved)

    @property
    def excess(self) -> int:
        return self.peak - self.floor


def _traced() -> int:
    gc.collect()
    tracemalloc.reset_peak()
    return tracemalloc.get_traced_memory()[0]


def _since(base: int) -> tuple[int, int]:
    current, peak = tracemalloc.get_traced_memory()
    return current - base, peak - base


Call = Callable[[ListingService], Awaitable[list[Any]]]
CALLS: list[Any] = [
    pytest.param(lambda service: service.list_children("p"), id="children"),
    pytest.param(lambda service: service.list_descendants("p"), id="descendants"),
]


async def measure(store: MemoryLogStore, call: Call, *, expected: int) -> Measured:
    registry = ProjectionRegistry(SUBAGENT_UNITS)
    # The write-back batch is kept for its size, and not written: the store stays without
    # checkpoint rows, so every measured listing observes every child.
    batches: list[Any] = []

    def keep(observed: Any) -> int:
        batches.append(observed)
        return 0

    store.write_observed_checkpoints = keep  # type: ignore[method-assign]  # a test seam on this instance only
    async with open_session_store(store, registry, now_ms=lambda: 1) as sessions:
        # No LRU of prepared observations: it is a separate structure with its own byte bound
        # (SPEC 5.1); what is left is the listing's own memory.
        query = SessionQuery(store, sessions, registry, cache_bytes=0)
        service = ListingService(registry=registry, sessions=sessions, query=query)
        await query.list_sessions()  # the store's index is built, outside the measurement

        base = _traced()
        corpus = await query.list_sessions()
        corpus_kept, corpus_peak = _since(base)
        assert len(corpus) == expected
        del corpus

        base = _traced()
        rows = await call(service)
        _, peak = _since(base)
        assert len(rows) == expected and all(row.to_json()["kind"] == "child" for row in rows)

        # The rows' own size: an independent copy of them (every string too), so that nothing
        # else the listing might have kept alive is counted as rows.
        pickled = pickle.dumps(rows)
        del rows
        base = _traced()
        copy = pickle.loads(pickled)
        rows_kept, _ = _since(base)
        del copy
        # The batch the same way (an independent copy: an upper bound).
        assert len(batches) == 1 and len(batches[0]) == expected
        pickled = pickle.dumps(batches.pop())
        base = _traced()
        copy = pickle.loads(pickled)
        proved, _ = _since(base)
        del copy
        return Measured(corpus_peak=corpus_peak, corpus=corpus_kept, rows=rows_kept, peak=peak, proved=proved)


@pytest.mark.slow
@pytest.mark.usefixtures("tracing")
@pytest.mark.parametrize("call", CALLS)
async def test_listing_memory_does_not_grow_with_the_children(stores: dict[int, MemoryLogStore], call: Call) -> None:
    """Method. For each size n, in a fresh session store and query (LRU of prepared observations
    off, the store's index built beforehand), with tracemalloc on and a collection before each
    baseline:

    - `corpus_peak(n)` and `corpus(n)`: the peak of one `list_sessions()` and what its result
      keeps, above the baseline;
    - `peak(n)`: the peak of the listing; `rows(n)`: the memory of an independent copy of its
      returned rows (a pickle round trip: every row and string anew — an upper bound);
    - `floor(n) = max(corpus_peak(n), corpus(n) + rows(n))`: the O(n) part any listing reaches —
      it builds its corpus, and at its end holds the corpus and the rows side by side;
    - `excess(n) = peak(n) - floor(n)`: everything else, which should be the reads in flight
      (at most four) and a constant.

    Assert `excess(2000) <= 1.2 * excess(1000) + SLACK` (SLACK: see its comment). A one-off
    listing of 50 children first warms the code paths and worker threads.

    It fails when the listing holds per-child state beyond the corpus and rows for its whole
    duration: one task per child (≈ 6 KB each), or every observation kept alive (≈ 3 KB each).
    """
    await measure(stores[WARM_UP], call, expected=WARM_UP)
    small = await measure(stores[SIZES[0]], call, expected=SIZES[0])
    large = await measure(stores[SIZES[1]], call, expected=SIZES[1])
    report = {
        n: attrs.asdict(m) | {"floor": m.floor, "excess": m.excess} for n, m in zip(SIZES, (small, large), strict=True)
    }
    assert large.excess <= RATIO * small.excess + SLACK, report
