"""Prices and cost (README "Cost"): what the tokens a model call recorded cost.

No price is built in (a built-in table would go stale without anyone noticing): the prices are
the `[prices]` table of `subagents.toml`, keyed by a model spec (`anthropic:claude-sonnet-4-5`)
or a bare model name (`claude-sonnet-4-5`), each `{input, output, cache_read, cache_write}` in
currency units per million tokens (`cache_read` and `cache_write` default to `input`).

Cost is never stored: it is derived, whenever it is shown or checked, from the usage records a
log holds and the model its `session/model` events say the session ran (`Tokens.models`), so it
can never disagree with them; a call whose model has no price — or a session that recorded no
model (a scripted one) — makes the sum `unknown`, never a wrong figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from .config_files import config_files, read_config_file
from .errors import ConfigInvalid

__all__ = ["PRICE_KEYS", "Price", "PriceTable", "format_cost", "load_prices", "parse_price"]

PRICE_KEYS = ("input", "output", "cache_read", "cache_write")
_MILLION = 1_000_000


@attrs.frozen(kw_only=True)
class Price:
    """Per million tokens: the prompt (uncached), the reply, the prompt read from and written to
    the provider's cache."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    def cost(self, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int) -> float:
        return (
            input_tokens * self.input
            + output_tokens * self.output
            + cache_read * self.cache_read
            + cache_write * self.cache_write
        ) / _MILLION


def parse_price(value: object) -> Price:
    """One `[prices."MODEL"]` table as a `Price`. Raises `ValueError` with the reason (the config
    loader names the file and key)."""
    if not isinstance(value, dict):
        raise ValueError("must be a table {input, output, cache_read?, cache_write?}")
    unknown = sorted(set(value) - set(PRICE_KEYS))
    if unknown:
        raise ValueError(f"has unknown key {unknown[0]} (known: {', '.join(PRICE_KEYS)})")
    for key in ("input", "output"):
        if key not in value:
            raise ValueError(f"needs {key} (per million tokens)")
    numbers: dict[str, float] = {}
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item) or item < 0:
            raise ValueError(f"{key} must be a number >= 0 (per million tokens), got {item!r}")
        numbers[key] = float(item)
    numbers.setdefault("cache_read", numbers["input"])
    numbers.setdefault("cache_write", numbers["input"])
    return Price(**numbers)


@attrs.frozen
class PriceTable:
    """Prices by model spec or model name; `price_of` looks a recorded model up."""

    prices: Mapping[str, Price] = attrs.field(factory=dict)

    def price_of(self, model: str | None) -> Price | None:
        """The price of a recorded model spec (`scheme:name[,options]`): by the whole spec, then
        without its options, then by its bare name. None: no price (or no model recorded)."""
        if not model:
            return None
        spec = model.split(",", 1)[0]
        name = spec.partition(":")[2]
        for key in (model, spec, name):
            if key and key in self.prices:
                return self.prices[key]
        return None

    def __bool__(self) -> bool:
        return bool(self.prices)


def format_cost(cost: float | None) -> str:
    """`$0.0123` (four decimals under 1, two above), or `unknown`."""
    if cost is None:
        return "unknown"
    return f"${cost:.4f}" if cost < 1 else f"${cost:.2f}"


def load_prices(project_dir: str = ".", env: Mapping[str, str] | None = None) -> PriceTable:
    """The `[prices]` of the user's and the project's `subagents.toml` (the project's entries
    win), for the read-only commands, which do not load the whole configuration (runtime/
    config.py checks the same table for the hosts). Raises `ValueError` with a one-line reason
    naming the file and key."""
    prices: dict[str, Price] = {}
    for path in config_files(project_dir, env):
        try:
            document = read_config_file(path)
        except ConfigInvalid as exc:
            raise ValueError(exc.message) from None
        if document is None:
            continue
        table = document.get("prices", {})
        if not isinstance(table, dict):
            raise ValueError(f"{path}: prices must be a table ([prices])")
        for model, value in table.items():
            try:
                prices[model] = parse_price(value)
            except ValueError as exc:
                raise ValueError(f'{path}: prices."{model}" {exc}') from None
    return PriceTable(prices)
