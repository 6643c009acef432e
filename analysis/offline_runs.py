"""W&B offline runs read back from their transaction logs, without any service or account.

An offline run (experiments/tracking.py writes one per job) is a folder
`<dir>/wandb/offline-run-<time>-<id>/` whose `run-<id>.wandb` file is W&B's transaction log:
every config, history, summary and exit record of the run. `find_offline_runs` finds them,
`read_offline_run` reads one; analysis.load turns their summaries into records.
"""

from __future__ import annotations

import json
import pathlib
import struct
import zlib
from typing import Any

# The .wandb file is a LevelDB-format log (github.com/google/leveldb, doc/log_format.md) after
# a 7-byte W&B header: 32 KiB blocks of chunks, each chunk = crc32 (uint32, zlib's CRC of the
# type byte then the data), length (uint16), type (uint8: FULL, FIRST, MIDDLE, LAST), data. A
# record is one FULL chunk or FIRST, MIDDLE..., LAST; its bytes are a serialized
# `wandb_internal_pb2.Record`. wandb 0.31 no longer ships a Python reader (its old
# `sdk.internal.datastore` is gone; `wandb leet inspect --json` reads it in the Go core), so the
# chunk framing is read here and W&B's own protobuf classes decode each record.

_HEADER = struct.Struct("<4sHB")  # ident ":W&B", magic 0xBEE1, version
_CHUNK = struct.Struct("<IHB")  # crc32, data length, chunk type
_BLOCK_BYTES = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def find_offline_runs(root: pathlib.Path) -> list[pathlib.Path]:
    """Every offline run folder (`offline-run-*` holding a `.wandb` log) under `root`, sorted."""
    runs = (path for path in pathlib.Path(root).rglob("offline-run-*") if path.is_dir())
    return sorted(path for path in runs if any(path.glob("run-*.wandb")))


def read_offline_run(run_dir: pathlib.Path) -> dict:
    """What W&B recorded for one run, read from its `.wandb` transaction log.

    Returns a dict with
      config   -- the run config as logged (W&B's own `_wandb` key dropped);
      summary  -- the latest summary: every key ever set, last value wins; keys starting with `_`
                  (W&B's runtime bookkeeping) and null values are dropped -- W&B writes NaN as
                  null, as `Tracker.finish` writes None, so "absent" means "no value";
      history  -- one dict per logged row, in order, without `_` keys (`_step`, `_runtime`, ...);
      group, job_type, tags, name, project, run_id -- the run's metadata;
      exit_code -- as passed to finish, or None if the run never finished (crashed, still open).
    A log cut short by a crash is read up to its last whole record. Nested keys are nested
    dicts. `run_dir` may also be the `.wandb` file itself. Raises ValueError if it is not one.
    """
    run = {
        "config": {},
        "summary": {},
        "history": [],
        "group": "",
        "job_type": "",
        "tags": [],
        "name": "",
        "project": "",
        "run_id": "",
        "exit_code": None,
    }
    for entry in _records(_log_file(pathlib.Path(run_dir))):
        kind = entry.WhichOneof("record_type")
        if kind == "run":
            _apply_run(run, entry.run)
        elif kind == "config":
            _apply_updates(run["config"], entry.config)
        elif kind == "summary":
            _apply_updates(run["summary"], entry.summary)
        elif kind == "history":
            row = {}
            for item in entry.history.item:
                _put(row, _path(item), _history_value(item))
            run["history"].append(_user_keys(row))
        elif kind == "exit":
            run["exit_code"] = entry.exit.exit_code
    run["config"] = _user_keys(run["config"])
    run["summary"] = {k: v for k, v in _user_keys(run["summary"]).items() if v is not None}
    return run


def _log_file(run_dir: pathlib.Path) -> pathlib.Path:
    if run_dir.is_file():
        return run_dir
    logs = sorted(run_dir.glob("run-*.wandb"))
    if len(logs) != 1:
        raise ValueError(f"{run_dir}: expected one run-*.wandb file, found {len(logs)}")
    return logs[0]


def _records(path: pathlib.Path):
    """Yield each `wandb_internal_pb2.Record` of a .wandb log, stopping at a torn or bad chunk."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _version = _HEADER.unpack_from(data) if len(data) >= _HEADER.size else (b"", 0, 0)
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path}: not a W&B transaction log (bad header)")
    pos, pending = _HEADER.size, None
    while pos + _CHUNK.size <= len(data):
        room = _BLOCK_BYTES - pos % _BLOCK_BYTES
        if room < _CHUNK.size:  # a block's tail too small for a chunk header is zero padding
            pos += room
            continue
        crc, length, kind = _CHUNK.unpack_from(data, pos)
        chunk = data[pos + _CHUNK.size : pos + _CHUNK.size + length]
        if kind == 0 or len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            return  # end of what was written: zeros, a torn write or a corrupted chunk
        pos += _CHUNK.size + length
        if kind in (_FULL, _FIRST):
            pending = chunk
        elif pending is not None:  # MIDDLE or LAST continue a FIRST
            pending += chunk
        if kind in (_FULL, _LAST) and pending is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = None
            yield record


def _apply_run(run: dict, record: Any) -> None:
    run.update(
        group=record.run_group,
        job_type=record.job_type,
        tags=list(record.tags),
        name=record.display_name,
        project=record.project,
        run_id=record.run_id,
    )
    _apply_updates(run["config"], record.config)
    _apply_updates(run["summary"], record.summary)


def _apply_updates(target: dict, record: Any) -> None:
    """Apply a ConfigRecord or SummaryRecord (`update` items, then `remove` items) to `target`."""
    for item in record.update:
        _put(target, _path(item), json.loads(item.value_json))
    for item in record.remove:
        *parents, last = _path(item)
        for key in parents:
            target = target.get(key, {})
        target.pop(last, None)


def _history_value(item: Any) -> Any:
    """A history item's value: JSON text, or one of the typed fields newer writers use."""
    if item.value_json:
        return json.loads(item.value_json)
    typed = item.WhichOneof("value")
    if typed == "json":
        return json.loads(item.json)
    return None if typed in (None, "none") else getattr(item, typed)


def _path(item: Any) -> list[str]:
    return list(item.nested_key) or [item.key]


def _put(target: dict, path: list[str], value: Any) -> None:
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value


def _user_keys(values: dict) -> dict:
    return {k: v for k, v in values.items() if not k.startswith("_")}
