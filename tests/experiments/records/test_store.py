"""The results store: records gathered per sweep, one row per configuration, newest wins."""

from __future__ import annotations

import json
import logging
import os

import pandas as pd
import pytest

from experiments.records import store


def rec(config_hash, *, status="ok", timestamp="2026-01-01T00:00:00+00:00", **columns):
    return {
        "config_hash": config_hash,
        "status": status,
        "timestamp": timestamp,
        "attention": "full",
        "block": "residual",
        "seq_len": 64,
        "depth": 1,
        "error": None if status == "ok" else f"{status} happened",
        **columns,
    }


def put(sweep_dir, job, record):
    path = sweep_dir / str(job) / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_gather_keeps_the_newest_record_of_each_configuration(tmp_path):
    # The newest record sits in the first job dir, so dir order cannot be what decides.
    put(tmp_path, 0, rec("aaa", timestamp="2026-01-02T00:00:00+00:00", attn_fwd_ms=2.0))
    put(tmp_path, 1, rec("aaa", status="oom", timestamp="2026-01-01T00:00:00+00:00"))
    put(tmp_path, 2, rec("bbb", status="error", timestamp="2026-01-01T00:00:00+00:00"))
    put(tmp_path, 3, rec("bbb", timestamp="2026-01-03T00:00:00+00:00", attn_fwd_ms=5.0))
    put(tmp_path, 4, rec("ccc", seq_len=32, attention="lsh"))
    frame = store.gather(tmp_path)
    assert frame["config_hash"].is_unique and len(frame) == 3
    rows = frame.set_index("config_hash")
    assert rows.loc["aaa", "status"] == "ok" and rows.loc["aaa", "attn_fwd_ms"] == 2.0
    assert rows.loc["bbb", "status"] == "ok" and rows.loc["bbb", "attn_fwd_ms"] == 5.0
    assert list(frame["attention"]) == ["full", "full", "lsh"]  # sorted for reading
    assert list(frame.index) == [0, 1, 2]


def test_gather_of_an_empty_or_missing_dir_is_empty(tmp_path):
    assert store.gather(tmp_path).empty
    assert store.gather(tmp_path / "nothing-here").empty
    assert store.write_results(tmp_path).empty
    assert not (tmp_path / "results.csv").exists()


def test_unreadable_record_is_reported_not_fatal(tmp_path, caplog):
    put(tmp_path, 0, rec("aaa"))
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "result.json").write_text('{"config_hash": "bb')  # a torn copy
    with caplog.at_level(logging.WARNING, logger="attnbench"):
        records = store.iter_records(tmp_path)
    assert [r["config_hash"] for r in records] == ["aaa"]
    assert "unreadable record" in caplog.text and "1/result.json" in caplog.text


def test_find_ok_record_only_finds_status_ok_of_that_hash(tmp_path):
    ok = put(tmp_path, 0, rec("aaa"))
    put(tmp_path, 1, rec("bbb", status="timeout"))
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "result.json").write_text("not json")
    assert store.find_ok_record(tmp_path, "aaa") == ok
    assert store.find_ok_record(tmp_path, "bbb") is None
    assert store.find_ok_record(tmp_path, "ccc") is None


def test_write_results_writes_csv_and_typed_parquet(tmp_path):
    # Mixed-type columns (stride 'auto' or 64) and missing values must not break Parquet.
    put(tmp_path, 0, rec("aaa", **{"attention.stride": "auto", "attn_fwd_ms": 1.5}))
    put(tmp_path, 1, rec("bbb", **{"attention.stride": 64, "attn_fwd_ms": None}))
    put(tmp_path, 2, rec("ccc", status="skipped", **{"attention.stride": 8}))
    frame = store.write_results(tmp_path)
    csv = pd.read_csv(tmp_path / "results.csv")
    parquet = pd.read_parquet(tmp_path / "results.parquet")
    assert len(frame) == len(csv) == len(parquet) == 3
    assert list(csv["config_hash"]) == list(parquet["config_hash"]) == list(frame["config_hash"])
    assert sorted(parquet["attention.stride"].astype(str)) == ["64", "8", "auto"]
    assert parquet["attn_fwd_ms"].dtype.kind == "f"
    # No temporary file is left beside the results; the lock file stays.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [store.LOCK]


