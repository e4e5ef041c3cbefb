"""The model travels with the session (issue 27 item 4; runtime/agent/model_record.py): what a
session records as `session/model`, and which model a host resumes a subagent with."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from subagents.runtime.agent.model_record import ModelRecorder, last_recorded, resumed_model
from subagents.runtime.foundation.errors import ModelSpecError, OptionsNotReapplied
from subagents.runtime.models.specs import ModelRecord, build_model, parse_model_spec, record_of
from subagents.storage import Event

KEY = "sk-never-recorded-7f3a9c"


def _event(seq: int, kind: str, data: dict[str, Any]) -> Event:
    return Event(seq=seq, type=kind, time=1, data=msgspec.Raw(msgspec.json.encode(data)), ignorable=True)


def _model(spec: str, base_url: str | None = None) -> Any:
    return build_model(parse_model_spec(spec, base_url=base_url, api_key=KEY))


def test_a_provider_model_carries_its_record_without_key_or_secrets() -> None:
    model = _model("openai:gpt-x", "https://me:pw@proxy.example/v1?api_key=abc&region=eu")
    assert record_of(model) == ModelRecord(
        model="openai:gpt-x", base_url="https://me:***@proxy.example/v1?api_key=***&region=eu"
    )
    assert KEY not in repr(record_of(model)) and "abc" not in str(record_of(model))
    assert record_of(object()) is None  # an embedder's model records nothing


def test_a_session_records_its_model_once_and_again_only_when_it_changes() -> None:
    first, second = _model("openai:gpt-x", "https://api.example/v1"), _model("deepseek:chat")
    recorder = ModelRecorder([])
    assert recorder.changed(object()) is None  # a scripted (unrecorded) model: nothing
    assert recorder.changed(first) == {"model": "openai:gpt-x", "base_url": "https://api.example/v1"}
    assert recorder.changed(first) is None
    assert recorder.changed(second) == {"model": "deepseek:chat", "base_url": "https://api.deepseek.com"}
    # A resumed agent knows what its log says already
    log = [_event(3, "session/model", {"model": "openai:gpt-x", "base_url": "https://api.example/v1"})]
    assert ModelRecorder(log).changed(first) is None


def test_the_last_record_holds() -> None:
    log = [
        _event(1, "session/model", {"model": "openai:a"}),
        _event(5, "session/model", {"model": "openai:b", "base_url": "https://x.example"}),
    ]
    assert last_recorded(log) == ModelRecord(model="openai:b", base_url="https://x.example")
    assert last_recorded([]) is None


def test_a_resumed_subagent_runs_its_recorded_model_with_this_hosts_credentials() -> None:
    default = _model("openai:gpt-x", "https://api.example/v1")
    built: list[tuple[str, str | None]] = []

    def factory(spec: str, base_url: str | None) -> Any:
        built.append((spec, base_url))
        return _model(spec, base_url)

    same = [_event(1, "session/model", {"model": "openai:gpt-x", "base_url": "https://api.example/v1"})]
    other = [_event(1, "session/model", {"model": "deepseek:chat", "base_url": "https://api.deepseek.com"})]
    hidden = [_event(1, "session/model", {"model": "openai:gpt-y", "base_url": "https://p.example/?token=***"})]
    assert resumed_model("c1", [], default, factory) is default  # recorded none: the host's (serve --model)
    assert resumed_model("c1", same, default, factory) is default
    assert resumed_model("c1", other, default, None) is default  # no factory (an embedder): as given
    assert record_of(resumed_model("c1", other, default, factory)) == ModelRecord(
        model="deepseek:chat", base_url="https://api.deepseek.com"
    )
    resumed_model("c1", hidden, default, factory)
    assert built == [("deepseek:chat", "https://api.deepseek.com"), ("openai:gpt-y", None)]  # a redacted URL: its own


def test_a_host_that_lacks_the_recorded_model_refuses_in_one_line_naming_it() -> None:
    def factory(spec: str, base_url: str | None) -> Any:
        raise ModelSpecError("DEEPSEEK_API_KEY is not set (needed for --model deepseek:...)")

    log = [_event(1, "session/model", {"model": "deepseek:chat"})]
    with pytest.raises(OptionsNotReapplied) as info:
        resumed_model("c1", log, object(), factory)  # type: ignore[arg-type]  # any model: it is not used
    message = str(info.value)
    assert "\n" not in message and "deepseek:chat" in message and "'c1'" in message
    assert "DEEPSEEK_API_KEY is not set" in message
