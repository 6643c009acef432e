"""The local results store: one `result.json` per job, gathered per sweep into CSV and Parquet.

Layout of a sweep dir (Hydra's `hydra.sweep.dir`):
    <sweep>/<job>/result.json       one record per job (its dir: named by its configuration,
                                    experiments/app/job_dirs.py), written atomically by the job
    <sweep>/results.csv             every record of the sweep, one row per configuration
    <sweep>/results.parquet         the same, typed
A configuration is identified by `config_hash`; measured more than once, its newest ok record
is shown, else its newest (`chosen`). The store is rewritten as jobs end and at the end of the
multirun, under a lock on `<sweep>/.results.lock`. The records are the truth:
`python -m experiments.records.store <sweep dir>` gathers them again. A `result.json` that
cannot be read, or is not a record of the schema's types, is reported by path and left out; a
multirun whose end cannot write the tables says so in one line and exits 1 (`gather_at_end`).

What is shown, locking, damaged records and Parquet's text columns: docs/internals.md, "store".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.records import record
from experiments.records.files import file_lock, write_atomic
from experiments.records.record import config_keys
from experiments.records.values import bool_or_none, text_or_none

log = logging.getLogger("attnbench")

# The printed table: these keys always (a single run's too), then every other key that varies,
# then the schema's shown measurements when any record has them, and the task's metrics.
HEADLINE_KEYS = ("attention", "block", "seq_len", "depth")
LOCK = ".results.lock"  # in the sweep dir: held while its records are gathered and written


@dataclass(frozen=True)
class Unreadable:
    """A `result.json` that could not be read, and why."""

    path: Path
    reason: str


def read_record(path: Path, *, checked: bool = True) -> dict[str, Any]:
    """The record in `path`: a JSON object. `OSError` if it cannot be read, `ValueError` if it
    is not JSON or not an object (`[]`, a number, ...), or (`checked`) not a record of the
    schema's types (`record.type_problem`: `{}`, a numeric timestamp), so callers treat all of
    these as unreadable. `checked=False`: any JSON object (a job reading the hash of a record
    it is to move aside, whatever else that record holds)."""
    value = json.loads(Path(path).read_text())
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but a JSON {type(value).__name__}")
    problem = record.type_problem(value) if checked else None
    if problem is not None:
        raise ValueError(f"not a record: {problem}")
    return value


def non_finite_warning(path: Path, rec: dict[str, Any]) -> str | None:
    """A warning naming `path` and its columns if `rec` is ok but holds NaN or infinities
    (a job records those as diverged; this record was written otherwise): it is kept, and
    its non-finite values read as not measured."""
    if rec.get("status") != record.OK:
        return None
    names = record.non_finite(rec)
    if not names:
        return None
    values = ", ".join(f"{k}={rec[k]}" for k in names)
    return f"ok record {path} holds non-finite {values} (read as not measured)"


Stamp = tuple[int, int, int, int]  # a file's (device, inode, mtime in ns, size)


def _stamp(path: Path) -> Stamp:
    stat = path.stat()
    return (stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size)


def record_stamps(sweep_dir: Path) -> set[Stamp]:
    """The stamp of every `result.json` below `sweep_dir`: what a multirun finds at its start,
    so that at its end `read_records(..., unchanged=...)` tells its own records from earlier
    ones without a clock. A record moved aside keeps its stamp (a rename keeps the inode and
    times); one written again gets a new one (new inode, or new time)."""
    stamps = set()
    for path in Path(sweep_dir).glob("**/result.json"):
        try:
            stamps.add(_stamp(path))
        except OSError:  # removed meanwhile
            continue
    return stamps


def read_records(
    sweep_dir: Path, *, unchanged: set[Stamp] | None = None
) -> tuple[list[dict[str, Any]], list[Unreadable]]:
    """Every readable `result.json` below `sweep_dir`, and the unreadable ones.

    `unchanged` (`record_stamps` taken earlier): leave out the files still as they were then,
    e.g. to read only the records a multirun wrote or rewrote.
    """
    found = scan(sweep_dir, unchanged=unchanged)
    return found.records, found.unreadable


@dataclass(frozen=True)
class Scan:
    """What a sweep dir holds: its readable records with their paths, the unreadable files,
    and a warning per readable record that is suspect (`non_finite_warning`)."""

    records: list[dict[str, Any]]
    paths: list[Path]
    mtimes: list[int]  # of each record's file, in ns
    unreadable: list[Unreadable]
    warnings: list[str]


def scan(sweep_dir: Path, *, unchanged: set[Stamp] | None = None) -> Scan:
    """Every `result.json` below `sweep_dir` (as `read_records`), with paths and warnings."""
    records, paths, mtimes, unreadable, warnings = [], [], [], [], []
    for path in sorted(Path(sweep_dir).glob("**/result.json")):
        try:
            stamp = _stamp(path)
            if unchanged is not None and stamp in unchanged:
                continue
            rec = read_record(path)
        except (OSError, ValueError) as error:
            unreadable.append(Unreadable(path, " ".join(str(error).split())))
            continue
        records.append(rec)
        paths.append(path)
        mtimes.append(stamp[2])
        if (warning := non_finite_warning(path, rec)) is not None:
            warnings.append(warning)
    return Scan(records, paths, mtimes, unreadable, warnings)


def iter_records(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every readable `result.json` below `sweep_dir` (unreadable ones are reported, not fatal)."""
    records, unreadable = read_records(sweep_dir)
    for bad in unreadable:
        log.warning("unreadable record %s: %s", bad.path, bad.reason)
    return records