def test_parquet_columns_have_the_schemas_types_and_unmixed_config_keys_keep_theirs(tmp_path):
    put(tmp_path, 0, rec("aaa", job="0", causal=True, peak_memory_bytes=7, **{"model.depth": 2}))
    put(tmp_path, 1, rec("bbb", job="1", causal=None, **{"attention.seed": None, "model.depth": 4}))
    put(tmp_path, 2, rec("ccc", job="2", causal=False, **{"attention.seed": 3, "model.depth": 2}))
    store.write_results(tmp_path)
    parquet = pd.read_parquet(tmp_path / "results.parquet").set_index("config_hash")
    assert str(parquet["seq_len"].dtype) == "Int64" and parquet["seq_len"].tolist() == [64] * 3
    assert str(parquet["peak_memory_bytes"].dtype) == "Int64"  # bytes stay whole, <NA> if none
    assert parquet.loc["aaa", "peak_memory_bytes"] == 7
    assert pd.isna(parquet.loc["bbb", "peak_memory_bytes"])
    assert str(parquet["causal"].dtype) == "boolean" and pd.isna(parquet.loc["bbb", "causal"])
    assert parquet["job"].tolist() == ["0", "1", "2"]  # text, as the record has it
    assert parquet["model.depth"].tolist() == [2, 4, 2] and parquet["model.depth"].dtype.kind == "i"
    assert parquet.loc["ccc", "attention.seed"] == 3 and pd.isna(
        parquet.loc["bbb", "attention.seed"]
    )
    # No temporary file is left beside the results; the lock file stays.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [store.LOCK]


def test_format_records_shows_headline_columns_with_memory_in_mib():
    table = store.format_records(
        [
            rec("aaa", peak_memory_bytes=3 * 2**20, attn_fwd_ms=1.23456, extra="not shown"),
            rec("bbb", status="oom"),
        ]
    )
    header = table.splitlines()[0].split()
    assert header[:4] == ["attention", "block", "seq_len", "depth"]
    assert "peak_memory" in header and "extra" not in header and "config_hash" not in header
    assert "3.0 MiB" in table and "1.235" in table and "oom" in table


def test_format_records_shows_every_key_that_varies_and_the_task_metrics():
    common = {"task": "duplication", "model.causal": True, "measure.warmup": 1}
    records = [
        rec(
            f"h{n}{b}",
            **common,
            **{"attention.n_hashes": n, "attention.bucket_size": b, "threads": 2},
            eval_accuracy=0.5,
            **{"eval_accuracy@lsh-8": 0.25, "eval_loss@lsh-8": 1.0},
        )
        for n in (1, 2)
        for b in (32, 64)
    ]
    records.append(rec("t1", **common, **{"attention.n_hashes": 1, "threads": 1}))
    header = store.format_records(records).splitlines()[0].split()
    assert header == [
        "attention",
        "block",
        "seq_len",
        "depth",
        "n_hashes",
        "bucket_size",
        "threads",
        "status",
        "eval_accuracy",
        "eval_accuracy@lsh-8",
    ]  # task, causal, warmup are the same everywhere; eval_loss@ is not a task metric


def test_the_end_of_a_multirun_writes_and_prints_the_store(tmp_path, capsys):
    put(tmp_path, 0, rec("aaa"))
    put(tmp_path, 1, rec("bbb", status="skipped"))
    assert len(store.gather_at_end(tmp_path)) == 2
    assert len(pd.read_csv(tmp_path / "results.csv")) == 2
    out = capsys.readouterr().out
    assert "2 configurations" in out and "results.csv" in out


@pytest.mark.parametrize("statuses", [["error"], ["oom", "timeout"]])
def test_the_end_of_a_multirun_gathers_when_every_job_failed(tmp_path, statuses):
    for job, status in enumerate(statuses):
        put(tmp_path, job, rec(f"h{job}", status=status))
    store.gather_at_end(tmp_path)
    assert sorted(pd.read_csv(tmp_path / "results.csv")["status"]) == sorted(statuses)


# --- damaged records and parallel gathering: neither stops a sweep nor loses a record -----------


@pytest.mark.parametrize("text", ["[]", "3", '"ok"', "null"])
def test_a_record_that_is_not_a_json_object_is_unreadable_not_fatal(tmp_path, text):
    """Scenario 2: `[]` in one result.json used to fail every job of the next sweep."""
    put(tmp_path, 0, rec("aaa"))
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "result.json").write_text(text)
    records, unreadable = store.read_records(tmp_path)
    assert [r["config_hash"] for r in records] == ["aaa"]
    assert [(bad.path.parent.name, "not a JSON object" in bad.reason) for bad in unreadable] == [
        ("1", True)
    ]
    assert store.find_ok_record(tmp_path, "aaa") == tmp_path / "0" / "result.json"
    assert store.find_ok_record(tmp_path, "bbb") is None
    assert list(store.write_results(tmp_path)["config_hash"]) == ["aaa"]


