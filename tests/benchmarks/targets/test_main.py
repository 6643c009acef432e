"""The command's flags (each bad one a one-line error naming it and its constraint) and the
table written as CSV, at toy lengths."""

from __future__ import annotations

import csv

import pytest
import torch

from benchmarks.targets import __main__ as cli
from benchmarks.targets import kernels, million, steps

# One length's timing per call, not 0.3 s of calls: the flags and the rows are tested.
QUICK = ["--rounds", "1", "--min-seconds", "0", "--threads", "1"]
SKIP = ["--skip-flex", "--skip-memory", "--skip-depth", "--skip-decode"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        # The reported IndexError: every default length is above 512.
        (["--kernels", "linear,blockwise", "--max-len", "512"], "argument --max-len: 512 is below"),
        (["--lengths", "64,0"], "argument --lengths: must be a comma-separated list of positive"),
        (["--lengths", "64,x"], "argument --lengths: must be a comma-separated list of positive"),
        (["--batch", "0"], "argument --batch: must be a positive integer, got '0'"),
        (["--heads", "-2"], "argument --heads: must be a positive integer, got '-2'"),
        (["--head-dim", "8.5"], "argument --head-dim: must be a positive integer, got '8.5'"),
        (["--dtype", "float8"], "argument --dtype: must be one of float32, float64, float16"),
        (["--device", "tpu"], "argument --device: must be one of auto, cpu, cuda, got 'tpu'"),
        (["--kernels", "linear,nope"], "argument --kernels: unknown kernel 'nope'; known: full"),
        (["--min-seconds", "-1"], "argument --min-seconds: must be a number >= 0, got '-1'"),
        (["--depth-attention", "nope"], "argument --depth-attention: unknown variant 'nope'"),
        (["--csv", "/no/such/folder/t.csv"], "argument --csv: folder '/no/such/folder' does not"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it_and_its_constraint(flags, message, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.parse_args(flags)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_cuda_without_a_device_is_refused_and_auto_falls_back_to_the_cpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        cli.parse_args(["--device", "cuda"])
    assert "argument --device: cuda, but torch sees no CUDA device" in capsys.readouterr().err
    assert cli.parse_args(["--device", "auto"]).shape.device == torch.device("cpu")


def test_flags_make_the_shape_and_the_lengths():
    args = cli.parse_args([])
    assert args.shape == kernels.Shape() and args.lengths == [4096, 8192, 16384, 32768]
    args = cli.parse_args(
        ["--lengths", "128,64,128", "--batch", "2", "--heads", "3", "--head-dim", "16"]
        + ["--dtype", "bfloat16", "--max-len", "100"]
    )
    assert args.lengths == [64]  # sorted, each once, --max-len applied
    assert args.shape == kernels.Shape(2, 3, 16, torch.bfloat16, torch.device("cpu"))


def test_a_run_below_4096_writes_the_table_as_csv(tmp_path, capsys, one_call):
    path = tmp_path / "targets.csv"
    cli.main(
        ["--lengths", "64,128", "--kernels", "linear,strided", "--batch", "2", "--heads", "2"]
        + ["--head-dim", "16", "--csv", str(path), *QUICK, *SKIP]
    )
    out = capsys.readouterr().out
    assert out.startswith("batch 2, heads 2, head_dim 16, float32 on cpu;")
    table = out.split("| target")[1].split("\n\n")[0]
    printed = [[c.strip() for c in line.split("|")[1:5]] for line in table.splitlines()[2:]]
    printed = [row for row in printed if len(row) == 4]
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == [
        *("target", "measured", "bound", "met"),
        *("batch", "heads", "head_dim", "dtype", "device", "threads", "commit", "date"),
    ]
    assert [[r["target"], f"{float(r['measured']):.2f}", r["bound"], r["met"]] for r in rows] == [
        [name, value, bound, met] for name, value, bound, met in printed
    ]
    assert {(r["batch"], r["heads"], r["head_dim"], r["dtype"], r["device"]) for r in rows} == {
        ("2", "2", "16", "float32", "cpu")
    }
    names = {r["target"] for r in rows}
    assert {"linear speed-up, L=64", "strided scaling exponent 64->128"} <= names
    assert kernels.shape() == kernels.Shape()  # the run's shape ends with it
    # the file's table is the printed one, read back without measuring
    cli.main(["--table", str(path)])
    again = capsys.readouterr().out
    assert again.startswith("batch 2, heads 2, head_dim 16, dtype float32, device cpu, threads")
    assert again.split("\n\n", 1)[1].strip() in out


def test_step_rows_are_written_after_each_row_and_read_back_as_printed(
    tmp_path, capsys, monkeypatch
):
    path = tmp_path / "million.csv"
    ended = []

    def fake_step(name, attention, length, depth, block, d_model):
        if ended:  # the second step never ends: the run is stopped
            raise KeyboardInterrupt
        ended.append(name)
        return steps.StepRow(name, 12.5, 3 * 10**9, 11.0)

    monkeypatch.setattr(million, "run_step_row", fake_step)
    with pytest.raises(KeyboardInterrupt):
        cli.main(
            ["--million", "--million-len", "256", "--kernels", "linear,blockwise"]
            + ["--threads", "1", "--csv", str(path)]
        )
    capsys.readouterr()
    rows, run = steps.read_step_csv(path)
    assert [r.name for r in rows] == ended == ["linear, 1 layer, L=256"]  # kept: the row that ended
    assert rows[0] == steps.StepRow(ended[0], 12.5, 3 * 10**9, 11.0, million.MILLION_LIMIT_BYTES)
    assert set(run) == {"threads", "commit", "date"} and run["threads"] == "1"
    # a row without a step (left out, or failed) survives the round trip with its note
    left_out = steps.StepRow("full, 1 layer", note="about 5.6e+14 FLOP: not run")
    steps.write_step_csv(path, [*rows, left_out], run)
    cli.main(["--table", str(path)])
    again = capsys.readouterr().out
    assert again.split("\n\n", 1)[1].strip() == steps.step_markdown([*rows, left_out])
    assert "| linear, 1 layer, L=256 | 12 | 11 | 3.00 | < 16 GB | yes |" in again
    assert "| full, 1 layer | | | | | about 5.6e+14 FLOP: not run |" in again
    # rows of two runs in one file: the run line names each commit once, in row order
    later = dict(run, commit="abc")
    with open(path, "a", newline="") as file:
        csv.writer(file).writerow(["blockwise, 1 layer", 1.0, 10**9, 1.0, "", "", *later.values()])
    assert steps.read_step_csv(path)[1]["commit"] == f"{run['commit']}, abc"
