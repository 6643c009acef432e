"""README.md keeps no measured wall time: each lives once, in the doc that measured it (with its
date, commit and load), and the README links there. A time quoted in both drifts (the presets
table once said 11 min 9 s for the main job while docs/running.md called that an older run)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
# A duration as the docs write one: "13 min 35 s", "22 min", "≈5 min", "159 s", "4.5 s".
WALL_TIME = re.compile(r"\b\d+(?:\.\d+)? (?:min|s)\b")


def wall_times(text: str) -> list[str]:
    """The lines of `text` that quote a duration in minutes or seconds."""
    return [line for line in text.splitlines() if WALL_TIME.search(line)]


def test_the_guard_sees_a_wall_time():
    assert wall_times("| main job | 13 min 35 s |\nruns ≈5 min\n159 s\n") == [
        "| main job | 13 min 35 s |",
        "runs ≈5 min",
        "159 s",
    ]
    assert wall_times("budget 15 minutes; 2 seeds; 0.263 ms per token") == []


def test_readme_quotes_no_wall_time():
    found = wall_times(README.read_text(encoding="utf-8"))
    assert not found, (
        "README.md quotes a wall time; keep it in the doc that measured it and link there:\n"
        + "\n".join(found)
    )
