"""One job: a configuration measured under its budgets and recorded, whatever happens.

`run_job` reads the resolved config once (`JobIdentity` for the record's identity, the checked
`JobConfig` for everything below), skips a configuration already recorded ok in the sweep dir
(resume), measures it (experiments/measurement/measure.py) and writes `<job dir>/result.json`
with its history beside it, and its W&B run. Any failure becomes the record's `status`: a
combination the variant cannot do is `skipped`, an invalid option or any other exception is
`error` (nothing is tracked in W&B for a job that measured nothing). A job's dir is named by its
configuration (experiments/app/job_dirs.py); an ok record of its own configuration that a
re-measure (`resume=false`) would replace, and a record of another configuration found there,
are moved aside (`displaced/<its hash>/`), never overwritten. The job holds claims on its dir
and its configuration from the resume check to its record's last write (`claimed`), so a second
sweep into the same dir waits. A record or history that cannot be written raises `NotWritten`,
one line naming the file. The Hydra entry point around it is experiments/run.py.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.app import tracking
from experiments.job_config import JobConfig, JobIdentity
from experiments.measurement import budget
from experiments.measurement.provenance import provenance
from experiments.records import files, history, index, record, store
from experiments.training import curriculum
from variants.checks import UnsupportedCombination

log = logging.getLogger("attnbench")

CLAIMS = ".claims"  # in a sweep dir: one lock per configuration being measured
JOB_LOCK = ".job.lock"  # in a job dir: held by the job measuring into it


def run_job(
    config: Mapping[str, Any],
    out_dir: Path,
    *,
    job: str,
    sweep_dir: Path | None,
    added: Sequence[str] = (),
    parallel_jobs: int = 1,
    lr_source: str | None = None,
) -> dict[str, Any] | None:
    """Measure and record one configuration; returns the record, or None if resumed (skipped).

    `config` is the resolved config (Hydra's, as a plain nested dict), read here once: as
    `JobIdentity` for the record's identity, and as the checked `JobConfig` that everything
    below takes. `sweep_dir` is set in a multirun: a configuration already recorded there with
    status ok is not measured again (resume), and nothing is written for it. `added`: the
    top-level keys the command line added with `+key=` (`experiments.job_config.added_keys`), an
    error record.
    `parallel_jobs`: how many jobs the launcher runs side by side (recorded: timings depend on it).
    `lr_source`: where `train.lr` came from (`resolvers.lr_source_of`: tuned, untuned or None),
    recorded as the record's `lr_source`.
    """
    identity = JobIdentity(config)  # the record's identity, computed once, at the door
    digest = identity.config_hash
    with claimed(out_dir, sweep_dir, digest):
        if sweep_dir is not None and identity.resume:
            previous = index.find_ok_record(sweep_dir, digest)  # not a scan of the sweep
            if previous is not None:
                log.info("already recorded with status ok in %s; skipping", previous)
                return None
            _say_if_unreadable(out_dir / "result.json")
        return _measure_and_record(
            config,
            identity,
            out_dir,
            job=job,
            sweep_dir=sweep_dir,
            added=added,
            parallel_jobs=parallel_jobs,
            lr_source=lr_source,
        )


class NotWritten(OSError):
    """A job's record (or its history) could not be written, e.g. on a full disk: the message
    is one line naming the file; nothing of the attempt is left beside it."""


def claimed(out_dir: Path, sweep_dir: Path | None, digest: str):
    """The job's claims, held from the resume check to its record's last write, so that no
    other process (a second sweep into the same dir, an orphaned worker) can write a record of
    another configuration into the same job dir meanwhile, or measure the same configuration
    at the same time: a lock on `<sweep dir>/.claims/<config hash>.lock` (in a sweep), then on
    `<job dir>/.job.lock`. A job that finds either held says so and waits (a configuration
    that the other process records ok meanwhile is then skipped, as resume does); locks are
    flocks, released when the holder ends, even killed."""
    stack = contextlib.ExitStack()

    def waiting(what: str):
        return lambda: log.warning(
            "%s is being measured by another process; waiting for it to end", what
        )

    try:
        if sweep_dir is not None:
            stack.enter_context(
                files.file_lock(
                    Path(sweep_dir) / CLAIMS / f"{digest}.lock",
                    waiting(f"configuration {digest}"),
                )
            )
        stack.enter_context(files.file_lock(Path(out_dir) / JOB_LOCK, waiting(str(out_dir))))
    except BaseException:
        stack.close()
        raise
    return stack


def _measure_and_record(
    config: dict[str, Any],
    identity: JobIdentity,
    out_dir: Path,
    *,
    job: str,
    sweep_dir: Path | None,
    added: Sequence[str],
    parallel_jobs: int,
    lr_source: str | None,
) -> dict[str, Any]:
    """The body of `run_job`, under the job's claims: measure, then write the record."""
    digest = identity.config_hash
    measure = import_for_measuring()
    import torch  # started by the measuring modules; the app's own import leaves it out

    _displace_other_record(out_dir, digest, sweep_dir, keep_ok=True)
    rec: dict[str, Any] = {
        "sweep": identity.sweep,
        "job": job,
        "config_hash": digest,
        "status": record.OK,
        "error": None,
        **identity.columns,
        "lr_source": lr_source,
    }
    tracker = tracking.Tracker()
    steps = history.History()
    device = None
    started = time.perf_counter()
    try:
        job_config = JobConfig.of(config, added)  # the job as one typed object, checked
        if note := job_config.skipped_note():
            log.warning(note)
        built = measure.setup(job_config)
    except UnsupportedCombination as error:
        rec.update(status=record.SKIPPED, error=" ".join(str(error).split()))
    except Exception as error:  # noqa: BLE001 — an invalid option, or a setup that broke
        rec.update(status=record.ERROR, error=record.one_line(error))
        if not isinstance(error, ValueError):
            log.error("setup failed:\n%s", traceback.format_exc())
    else:
        device = built.device
        tracker = tracking.start_tracker(
            identity.logger,
            run_config=identity.tree,
            group=tracking.group_of(identity.sweep, sweep_dir),
            job_type=f"{rec['attention']}-{rec['block']}",
            name=tracking.run_name(rec, digest),
            tags=[rec["attention"], rec["block"], rec["task"]],
            out_dir=out_dir,
            run_id=None  # made only if W&B is on: it writes `.sweep_id`
            if sweep_dir is None
            else lambda: tracking.run_id(identity.sweep, digest, sweep_dir),
            replace_in=sweep_dir,
        )
        try:
            with (
                budget.time_limit(job_config.budget.max_seconds),
                budget.memory_cap(job_config.budget.max_memory_gb, device),
            ):
                measured = measure.measure(
                    job_config,
                    built,
                    on_step=_logged(steps, tracker),
                    on_stage=_stage_recorder(
                        identity, rec, out_dir, sweep_dir, tracker, steps, started
                    ),
                )
            rec.update(measured)
            non_finite = record.non_finite(measured)
            if non_finite:  # a NaN would be recorded as null, which reads "not measured"
                values = ", ".join(f"{k}={measured[k]}" for k in non_finite)
                rec.update(status=record.DIVERGED, error=f"Diverged: non-finite {values}")
        except KeyboardInterrupt:
            tracker.discard()  # no record, so no run: a re-run measures it afresh
            raise
        except BaseException as error:  # noqa: BLE001 — every failure becomes data
            rec.update(status=_status_of(error), error=record.one_line(error))
            if rec["status"] == record.ERROR:
                log.error("job failed:\n%s", traceback.format_exc())
        finally:
            del built
            gc.collect()
    rec["job_seconds"] = time.perf_counter() - started
    if (
        rec["status"] != record.OK
    ):  # as it would have run: `auto` and null resolved, as measured ones
        rec["device"] = device.type if device is not None else _device_or_as_configured(identity)
        rec["threads"] = torch.get_num_threads()
    rec["shared_qk"] = identity.shared_qk  # None: the variant is unknown
    rec.update(provenance(device), parallel_jobs=parallel_jobs)
    rec["offline_run_dir"] = None
    try:
        # The history before the record, which makes the job's outcome final; a record of
        # another configuration that arrived meanwhile (not through the claims) moves aside.
        steps.write(out_dir / history.FILE)
        _displace_other_record(out_dir, digest, sweep_dir)
        record.write_json_atomic(out_dir / "result.json", rec)
        _note_written(sweep_dir, out_dir / "result.json", rec)
    except OSError as error:  # a full disk: one line naming the file, the sweep goes on
        tracker.discard()
        if not (out_dir / "result.json").is_file():  # no curve without its record
            history.beside(out_dir / "result.json").unlink(missing_ok=True)
        raise NotWritten(
            f"{error.filename or out_dir} not written ({error.strerror or error}); "
            f"the record of job {job} ({digest}) is lost"
        ) from error
    try:
        tracker.finish(rec, exit_code=0 if rec["status"] == record.OK else 1)
    except KeyboardInterrupt:
        tracker.discard()
        raise
    if tracker.run_dir is not None:
        rec["offline_run_dir"] = str(tracker.run_dir)
        try:
            record.write_json_atomic(out_dir / "result.json", rec)
        except OSError as error:  # the record without its run's folder is still there
            log.warning("%s not updated with its W&B run: %s", out_dir / "result.json", error)
    return rec


def import_for_measuring():
    """The measuring modules, imported once a job is to be measured, before its budget starts.

    torch._dynamo (1.7 s of imports) is imported here on purpose: AdamW imports it lazily at its
    first step, and a job timeout that struck in the middle of that import once left it half
    done and broke every later job of the process. It is not needed for `--help` or for a
    configuration already recorded, so the app's own import leaves it (and measure's kernels,
    tasks and training) out. Returns `experiments.measurement.measure`.
    """
    import torch._dynamo  # noqa: F401

    from experiments.measurement import measure

    return measure


def _logged(steps: history.History, tracker: tracking.Tracker):
    """The `on_step` of a job: each step's metrics kept in its history and logged to W&B."""

    def on_step(metrics: dict[str, Any], step: int) -> None:
        steps.log_step(metrics, step)
        tracker.log_step(metrics, step)

    return on_step


def _stage_recorder(
    identity: JobIdentity,
    rec,
    out_dir: Path,
    sweep_dir: Path | None,
    tracker,
    steps: history.History,
    started: float,
):
    """Record each finished curriculum stage as its own configuration, as soon as it ends.

    A stage's record is the job's config at the stage's seq_len and batch_size
    (`JobIdentity.at`; a mixture point's at its task options), in
    `<job dir>/stages/<label>/result.json`, where the store,
    resume and the report find it like any other record, with the job's history up to the end
    of the stage beside it. A stage record of another configuration found there is displaced,
    never overwritten (`_displace_other_stage`).
    """

    def write(stage: curriculum.Stage, columns: dict[str, Any]) -> None:
        import torch  # the job's measuring started it

        staged = identity.at(stage)
        stage_rec = {
            **rec,
            "job": f"{rec['job']}/{stage.label}",
            "config_hash": staged.config_hash,
            **staged.columns,
            **columns,
            "shared_qk": staged.shared_qk,
            "job_seconds": time.perf_counter() - started,
            **provenance(torch.device(columns["device"])),
            "offline_run_dir": None if tracker.run_dir is None else str(tracker.run_dir),
        }
        path = out_dir / "stages" / stage.label / "result.json"
        _displace_other_stage(path, stage_rec["config_hash"], sweep_dir)
        steps.write(history.beside(path))
        record.write_json_atomic(path, stage_rec)
        _note_written(sweep_dir, path, stage_rec)

    return write


def _say_if_unreadable(path: Path) -> None:
    """A job dir's record that cannot be read is measured again: say so, it is not silent."""
    try:
        store.read_record(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as error:
        log.warning("%s is unreadable (%s); measuring this configuration again", path, error)


def _device_or_as_configured(identity: JobIdentity) -> str:
    """The device the job would have used (auto resolved), or the configured name if invalid."""
    from experiments.measurement import measure

    try:
        return measure.resolve_device(identity.device).type
    except ValueError:
        return str(identity.device)


def _displace_other_record(
    out_dir: Path, digest: str, sweep_dir: Path | None, *, keep_ok: bool = False
) -> None:
    """Move a record of another configuration out of this job's way, never overwrite it;
    `keep_ok` (as a job starts): an ok record of this configuration too (a re-measure,
    `resume=false`), so that whatever the new measurement ends in, the ok one is kept.

    Job dirs are named by configuration (experiments/app/job_dirs.py), so another
    configuration's record is found in one only where the command line named the subdirs
    (`hydra.sweep.subdir=...`) or records were copied in by hand. The old record moves to
    `displaced/<its hash>/result.json` below it (`<its hash>.2`, ... if that is taken: a
    record there is never replaced; a hash that is not a plain name, e.g. `../x` in a crafted
    record, as `unsafe-<its sha256>`: `store.safe_name`), its curriculum stages' records
    (`stages/<seq_len>/result.json`) with it, where the store and resume still find them;
    each record's history moves with it, and the sweep's index follows them (`index.moved`).
    """
    other, status = _identity_of_record(out_dir / "result.json")
    if other is None or (other == digest and not (keep_ok and status == record.OK)):
        return
    target = _aside(out_dir / "displaced", other)
    _move_record(out_dir / "result.json", target / "result.json", sweep_dir)
    if (out_dir / "stages").is_dir():
        _move_stages(out_dir / "stages", target / "stages", sweep_dir)
    if other == digest:
        log.warning(
            "%s held an ok record of this configuration; measuring it again, the ok record is "
            "kept at %s",
            out_dir,
            target / "result.json",
        )
        return
    log.warning(
        "%s held another configuration (%s); moved to %s", out_dir, other, target / "result.json"
    )


def _aside(displaced: Path, digest: str) -> Path:
    """A dir below `displaced` for a record of `digest` that no record uses yet: its hash as
    a name (`store.safe_name`: a name from a file, never a path), then `<name>.2`, ..."""
    name = store.safe_name(digest)
    target, n = displaced / name, 1
    while target.exists():
        n += 1
        target = displaced / f"{name}.{n}"
    return target


def _move_stages(source: Path, target: Path, sweep_dir: Path | None) -> None:
    """Move every stage record below `source` to the same place below `target` (a dir of its
    own, `_aside`)."""
    for path in sorted(source.glob("*/result.json")):
        _move_record(path, target / path.parent.name / "result.json", sweep_dir)


def _move_record(path: Path, destination: Path, sweep_dir: Path | None) -> None:
    """Move the record at `path` and its history (if any) to `destination` and beside it; a
    history at the destination that the moved record does not have is removed. In a sweep,
    its index follows an ok record to where it now is."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    if history.beside(path).is_file():
        os.replace(history.beside(path), history.beside(destination))
    else:
        history.beside(destination).unlink(missing_ok=True)
    os.replace(path, destination)
    if sweep_dir is not None:
        try:
            index.moved(sweep_dir, destination, store.read_record(destination))
        except (OSError, ValueError):  # not a record resume could skip on: nothing to note
            pass


def _note_written(sweep_dir: Path | None, path: Path, rec: dict[str, Any]) -> None:
    """In a sweep, note a record just written in its index (`index.written`)."""
    if sweep_dir is not None:
        index.written(sweep_dir, path, rec)


def _displace_other_stage(path: Path, digest: str, sweep_dir: Path | None) -> None:
    """A stage record at `path` of another configuration (a job dir whose own record was lost
    or unreadable, so it did not move with it), or an ok one of this stage's configuration (a
    re-measure of a job whose own record did not end ok), moves to `displaced/<its hash>/`
    beside it (`_aside`): a stage's ok record is never written over either."""
    other, status = _identity_of_record(path)
    if other is None or (other == digest and status != record.OK):
        return
    target = _aside(path.parent / "displaced", other) / "result.json"
    _move_record(path, target, sweep_dir)
    if other == digest:
        log.warning("%s held an ok record of this stage; kept at %s", path, target)
    else:
        log.warning("%s held another configuration (%s); moved to %s", path, other, target)


def _identity_of_record(path: Path) -> tuple[str | None, Any]:
    """The `config_hash` and `status` of the record in `path`; (None, None) if there is none
    or it is unreadable."""
    try:
        # Unchecked: a record of another configuration moves aside whatever its values are.
        found = store.read_record(path, checked=False)
    except (OSError, ValueError):
        return None, None
    other = found.get("config_hash")
    return (other, found.get("status")) if isinstance(other, str) and other else (None, None)


def _status_of(error: BaseException) -> str:
    """The record status (`record.STATUSES`) of a measurement that raised `error`."""
    from experiments.training.train import Diverged

    if isinstance(error, budget.JobTimeout):
        return record.TIMEOUT
    if budget.is_out_of_memory(error):
        return record.OOM
    if isinstance(error, Diverged):
        return record.DIVERGED
    return record.ERROR
