"""A job's record: its configuration hash, columns and atomic write."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from experiments.records import record
from tests.conftest import output_of_another_process


def reversed_order(tree):
    """The same mapping with every level's keys in reverse insertion order."""
    if isinstance(tree, dict):
        return {k: reversed_order(tree[k]) for k in reversed(list(tree))}
    return tree


def test_flatten_joins_keys_with_dots_and_lists_become_json():
    flat = record.flatten({"a": {"b": 1, "c": {"d": None}}, "e": [1, "x"], "f": "g"})
    assert flat == {"a.b": 1, "a.c.d": None, "e": '[1, "x"]', "f": "g"}


def test_config_hash_is_stable_and_ignores_key_order(resolved_config):
    config = resolved_config("attention=lsh", "seq_len=256")
    digest = record.config_hash(config)
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert record.config_hash(resolved_config("attention=lsh", "seq_len=256")) == digest
    assert record.config_hash(reversed_order(config)) == digest


def test_config_hash_is_the_same_in_another_process(resolved_config):
    config = resolved_config("attention=blockwise", "seq_len=512")
    script = (
        "import json, sys; from experiments.records.record import config_hash; "
        "print(config_hash(json.load(sys.stdin)))"
    )
    there = output_of_another_process(script, hash_seed="12345", stdin=json.dumps(config))
    assert there == record.config_hash(config)


@pytest.mark.parametrize(
    "overrides",
    [
        ["logger=none"],
        ["logger.mode=online", "logger.project=elsewhere"],
        ["sweep=another-sweep"],
        ["resume=false"],
        ["train.progress=true"],
    ],
    ids=lambda o: " ".join(o),
)
def test_config_hash_ignores_bookkeeping_keys(resolved_config, overrides):
    assert record.config_hash(resolved_config(*overrides)) == record.config_hash(resolved_config())


@pytest.mark.parametrize(
    "overrides",
    [
        ["seq_len=2048"],
        ["attention=blockwise"],
        ["attention=lsh", "attention.n_hashes=8"],
        ["model.causal=false"],
        ["block=reversible"],
        ["train.steps=7"],
        ["seed=1"],
    ],
    ids=lambda o: " ".join(o),
)
def test_config_hash_changes_with_what_is_measured(resolved_config, overrides):
    assert record.config_hash(resolved_config(*overrides)) != record.config_hash(resolved_config())


def test_keys_added_later_keep_older_hashes_at_their_neutral_default(resolved_config):
    """A record made before train.stop_accuracy, train.patience and task.query_format existed
    has the hash the same configuration has now at their defaults; set, they change it."""
    config = resolved_config("task=recall")
    older = {
        **config,
        "train": {
            k: v for k, v in config["train"].items() if k not in ("stop_accuracy", "patience")
        },
        "task": {k: v for k, v in config["task"].items() if k != "query_format"},
    }
    assert config["train"]["stop_accuracy"] is None and config["task"]["query_format"] == "repeated"
    assert record.config_hash(older) == record.config_hash(config)
    for overrides in (["train.stop_accuracy=0.99"], ["task.query_format=zoology"]):
        changed = resolved_config("task=recall", *overrides)
        assert record.config_hash(changed) != record.config_hash(config)


def test_config_columns_have_short_aliases_and_every_option(resolved_config):
    config = resolved_config(
        "attention=blockwise",
        "attention.block_size=32",
        "seq_len=128",
        "model.depth=3",
        "block=checkpoint",
    )
    columns = record.config_columns(config)
    assert {
        k: columns[k]
        for k in (
            "attention",
            "block",
            "task",
            "seq_len",
            "depth",
            "d_model",
            "n_heads",
            "causal",
            "batch_size",
            "dtype",
            "seed",
        )
    } == {
        "attention": "blockwise",
        "block": "checkpoint",
        "task": "random_lm",
        "seq_len": 128,
        "depth": 3,
        "d_model": config["model"]["d_model"],
        "n_heads": config["model"]["n_heads"],
        "causal": True,
        "batch_size": 1,
        "dtype": "float32",
        "seed": 0,
    }
    assert columns["attention.block_size"] == 32 and columns["model.depth"] == 3
    assert columns["budget.max_seconds"] == config["budget"]["max_seconds"]
    assert not [k for k in columns if k.startswith(("logger", "hydra"))]
    assert all(not isinstance(v, (dict, list)) for v in columns.values())


