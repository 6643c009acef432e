"""The resolvers the configs use (experiments/app/resolvers.py): `tuned_lr` reads a table."""

from __future__ import annotations

import pytest

from experiments.app import resolvers


@pytest.fixture
def tables(tmp_path, monkeypatch):
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "demo.yaml").write_text("# from a grid\nfull: 0.001\nlsh: 1.0e-2\n")
    monkeypatch.setattr(resolvers, "config_dir", lambda: tmp_path)
    return tmp_path


def test_tuned_lr_is_the_tables_rate(tables):
    assert resolvers.tuned_lr("demo", "full") == 1e-3
    assert resolvers.tuned_lr("demo", "lsh") == 1e-2


def test_a_variant_the_table_lacks_is_an_error_naming_both(tables):
    with pytest.raises(ValueError, match="demo.yaml has no learning rate for attention 'linear'"):
        resolvers.tuned_lr("demo", "linear")
    with pytest.raises(ValueError, match="no table 'other'"):
        resolvers.tuned_lr("other", "full")


def test_the_checkouts_configs_are_found():
    assert (resolvers.config_dir() / "config.yaml").is_file()
