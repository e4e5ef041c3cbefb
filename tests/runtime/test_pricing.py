"""Prices and cost (issue 30 item 3): `[prices]` in subagents.toml (per model spec or bare name;
bad tables are one line naming the file and key), cost derived from recorded usage and the model
`session/model` recorded — `unknown` when a model has no price, a call's usage is unknown, or no
model was recorded — and the `--budget-*` flags over `[budget]`."""

from __future__ import annotations

from pathlib import Path

import pytest
from subagents.runtime import Price, PriceTable, SessionUsage, Tokens, cost_of, usage_of
from subagents.runtime.config import load_config, with_budget_flags
from subagents.runtime.foundation.errors import ConfigInvalid, UsageError
from subagents.runtime.usage import describe, usage_lines
from subagents.storage import Event, make_event

SONNET = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)


def _events(*items: tuple[str, dict[str, object]]) -> list[Event]:
    return [
        make_event(seq, kind, seq, data, surface_op="append" if kind == "assistant/message" else None)
        for seq, (kind, data) in enumerate(items)
    ]


def _reply(turn: int, **usage: int) -> tuple[str, dict[str, object]]:
    message = {"id": f"m{turn}", "role": "assistant", "content": [], "source": {"kind": "model"}}
    return ("assistant/message", {"turn": turn, "step": 1, "message": message, "finish": "stop", "usage": usage})


def test_cost_is_derived_per_model_from_the_usage_and_the_model_recorded() -> None:
    events = _events(
        ("session/model", {"model": "anthropic:claude-sonnet,thinking=2048"}),
        _reply(1, input_tokens=1000, output_tokens=100, cache_read_tokens=10_000, cache_write_tokens=2000),
        ("session/model", {"model": "openai:gpt-x"}),
        _reply(2, input_tokens=500, output_tokens=50),
    )
    turns, total = usage_of(events)
    prices = PriceTable(
        {"claude-sonnet": SONNET, "openai:gpt-x": Price(input=1, output=2, cache_read=1, cache_write=1)}
    )
    # by bare name (options stripped) and by whole spec
    assert cost_of(turns[1], prices) == pytest.approx((1000 * 3 + 100 * 15 + 10_000 * 0.3 + 2000 * 3.75) / 1e6)
    assert cost_of(turns[2], prices) == pytest.approx((500 + 100) / 1e6)
    assert cost_of(total, prices) == pytest.approx(cost_of(turns[1], prices) + cost_of(turns[2], prices))
    assert describe(turns[2], prices).endswith(", cost $0.0006")
    # One model without a price: the sum is unknown, never a partial figure.
    only_sonnet = PriceTable({"claude-sonnet": SONNET})
    assert cost_of(total, only_sonnet) is None
    assert describe(total, only_sonnet).endswith(", cost unknown")
    # No prices at all: nothing is said about cost.
    assert "cost" not in describe(total, PriceTable())
    assert "cost" not in "\n".join(usage_lines(_session(total)))


def _session(total: Tokens) -> SessionUsage:
    return SessionUsage(session_id="s", turns=((1, total),), total=total)


def test_cost_is_unknown_without_a_recorded_model_or_with_an_unknown_call() -> None:
    prices = PriceTable({"m": SONNET})
    scripted = usage_of(_events(_reply(1, input_tokens=10, output_tokens=1)))[1]
    assert cost_of(scripted, prices) is None  # no `session/model`: which price?
    lost = usage_of(
        _events(
            ("session/model", {"model": "x:m"}),
            _reply(1, input_tokens=10, output_tokens=1),
            ("turn/continue", {"turn": 1, "step": 1, "attempt": 2, "lost_model_call": True}),
        )
    )[1]
    assert cost_of(lost, prices) is None


def _load(tmp_path: Path, text: str) -> object:
    (tmp_path / "subagents.toml").write_text(text)
    return load_config(str(tmp_path), env={"SUBAGENTS_CONFIG_DIR": str(tmp_path / "none")})


