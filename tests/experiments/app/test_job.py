"""One job in-process (`run_job`): resume reading records, and failures recorded as data.

The same jobs through the CLI, in real Hydra sweeps, are in tests/experiments/test_run.py.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.app import job
from experiments.app.job import import_for_measuring, run_job
from experiments.records import store
from tests.experiments.conftest import ROOT, TIMEOUT_S, TINY
from tests.experiments.test_run import BOOKKEEPING, QUICK


@pytest.mark.parametrize("text", ['{"status": "ok", "config_ha', "[]"])  # cut short; no object
def test_an_unreadable_record_is_measured_again_and_says_so(
    resolved_config, tmp_path, caplog, text
):
    sweep_dir = tmp_path / "sweep"
    path = sweep_dir / "0" / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    (sweep_dir / "1").mkdir()
    (sweep_dir / "1" / "result.json").write_text(text)  # another job's: resume reads it too
    config = resolved_config(*TINY, *QUICK)
    with caplog.at_level(logging.WARNING, logger="attnbench"):
        rec = run_job(config, path.parent, job="0", sweep_dir=sweep_dir)
    assert f"{path} is unreadable" in caplog.text
    assert "measuring this configuration again" in caplog.text
    assert rec["status"] == "ok" and json.loads(path.read_text()) == rec


def test_a_run_whose_eval_loss_is_not_finite_is_diverged(resolved_config, tmp_path):
    """Scenario 4: `train.steps=1 train.lr=1e30` was recorded ok with eval_loss null."""
    config = resolved_config(*TINY, *QUICK, "train.steps=1", "train.lr=1e30")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    assert rec["status"] == "diverged", rec["error"]
    assert rec["error"].startswith("Diverged: eval_loss is nan after 1 training steps")


def test_any_non_finite_measured_float_is_diverged_naming_it(
    resolved_config, tmp_path, monkeypatch
):
    measure = import_for_measuring()  # the module the job measures with
    real = measure.measure
    monkeypatch.setattr(
        measure, "measure", lambda *a, **k: {**real(*a, **k), "approx_rel_error": math.inf}
    )
    config = resolved_config(*TINY, *QUICK, "train.steps=1")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    assert (rec["status"], rec["error"]) == (
        "diverged",
        "Diverged: non-finite approx_rel_error=inf",
    )
    assert rec["train_loss"] > 0  # the finite figures are kept
    assert json.loads((tmp_path / "0" / "result.json").read_text())["approx_rel_error"] is None


def test_a_top_level_key_added_on_the_command_line_is_an_error_naming_the_nearest(
    resolved_config, tmp_path
):
    """Scenario 7: `+seqlen=128` was hashed, recorded and measured at the default length."""
    config = resolved_config(*TINY, *QUICK, "+seqlen=128")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None, added=["seqlen"])
    assert rec["status"] == "error"
    assert (
        "option 'seqlen' (added with +seqlen=) is unknown; did you mean 'seq_len'?"
        in (rec["error"])
    )


# --- two sweeps into one dir, a record that names a path: no record lost or written elsewhere --


@pytest.mark.slow
def test_two_concurrent_sweeps_into_one_dir_keep_every_configurations_record(cli, tmp_path):
    """Item 1: `attention=full,linear` and, at the same time, `attention=blockwise,moba` into
    one sweep dir both printed D/0 and D/1, and only one sweep's two records survived. Job
    dirs are named by configuration now: each of the four in a dir of its own."""
    sweep_dir = tmp_path / "sweep"
    quick = (*BOOKKEEPING, "train.steps=2")  # a little training: the jobs overlap
    first = cli.start(*cli.sweep_args(sweep_dir, "attention=full,linear", *quick))
    second = cli.start(*cli.sweep_args(sweep_dir, "attention=blockwise,moba", *quick))
    outputs = [process.communicate(timeout=TIMEOUT_S) for process in (first, second)]
    for process, (_, stderr) in zip((first, second), outputs, strict=True):
        assert process.returncode == 0, stderr[-3000:]
    said = "".join(out + err for out, err in outputs)
    records = [json.loads(p.read_text()) for p in sweep_dir.glob("**/result.json")]
    assert sorted(r["attention"] for r in records) == ["blockwise", "full", "linear", "moba"]
    assert all(r["job"].startswith(f"{r['attention']}-L") for r in records)
    assert "held another configuration" not in said  # nothing displaced
    frame = store.write_results(sweep_dir, quiet=True)
    assert sorted(frame["attention"]) == ["blockwise", "full", "linear", "moba"]


def test_a_job_waits_for_the_process_measuring_into_its_dir(resolved_config, tmp_path, caplog):
    """Item 1, in-process: while another process holds the job dir's claim, the job does not
    write into it; once it is released, the other configuration's record is displaced."""
    sweep_dir, out_dir = tmp_path / "sweep", tmp_path / "sweep" / "0"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from experiments.records import files\n"
            f"with files.file_lock({str(out_dir / job.JOB_LOCK)!r}):\n"
            "    print('held', flush=True); time.sleep(1.5)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    other = {"config_hash": "0123456789ab", "status": "ok", "attention": "linear"}
    (out_dir / "result.json").write_text(json.dumps(other))  # as the holder would, at its end
    with caplog.at_level(logging.WARNING, logger="attnbench"):
        rec = run_job(resolved_config(*TINY, *QUICK), out_dir, job="0", sweep_dir=sweep_dir)
    holder.wait(timeout=30)
    assert f"{out_dir} is being measured by another process; waiting" in caplog.text
    assert json.loads((out_dir / "result.json").read_text()) == rec
    assert json.loads((out_dir / "displaced" / other["config_hash"] / "result.json").read_text())