def find_ok_record(sweep_dir: Path, config_hash: str) -> Path | None:
    """The path of a status-ok record of `config_hash` in `sweep_dir`, if there is one."""
    for path in Path(sweep_dir).glob("**/result.json"):
        try:
            rec = read_record(path)
        except (OSError, ValueError):
            continue
        if rec.get("config_hash") == config_hash and rec.get("status") == record.OK:
            return path
    return None


def gather(sweep_dir: Path) -> pd.DataFrame:
    """All records of a sweep as a DataFrame, one row per configuration (`shown`)."""
    found = scan(sweep_dir)  # the callers report unreadable ones
    return shown(found.records, found.mtimes)


def shown(records: list[dict[str, Any]], mtimes: list[int] | None = None) -> pd.DataFrame:
    """`records` (each of the schema's types: `record.type_problem`) as a frame, one row per
    configuration: the record `chosen` for it."""
    frame = pd.DataFrame([records[i] for i in chosen(records, mtimes)])
    if frame.empty:
        return frame
    order = [c for c in ("attention", "block", "seq_len") if c in frame]
    return (frame.sort_values(order, kind="stable") if order else frame).reset_index(drop=True)


def chosen(records: list[dict[str, Any]], mtimes: list[int] | None = None) -> list[int]:
    """The index of the record each configuration (`config_hash`) shows: its newest ok record,
    else its newest record. Ok first, because a failed re-measure (`resume=false` under a
    smaller budget) must not hide a measurement that resume then skips as done: the loader and
    resume agree, and `shown_notes` names the newer failure. Newest by `timestamp` (none: the
    oldest), then by the file's mtime (`mtimes`, as `Scan.mtimes`; timestamps are whole
    seconds)."""
    mtimes = mtimes or [0] * len(records)
    best: dict[str, int] = {}
    for i, rec in enumerate(records):
        j = best.get(rec["config_hash"])
        if j is None or _rank(rec, mtimes[i]) >= _rank(records[j], mtimes[j]):
            best[rec["config_hash"]] = i
    return sorted(best.values())


def _rank(rec: dict[str, Any], mtime: int) -> tuple[bool, str, int]:
    return rec.get("status") == record.OK, rec.get("timestamp") or "", mtime


def shown_notes(found: Scan) -> list[str]:
    """What a reader of the gathered table should know of the records it does not show: a
    configuration whose ok record is shown over newer ones that did not end ok (each named),
    and how many older ok records are kept beside the ones shown (`displaced/`)."""
    by_hash: dict[str, list[int]] = {}
    for j, rec in enumerate(found.records):
        by_hash.setdefault(rec["config_hash"], []).append(j)
    notes, older_ok, configurations = [], [], set()
    for i in chosen(found.records, found.mtimes):
        digest = found.records[i]["config_hash"]
        shown_rec, shown_rank = found.records[i], _rank(found.records[i], found.mtimes[i])
        others = [j for j in by_hash[digest] if j != i]
        newer = [
            j
            for j in others
            if found.records[j]["status"] != record.OK
            and _rank(found.records[j], found.mtimes[j])[1:] > shown_rank[1:]
        ]
        if shown_rec["status"] == record.OK and newer:
            failures = ", ".join(
                f"{found.records[j]['status']} record {found.paths[j]}" for j in newer
            )
            notes.append(
                f"configuration {digest}: shows its ok record {found.paths[i]}, not the newer "
                f"{failures}"
            )
        ok = [j for j in others if found.records[j]["status"] == record.OK]
        older_ok += ok
        configurations |= {digest} if ok else set()
    if older_ok:
        notes.append(
            f"{len(older_ok)} older ok record(s) of {len(configurations)} configuration(s) kept "
            f"beside the one shown (its newest ok record), e.g. {found.paths[older_ok[0]]}"
        )
    return notes


