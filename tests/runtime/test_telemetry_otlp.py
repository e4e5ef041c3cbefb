"""Traces end to end (issue 29 item 5): `subagents run` in a subprocess with
OTEL_EXPORTER_OTLP_ENDPOINT set exports its spans over OTLP/HTTP (protobuf) to a receiver the
test runs; a second `run` of the same session — a new process, a cold resume from the log — adds
its turn to the same trace, under the first turn's span."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_process import CLI, clean_env, write_script
from otlp_receiver import otlp_receiver
from scripts import BACKGROUND_CHILD

RUN_AGAIN = {
    "agents": [{"session": "s1", "responses": [{"text": "AGAIN", "usage": {"input_tokens": 7, "output_tokens": 1}}]}]
}


def _run(root: Path, model: str, prompt: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--root", str(root), "--model", model, "--session", "s1", prompt],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        cwd=root.parent,
        timeout=60,
    )


@pytest.mark.slow  # two processes, about 3 s
def test_run_exports_gen_ai_spans_over_otlp_http_and_a_restart_continues_the_trace(tmp_path: Path) -> None:
    root = tmp_path / "store"
    first_model = write_script(
        tmp_path / "first.json",
        {"agents": [{"session": "s1", **BACKGROUND_CHILD["agents"][0]}, BACKGROUND_CHILD["agents"][1]]},
    )
    again_model = write_script(tmp_path / "again.json", RUN_AGAIN)
    with otlp_receiver() as receiver:
        done = _run(root, first_model, "Delegate the thing.", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
        assert (done.returncode, done.stdout) == (0, "NOTED\n"), done.stderr
        first = list(receiver.spans)
        done = _run(root, again_model, "And again.", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
        assert (done.returncode, done.stdout) == (0, "AGAIN\n"), done.stderr
        second = receiver.spans[len(first) :]
        assert set(receiver.paths) == {"/v1/traces"}
    assert sorted(s.name for s in first) == [
        "chat ScriptedModel",
        "chat ScriptedModel",
        "chat ScriptedModel",
        "chat ScriptedModel",
        "execute_tool list_agents",
        "execute_tool subagent",
        "invoke_agent helper",
        "invoke_agent root",
    ]
    assert {s.service_name for s in receiver.spans} == {"subagents"}
    (turn1,) = [s for s in first if s.name == "invoke_agent root"]
    (spawn,) = [s for s in first if s.name == "execute_tool subagent"]
    (child,) = [s for s in first if s.name == "invoke_agent helper"]
    assert turn1.parent_span_id == "" and turn1.attributes["gen_ai.agent.id"] == "s1"
    assert turn1.attributes["gen_ai.agent.name"] == "root"
    assert turn1.attributes["gen_ai.usage.input_tokens"] == 60
    assert child.parent_span_id == spawn.span_id
    assert "Delegate" not in str([s.attributes for s in receiver.spans])  # no content by default
    assert sorted(s.name for s in second) == ["chat ScriptedModel", "invoke_agent root"]
    (turn2,) = [s for s in second if s.name == "invoke_agent root"]
    assert (turn2.trace_id, turn2.parent_span_id) == (turn1.trace_id, turn1.span_id)
    assert turn2.attributes["subagents.turn"] == 2
    assert {s.trace_id for s in receiver.spans} == {turn1.trace_id}


@pytest.mark.slow  # two processes
def test_run_with_tracing_off_exports_nothing(tmp_path: Path) -> None:
    """OTEL_SDK_DISABLED wins over an endpoint: nothing is sent, and the log has no trace record."""
    root = tmp_path / "store"
    model = write_script(tmp_path / "s.json", {"agents": [{"session": "s1", "responses": [{"text": "hi"}]}]})
    with otlp_receiver() as receiver:
        done = _run(root, model, "go", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SDK_DISABLED="true")
        assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
        assert receiver.spans == []
    shown = subprocess.run([*CLI, "tail", "--root", str(root), "s1"], capture_output=True, text=True, env=clean_env())
    assert shown.returncode == 0 and "telemetry/trace" not in shown.stdout