def test_write_json_atomic_writes_sorted_json_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "job" / "result.json"
    record.write_json_atomic(path, {"b": 1, "a": Path("/x"), "c": float("inf")})
    # Infinity and NaN are not JSON: recorded as null, so any JSON reader can load a record.
    assert json.loads(path.read_text()) == {"a": "/x", "b": 1, "c": None}
    record.write_json_atomic(path, {"status": "ok", "z": None, "a": 2})  # replaces the first
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]
    assert json.loads(path.read_text()) == {"a": 2, "status": "ok", "z": None}
    assert list(json.loads(path.read_text())) == ["a", "status", "z"]


def test_write_json_atomic_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "result.json"
    record.write_json_atomic(path, {"status": "ok"})
    with pytest.raises(TypeError):
        record.write_json_atomic(path, {1: "int key", "a": "str key"})  # unsortable keys
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
    assert json.loads(path.read_text()) == {"status": "ok"}


def test_record_file_mode_follows_the_umask(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    record.write_json_atomic(tmp_path / "result.json", {})
    assert stat.S_IMODE((tmp_path / "result.json").stat().st_mode) == stat.S_IMODE(
        plain.stat().st_mode
    )


def test_the_schema_names_each_column_once_with_a_type_and_its_unit_in_the_name():
    assert len(record.COLUMNS) == len(record.SCHEMA)
    for column in record.SCHEMA:
        assert column.type in (int, float, bool, str), column.name
        assert column.part in (record.IDENTITY, record.CONFIG, record.MEASURED, record.PROVENANCE)
        for unit, suffix in (("ms", "_ms"), ("bytes", "_bytes"), ("GFLOP/s", "_per_s")):
            if column.unit == unit:
                assert column.name.endswith(suffix), column.name
    assert record.column("eval_accuracy@lsh-8") is record.COLUMNS["eval_accuracy"]
    assert record.column("attention.n_hashes") is None  # a config key, typed by its values
    assert set(record.SHOWN) | set(record.SCALING_METRICS) <= {
        c.name for c in record.SCHEMA if c.numeric
    }
    assert record.ALIASES["attention"] == "attention.name" and "device" in record.RESOLVED


def test_every_config_alias_stands_for_a_key_of_the_resolved_config(resolved_config):
    flat = record.flatten(resolved_config())
    for alias, key in {**record.ALIASES, **record.RESOLVED}.items():
        assert key in flat or record.COLUMNS[alias].derived, alias
    assert [c.name for c in record.SCHEMA if c.derived] == ["head_dim", "lr_source"]


def test_a_stack_of_one_variant_keeps_its_hash_and_a_hybrid_names_its_stack(resolved_config):
    """model.layers and measure.decode_scope came later: at null and kernel a record has the
    hash it had before them; the record's `layers` names the stack (null: the attention)."""
    config = resolved_config("attention=deltanet")
    older = {
        **config,
        "model": {k: v for k, v in config["model"].items() if k != "layers"},
        "measure": {k: v for k, v in config["measure"].items() if k != "decode_scope"},
    }
    assert config["model"]["layers"] is None and config["measure"]["decode_scope"] == "kernel"
    assert record.config_hash(older) == record.config_hash(config)
    assert record.config_columns(config)["layers"] == "deltanet"
    hybrid = resolved_config("attention=deltanet", "model.layers=[deltanet,deltanet,deltanet,full]")
    assert record.config_hash(hybrid) != record.config_hash(config)
    columns = record.config_columns(hybrid)
    assert columns["layers"] == "3×deltanet+full" and columns["attention"] == "deltanet"
    assert columns["model.layers"] == '["deltanet", "deltanet", "deltanet", "full"]'
    assert "layers" in record.config_keys(columns) and "model.layers" not in record.config_keys(
        columns
    )
    assert record.stack_label([{"name": "sliding_window", "window": 64}, "full", "full"]) == (
        "sliding_window(window=64)+2×full"
    )


def test_linformers_probe_options_at_their_defaults_keep_its_older_hashes(resolved_config):
    """Linformer's records from before `init` and `learn_projection` are found on resume."""
    config = resolved_config("attention=linformer", "model.causal=false")
    older = {
        **config,
        "attention": {
            k: v for k, v in config["attention"].items() if k not in ("init", "learn_projection")
        },
    }
    assert record.config_hash(older) == record.config_hash(config)
    for overrides in (["attention.init=identity"], ["attention.learn_projection=false"]):
        changed = resolved_config("attention=linformer", "model.causal=false", *overrides)
        assert record.config_hash(changed) != record.config_hash(config)
