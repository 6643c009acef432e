"""TransformerLM.generate through the layers' caches against re-running the whole forward."""

from __future__ import annotations

import pytest
import torch

import variants
from variants import TransformerLM, attention_names, attention_spec, block_names

# Small blocks, strides and windows so that the patterns matter within 17 tokens. The stride is
# fixed and BigBird's random blocks have one candidate per query block at these lengths: decode
# takes length-dependent patterns at the cache's max_len, a forward over a shorter sequence at
# its own length.
OPTIONS = {
    "blockwise": {"block_size": 4},
    "strided": {"stride": 3},
    "compressed": {"factor": 3},
    "combined": {"block_size": 4},
    "longformer": {"block_size": 4},
    "bigbird": {"block_size": 4, "n_global": 4, "n_random": 1},
    "sparse_fixed": {"block_size": 8, "n_summary": 2},
    "routing": {"window": 4, "n_clusters": 3},
    "moba": {"block_size": 4, "top_k": 2},
    "nsa": {"block_size": 4, "n_select": 2, "window": 6},  # mlp compression: gates and MLP
    "deltanet": {"chunk_size": 4},
}
EXACT_DECODERS = [
    name
    for name in attention_names()
    if attention_spec(name).supports_decode and attention_spec(name).decode_matches_forward
]


def _model(attention, **options):
    torch.manual_seed(0)
    config = {"vocab_size": 11, "d_model": 16, "n_heads": 2, "depth": 2, "max_seq_len": 32}
    model = TransformerLM(
        **config, attention=attention, attention_options=OPTIONS.get(attention, {}), **options
    )
    return model.double().eval()


def _recomputed(model, prompt, steps):
    """Greedy generation by re-running the whole forward on the growing sequence."""
    tokens = prompt
    for _ in range(steps):
        following = model(tokens)[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens = torch.cat([tokens, following], dim=1)
    return tokens


def test_the_block_selection_and_delta_rule_variants_are_generated_with():
    assert {"moba", "nsa", "deltanet"} <= set(EXACT_DECODERS)


@pytest.mark.parametrize("attention", EXACT_DECODERS)
def test_greedy_generation_equals_recomputing_the_forward(attention):
    model = _model(attention)
    prompt = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    got = model.generate(prompt, 12)
    assert got.shape == (2, 17)
    assert torch.equal(got, _recomputed(model, prompt, 12))


@pytest.mark.parametrize("block", block_names())
def test_generation_through_every_block_type_and_the_token_shift(block):
    model = _model("full", block=block, token_shift=True)
    prompt = torch.randint(0, 11, (1, 3), generator=torch.Generator().manual_seed(2))
    assert torch.equal(model.generate(prompt, 8), _recomputed(model, prompt, 8))


def test_sampling_is_seeded_and_uses_the_temperature():
    model = _model("linear")
    prompt = torch.zeros(4, 2, dtype=torch.long)
    first = model.generate(prompt, 10, temperature=1.0, seed=5)
    assert torch.equal(first, model.generate(prompt, 10, temperature=1.0, seed=5))
    assert not torch.equal(first, model.generate(prompt, 10, temperature=1.0, seed=6))
    # A vanishing temperature is greedy.
    greedy = model.generate(prompt, 10)
    assert torch.equal(model.generate(prompt, 10, temperature=1e-6, seed=0), greedy)


def test_generation_refuses_what_it_cannot_do():
    model = _model("full")
    with pytest.raises(ValueError, match="exceeds option 'max_seq_len'=32"):
        model.generate(torch.zeros(1, 30, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="'temperature' must be >= 0"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 3, temperature=-1.0)
    bidirectional = _model("linformer", causal=False)
    with pytest.raises(ValueError, match="linformer: cannot decode"):
        bidirectional.generate(torch.zeros(1, 3, dtype=torch.long), 3)
    assert [k.name for k in model.kernels()] == ["full", "full"]  # kernels restored


@pytest.mark.parametrize("attention", [a for a in EXACT_DECODERS if attention_spec(a).supports_gqa])
def test_generation_with_grouped_kv_heads_equals_recomputing_the_forward(attention):
    model = _model(attention, n_kv_heads=1)  # both query heads read one key head
    prompt = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model.generate(prompt, 6), _recomputed(model, prompt, 6))


def _lm(**fields):
    torch.manual_seed(0)
    config = {"vocab_size": 50, "d_model": 32, "n_heads": 4, "depth": 2, "max_seq_len": 64}
    return variants.TransformerLM(**(config | fields)).eval()


@pytest.mark.parametrize("attention", ["full", "linear", "sliding_window"])
def test_rotary_generation_equals_recomputing_the_forward(attention):
    """The cache tracks the position offset: each decoded token is rotated at its place."""
    model = _lm(attention=attention, positions="rotary")
    prompt = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    out = model.generate(prompt, 6)
    recomputed = prompt
    with torch.no_grad():
        for _ in range(6):
            next_token = model(recomputed)[:, -1].argmax(-1, keepdim=True)
            recomputed = torch.cat([recomputed, next_token], dim=1)
    assert torch.equal(out, recomputed)


def test_multihead_attention_rotary_decoding_equals_its_forward():
    mha = variants.MultiheadAttention(32, 4, attention="full", positions="rotary").eval()
    x = torch.randn(2, 10, 32)
    cache = mha.init_cache(2, max_len=16)
    with torch.no_grad():
        steps = [mha.prefill(x[:, :4], cache)]
        steps += [mha.decode(x[:, t : t + 1], cache) for t in range(4, 10)]
        stepped = torch.cat(steps, dim=1)
        torch.testing.assert_close(stepped, mha(x))
    with pytest.raises(ValueError, match="option 'positions'"):
        variants.MultiheadAttention(32, 4, attention="full", positions="sinusoidal")


def test_generate_stops_at_eos_and_samples_within_top_k_and_top_p():
    model = _lm(attention="full")
    prompt = torch.randint(0, 50, (3, 5), generator=torch.Generator().manual_seed(2))
    greedy = model.generate(prompt, 8)
    eos = int(greedy[0, 6])  # the second token row 0 generates
    stopped = model.generate(prompt, 8, eos_token_id=eos)
    assert stopped.shape[1] <= greedy.shape[1]
    assert (stopped[0, 7:] == eos).all() and torch.equal(stopped[0, :7], greedy[0, :7])
    top1 = model.generate(prompt, 8, temperature=1.0, top_k=1, seed=0)
    assert torch.equal(top1, greedy)  # one candidate: the argmax
    nucleus = model.generate(prompt, 8, temperature=1.0, top_p=1e-6, seed=0)
    assert torch.equal(nucleus, greedy)  # the smallest nucleus holds the likeliest token alone
    for bad in ({"top_k": 0}, {"top_p": 1.5}):
        with pytest.raises(ValueError, match=f"option '{next(iter(bad))}'"):
            model.generate(prompt, 2, **bad)