def test_parallel_gathers_never_leave_a_table_missing_a_record(tmp_path, monkeypatch):
    """Scenario 6: job A gathers (1 record), job B writes its record and gathers (2), B writes
    results.csv, then A writes its older table over it. Under the lock B waits for A."""
    import threading

    put(tmp_path, 0, rec("aaa"))
    gathered, release = threading.Event(), threading.Event()
    real_gather = store.gather

    def slow_gather(sweep_dir):
        frame = real_gather(sweep_dir)
        if threading.current_thread().name == "A":
            gathered.set()
            release.wait(timeout=1.0)  # without the lock, B finishes meanwhile
        return frame

    monkeypatch.setattr(store, "gather", slow_gather)
    a = threading.Thread(target=store.write_results, args=(tmp_path,), name="A")
    a.start()
    assert gathered.wait(timeout=10)
    put(tmp_path, 1, rec("bbb", seq_len=32))
    b = threading.Thread(target=store.write_results, args=(tmp_path,), name="B")
    b.start()
    b.join(timeout=0.3)
    release.set()
    a.join(timeout=10)
    b.join(timeout=10)
    assert sorted(pd.read_csv(tmp_path / "results.csv")["config_hash"]) == ["aaa", "bbb"]
    assert sorted(pd.read_parquet(tmp_path / "results.parquet")["config_hash"]) == ["aaa", "bbb"]


def test_the_lock_file_is_not_followed_through_a_symlink(tmp_path):
    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("keep me")
    sweep_dir = tmp_path / "sweep"
    put(sweep_dir, 0, rec("aaa"))
    (sweep_dir / store.LOCK).symlink_to(elsewhere)
    with pytest.raises(OSError):
        store.write_results(sweep_dir)
    assert elsewhere.read_text() == "keep me"


def test_python_m_experiments_store_gathers_a_killed_sweeps_records_again(tmp_path, capsys):
    put(tmp_path, 0, rec("aaa"))
    store.write_results(tmp_path)
    put(tmp_path, 1, rec("bbb", seq_len=32))  # recorded after the last gather: the sweep died
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "result.json").write_text("[]")
    assert store.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert f"2 configurations: {tmp_path / 'results.csv'}" in out
    assert f"unreadable record {tmp_path / '2' / 'result.json'}: not a JSON object" in err
    assert sorted(pd.read_csv(tmp_path / "results.csv")["config_hash"]) == ["aaa", "bbb"]
    assert store.main([str(tmp_path / "missing")]) == 1


def test_records_unchanged_since_a_stamp_are_left_out_moved_or_not(tmp_path):
    """A multirun's own records are those not stamped at its start: a record moved aside
    (displaced) is still an earlier one, however recent its time; one written again is new."""
    put(tmp_path, 0, rec("moved"))
    put(tmp_path, 1, rec("rewritten", status="error"))
    put(tmp_path, 2, rec("kept"))
    stamps = store.record_stamps(tmp_path)
    target = tmp_path / "0" / "displaced" / "moved" / "result.json"
    target.parent.mkdir(parents=True)
    os.replace(tmp_path / "0" / "result.json", target)
    put(tmp_path, 0, rec("new"))
    put(tmp_path, 1, rec("rewritten", status="ok", extra="a longer record than before"))
    records, _ = store.read_records(tmp_path, unchanged=stamps)
    assert sorted((r["config_hash"], r["status"]) for r in records) == [
        ("new", "ok"),
        ("rewritten", "ok"),
    ]
    assert len(store.read_records(tmp_path)[0]) == 4


def test_a_gap_of_a_nullable_column_stays_a_gap_not_the_text_na():
    """Records gathered with a frame read back (nullable dtypes: a gap is pd.NA) keep the gap
    missing in a text column, in the schema's and in a mixed config key's, never "<NA>"."""
    frame = pd.DataFrame(
        {
            "attention": pd.array(["lsh", pd.NA], dtype="string").astype(object),
            # mixed kinds (an object column, as gathered records hold): written as text
            "attention.stride": pd.Series(["auto", pd.NA], dtype=object),
        }
    )
    frame.loc[2] = ["full", 64]
    typed = store.parquet_frame(frame)
    for name in ("attention", "attention.stride"):
        assert typed[name].isna().tolist() == [False, True, False], typed[name].tolist()
        assert "<NA>" not in typed[name].dropna().tolist()


# --- Records of the wrong type, mixed extra columns, non-finite values ---------------------------


