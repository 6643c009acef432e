"""The block registry: names, building, stacking, and the Hydra configs that mirror it."""

from pathlib import Path

import pytest
import torch
import yaml

from variants import block_names, build_block
from variants.blocks import build_stack

CONF = Path(__file__).resolve().parents[3] / "conf" / "block"


def test_block_names():
    assert block_names() == ["residual", "reversible", "checkpoint"]


@pytest.mark.parametrize("name", ["residual", "reversible", "checkpoint"])
def test_every_block_has_a_config_naming_it(name):
    assert yaml.safe_load((CONF / f"{name}.yaml").read_text()) == {"name": name}


@pytest.mark.parametrize("name", ["residual", "reversible", "checkpoint"])
def test_stack_keeps_the_shape(name):
    blocks = [build_block(name, 16, 2) for _ in range(2)]
    x = torch.randn(2, 7, 16)
    assert build_stack(name, blocks)(x).shape == (2, 7, 16)


def test_unknown_block_lists_the_available_ones():
    with pytest.raises(ValueError, match="'nope'.*residual, reversible, checkpoint"):
        build_block("nope", 16, 2)


def test_stack_refuses_empty_and_mixed_lists():
    with pytest.raises(ValueError, match="at least one block"):
        build_stack("residual", [])
    with pytest.raises(ValueError, match="ReversibleBlock"):
        build_stack("reversible", [build_block("residual", 16, 2)])


def test_block_options_reach_the_sublayers():
    block = build_block("residual", 16, 4, ff_mult=2, ff_chunks=3, causal=False, dropout=0.25)
    assert block.attn.fn.kernel.causal is False
    assert block.ff.fn.ff_chunks == 3
    assert block.ff.fn.net[0].out_features == 32
    assert block.attn.fn.dropout.p == 0.25
