"""W&B offline runs as W&B itself reads them back, for tests of what the suite logs there.

The suite never reads W&B's files (records and histories are kept locally). The tests check
what reached W&B with W&B's own reader, `wandb leet inspect --json` (its CLI prints each record
of a run's log as one JSON line), and find run folders by the name W&B gives them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from experiments.app import tracking


def find(root: Path) -> list[Path]:
    """Every offline run folder below `root`, sorted (by W&B's folder name)."""
    return tracking.offline_run_dirs(root)


def read(run_dir: Path) -> dict[str, Any]:
    """config, summary (last value per key; `_` keys and nulls dropped), history (rows without
    `_` keys), group, job_type, tags, name, project, run_id, exit_code and artifacts (their
    names) of one run, from `wandb leet inspect --json`."""
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=True,
    )
    run: dict[str, Any] = {"config": {}, "summary": {}, "history": [], "exit_code": None}
    run["artifacts"] = []
    for line in done.stdout.splitlines():
        entry = json.loads(line)
        kind, body = entry["type"], entry.get(entry["type"], {})
        if kind == "run":
            run.update(
                group=body.get("run_group", ""),
                job_type=body.get("job_type", ""),
                tags=body.get("tags", []),
                name=body.get("display_name", ""),
                project=body.get("project", ""),
                run_id=body.get("run_id", ""),
            )
            run["config"].update(body.get("config", {}).get("update", {}))
        elif kind == "config":
            run["config"].update(body.get("update", {}))
        elif kind == "summary":
            run["summary"].update(body.get("update", {}))
        elif kind == "history":
            run["history"].append(_user_keys(body.get("item", {})))
        elif kind == "artifact":
            run["artifacts"].append(body.get("name"))
        elif kind == "exit":
            run["exit_code"] = body.get("exit_code", 0)
    run["config"] = _user_keys(run["config"])
    run["summary"] = {k: v for k, v in _user_keys(run["summary"]).items() if v is not None}
    return run


def _user_keys(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not k.startswith("_")}