def test_a_record_whose_config_hash_is_a_path_is_displaced_inside_its_job_dir(
    resolved_config, tmp_path, caplog
):
    """Item 2: config_hash "../../../../escaped" moved the record outside the sweep dir and
    deleted a history.parquet there."""
    out_dir = tmp_path / "a" / "b" / "sweep" / "0"
    out_dir.mkdir(parents=True)
    crafted = {"config_hash": "../../../../escaped", "status": "ok", "attention": "linear"}
    (out_dir / "result.json").write_text(json.dumps(crafted))
    victim = tmp_path / "a" / "escaped" / "history.parquet"  # where the displacement went
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"someone's curve")
    with caplog.at_level(logging.WARNING, logger="attnbench"):
        run_job(resolved_config(*TINY, *QUICK), out_dir, job="0", sweep_dir=out_dir.parent)
    assert victim.read_bytes() == b"someone's curve"
    assert not (tmp_path / "a" / "escaped" / "result.json").exists()
    moved = list((out_dir / "displaced").glob("*/result.json"))
    assert [json.loads(p.read_text()) for p in moved] == [crafted]
    assert moved[0].parent.name == store.safe_name(crafted["config_hash"])
    assert moved[0].parent.name.startswith("unsafe-")
    assert f"moved to {moved[0]}" in caplog.text and "displaced/.." not in caplog.text


@pytest.mark.parametrize("name", ["../escaped", "/abs", "a/../../b", "..", "x/", "a\0b"])
def test_a_name_read_from_a_file_becomes_one_component_inside_its_dir(tmp_path, name):
    safe = store.safe_name(name)
    assert "/" not in safe and ".." not in safe and "\0" not in safe
    assert (tmp_path / safe).resolve().parent == tmp_path.resolve()
    assert store.safe_name(name) == safe and store.safe_name("0123456789ab") == "0123456789ab"


# A multirun whose disk is full from the first job's record on, until the end of the sweep:
# every file opened for writing in the sweep dir (but Hydra's own, `.hydra/` and the log) is
# created and then refuses its data, as a full disk does (`[Errno 28]`, naming no file).
FULL_DISK = """
import builtins, errno, io, os, sys
from pathlib import Path

sweep_dir = Path(sys.argv.pop(1)).resolve()
state = {"full": False}
real_open = io.open


class Full:
    def __init__(self, file):
        self._file = file

    def write(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()

    def __iter__(self):
        return iter(self._file)


def patched(file, mode="r", *args, **kwargs):
    opened = real_open(file, mode, *args, **kwargs)
    if not state.get("over"):
        state["full"] = state["full"] or any(sweep_dir.glob("full-*/result.json"))
    path = Path(os.fsdecode(file)) if isinstance(file, (str, bytes, os.PathLike)) else None
    if (
        state["full"] and path is not None and set(mode) & set("wax")
        and path.resolve().is_relative_to(sweep_dir)
        and ".hydra" not in path.parts and path.suffix != ".log"
    ):
        return Full(opened)
    return opened


builtins.open = io.open = patched

from experiments.app import sweep

real_end = sweep.Multirun.end


def end(self, **kwargs):
    state["full"], state["over"] = False, True  # space again at the end of the sweep
    return real_end(self, **kwargs)


sweep.Multirun.end = end
from experiments import run

sys.argv[0] = "experiments.run"
run.main()
"""


@pytest.mark.slow
def test_a_full_disk_between_jobs_is_one_line_naming_the_file_and_the_sweep_ends(cli, tmp_path):
    """Item 7: ENOSPC writing `.sweep_id` (even with logger=none) ended the sweep with a
    30-line traceback naming no file; the summary was skipped and a temp file left."""
    sweep_dir = tmp_path / "sweep"
    args = cli.sweep_args(sweep_dir, "attention=full,linear", *BOOKKEEPING)
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(sweep_dir), *args],
        cwd=ROOT,
        env=cli.env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    lost = Path(lines[0].split()[1])  # the second job's, linear's
    assert lost.parent.name.startswith("linear-L64-") and lost.name == "result.json", lines
    assert lines[0].startswith(f"error: {lost} not written (No space left on device)"), lines
    assert "1 job(s) of this multirun could not write their record" in lines[-1]
    assert "1 configurations {'ok': 1}" in done.stdout  # the end of the sweep, printed
    assert done.returncode == 1
    hidden = {p.name for p in sweep_dir.glob("**/.*") if ".hydra" not in p.parts}
    assert hidden <= {".job.lock", ".multirun.json", ".results.lock", ".claims", ".index"}
    assert not lost.exists() and not (lost.parent / "history.parquet").exists()