def write_results(sweep_dir: Path, *, quiet: bool = False) -> pd.DataFrame:
    """Gather a sweep into `results.csv` and `results.parquet` in `sweep_dir`; returns the frame.

    Each file is replaced whole (written aside, then renamed), so a reader never sees half a
    file; the records are read and the files written under the sweep's lock (`results_lock`),
    so a parallel job gathering at the same moment cannot replace them with an older table.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        if not quiet:
            log.warning("no records found in %s", sweep_dir)
        return pd.DataFrame()
    with results_lock(sweep_dir):
        frame = write_results_locked(sweep_dir)
    if frame.empty and not quiet:
        log.warning("no records found in %s", sweep_dir)
    return frame


def write_results_locked(sweep_dir: Path) -> pd.DataFrame:
    """`write_results` for a caller that holds the sweep's lock (`results_lock`) already."""
    frame = gather(sweep_dir)
    if frame.empty:
        return frame
    write_atomic(sweep_dir / "results.csv", lambda path: frame.to_csv(path, index=False))
    typed = parquet_frame(frame)
    write_atomic(sweep_dir / "results.parquet", lambda path: typed.to_parquet(path, index=False))
    return frame


@contextlib.contextmanager
def results_lock(sweep_dir: Path) -> Iterator[None]:
    """Hold the sweep's exclusive lock (`<sweep_dir>/LOCK`) while its records are gathered."""
    with file_lock(Path(sweep_dir) / LOCK):
        yield


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def safe_name(value: object) -> str:
    """`value` (a name read from a file, e.g. a record's `config_hash`) as one path component
    that stays inside its directory: itself when it is a plain name (letters, digits, `_.-`,
    not starting with a dot, at most 64 characters), else `unsafe-<12 hex digits of its
    sha256>`, the same for the same value and never a path (`../x`, `/x`, ...)."""
    text = str(value)
    if _PLAIN_NAME.fullmatch(text) and ".." not in text:
        return text
    return "unsafe-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def check_relative_name(option: str, value: object) -> str:
    """`value` of command-line option `option` that names a dir below another (`sweep`: the
    dir `multirun/<sweep>`): a relative path with no `..`, empty or absolute part; else a
    one-line ValueError naming the option."""
    text = str(value)
    parts = text.split("/")
    if not text or text.startswith("/") or "\0" in text or any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"config: option {option!r} names a dir below multirun/ and outputs/, so it must be "
            f"a relative name with no '..', '.' or empty part; got {text!r}"
        )
    return text


def parquet_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The records with one type per column, as Parquet wants: a schema column in its type
    (`record.SCHEMA`; ints and bools nullable), any other column as it is when its values share
    a kind and Parquet can hold them, and as text when they mix (a config key such as
    `attention.stride`: 'auto' or 64) or it cannot (lists of mixed items, an int past 64
    bits: a hand-written record's extra column must not cost the sweep its results.parquet)."""
    typed = frame.copy()
    for name in typed.columns:
        column = record.column(name)
        values = typed[name]
        if column is None:
            if values.dtype == object and (_mixed(values) or not _arrow_holds(values)):
                typed[name] = values.map(_text)
        elif column.type is int:
            typed[name] = pd.array(pd.to_numeric(values, errors="coerce"), dtype="Int64")
        elif column.type is float:
            typed[name] = pd.to_numeric(values, errors="coerce").astype(float)
        elif column.type is bool:
            typed[name] = pd.array(values.map(bool_or_none), dtype="boolean")
        else:
            typed[name] = values.map(text_or_none)
    return typed


def _arrow_holds(values: pd.Series) -> bool:
    """Whether Parquet (pyarrow) takes these values as one column as they are."""
    import pyarrow as pa

    try:
        pa.array(values.tolist(), from_pandas=True)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return False
    return True


def _text(value: Any) -> str | None:
    """A value as Parquet text: a list or an object as its JSON, a gap as None."""
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True, default=str)
    return text_or_none(value)


def _mixed(values: pd.Series) -> bool:
    """Whether the present values are of more than one kind (bool, number, text, ...)."""

    def kind(value: Any) -> str:
        if isinstance(value, bool):
            return "bool"
        return "number" if isinstance(value, (int, float)) else type(value).__name__

    return values.dropna().map(kind).nunique() > 1


def varying_keys(frame: pd.DataFrame) -> list[str]:
    """The configuration keys (`record.config_keys`) that take more than one value in `frame`.

    A missing value is not a value: a job that failed before it resolved `threads` does not
    make threads vary. `layers` counts only where a stack mixes variants (`has_hybrid`): else it
    is each record's attention again.
    """
    return [
        key
        for key in config_keys(frame.columns)
        if frame[key].dropna().map(text_or_none).nunique() > 1
        and (key != "layers" or has_hybrid(frame))
    ]


def is_stack(frame: pd.DataFrame) -> pd.Series:
    """Whether each record of `frame` is a hybrid stack's: its `layers` names more than its
    attention (`record.stack_label`; a plain model's `layers` is its attention)."""
    if "layers" not in frame or "attention" not in frame:
        return pd.Series(False, index=frame.index)
    layers = frame["layers"]
    return layers.notna() & (layers.map(str) != frame["attention"].map(str))


