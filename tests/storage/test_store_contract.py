"""The narrow parts of the storage contract (storage/log_store.py), on every backend: a write
handle carries the epoch of its lease (None where the single-writer lock is not a lease), and the
leased capability is asked for (`LogStore.leased`), never probed for."""

from __future__ import annotations

from collections.abc import Callable

from events import turn_batch as batch
from log_lines import header
from subagents.storage import LogStore, PostgresLogStore
from subagents.storage.testing import FaultyLogStore, MemoryLogStore

StoreFactory = Callable[[], LogStore]


def test_a_write_handle_carries_its_lease_epoch(store: LogStore) -> None:
    made = store.create(header("s1"))
    store.append(made, [batch(0, 2)])
    store.close(made)
    again = store.open_write("s1")
    try:
        if store.leased is None:
            assert made.epoch is None and again.epoch is None
        else:
            # The lease's own epoch (pg_leases), and a new claim takes the next one.
            assert made.epoch == made.impl.epoch == 1  # type: ignore[attr-defined]  # a LeaseState
            assert again.epoch == again.impl.epoch == 2  # type: ignore[attr-defined]  # a LeaseState
    finally:
        store.close(again)


def test_only_a_store_shared_by_hosts_has_the_leased_capability(store: LogStore) -> None:
    leased = store.leased
    if isinstance(store, PostgresLogStore):
        assert leased is store
        assert leased.lease_renew_interval > 0
        assert leased.renew_leases() == frozenset()
    else:
        # The file store's flocks need no renewal; the faulty wrapper injects no lease faults.
        assert leased is None


def test_the_faulty_wrapper_has_no_leases_whatever_it_wraps() -> None:
    assert FaultyLogStore(MemoryLogStore()).leased is None