def test_a_price_table_is_read_with_cache_prices_defaulting_to_input(tmp_path: Path) -> None:
    config = _load(tmp_path, '[prices."anthropic:claude-sonnet"]\ninput = 3\noutput = 15\ncache_read = 0.3\n')
    price = config.prices.price_of("anthropic:claude-sonnet,thinking=1024")
    assert price == Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.0)
    rows = {key: value for key, value, _source in config.rows()}
    assert rows['prices."anthropic:claude-sonnet"'] == "input 3.0, output 15.0, cache_read 0.3, cache_write 3.0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prices = 1", "prices must be a table ([prices]), got 1"),
        ('[prices]\n"m" = 3', 'prices."m" must be a table {input, output, cache_read?, cache_write?}'),
        ('[prices."m"]\ninput = 1', 'prices."m" needs output (per million tokens)'),
        ('[prices."m"]\ninput = 1\noutput = 2\ncached = 1', 'prices."m" has unknown key cached'),
        ('[prices."m"]\ninput = -1\noutput = 2', 'prices."m" input must be a number >= 0 (per million tokens), got -1'),
        ('[prices."m"]\ninput = "3"\noutput = 2', "input must be a number >= 0 (per million tokens), got '3'"),
        ('[prices."m"]\ninput = true\noutput = 2', "input must be a number >= 0 (per million tokens), got True"),
        ('[prices."m"]\ninput = nan\noutput = 2', "input must be a number >= 0 (per million tokens), got nan"),
        ("[budget]\nmax_cost = -1", "budget.max_cost must be a number >= 0 (the prices' currency), got -1"),
        ("[budget]\nmax_descendants = 1.5", "budget.max_descendants must be an integer >= 0, got 1.5"),
    ],
)
def test_a_bad_price_table_is_one_line_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        _load(tmp_path, text)
    assert str(caught.value).startswith(str(tmp_path / "subagents.toml") + ": ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, UsageError)


def test_budget_flags_win_over_the_file_and_bad_ones_name_the_flag(tmp_path: Path) -> None:
    config = _load(tmp_path, "[budget]\nmax_tokens = 100\nmax_turns = 3\n")
    flagged = with_budget_flags(config, {"max_tokens": "5000", "max_cost": "2.5", "max_turns": None})
    assert dict(flagged.budget) == {"max_tokens": 5000, "max_turns": 3, "max_cost": 2.5}
    assert flagged.sources["budget.max_tokens"] == "flag --budget-tokens"
    for flags, message in (
        ({"max_tokens": "many"}, "--budget-tokens must be a number, got 'many'"),
        ({"max_tokens": "0"}, "--budget-tokens must be an integer >= 1, got 0"),
        ({"max_cost": "-2"}, "--budget-cost must be a number >= 0 (the prices' currency), got -2.0"),
        ({"max_turns": "1.5"}, "--budget-turns must be a number, got '1.5'"),
    ):
        with pytest.raises(ConfigInvalid) as caught:
            with_budget_flags(config, flags)
        assert str(caught.value) == message


def test_reasoning_tokens_are_summed_shown_and_not_charged_twice() -> None:
    events = _events(
        ("session/model", {"model": "m"}),
        _reply(1, input_tokens=100, output_tokens=40, reasoning_tokens=32),
        _reply(2, input_tokens=100, output_tokens=10),
    )
    turns, total = usage_of(events)
    assert (turns[1].reasoning_tokens, total.reasoning_tokens, total.output_tokens) == (32, 32, 50)
    assert describe(total) == "200 in, 50 out tokens (32 reasoning) (2 model calls)"
    assert total.to_json()["reasoning_tokens"] == 32 and "reasoning_tokens" not in turns[2].to_json()
    assert Tokens.from_json(total.to_json()) == total
    # Cost: reasoning is output, priced once.
    assert cost_of(total, PriceTable({"m": Price(input=1, output=2, cache_read=1, cache_write=1)})) == pytest.approx(
        (200 + 100) / 1e6
    )
