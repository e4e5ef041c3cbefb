"""The web console at 10,000 sessions (issue 31: "the overview and the first tree page each
answer in under 0.5 s"). A store of 100 roots with 99 continuable children each (written with
the storage layer, bench/corpus.py), the console's app over one read side, requests through
httpx's ASGI transport (the app's own time: no socket, no browser). Reported per page: the first
request (the store's index built by it when `--no-index`, else already there), then the median
and the worst of `--reps` more.

Run: `.venv/bin/python bench/web.py` (`--reps N`, default 10; `--sessions` per root 100 by
default; `--dir` for the temporary store; `--store DIR` keeps one store between runs, so two
versions of the console can be measured on the same files). A measurement, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence

import httpx
import trio
from corpus import build_store, drop_index
from subagents.runtime.hosts.web.app import WebSettings, build_app
from subagents.runtime.hosts.web.security import Access
from subagents.runtime.read_side import open_read_side

PAGES = ("/", "/tree", "/tree/r000", "/session/r000-c00000")


async def measure(root: str, reps: int) -> dict[str, tuple[float, float, float]]:
    out = {}
    async with open_read_side(root) as side:
        settings = WebSettings(root=root, access=Access("bench-token-long-enough"))
        transport = httpx.ASGITransport(app=build_app(side, settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as client:
            for path in PAGES:
                times = []
                for _ in range(reps + 1):
                    start = time.perf_counter()
                    response = await client.get(path)
                    times.append(time.perf_counter() - start)
                    assert response.status_code == 200, (path, response.status_code)
                out[path] = (times[0], statistics.median(times[1:]), max(times[1:]))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--roots", type=int, default=100)
    parser.add_argument("--children", type=int, default=99, help="children per root")
    parser.add_argument("--dir", default=None)
    parser.add_argument(
        "--store", default=None, help="a folder kept between runs (written when empty): before/after on one store"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        root = args.store or scratch
        roots = [f"r{i:03d}" for i in range(args.roots)]
        if not os.path.isdir(os.path.join(root, "sessions")):
            start = time.perf_counter()
            n = build_store(root, roots=roots, children=[(r, args.children) for r in roots])
            print(f"store: {n} sessions written in {time.perf_counter() - start:.1f} s")
        for label, drop in (("no index (the first request builds it)", True), ("index in place", False)):
            if drop:
                drop_index(root)
            figures = trio.run(measure, root, args.reps)
            print(f"-- {label}")
            for path, (first, median, worst) in figures.items():
                print(
                    f"{path:24} first {first * 1000:8.1f} ms   median {median * 1000:7.1f} ms   worst {worst * 1000:7.1f} ms"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
