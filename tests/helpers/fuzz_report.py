"""The failure message of a fuzz test that collects every disagreeing case before it fails."""

from __future__ import annotations

import collections


def report(failures: dict[str, list[str]], total: int) -> str:
    """Group failures by their first problem's shape so one bug does not bury another."""
    groups: collections.OrderedDict[str, list[str]] = collections.OrderedDict()
    for case, problems in failures.items():
        key = problems[0].split(":")[0] + ": " + problems[0].split(":", 1)[1][:70]
        groups.setdefault(key, []).append(f"{case}: " + " | ".join(problems)[:600])
    lines = [f"{len(failures)} of {total} cases disagree with the model, in {len(groups)} groups:"]
    for key, cases in groups.items():
        lines.append(f"- {len(cases)} like [{key}], e.g.")
        lines += [f"    {c}" for c in cases[:3]]
    return "\n".join(lines)
