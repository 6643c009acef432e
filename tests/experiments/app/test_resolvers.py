"""The resolvers the configs use (experiments/app/resolvers.py): `tuned_lr` reads a table."""

from __future__ import annotations

import logging

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from experiments.app import resolvers
from tests.experiments.conftest import CONF


@pytest.fixture
def resolved_config_tree():
    """compose(*overrides) -> the DictConfig a job gets, unresolved (as `experiments.run`)."""
    resolvers.register()

    def build(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    return build


@pytest.fixture
def tables(tmp_path, monkeypatch):
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "demo.yaml").write_text("# from a grid\nfull: 0.001\nlsh: 1.0e-2\n")
    monkeypatch.setattr(resolvers, "config_dir", lambda: tmp_path)
    return tmp_path


def test_tuned_lr_is_the_tables_rate(tables):
    assert resolvers.tuned_lr("demo", "full") == 1e-3
    assert resolvers.tuned_lr("demo", "lsh") == 1e-2


def test_a_missing_table_is_an_error_naming_it(tables):
    with pytest.raises(ValueError, match="no table 'other'"):
        resolvers.tuned_lr("other", "full")


def test_the_checkouts_configs_are_found():
    assert (resolvers.config_dir() / "config.yaml").is_file()


# --- An untuned variant trains at the default rate, and its record says so ---------------------


def test_a_variant_the_table_lacks_or_holds_null_trains_untuned_at_the_default(
    tables, caplog, monkeypatch
):
    """A missing entry arrived inside a Hydra traceback and its job left no record."""
    (tables / "tuned" / "demo.yaml").write_text("full: 0.001\nlinear: null\n")
    (tables / "config.yaml").write_text("train:\n  lr: 2.0e-3\n")
    default = resolvers.default_lr()
    assert default == 2e-3  # the base config's train.lr
    with caplog.at_level(logging.WARNING, logger="attnbench"):
        assert resolvers.tuned_lr("demo", "lsh") == default
        assert resolvers.tuned_lr("demo", "linear", 3e-3) == 3e-3  # the preset's fallback
    assert "demo.yaml has no usable rate for attention 'lsh'" in caplog.text
    assert resolvers.lr_source("demo", "full") == "tuned"
    assert resolvers.lr_source("demo", "lsh") == resolvers.lr_source("demo", "linear") == "untuned"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("full: 0.001\nlnear: 0.003\n", "'lnear' is not an attention variant"),
        ("full: 0.001\nlinear: fast\n", "'linear': 'fast' is not a positive learning rate"),
        ("full: -1\n", "'full': -1 is not a positive learning rate"),
        ("- full\n", "not a mapping"),
    ],
)
def test_a_damaged_table_is_one_line_naming_the_file_and_the_entry(tables, text, words):
    (tables / "tuned" / "demo.yaml").write_text(text)
    with pytest.raises(resolvers.TunedTableError) as raised:
        resolvers.tuned_lr("demo", "full")
    message = str(raised.value)
    assert "\n" not in message and "demo.yaml" in message and words in message, message


def test_lr_source_of_a_composed_config(resolved_config_tree):
    assert resolvers.lr_source_of(resolved_config_tree("+experiment=long_range_quick")) == "tuned"
    assert resolvers.lr_source_of(resolved_config_tree()) is None  # train.lr as configured
    given = resolved_config_tree("+experiment=long_range_quick", "train.lr=0.01")
    assert resolvers.lr_source_of(given) is None  # a rate given on the command line


def test_the_default_rate_is_the_base_configs_train_lr():
    assert resolvers.default_lr() == 1e-3
