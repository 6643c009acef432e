"""A sweep's index of its records, so that a job's bookkeeping does not grow with the sweep.

- resume asks `<sweep>/.index/ok/<config_hash>`, a marker holding the path (relative to the
  sweep dir) of an ok record of that configuration, and checks that record (`find_ok_record`);
- a job notes each record it writes (`written`) or moves (`moved`), under the store's lock;
- the tables are rewritten at a job's end only when due (`gather_if_due`): after every record
  up to `EVERY_RECORD` configurations, then once 1/`EVERY_RECORD` of them have been written
  since, or when the last rewrite is older than `SLACK` times its own duration. The end of a
  multirun always gathers the records themselves.

The records stay the truth and the index a cache of them: it is rebuilt from a full scan at a
multirun's start (`rebuild`), and whenever a lookup finds it incomplete or a marker pointing at
anything but an ok record of its configuration.

Why (the quadratic cost it removed), and when it is rebuilt: docs/internals.md, "index".
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from experiments.records import record, store
from experiments.records.files import write_atomic

log = logging.getLogger("attnbench")

DIR = ".index"  # in the sweep dir
STATE = "state.json"  # in DIR: {"complete", "records", "pending", "gathered_at", "gather_s"}
EVERY_RECORD = 32  # up to this many configurations, the tables are rewritten after each record
SLACK = 10  # ... and whenever the last rewrite is older than this many times its duration


def find_ok_record(sweep_dir: Path, digest: str) -> Path | None:
    """The path of a status-ok record of `digest` in `sweep_dir`, if there is one: as
    `store.find_ok_record`, through the index (rebuilt first if it cannot be trusted)."""
    sweep_dir = Path(sweep_dir)
    if _state(sweep_dir).get("complete") or rebuild(sweep_dir):
        path = _marked(sweep_dir, digest)
        if path is None or _is_ok_record(path, digest):
            return path
        # A marker naming anything but an ok record of `digest`: records moved or changed
        # behind the index's back (or a marker written by hand).
        if rebuild(sweep_dir):
            return _marked(sweep_dir, digest)
    return store.find_ok_record(sweep_dir, digest)


def rebuild(sweep_dir: Path) -> bool:
    """Index every record below `sweep_dir` from a full scan (under the store's lock, so no
    note of a job is lost between the scan and the markers); whether it could be written. A
    dir that cannot be written keeps no index: lookups then scan, as before the index."""
    sweep_dir = Path(sweep_dir)
    try:
        with store.results_lock(sweep_dir):
            found = store.scan(sweep_dir)
            ok = {}
            for rec, path in zip(found.records, found.paths, strict=True):
                if rec["status"] == record.OK:
                    ok.setdefault(store.safe_name(rec["config_hash"]), path)
            markers = sweep_dir / DIR / "ok"
            markers.mkdir(parents=True, exist_ok=True)
            for stale in os.listdir(markers):
                if stale not in ok and not stale.startswith("."):
                    (markers / stale).unlink(missing_ok=True)
            for name, path in ok.items():
                _mark(sweep_dir, name, path)
            shown = len({rec["config_hash"] for rec in found.records})
            _write_state(sweep_dir, {**_state(sweep_dir), "complete": True, "records": shown})
    except OSError as error:
        log.warning("%s not indexed (%s); resume reads every record", sweep_dir / DIR, error)
        _forget(sweep_dir)
        return False
    return True


def written(sweep_dir: Path, path: Path, rec: dict[str, Any]) -> None:
    """Note the record `rec` a job just wrote at `path`: its marker if it is ok, and one more
    record for `gather_if_due`. A note that cannot be written (a full disk) marks the index
    incomplete, so the next lookup rebuilds it; it never fails the job."""
    _note(sweep_dir, path, rec, pending=1)


def moved(sweep_dir: Path, path: Path, rec: dict[str, Any]) -> None:
    """Note that the record `rec` now lives at `path` (displaced): its marker follows it."""
    _note(sweep_dir, path, rec, pending=0)


def gather_if_due(sweep_dir: Path) -> bool:
    """Rewrite the sweep's results.csv/.parquet if due (the module doc); whether it was."""
    sweep_dir = Path(sweep_dir)
    with store.results_lock(sweep_dir):
        state = _state(sweep_dir)
        if not _due(state):
            return False
        started = time.monotonic()
        frame = store.write_results_locked(sweep_dir)
        state.update(
            records=len(frame),
            pending=0,
            gathered_at=time.time(),
            gather_s=time.monotonic() - started,
        )
        try:
            _write_state(sweep_dir, state)
        except OSError as error:  # the tables are written; the next job end gathers again
            log.warning("%s not updated: %s", sweep_dir / DIR / STATE, error)
    return True


def _due(state: dict[str, Any]) -> bool:
    """Whether the tables are due: always without a state (an older sweep, a failed note)."""
    if not state:
        return True
    pending = state.get("pending", 0)
    if pending < 1:
        return False
    every = max(1, state.get("records", 0) // EVERY_RECORD)
    if pending >= every:
        return True
    took = state.get("gather_s")  # unknown until this index's first rewrite
    return took is not None and time.time() - state.get("gathered_at", 0.0) >= SLACK * took


def _note(sweep_dir: Path, path: Path, rec: dict[str, Any], *, pending: int) -> None:
    sweep_dir = Path(sweep_dir)
    try:
        with store.results_lock(sweep_dir):
            if rec.get("status") == record.OK:
                _mark(sweep_dir, store.safe_name(rec["config_hash"]), Path(path))
            if pending:
                state = _state(sweep_dir)
                _write_state(sweep_dir, {**state, "pending": state.get("pending", 0) + pending})
    except OSError as error:
        log.warning("%s not noted in %s (%s)", path, sweep_dir / DIR, error)
        _forget(sweep_dir)


def _mark(sweep_dir: Path, name: str, path: Path) -> None:
    marker = sweep_dir / DIR / "ok" / name
    relative = os.path.relpath(path, sweep_dir)
    try:
        if marker.read_text() == relative:  # a rebuild rewrites only what changed
            return
    except OSError:
        pass
    write_atomic(marker, lambda tmp: tmp.write_text(relative))


def _marked(sweep_dir: Path, digest: str) -> Path | None:
    """The record the marker of `digest` names; None if there is no marker. A marker naming
    anything but a `result.json` below the sweep dir (a marker is a file in a shared dir)
    names `sweep_dir / DIR`, which no lookup takes for a record."""
    try:
        relative = Path((sweep_dir / DIR / "ok" / store.safe_name(digest)).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return sweep_dir / DIR
    below = not relative.is_absolute() and ".." not in relative.parts
    return sweep_dir / relative if below and relative.name == "result.json" else sweep_dir / DIR


def _is_ok_record(path: Path, digest: str) -> bool:
    try:
        rec = store.read_record(path)
    except (OSError, ValueError):
        return False
    return rec["config_hash"] == digest and rec["status"] == record.OK


def _state(sweep_dir: Path) -> dict[str, Any]:
    try:
        state = json.loads((sweep_dir / DIR / STATE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(sweep_dir: Path, state: dict[str, Any]) -> None:
    write_atomic(sweep_dir / DIR / STATE, lambda tmp: tmp.write_text(json.dumps(state)))


def _forget(sweep_dir: Path) -> None:
    """Mark the index incomplete (remove its state; a full disk can still unlink)."""
    try:
        (sweep_dir / DIR / STATE).unlink(missing_ok=True)
    except OSError:
        pass
