"""Listing rows as the JSON a caller sees, for comparing whole listings at once."""

from __future__ import annotations

from typing import Any


def rows(result: list[Any]) -> list[dict[str, Any]]:
    """The `to_json()` form of each row of a listing, in order."""
    return [row.to_json() for row in result]
