"""Hybrid stacks (`ModelConfig.layers`): layers of different variants in one model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from variants import ModelConfig, TransformerLM, attention_spec, block_names
from variants.attention.full import FullAttention
from variants.blocks import build_stack, wire
from variants.layers import pre_norm_sublayers

# deltanet's chunks and the window small enough to matter within 17 tokens.
DELTANET = {"name": "deltanet", "chunk_size": 4}
WINDOW = {"name": "sliding_window", "window": 4}


def _config(**fields) -> ModelConfig:
    sizes = {"vocab_size": 11, "d_model": 16, "n_heads": 2, "depth": 4, "max_seq_len": 32}
    return ModelConfig(**{**sizes, **fields})


def _model(**fields) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(_config(**fields)).double().eval()


def _tokens(batch=2, length=13, seed=1):
    return torch.randint(0, 11, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("block", block_names())
def test_a_hybrid_equals_the_same_layers_built_by_hand(block):
    layers = [DELTANET, "linear", DELTANET, "full"]
    hybrid = _model(block=block, layers=layers)
    assert [k.name for k in hybrid.kernels()] == ["deltanet", "linear", "deltanet", "full"]
    # By hand: a plain stack whose blocks are replaced by blocks of the listed kernels.
    config = _config(block=block)
    hand = TransformerLM(config).double().eval()
    kernels = [
        config.kernel(attention_spec("deltanet"), {"chunk_size": 4}),
        config.kernel(attention_spec("linear"), {}),
        config.kernel(attention_spec("deltanet"), {"chunk_size": 4}),
        config.kernel(attention_spec("full"), {}),
    ]
    blocks = [wire(block, *pre_norm_sublayers(config, kernel)) for kernel in kernels]
    hand.blocks = build_stack(block, blocks).double()
    hand.load_state_dict(hybrid.state_dict())  # the same parameters, by name and shape
    tokens = _tokens()
    torch.testing.assert_close(hybrid(tokens), hand(tokens), rtol=0, atol=0)


def test_the_unit_of_the_jobs_attention_alone_is_the_plain_stack():
    tokens = _tokens()
    plain = _model(attention="deltanet", attention_options={"chunk_size": 4})
    unit = _model(attention="deltanet", attention_options={"chunk_size": 4}, layers=["deltanet"])
    assert not plain.config.hybrid and unit.config.hybrid
    torch.testing.assert_close(plain(tokens), unit(tokens), rtol=0, atol=0)


def test_the_jobs_attention_options_apply_to_its_layers_only():
    config = _config(
        attention="sliding_window",
        attention_options={"window": 3},
        layers=["sliding_window", "full", {"name": "sliding_window", "window": 5}, "full"],
    )
    kernels = [config.layer_kernel(i) for i in range(4)]
    assert [k.name for k in kernels] == ["sliding_window", "full", "sliding_window", "full"]
    assert kernels[0].window == 3 and kernels[2].window == 5
    assert config.own_layers() == (0,)
    assert config.layer_groups() == (0, 1, 2, 1)
    # The config keeps plain values, so that it compares and prints as given.
    assert config.layers == (
        "sliding_window",
        "full",
        {"name": "sliding_window", "window": 5},
        "full",
    )


def test_gated_layers_project_their_own_gates():
    model = _model(layers=[DELTANET, "full"])
    attention = [m.fn for m in model.modules() if type(m).__name__ == "PreNorm"][::2]
    assert [a.gates is None for a in attention] == [False, True, False, True]


def test_kernels_are_tied_within_their_entry(monkeypatch):
    calls = []
    monkeypatch.setattr(FullAttention, "tie_to", lambda self, first: calls.append((self, first)))
    model = _model(layers=["full", "linear"])
    first, _, third, _ = model.kernels()
    assert calls == [(third, first)]


@pytest.mark.parametrize(("n_kv_heads", "positions"), [(None, "sinusoidal"), (1, "rotary")])
def test_generation_through_each_layers_cache_equals_the_forward(n_kv_heads, positions):
    model = _model(
        layers=[DELTANET, WINDOW, "linear", "full"], n_kv_heads=n_kv_heads, positions=positions
    )
    prompt = _tokens(length=5)
    got = model.generate(prompt, 10)
    tokens = prompt
    for _ in range(10):
        following = model(tokens)[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, following], dim=1)
    assert torch.equal(got, tokens)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"layers": ["deltanet", "no_such_variant"]}, "option 'layers' entry 1: unknown"),
        ({"layers": ["deltanet", "full", "full"]}, "'depth'=4 must be a multiple .* 'layers'"),
        ({"layers": []}, "option 'layers' must be null or a non-empty list"),
        ({"layers": "full"}, "option 'layers' must be null or a non-empty list"),
        ({"layers": [{"window": 4}]}, "option 'layers' entry 0 must be a variant name"),
        ({"layers": [{"name": "full", "windw": 4}]}, "option 'layers' entry 0: .*'windw'"),
        ({"layers": ["full"], "family": "hf_llama", "positions": "rotary"}, "option 'layers'"),
    ],
)
def test_bad_layers_are_one_value_error_naming_the_option(fields, words):
    with pytest.raises(ValueError, match=words):
        _config(**fields)


def test_a_replaced_config_keeps_its_layers():
    config = _config(layers=["linear", "full"])
    deeper = dataclasses.replace(config, depth=6)
    assert deeper.layers == ("linear", "full") and deeper.own_layers() == (1, 3, 5)
