"""Start-up of a read-only command (issue 20, item 2).

`subagents children lonely` — a parent with no children — in a store of 1,000 sessions (written
with the storage layer: bench/corpus.py), against the floor of what such a command needs:
`python -c "import trio, msgspec, zstandard, sqlite3"`. Each is a new process; the two alternate
(the order reversed on every repetition) and the figure is the median of the per-repetition
ratios of wall-clock time (CPU time, user + system, as context: it moves less on a loaded
machine). Target: <= 2.5x.

Every process runs with Python's bytecode cache on, kept in the bench's temporary folder
(`PYTHONPYCACHEPREFIX`; bench/corpus.py `bytecode_env`), as an installed package runs (pip
writes the .pyc files at install); one untimed run of each writes it. As context, the command also
runs as an editable checkout runs when its environment sets `PYTHONDONTWRITEBYTECODE=1` (this
machine's does): the third-party packages load from the .pyc files pip wrote, but the project's
own modules are compiled from source at every start.

Context, in the same interleaving: `python -c "import subagents.runtime.hosts.cli"` (the command's
imports alone). With `--profile`, the command's own import times (`-X importtime`, the slowest
modules) and a cProfile of `main()` in this process are printed after the figures.

Run: `.venv/bin/python bench/startup.py` (`--reps N`, default 10; `--quick`: 3 repetitions over
100 sessions; `--dir` for the temporary store). It always exits 0: a measurement, not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from bench_common import bug, load, per_rep, spread
from corpus import Run, build_store, bytecode_env, cli_command, run_process

TARGET = 2.5
FLOOR = [sys.executable, "-c", "import trio, msgspec, zstandard, sqlite3"]
IMPORTS = [sys.executable, "-c", "import subagents.runtime.hosts.cli"]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10, help="repetitions of each process (default 10)")
    parser.add_argument("--sessions", type=int, default=1000, help="sessions in the store (default 1,000)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 repetitions, 100 sessions")
    parser.add_argument("--profile", action="store_true", help="also print import times and a cProfile of the command")
    parser.add_argument("--dir", default=None, help="where to put the temporary store (default: the system temp dir)")
    return parser.parse_args(argv)


def interleaved(reps: int, runs: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {name: [] for name in runs}
    names = list(runs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            argv, env = runs[name]
            out[name].append(run_process(argv, env=env))
    return out


def import_times(command: list[str], env: dict[str, str], top: int = 15) -> str:
    """The slowest modules (cumulative µs) of the command's imports, from `-X importtime`."""
    python = [sys.executable, "-X", "importtime"]
    argv = python + command[1:] if command[0] == sys.executable else python + [command[0], *command[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            self_us, cumulative, name = (part.strip() for part in line.removeprefix("import time:").split("|", 2))
            if self_us.isdigit():
                rows.append((int(cumulative), int(self_us), name))
    rows.sort(reverse=True)
    lines = [f"   {'module':<52} {'self ms':>8} {'cumulative ms':>14}"]
    lines += [f"   {name:<52} {own / 1e3:>8.1f} {cum / 1e3:>14.1f}" for cum, own, name in rows[:top]]
    return "\n".join(lines)


def profile_main(argv: list[str]) -> str:
    from subagents.runtime.hosts.cli import main

    profile = cProfile.Profile()
    stdout = sys.stdout
    sys.stdout = io.StringIO()
    try:
        profile.runcall(main, argv)
    finally:
        sys.stdout = stdout
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
    return text.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    reps, sessions = (3, 100) if args.quick else (args.reps, args.sessions)
    workdir = tempfile.mkdtemp(prefix="subagents-startup-bench-", dir=args.dir)
    try:
        root = os.path.join(workdir, "root")
        written = build_store(root, roots=["lonely"], others=sessions - 1)
        command = [*cli_command(), "children", "--root", root, "lonely"]
        env = bytecode_env(os.path.join(workdir, "pycache"))
        # Context: as a checkout whose environment sets PYTHONDONTWRITEBYTECODE=1 runs (this
        # machine's): the third-party packages from the .pyc files pip wrote, the project's own
        # modules compiled at every start (unless a .pyc lies next to them).
        uncached = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
        uncached["PYTHONDONTWRITEBYTECODE"] = "1"
        print(
            f"start-up bench: {' '.join(command[-4:])} in a store of {written} sessions, {reps} interleaved runs "
            f"of each process, python {sys.version.split()[0]}, {os.cpu_count()} cpus, {load()}"
        )
        # Untimed: writes the bytecode cache, and the first listing builds the index (a cache).
        first = run_process(command, env=env)
        if first.stdout != b"(no subagents)\n":
            raise bug(f"children of a childless parent printed {first.stdout[:200]!r}")
        run_process(FLOOR, env=env)
        run_process(IMPORTS, env=env)
        runs = interleaved(
            reps,
            {
                "floor": (FLOOR, env),
                "command": (command, env),
                "imports": (IMPORTS, env),
                "uncached": (command, uncached),
            },
        )
        if any(run.stdout != first.stdout for run in runs["command"] + runs["uncached"]):
            raise bug("the command's output changed between runs")
        print(f"   {'process (medians)':<74} {'wall ms':>8} {'cpu ms':>8}")
        for name, what in (
            ("floor", 'python -c "import trio, msgspec, zstandard, sqlite3" (floor)'),
            ("imports", 'python -c "import subagents.runtime.hosts.cli" (context)'),
            ("command", f"subagents children lonely ({written} sessions)"),
            ("uncached", "context: the command, PYTHONDONTWRITEBYTECODE=1 (own modules compiled)"),
        ):
            wall = statistics.median(r.wall for r in runs[name]) * 1e3
            cpu = statistics.median(r.cpu for r in runs[name]) * 1e3
            print(f"   {what:<74} {wall:>8.1f} {cpu:>8.1f}")

        def ratios(over: str, under: str, field: str) -> list[float]:
            return per_rep([getattr(r, field) for r in runs[over]], [getattr(r, field) for r in runs[under]])

        walls = ratios("command", "floor", "wall")
        cpus = ratios("command", "floor", "cpu")
        ratio = statistics.median(walls)
        print(
            f"   command / floor: wall {ratio:.2f}x ({spread(walls)}), cpu {statistics.median(cpus):.2f}x "
            f"({spread(cpus)}); imports alone / floor, wall: {statistics.median(ratios('imports', 'floor', 'wall')):.2f}x; "
            f"PYTHONDONTWRITEBYTECODE=1, command / floor, wall: {statistics.median(ratios('uncached', 'floor', 'wall')):.2f}x"
        )
        if args.profile:
            print("\nimport times of the command (-X importtime, slowest cumulative):")
            print(import_times(command, env))
            print("\ncProfile of main() in this process (its imports already done):")
            print(profile_main(command[-4:]))
        print(f"\n{load()}")
        print(f"start-up target <= {TARGET}x the floor: {'PASS' if ratio <= TARGET else 'BELOW'} ({ratio:.2f}x)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
