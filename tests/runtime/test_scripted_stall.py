"""No silent hangs (issue 13 item 5, SPEC 5.6): a scripted `wait_for` that nothing satisfies fails
after `stall_timeout` seconds without progress, with one line naming the session, the response
and the wait; progress restarts the timer; `wait_for settled` takes a `count`.

The model-level tests run under `autojump_clock` with fake waits (virtual time only). The
runtime-level stall tests use `MemoryLogStore` under `autojump_clock`: the wait can never be
satisfied, so whenever the clock jumps, the outcome is the same line. The `count` test does real
IO on the real Trio clock and is ordered by `wait_for` alone; the CLI test's only real-time wait
is the tiny stall timeout of the code under test.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from cli_process import CLI
from scripted_calls import collect, failure, req
from subagents.runtime.app import open_runtime
from subagents.runtime.foundation.clock import RealClock, ScenarioClock
from subagents.runtime.foundation.errors import ModelError, ScriptError
from subagents.runtime.foundation.ids import CountingIds
from subagents.runtime.models.base import Chunk, Finish, TextDelta
from subagents.runtime.testing.script_format import Script, WaitForSettled, load_script
from subagents.runtime.testing.scripted_model import DEFAULT_STALL_TIMEOUT, ScriptedModel, parse_stall_timeout
from subagents.storage.testing import MemoryLogStore

Json = dict[str, Any]

GUARD = 30.0  # real seconds: only reached if something hangs


# --- helpers ----------------------------------------------------------------------------------


def model_of(document: Json, **options: Any) -> ScriptedModel:
    return ScriptedModel(Script.from_json(json.dumps(document)), **options)


class Waits:
    """Fake `ScriptWaits` (given to `bind`): each hold is an event the test sets."""

    def __init__(self) -> None:
        self.steer = trio.Event()
        self.settle: dict[tuple[str, int], trio.Event] = {}

    async def steered(self) -> None:
        await self.steer.wait()

    async def settled(self, child: str, count: int = 1) -> None:
        await self.settle.setdefault((child, count), trio.Event()).wait()


STALLS = [
    ({"steered": True}, '{"steered": true}'),
    ({"settled": "Alpha"}, '{"settled": "Alpha"}'),
    ({"settled": "Alpha", "count": 2}, '{"settled": "Alpha", "count": 2}'),
    ({"waiting": "nobody"}, '{"waiting": "nobody"}'),
]


# --- the model: stalls, progress, delays ------------------------------------------------------


@pytest.mark.parametrize(("wait", "shown"), STALLS)
async def test_an_unsatisfiable_wait_fails_with_one_line(wait: Json, shown: str, autojump_clock: Any) -> None:
    model = model_of(
        {
            "agents": [
                {
                    "session": "parent",
                    "responses": [{"text": "one"}, {"text": "two"}, {"wait_for": wait, "text": "never"}],
                }
            ]
        }
    )
    waits = Waits()
    for _ in range(2):
        await collect(model, req("parent", waits=waits))
    start = trio.current_time()
    error = await failure(model, req("parent", waits=waits))
    assert error.code == "MODEL_SCRIPT_STALLED"
    assert error.message == (
        f'scripted wait stalled: session "parent" response 3 waits for {shown} with no progress for 30 s'
    )
    assert "\n" not in error.message
    assert trio.current_time() - start >= DEFAULT_STALL_TIMEOUT


async def test_the_stall_line_names_the_label_and_the_expanded_template(autojump_clock: Any) -> None:
    model = model_of(
        {"agents": [{"label": "Alpha", "responses": [{"wait_for": {"settled": "{{from_request:(nobody)}}"}}]}]},
        stall_timeout=2.5,
    )
    call = req(
        "child-1",
        label="Alpha",
        waits=Waits(),
        messages=({"role": "user", "content": [{"type": "text", "text": "ask nobody"}]},),
    )
    error = await failure(model, call)
    assert error.message == (
        'scripted wait stalled: session "child-1" (label "Alpha") response 1 waits for'
        ' {"settled": "nobody"} with no progress for 2.5 s'
    )


async def test_progress_restarts_the_timer(autojump_clock: Any) -> None:
    # The parent waits 100 s in all, but some other scripted response is served every 20 s:
    # each gap is below the 30 s timeout, so the wait never trips.
    model = model_of(
        {
            "agents": [
                {"session": "parent", "responses": [{"wait_for": {"steered": True}, "text": "held"}]},
                {"session": "other", "responses": [{"text": "tick"}] * 4},
            ]
        }
    )
    waits = Waits()
    seen: list[Chunk] = []

    async def parent() -> None:
        seen.extend(await collect(model, req("parent", waits=waits)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parent)
        for _ in range(4):
            await trio.sleep(20)
            assert await collect(model, req("other")) == [TextDelta("tick"), Finish("stop")]
        await trio.sleep(20)
        waits.steer.set()
    assert seen == [TextDelta("held"), Finish("stop")]


async def test_without_progress_the_same_gaps_trip(autojump_clock: Any) -> None:
    # The control of the test above: nothing moves during the first 30 s, so the wait fails.
    model = model_of(
        {"agents": [{"session": "parent", "responses": [{"wait_for": {"steered": True}, "text": "held"}]}]}
    )
    waits = Waits()
    outcome: list[BaseException] = []

    async def parent() -> None:
        try:
            await collect(model, req("parent", waits=waits))
        except ModelError as exc:
            outcome.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parent)
        await trio.sleep(40)
        waits.steer.set()
    assert [getattr(e, "code", None) for e in outcome] == ["MODEL_SCRIPT_STALLED"]


async def test_note_progress_from_the_host_restarts_the_timer(autojump_clock: Any) -> None:
    model = model_of(
        {"agents": [{"session": "parent", "responses": [{"wait_for": {"steered": True}, "text": "held"}]}]},
        stall_timeout=10,
    )
    waits = Waits()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect, model, req("parent", waits=waits))
        for _ in range(5):
            await trio.sleep(9)
            model.note_progress()
        waits.steer.set()


async def test_a_scripted_delay_suspends_the_timer(autojump_clock: Any) -> None:
    # A real-time delay elsewhere is progress that is certain to come: the parent keeps waiting
    # through a 100 s `delay_ms` of another session and is released after it.
    model = model_of(
        {
            "agents": [
                {"session": "parent", "responses": [{"wait_for": {"steered": True}, "text": "held"}]},
                {"session": "slow", "responses": [{"delay_ms": 100_000, "text": "late"}]},
            ]
        }
    )
    waits = Waits()
    seen: list[Chunk] = []

    async def parent() -> None:
        seen.extend(await collect(model, req("parent", waits=waits)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parent)
        await trio.testing.wait_all_tasks_blocked()
        assert await collect(model, req("slow", clock=RealClock())) == [TextDelta("late"), Finish("stop")]
        await trio.sleep(20)
        waits.steer.set()
    assert seen == [TextDelta("held"), Finish("stop")]


async def test_a_wait_that_is_satisfied_releases_with_its_count(autojump_clock: Any) -> None:
    model = model_of(
        {
            "agents": [
                {"session": "parent", "responses": [{"wait_for": {"settled": "Alpha", "count": 2}, "text": "second"}]}
            ]
        }
    )
    waits = Waits()
    seen: list[Chunk] = []

    async def parent() -> None:
        seen.extend(await collect(model, req("parent", waits=waits)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parent)
        await trio.testing.wait_all_tasks_blocked()
        assert list(waits.settle) == [("Alpha", 2)]
        await trio.sleep(29)
        waits.settle["Alpha", 2].set()
    assert seen == [TextDelta("second"), Finish("stop")]


async def test_no_stall_timeout_waits_forever(autojump_clock: Any) -> None:
    model = model_of({"agents": [{"responses": [{"wait_for": {"steered": True}}]}]}, stall_timeout=None)
    with trio.move_on_after(10_000) as scope:
        await collect(model, req("parent", waits=Waits()))
    assert scope.cancelled_caught


@pytest.mark.parametrize("bad", [0, -1, 0.0, float("nan"), float("inf"), True, "1"])
def test_the_stall_timeout_is_validated(bad: Any) -> None:
    with pytest.raises(ValueError, match="stall_timeout"):
        model_of({"agents": [{"responses": []}]}, stall_timeout=bad)


@pytest.mark.parametrize("text", ["0", "-1", "abc", "nan", "inf", "", "1e999"])
def test_the_stall_timeout_flag_is_validated(text: str) -> None:
    with pytest.raises(ValueError, match="--stall-timeout must be a positive number of seconds"):
        parse_stall_timeout(text)


def test_the_stall_timeout_flag_accepts_positive_numbers() -> None:
    assert parse_stall_timeout("0.2") == 0.2
    assert parse_stall_timeout("45") == 45.0


# --- the loader: count ------------------------------------------------------------------------

COUNT_PATH = "$.agents[0].responses[0].wait_for.count"


@pytest.mark.parametrize(
    ("count", "problem"),
    [
        (0, "must be >= 1, got 0"),
        (-3, "must be >= 1, got -3"),
        ("2", "must be an integer, got string"),
        (True, "must be an integer, got boolean"),
        (1.5, "must be an integer, got number"),
        (None, "must be an integer, got null"),
    ],
)
def test_the_loader_refuses_a_bad_count(count: Any, problem: str) -> None:
    with pytest.raises(ScriptError) as info:
        load_script(json.dumps({"agents": [{"responses": [{"wait_for": {"settled": "Alpha", "count": count}}]}]}))
    assert info.value.path == COUNT_PATH
    assert info.value.problem == problem


@pytest.mark.parametrize("wait", [{"steered": True, "count": 2}, {"waiting": "x", "count": 2}, {"count": 2}])
def test_count_only_goes_with_settled(wait: Json) -> None:
    with pytest.raises(ScriptError) as info:
        load_script(json.dumps({"agents": [{"responses": [{"wait_for": wait}]}]}))
    assert info.value.path.startswith("$.agents[0].responses[0].wait_for")


def test_the_loader_keeps_the_count() -> None:
    script = load_script(
        json.dumps(
            {
                "agents": [
                    {"responses": [{"wait_for": {"settled": "Alpha", "count": 2}}, {"wait_for": {"settled": "Alpha"}}]}
                ]
            }
        )
    )
    assert [r.wait_for for r in script.agents[0].responses] == [
        WaitForSettled(child="Alpha", count=2),
        WaitForSettled(child="Alpha", count=1),
    ]


# --- the runtime: the turn ends with the line ---------------------------------------------------


@pytest.mark.parametrize(("wait", "shown"), STALLS)
async def test_a_stalled_turn_ends_with_the_line(wait: Json, shown: str, autojump_clock: Any) -> None:
    script = {"agents": [{"session": "parent", "responses": [{"wait_for": wait, "text": "never"}]}]}
    model = ScriptedModel(load_script(json.dumps(script)), stall_timeout=5)
    async with open_runtime(
        "/nonexistent-memory-root",
        model=model,
        log_store=MemoryLogStore(compression="none"),
        clock=ScenarioClock(),
        id_factory=CountingIds("child"),
    ) as rt:
        agent = await rt.agents.create(session_id="parent")
        await agent.send("go")
        result = await rt.subagents.wait_tree_idle(agent)
    assert result is not None
    assert result.reason == {
        "kind": "error",
        "message": f'scripted wait stalled: session "parent" response 1 waits for {shown} with no progress for 5 s',
    }


def _two_runs_script() -> Json:
    """The parent starts Alpha, waits for its first settlement, sends it a message, then waits
    for its second settlement; Alpha answers each run."""
    return {
        "agents": [
            {
                "session": "parent",
                "responses": [
                    {"tool_calls": [{"name": "subagent", "arguments": {"description": "Alpha", "prompt": "run once"}}]},
                    {
                        "wait_for": {"settled": "Alpha"},
                        "tool_calls": [
                            {"name": "send_message", "arguments": {"agent_id": "child-1", "message": "again"}}
                        ],
                    },
                    {"wait_for": {"settled": "Alpha", "count": 2}, "text": "TWICE"},
                    *[{"text": "NOTED"}] * 4,
                ],
            },
            {"label": "Alpha", "responses": [{"text": "first run"}, {"text": "second run"}]},
        ]
    }


async def test_count_waits_for_the_second_settlement_and_earlier_runs_count(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with trio.fail_after(GUARD):
        model = ScriptedModel(load_script(json.dumps(_two_runs_script())))
        async with open_runtime(
            root, model=model, clock=ScenarioClock(), id_factory=CountingIds("child"), compression="none"
        ) as rt:
            agent = await rt.agents.create(session_id="parent")
            await agent.send("go")
            await rt.subagents.wait_tree_idle(agent)
    records = [
        json.loads(line) for line in (root / "sessions" / "parent" / "session.jsonl").read_text().splitlines()[1:]
    ]
    settled = [r["seq"] for r in records if r["type"] == "subagent/settled"]
    twice = [
        r["seq"]
        for r in records
        if r["type"] == "assistant/message"
        and r["data"]["message"]["content"][:1] == [{"type": "text", "text": "TWICE"}]
    ]
    assert len(settled) == 2 and len(twice) == 1
    assert twice[0] > settled[1]  # held until the second settlement was durable

    # A new process (a fresh model): the two settlements the log holds count.
    resumed = {
        "agents": [
            {"session": "parent", "responses": [{"wait_for": {"settled": "Alpha", "count": 2}, "text": "SAW TWO"}]}
        ]
    }
    with trio.fail_after(GUARD):
        model = ScriptedModel(load_script(json.dumps(resumed)), stall_timeout=0.2)
        async with open_runtime(
            root, model=model, clock=ScenarioClock(), id_factory=CountingIds("later"), compression="none"
        ) as rt:
            agent = await rt.agents.resume("parent")
            await agent.send("again")
            result = await rt.subagents.wait_tree_idle(agent)
    assert result is not None and (result.reason, result.text) == ({"kind": "completed"}, "SAW TWO")

    # ... and a third is not there: that wait stalls (0.2 s of real time, bounded by the model).
    third = {"agents": [{"session": "parent", "responses": [{"wait_for": {"settled": "Alpha", "count": 3}}]}]}
    with trio.fail_after(GUARD):
        model = ScriptedModel(load_script(json.dumps(third)), stall_timeout=0.2)
        async with open_runtime(
            root, model=model, clock=ScenarioClock(), id_factory=CountingIds("later"), compression="none"
        ) as rt:
            agent = await rt.agents.resume("parent")
            await agent.send("once more")
            result = await rt.subagents.wait_tree_idle(agent)
    assert result is not None and result.reason["kind"] == "error"
    assert result.reason["message"].endswith('waits for {"settled": "Alpha", "count": 3} with no progress for 0.2 s')


# --- the CLI ------------------------------------------------------------------------------------


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=GUARD)


@pytest.mark.slow  # a real `subagents run` process
def test_cli_run_stalls_with_one_line_and_exit_1(tmp_path: Path) -> None:
    script = tmp_path / "never.json"
    script.write_text(
        json.dumps(
            {"agents": [{"session": "parent", "responses": [{"wait_for": {"settled": "Alpha"}, "text": "never"}]}]}
        )
    )
    root = tmp_path / "root"
    done = run_cli(
        [
            "run",
            "--root",
            str(root),
            "--session",
            "parent",
            "--model",
            f"scripted:{script}",
            "--stall-timeout",
            "0.2",
            "go",
        ],
        tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    line = (
        'subagents: the turn ended error: scripted wait stalled: session "parent" response 1 waits for'
        ' {"settled": "Alpha"} with no progress for 0.2 s'
    )
    assert line in done.stderr.splitlines()
    assert [ln for ln in done.stderr.splitlines() if "stall" in ln] == [line]
    assert done.stdout == ""  # a failed turn that said nothing prints nothing, not an empty line


@pytest.mark.slow  # 8 subprocesses
@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan"])
@pytest.mark.parametrize("command", ["run", "scenario"])
def test_cli_refuses_a_bad_stall_timeout(tmp_path: Path, command: str, value: str) -> None:
    script = tmp_path / "ok.json"
    script.write_text(json.dumps({"agents": [{"responses": [{"text": "ok"}]}]}))
    root = tmp_path / "root"
    args = (
        ["run", "--root", str(root), "--model", f"scripted:{script}", "--stall-timeout", value, "go"]
        if command == "run"
        else ["scenario", "run", str(tmp_path), "--stall-timeout", value]
    )
    done = run_cli(args, tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"subagents: --stall-timeout must be a positive number of seconds, got {value!r}\n"
    assert not root.exists()


@pytest.mark.slow  # a real `subagents scenario` process
def test_cli_scenario_run_stalls_instead_of_hanging(tmp_path: Path) -> None:
    scenario = tmp_path / "stuck"
    scenario.mkdir()
    (scenario / "scenario.json").write_text(
        json.dumps({"steps": [{"op": "prompt", "session": "parent", "text": "go"}]})
    )
    (scenario / "script.json").write_text(
        json.dumps({"agents": [{"session": "parent", "responses": [{"wait_for": {"steered": True}, "text": "never"}]}]})
    )
    done = run_cli(["scenario", "run", str(scenario), "--stall-timeout", "0.2"], tmp_path)
    assert done.returncode == 0, done.stderr
    [output] = json.loads(done.stdout)["outputs"]
    assert output["reason"] == {
        "kind": "error",
        "message": 'scripted wait stalled: session "parent" response 1'
        ' waits for {"steered": true} with no progress for 0.2 s',
    }
