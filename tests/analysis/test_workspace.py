"""The W&B workspace's panel spec, checked without a server against what the runner logs."""

from __future__ import annotations

import json

import pytest

from analysis import load, workspace
from experiments.records import record


def panels(spec):
    return [p for section in spec["sections"] for p in section["panels"]]


def test_every_panel_plots_a_metric_the_runner_logs_on_its_axis():
    spec = workspace.workspace_spec("me", "attnbench", "scaling")
    scaling_metrics = set(record.SCALING_METRICS)  # conf/logger/wandb.yaml's default
    for panel in panels(spec):
        logged = scaling_metrics if panel["x"] == "seq_len" else set(load.CURVE_METRICS)
        assert panel["x"] in ("seq_len", "step"), panel
        assert set(panel["y"]) <= logged, panel
    plotted = {m for p in panels(spec) if p["x"] == "seq_len" for m in p["y"]}
    assert plotted == scaling_metrics  # every cost the runner puts on the seq_len axis
    times = [p for p in panels(spec) if p["y"][0].endswith("_ms")]
    assert times and all(p["log_x"] and p["log_y"] for p in times)


def test_spec_selects_the_sweeps_job_runs_grouped_by_variant():
    spec = workspace.workspace_spec("me", "attnbench", "scaling")
    assert (spec["entity"], spec["project"], spec["name"]) == (
        "me",
        "attnbench",
        "attnbench: scaling",
    )
    assert spec["filters"] == (
        "Metric('Group') = \"scaling\" and Metric('JobType') != 'sweep-summary'"
    )
    assert spec["groupby"] == ["attention.name"]
    assert "Group" not in workspace.workspace_spec("me", "p")["filters"]
    json.dumps(spec)  # plain data


def test_print_needs_no_server(capsys):
    assert workspace.main(["me/attnbench", "--group", "depth", "--print"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "attnbench: depth"
    with pytest.raises(SystemExit):
        workspace.main(["attnbench"])


def test_builds_workspace_objects_when_the_package_is_installed():
    pytest.importorskip("wandb_workspaces")
    built = workspace.build_workspace(workspace.workspace_spec("me", "attnbench", "scaling"))
    assert [s.name for s in built.sections] == list(workspace.SECTIONS)
