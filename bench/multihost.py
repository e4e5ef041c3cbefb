"""Many hosts on one PostgreSQL (issue 19): background children completed per second on 1, 2 and
3 `subagents serve` hosts at the same per-host capacity, the work latency-bound (each child's
scripted model answers after DELAY_MS), on one embedded PostgreSQL server (the tests' wheel).

Each run: a fresh database, N serve processes (`--capacity CAPACITY`), then one `subagents run`
whose root starts CHILDREN background children in one step (their family may have all of them
active: `max_active_subagents`). The figure is CHILDREN over the time from the first child a host
took (`claimed`) to the last one it let go (`finished`), read from the hosts' own lines; the run's
start-up and the hosts' are outside it. The runs for 1, 2 and 3 hosts alternate (REPS rounds); the
figure per host count is the median. Target: 3 hosts >= 2.5x 1 host. Every run checks its work:
every child settled once (`completed`) in the parent's log, every host's lines add up.

Run: `.venv/bin/python bench/multihost.py` (`--quick`: fewer children and rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "helpers"))

from pg_server import EmbeddedServer, fresh_database  # noqa: E402  # the tests' embedded server, after the sys.path line

CLI = [os.path.join(os.path.dirname(sys.executable), "subagents")]
TARGET = 2.5


class Host:
    """A `subagents serve` process whose stdout lines are stamped as they arrive."""

    def __init__(self, argv: list[str], cwd: str) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))
        self.lines.put(None)

    def wait_for(self, prefix: str, timeout: float = 120) -> None:
        while True:
            item = self.lines.get(timeout=timeout)
            if item is None:
                raise SystemExit(
                    f"bench bug: a host ended early: {self.proc.stderr.read() if self.proc.stderr else ''}"
                )
            self.seen.append(item)
            if item[1].startswith(prefix):
                return

    def drain(self) -> None:
        while True:
            try:
                item = self.lines.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self.seen.append(item)

    def stop(self) -> None:
        self.proc.send_signal(2)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.drain()


def script(children: int, delay_ms: int) -> dict[str, Any]:
    calls = [
        {"name": "subagent", "arguments": {"description": f"kid-{i}", "prompt": f"part {i}"}} for i in range(children)
    ]
    parent = {
        "session": "bench-parent",
        "responses": [{"tool_calls": calls}, {"text": "started"}, *({"text": "noted"} for _ in range(children))],
    }
    kids = [{"label": f"kid-{i}", "responses": [{"delay_ms": delay_ms, "text": "done"}]} for i in range(children)]
    return {"agents": [parent, *kids]}


def one_run(admin_url: str, name: str, hosts: int, args: argparse.Namespace, folder: str) -> float:
    """Children per second with `hosts` serving hosts (see the module docstring)."""
    url = fresh_database(admin_url, name)
    cwd = os.path.join(folder, name)
    os.makedirs(cwd)
    with open(os.path.join(cwd, "subagents.toml"), "w") as f:
        f.write(f"max_active_subagents = {args.children}\n")
    model = os.path.join(cwd, "script.json")
    with open(model, "w") as f:
        json.dump(script(args.children, args.delay_ms), f)
    started = []
    try:
        for _ in range(hosts):
            host = Host(
                [*CLI, "serve", "--store", url, "--model", f"scripted:{model}", "--capacity", str(args.capacity)], cwd
            )
            started.append(host)
            host.wait_for("serving host ")
        run = subprocess.run(
            [*CLI, "run", "--store", url, "--model", f"scripted:{model}", "--session", "bench-parent", "go"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if run.returncode != 0:
            raise SystemExit(f"bench bug: the run failed: {run.stderr}")
    finally:
        for host in started:
            host.stop()
    claimed = [(t, line.split()[1]) for h in started for t, line in h.seen if line.startswith("claimed ")]
    finished = [(t, line.split()[1]) for h in started for t, line in h.seen if line.startswith("finished ")]
    if len(claimed) != args.children or len({c for _, c in claimed}) != args.children or len(finished) != args.children:
        raise SystemExit(f"bench bug: {len(claimed)} claims and {len(finished)} finishes for {args.children} children")
    settled = _settled(url)
    if sorted(settled) != sorted(c for _, c in claimed):
        raise SystemExit("bench bug: the parent's settlements do not match the children run")
    span = max(t for t, _ in finished) - min(t for t, _ in claimed)
    if args.verbose:
        t0 = min(t for t, _ in claimed)
        for i, h in enumerate(started):
            marks = [
                f"{line.split()[0][0]}{t - t0:.2f}" for t, line in h.seen if line.split()[0] in ("claimed", "finished")
            ]
            print(f"    host {i}: {' '.join(marks)}")
    return args.children / span


def _settled(url: str) -> list[str]:
    from subagents.storage import PostgresLogStore

    store = PostgresLogStore(url)
    try:
        handle = store.open_read("bench-parent")
        try:
            out = []
            for event in store.read(handle):
                if event.type == "subagent/settled":
                    data = json.loads(bytes(event.data))
                    if data["reason_kind"] != "completed":
                        raise SystemExit(f"bench bug: a child settled {data['reason_kind']}")
                    out.append(data["child_id"])
            return out
        finally:
            store.close(handle)
    finally:
        store.close_store()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer children and rounds")
    parser.add_argument("--children", type=int, default=None)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--delay-ms", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--verbose", action="store_true", help="when each host took and let go of each child")
    args = parser.parse_args()
    args.children = args.children or (12 if args.quick else 36)
    args.delay_ms = args.delay_ms or (500 if args.quick else 2000)
    args.reps = args.reps or (1 if args.quick else 3)
    print(
        f"multihost: {args.children} children, {args.delay_ms} ms each, capacity {args.capacity} per host, "
        f"{args.reps} rounds"
    )
    server = EmbeddedServer.start()
    rates: dict[int, list[float]] = {1: [], 2: [], 3: []}
    try:
        with tempfile.TemporaryDirectory(prefix="subagents-multihost-") as folder:
            for rep in range(args.reps):
                order = [1, 2, 3] if rep % 2 == 0 else [3, 2, 1]
                for hosts in order:
                    rate = one_run(server.url, f"mh_{rep}_{hosts}", hosts, args, folder)
                    rates[hosts].append(rate)
                    print(f"  round {rep + 1}: {hosts} host(s): {rate:.2f} children/s")
    finally:
        server.stop()
    medians = {n: statistics.median(r) for n, r in rates.items()}
    for n in (1, 2, 3):
        print(f"{n} host(s): {medians[n]:.2f} children/s (median; {', '.join(f'{r:.2f}' for r in rates[n])})")
    ratio = medians[3] / medians[1]
    print(f"3 hosts / 1 host: {ratio:.2f}x (target >= {TARGET}x): {'PASS' if ratio >= TARGET else 'BELOW'}")
    print(f"2 hosts / 1 host: {medians[2] / medians[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