@pytest.mark.parametrize(
    ("changed", "column"),
    [
        ({"timestamp": 1733000000}, "timestamp"),
        ({"seq_len": 64.5}, "seq_len"),
        ({"status": "fine"}, "status"),
        ({"config_hash": 7}, "config_hash"),
    ],
)
def test_a_record_of_the_wrong_type_is_named_and_left_out(tmp_path, capsys, changed, column):
    """A numeric timestamp or seq_len 64.5 broke the end of the sweep ("'<' not supported",
    the file not named) and `records.store`: now named with its column, the rest gathered."""
    put(tmp_path, 0, rec("aaa"))
    bad = put(tmp_path, 1, {**rec("bbb", seq_len=32), **changed})
    records, unreadable = store.read_records(tmp_path)
    assert [r["config_hash"] for r in records] == ["aaa"]
    assert [u.path for u in unreadable] == [bad] and repr(column) in unreadable[0].reason
    assert list(store.gather_at_end(tmp_path)["config_hash"]) == ["aaa"]
    assert f"unreadable record {bad}: " in capsys.readouterr().err
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == 1
    assert store.main([str(tmp_path)]) == 0
    assert store.find_ok_record(tmp_path, "bbb") is None


@pytest.mark.parametrize("text", ["{}", '{"status": "ok"}', '{"config_hash": "", "status": "ok"}'])
def test_an_object_without_a_configuration_and_status_is_no_record(tmp_path, text):
    put(tmp_path, 0, rec("aaa"))
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "result.json").write_text(text)
    records, unreadable = store.read_records(tmp_path)
    assert len(records) == 1 and [u.path.parent.name for u in unreadable] == ["1"]
    assert len(store.write_results(tmp_path)) == 1


@pytest.mark.parametrize(
    "values",
    [
        [[1, 2], [3, "a"]],  # lists whose items differ in kind
        [{"a": 1}, {"a": "x"}],
        [2**70, 3],  # beyond Parquet's int64
        [[1], None],
    ],
)
def test_a_mixed_extra_column_is_written_to_parquet_as_text(tmp_path, values):
    put(tmp_path, 0, rec("aaa", **{"x.extra": values[0]}))
    put(tmp_path, 1, rec("bbb", seq_len=32, **{"x.extra": values[1]}))
    store.write_results(tmp_path)
    assert len(pd.read_csv(tmp_path / "results.csv")) == 2
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == 2


def test_an_ok_record_holding_a_non_finite_value_is_kept_with_a_warning(tmp_path, capsys):
    path = tmp_path / "0" / "result.json"
    path.parent.mkdir()
    path.write_text(json.dumps(rec("aaa", attn_fwd_ms=float("nan"), step_ms=float("inf"))))
    assert len(store.gather_at_end(tmp_path)) == 1
    err = capsys.readouterr().err
    assert f"warning: ok record {path} holds non-finite attn_fwd_ms=nan, step_ms=inf" in err
    assert store.main([str(tmp_path)]) == 0
    assert f"ok record {path} holds non-finite" in capsys.readouterr().err


# --- Which record of a configuration is shown ---------------------------------------------------


def test_an_ok_record_is_shown_over_a_newer_failure_and_the_store_says_so(tmp_path, capsys):
    """A newer timeout and an older ok record of one configuration were shown as timeout while
    resume skipped the configuration as ok; now both say ok, and the end of a sweep says
    which record it shows and which it does not."""
    ok = put(tmp_path, 0, rec("aaa", timestamp="2026-01-01T00:00:00+00:00", attn_fwd_ms=2.0))
    failed = put(tmp_path, 1, rec("aaa", status="timeout", timestamp="2026-01-02T00:00:00+00:00"))
    put(tmp_path, 2, rec("bbb", seq_len=32, status="oom"))
    frame = store.gather(tmp_path).set_index("config_hash")
    assert frame.loc["aaa", "status"] == "ok" and frame.loc["aaa", "attn_fwd_ms"] == 2.0
    assert store.find_ok_record(tmp_path, "aaa") == ok
    store.gather_at_end(tmp_path)
    err = capsys.readouterr().err
    assert f"shows its ok record {ok}" in err and f"not the newer timeout record {failed}" in err
    assert "bbb" not in err


def test_older_ok_records_kept_aside_are_counted(tmp_path, capsys):
    put(tmp_path, 0, rec("aaa", timestamp="2026-01-01T00:00:00+00:00"))
    newest = put(tmp_path, 1, rec("aaa", timestamp="2026-01-03T00:00:00+00:00"))
    put(tmp_path, "0/displaced/aaa.2", rec("aaa", timestamp="2026-01-02T00:00:00+00:00"))
    assert store.gather(tmp_path)["timestamp"].tolist() == ["2026-01-03T00:00:00+00:00"]
    assert store.main([str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "2 older ok record(s) of 1 configuration(s) kept beside the one shown" in err
    assert str(newest) not in err
