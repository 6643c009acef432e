"""A W&B workspace with the standard panels, so a project's dashboard is useful on first open.

    python -m analysis.workspace ENTITY/PROJECT [--group scaling] [--name NAME]
    python -m analysis.workspace ENTITY/PROJECT --print      # the panel spec as JSON, offline

The panels are plain data (`SECTIONS`): cost metrics against `seq_len` (the runner logs each
job's costs as one history row on that axis: `record.SCALING_METRICS`, the default of
conf/logger/wandb.yaml's `scaling_metrics`) and
training curves against `step`, with runs grouped by variant. Creating the workspace needs the
optional package `wandb-workspaces` (`pip install wandb-workspaces`) and a W&B login.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from analysis.load import SUMMARY_JOB_TYPE

GROUP_BY = ("attention.name",)  # run config key: one line per variant


@dataclass(frozen=True)
class Panel:
    """One line plot: `y` metrics against `x`, optionally on log axes."""

    title: str
    x: str
    y: tuple[str, ...]
    log_x: bool = False
    log_y: bool = False


SECTIONS: dict[str, tuple[Panel, ...]] = {
    "Cost vs sequence length": (
        Panel("Attention forward (ms)", "seq_len", ("attn_fwd_ms",), True, True),
        Panel("Attention forward+backward (ms)", "seq_len", ("attn_fwd_bwd_ms",), True, True),
        Panel("Training step (ms)", "seq_len", ("step_ms",), True, True),
        Panel("Peak memory of a step (bytes)", "seq_len", ("peak_memory_bytes",), True, True),
        Panel(
            "Peak memory of the kernel alone, fwd+bwd (bytes)",
            "seq_len",
            ("attn_fwd_bwd_peak_bytes",),
            True,
            True,
        ),
        Panel("Tokens per second", "seq_len", ("tokens_per_s",), True, True),
        Panel("Achieved GFLOP/s (fwd+bwd)", "seq_len", ("attn_fwd_bwd_gflops_per_s",), True),
        Panel("Approximation error vs exact", "seq_len", ("approx_rel_error",), True),
    ),
    "Training": (
        Panel("Loss", "step", ("train/loss", "eval/loss")),
        Panel("Eval accuracy", "step", ("eval/accuracy",)),
    ),
}


def workspace_spec(
    entity: str, project: str, group: str | None = None, name: str | None = None
) -> dict[str, Any]:
    """The workspace as JSON-able data: where, which runs, how grouped, which panels."""
    return {
        "entity": entity,
        "project": project,
        "name": name or f"attnbench: {group or 'all sweeps'}",
        "filters": runs_filter(group),
        "groupby": list(GROUP_BY),
        "sections": [
            {"name": title, "panels": [asdict(p) for p in panels]}
            for title, panels in SECTIONS.items()
        ],
    }


def runs_filter(group: str | None) -> str:
    """wandb-workspaces filter expression: the sweep's job runs, without its summary run."""
    jobs = f"Metric('JobType') != '{SUMMARY_JOB_TYPE}'"
    return jobs if group is None else f"Metric('Group') = {json.dumps(group)} and {jobs}"


def build_workspace(spec: dict[str, Any]) -> Any:
    """A `wandb_workspaces.workspaces.Workspace` from the spec (needs wandb-workspaces)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    sections = [
        ws.Section(
            name=section["name"],
            is_open=True,
            panels=[
                wr.LinePlot(
                    title=p["title"],
                    x=p["x"],
                    y=list(p["y"]),
                    log_x=p["log_x"] or None,
                    log_y=p["log_y"] or None,
                )
                for p in section["panels"]
            ],
        )
        for section in spec["sections"]
    ]
    return ws.Workspace(
        entity=spec["entity"],
        project=spec["project"],
        name=spec["name"],
        sections=sections,
        runset_settings=ws.RunsetSettings(
            filters=spec["filters"], groupby=[expr.Config(key) for key in spec["groupby"]]
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.workspace", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("project", metavar="ENTITY/PROJECT")
    parser.add_argument("--group", help="only the runs of this sweep (W&B group)")
    parser.add_argument("--name", help="workspace name (default: attnbench: <group>)")
    parser.add_argument("--print", action="store_true", help="print the spec, create nothing")
    args = parser.parse_args(argv)
    entity, _, project = args.project.partition("/")
    if not entity or not project:
        parser.error(f"expected ENTITY/PROJECT, got {args.project!r}")
    spec = workspace_spec(entity, project, args.group, args.name)
    if args.print:
        print(json.dumps(spec, indent=1))
        return 0
    try:
        workspace = build_workspace(spec)
    except ImportError:
        print(
            "creating a workspace needs the optional package wandb-workspaces: "
            "pip install wandb-workspaces",
            file=sys.stderr,
        )
        return 1
    workspace.save()
    print(f"workspace: {workspace.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