def test_grouped_kv_heads_a_variant_cannot_take_are_skipped_naming_the_option(
    resolved_config, tmp_path
):
    """`model.n_kv_heads` on LSH, whose keys are the queries (shared QK): skipped, not error."""
    config = resolved_config(*TINY, *QUICK, "attention=lsh", "model.n_kv_heads=1")
    rec = run_job(config, tmp_path / "0", job="0", sweep_dir=None)
    assert rec["status"] == "skipped", rec["error"]
    assert "n_kv_heads" in rec["error"] and "shared_qk" in rec["error"]


# --- A re-measure never destroys an ok record -------------------------------------------------


def _out_of_memory(*args, **kwargs):
    raise MemoryError("out of memory (as under budget.max_memory_gb=0.001)")


def test_a_failed_re_measure_keeps_the_ok_record_which_is_shown_and_resumed(
    resolved_config, tmp_path, monkeypatch, caplog
):
    """`resume=false budget.max_memory_gb=0.001` over an ok sweep replaced both ok records
    with oom ones and kept no copy."""
    sweep_dir, out_dir = tmp_path / "sweep", tmp_path / "sweep" / "0"
    first = run_job(resolved_config(*TINY, *QUICK), out_dir, job="0", sweep_dir=sweep_dir)
    monkeypatch.setattr(import_for_measuring(), "measure", _out_of_memory)
    with caplog.at_level(logging.WARNING, logger="attnbench"):
        again = run_job(
            resolved_config(*TINY, *QUICK, "resume=false"), out_dir, job="0", sweep_dir=sweep_dir
        )
    assert (first["status"], again["status"]) == ("ok", "oom")
    kept = out_dir / "displaced" / first["config_hash"] / "result.json"
    assert json.loads(kept.read_text()) == first
    assert json.loads((out_dir / "result.json").read_text()) == again
    assert f"kept at {kept}" in caplog.text
    # The loader shows the ok record, and resume skips it as ok: they agree.
    assert list(store.gather(sweep_dir)["status"]) == ["ok"]
    assert store.find_ok_record(sweep_dir, first["config_hash"]) == kept
    assert run_job(resolved_config(*TINY, *QUICK), out_dir, job="0", sweep_dir=sweep_dir) is None


def test_an_ok_re_measure_keeps_the_older_ok_record_and_shows_the_newer(resolved_config, tmp_path):
    sweep_dir, out_dir = tmp_path / "sweep", tmp_path / "sweep" / "0"
    config = resolved_config(*TINY, *QUICK, "resume=false")
    records = [run_job(config, out_dir, job="0", sweep_dir=sweep_dir) for _ in range(3)]
    digest = records[0]["config_hash"]
    kept = sorted(p.parent.name for p in (out_dir / "displaced").glob("*/result.json"))
    assert kept == [digest, f"{digest}.2"]  # never one written over another
    assert [r["status"] for r in store.read_records(sweep_dir)[0]] == ["ok"] * 3
    assert store.gather(sweep_dir)["timestamp"].tolist() == [records[-1]["timestamp"]]


def test_a_jobs_bookkeeping_does_not_read_the_whole_sweep(resolved_config, tmp_path, monkeypatch):
    """Each job's resume check parsed every record of its sweep and its end gathered them all
    again (0.46 s per job at 100 records, 2.5 s at 1000 in the tracker's sweep)."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from experiments.app import sweep
    from tests.experiments.records.test_store import put, rec

    sweep_dir = tmp_path / "sweep"
    for n in range(100):
        put(sweep_dir, f"old{n}", rec(f"h{n:04d}", seq_len=n + 1, job=f"old{n}"))
    config = OmegaConf.create(
        {
            "hydra": {"mode": RunMode.MULTIRUN, "sweep": {"dir": str(sweep_dir)}},
            "sweep": "s",
            "fail_on": None,
            "logger": {"name": "none"},
        }
    )
    callback = sweep.SweepEnd()
    callback.on_multirun_start(config)
    opened = []
    real = store.read_record
    monkeypatch.setattr(store, "read_record", lambda p, **k: opened.append(p) or real(p, **k))
    run_job(resolved_config(*TINY, *QUICK), sweep_dir / "0", job="0", sweep_dir=sweep_dir)
    callback.on_job_end(config)
    assert len(opened) <= 3, f"{len(opened)} records read"
