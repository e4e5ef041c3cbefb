"""Model specs of the CLI (README, "The CLI"): `scripted:PATH`, `deepseek:MODEL`, `openai:MODEL`,
`anthropic:MODEL` (with options: `anthropic:MODEL,thinking=TOKENS,max_tokens=N,cache=off`).

Parsing is separate from building so the CLI can validate every argument — scheme, script
file, API key — before it opens the runtime. Only the caller reads the environment; keys are
passed in and never appear in an error text.

A provider model built here carries its `ModelRecord` (`record_of`): `scheme:name` and its base
URL without secrets, what a session writes as `session/model` so that whichever host resumes it
runs the same model with its own credentials (runtime/agent/model_record.py). A scripted model
records nothing: its script path is one machine's, and a run's log would differ by checkout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
from subagents.storage import redact_url

from ..foundation.clock import Clock
from ..foundation.errors import ModelSpecError, ScriptError
from ..testing.script_format import load_script
from ..testing.scripted_model import ScriptedModel
from .base import Model, SessionModel
from .defaults import DEFAULT_MODEL as DEFAULT_MODEL  # where it was before (re-exported)
from .defaults import DEFAULT_STALL_TIMEOUT
from .openai import OpenAIChatModel

if TYPE_CHECKING:
    from .anthropic_wire import AnthropicOptions

__all__ = ["ModelRecord", "ModelSpec", "anthropic_options", "build_model", "parse_model_spec", "record_of"]

_PROVIDERS = {
    # scheme: (API-key variable, base-URL variable or None, default base URL)
    "deepseek": ("DEEPSEEK_API_KEY", None, "https://api.deepseek.com"),
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL", "https://api.openai.com/v1"),
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
}
_SCHEMES = "scripted:PATH, deepseek:MODEL, openai:MODEL or anthropic:MODEL"


@attrs.frozen(kw_only=True)
class ModelSpec:
    scheme: str
    name: str  # the model name, or the script path for `scripted`
    base_url: str | None = None
    api_key: str | None = attrs.field(default=None, repr=False)


@attrs.frozen(kw_only=True)
class ModelRecord:
    """Which model a session runs, as `session/model` records it: never a key, and a base URL
    without userinfo or secret-bearing query parameters."""

    model: str  # "scheme:name"
    base_url: str | None = None

    def data(self) -> dict[str, str]:
        """The `session/model` payload."""
        return {"model": self.model} | ({} if self.base_url is None else {"base_url": self.base_url})


# The attribute a built provider model carries its record in: the transports are the models'
# own classes, and what spec built one is the host's knowledge, not the transport's.
_RECORD_ATTR = "subagents_model_record"


def record_of(model: object) -> ModelRecord | None:
    """The record of a model `build_model` made (None for any other: a scripted model, an
    embedder's own)."""
    record = getattr(model, _RECORD_ATTR, None)
    return record if isinstance(record, ModelRecord) else None


def parse_model_spec(
    spec: str, *, base_url: str | None = None, env: Mapping[str, str] = {}, api_key: str | None = None
) -> ModelSpec:
    """`api_key` wins over `env` (the library passes keys explicitly; only the CLI hands in
    `os.environ`)."""
    scheme, sep, name = spec.partition(":")
    if not sep or not name:
        raise ModelSpecError(f"model must look like {_SCHEMES}, got {spec!r}")
    if scheme == "scripted":
        return ModelSpec(scheme=scheme, name=name)
    if scheme not in _PROVIDERS:
        raise ModelSpecError(f"unknown model scheme {scheme!r} (use scripted, deepseek, openai or anthropic)")
    if scheme == "anthropic":
        anthropic_options(name)  # a bad option fails before the key is looked for
    key_var, url_var, default_url = _PROVIDERS[scheme]
    key = api_key or env.get(key_var)
    if not key:
        raise ModelSpecError(
            f"{key_var} is not set (needed for --model {scheme}:...)"
            if env
            else f"model {scheme}:{name} needs an api_key"
        )
    url = base_url or (env.get(url_var) if url_var else None) or default_url
    return ModelSpec(scheme=scheme, name=name, base_url=url, api_key=key)


def build_model(
    spec: ModelSpec, *, stall_timeout: float | None = DEFAULT_STALL_TIMEOUT, clock: Clock | None = None
) -> Model | SessionModel:
    """Build the model (loading and validating a script now, so a bad one fails up front).
    `stall_timeout` only applies to a scripted model (see `ScriptedModel`); `clock` only to a
    transport (its retry backoff; a scripted model sleeps on the clock of the runtime it joins)."""
    if spec.scheme == "scripted":
        try:
            return ScriptedModel(load_script(spec.name), stall_timeout=stall_timeout)
        except ScriptError as exc:
            raise ModelSpecError(str(exc).replace("invalid script", "bad script", 1)) from None
    assert spec.base_url is not None
    try:
        model: Model
        if spec.scheme == "anthropic":
            from .anthropic import AnthropicModel  # only a run on Anthropic loads it

            name, options = anthropic_options(spec.name)
            model = AnthropicModel(name, base_url=spec.base_url, api_key=spec.api_key, options=options, clock=clock)
        else:
            model = OpenAIChatModel(spec.name, base_url=spec.base_url, api_key=spec.api_key, clock=clock)
    except ValueError as exc:
        raise ModelSpecError(str(exc)) from None
    record = ModelRecord(model=f"{spec.scheme}:{spec.name}", base_url=redact_url(spec.base_url))
    setattr(model, _RECORD_ATTR, record)
    return model


def anthropic_options(name: str) -> tuple[str, AnthropicOptions]:
    """`MODEL[,thinking=TOKENS][,max_tokens=N][,cache=on|off]` → the model name and its options.
    The options are part of the spec, so a session records them with its model and a resume on
    any host asks the same. `ModelSpecError` for an unknown, repeated or malformed option."""
    from .anthropic_wire import AnthropicOptions  # only an anthropic: spec loads the wire module

    model, *pairs = name.split(",")
    if not model:
        raise ModelSpecError(f"anthropic:{name} names no model")
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in ("thinking", "max_tokens", "cache") or key in values:
            raise ModelSpecError(
                f"bad option {pair!r} in anthropic:{name} (use thinking=TOKENS, max_tokens=N, cache=on|off, once each)"
            )
        values[key] = value
    numbers: dict[str, int] = {}
    for key in ("thinking", "max_tokens"):
        if key in values:
            if not values[key].isdigit() or int(values[key]) < 1:
                raise ModelSpecError(f"{key} must be a positive integer in anthropic:{name}, got {values[key]!r}")
            numbers[key] = int(values[key])
    cache = values.get("cache", "on")
    if cache not in ("on", "off"):
        raise ModelSpecError(f"cache must be on or off in anthropic:{name}, got {cache!r}")
    default = AnthropicOptions()
    max_tokens = numbers.get("max_tokens", default.max_tokens)
    thinking = numbers.get("thinking")
    if thinking is not None and "max_tokens" not in numbers and thinking >= max_tokens:
        max_tokens = thinking + default.max_tokens  # room for the answer after the thinking
    return model, AnthropicOptions(max_tokens=max_tokens, thinking_budget=thinking, cache=cache == "on")