def has_hybrid(frame: pd.DataFrame) -> bool:
    """Whether a record of `frame` is a hybrid stack (`is_stack`)."""
    return bool(is_stack(frame).any())


def task_metrics(columns) -> list[str]:
    """The task's quality columns among `columns`: the schema's task metrics
    (`record.TASK_METRICS`) and their `@<label>` columns."""
    return [c for c in columns if c.split("@", 1)[0] in record.TASK_METRICS]


def key_columns(frame: pd.DataFrame) -> list[str]:
    """The columns that tell a sweep's rows apart: HEADLINE_KEYS present, then varying keys."""
    headline = [k for k in HEADLINE_KEYS if k in frame]
    return headline + [k for k in varying_keys(frame) if k not in headline]


def short_names(columns: list[str]) -> dict[str, str]:
    """Column -> the part after its last dot (`attention.n_hashes` -> `n_hashes`) when unique."""
    tails = [c.rsplit(".", 1)[-1] for c in columns]
    return {c: t if tails.count(t) == 1 else c for c, t in zip(columns, tails, strict=True)}


def format_records(
    records: list[dict[str, Any]] | pd.DataFrame, keys: list[str] | None = None
) -> str:
    """A compact text table: the keys that tell the rows apart, status, what was measured.

    `keys` default to `key_columns` of the records themselves. Measurements are shown when any
    record has one, then the task's metrics (`eval_accuracy`, `eval_bits_per_byte` and their
    `@<label>` evaluations); peak memory in MiB.
    """
    frame = pd.DataFrame(records)
    keys = key_columns(frame) if keys is None else [k for k in keys if k in frame]
    measured = [
        c
        for c in (*record.SHOWN, *task_metrics(frame.columns))
        if c in frame and frame[c].notna().any()
    ]
    frame = frame[[*keys, "status", *measured]].copy()
    if "peak_memory_bytes" in frame:
        frame["peak_memory_bytes"] = frame["peak_memory_bytes"].map(
            lambda b: f"{b / record.MIB:.1f} MiB" if pd.notna(b) else ""
        )
        frame = frame.rename(columns={"peak_memory_bytes": "peak_memory"})
    frame = frame.rename(columns=short_names(keys))
    return frame.to_string(index=False, float_format=lambda x: f"{x:.4g}", na_rep="")


def gather_at_end(sweep_dir: Path) -> pd.DataFrame | None:
    """A multirun's last gathering: the sweep's records into results.csv/.parquet, printed with
    a line per record that could not be read; the frame. None, after one line on stderr, when
    the tables could not be written (a full disk, a symlink planted as the lock): the records
    are kept, and the sweep then fails (experiments/app/sweep.py)."""
    sweep_dir = Path(sweep_dir)
    try:
        frame = write_results(sweep_dir)
    except OSError as error:
        reason = " ".join(str(error).split())
        print(
            f"error: {sweep_dir / 'results.csv'} not gathered ({reason}); the records are "
            f"kept: python -m experiments.records.store {sweep_dir} gathers them again",
            file=sys.stderr,
        )
        return None
    say_what_was_read(sweep_dir)
    if not frame.empty:
        print(format_records(frame))
        counts = frame["status"].value_counts().to_dict()
        print(f"{len(frame)} configurations {counts}; results: {sweep_dir / 'results.csv'}")
    return frame


def say_what_was_read(sweep_dir: Path) -> None:
    """A line on stderr per record of `sweep_dir` that was left out (unreadable, or not a
    record of the schema's types), per suspect record kept (`Scan.warnings`) and per note on
    which record of a configuration is shown (`shown_notes`)."""
    found = scan(sweep_dir)
    for bad in found.unreadable:
        print(f"warning: unreadable record {bad.path}: {bad.reason}", file=sys.stderr)
    for warning in found.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for note in shown_notes(found):
        print(f"note: {note}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """`python -m experiments.records.store SWEEP_DIR...`: gather each sweep's records into its
    results.csv/.parquet again (e.g. after a killed sweep); unreadable records are named."""
    dirs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not dirs:
        print("usage: python -m experiments.records.store SWEEP_DIR...", file=sys.stderr)
        return 2
    code = 0
    for sweep_dir in dirs:
        if not sweep_dir.is_dir():
            print(f"error: {sweep_dir}: no such sweep dir", file=sys.stderr)
            code = 1
            continue
        frame = write_results(sweep_dir, quiet=True)
        say_what_was_read(sweep_dir)
        if frame.empty:
            print(f"warning: no readable records in {sweep_dir}", file=sys.stderr)
        else:
            print(f"{len(frame)} configurations: {sweep_dir / 'results.csv'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
