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


def _model(attention, attention_options=None, **options):
    torch.manual_seed(0)
    config = {"vocab_size": 11, "d_model": 16, "n_heads": 2, "depth": 2, "max_seq_len": 32}
    if attention_options is None:
        attention_options = OPTIONS.get(attention, {})
    model = TransformerLM(
        **config, attention=attention, attention_options=attention_options, **options
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


# --- left-padded batches: each row generates what it generates alone ------------------------
LENGTHS = (5, 9, 12)
PADDED = {  # case: (attention, the model's other fields)
    "full": ("full", {}),
    "full, rotary": ("full", {"positions": "rotary"}),
    "full, token shift, grouped KV heads": ("full", {"token_shift": True, "n_kv_heads": 1}),
    "sliding_window": ("sliding_window", {"attention_options": {"window": 4}}),
    "sliding_window, rotary, learned sink": ("sliding_window", {
        "positions": "rotary", "attention_options": {"window": 4, "learned_sink": True},
    }),
    "strided": ("strided", {}),
    "linear": ("linear", {}),
    "linear, rotary": ("linear", {"positions": "rotary"}),
    "performer": ("performer", {}),
    "deltanet, short conv": ("deltanet", {"attention_options": {"chunk_size": 4, "short_conv": 3}}),
    "gated_deltanet, rotary": ("gated_deltanet", {"positions": "rotary"}),
    "mamba2": ("mamba2", {}),
    "hybrid gated_deltanet : full": ("full", {"layers": ["gated_deltanet", "full"]}),
}  # fmt: skip


def _left_padded(lengths=LENGTHS, vocab=11):
    """Rows of `lengths` random tokens in 1..vocab - 1, left-padded with 0 to the longest:
    the rows, the prompt (B, T) and its mask (B, T), True = a real token."""
    generator = torch.Generator().manual_seed(4)
    rows = [torch.randint(1, vocab, (n,), generator=generator) for n in lengths]
    width = max(lengths)
    prompt = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        prompt[i, width - len(row) :], mask[i, width - len(row) :] = row, True
    return rows, prompt, mask


def _stepped_logits(model, prompt, mask, steps):
    """Greedy decoding through the caches: the logits of the prompt's positions and of each
    new token's, (B, T + steps, vocab_size)."""
    from variants.generation import Positions, cached_kernels

    with torch.no_grad(), cached_kernels(model, prompt.shape[0], prompt.shape[1] + steps, mask):
        positions = Positions(model, mask)
        logits = [positions.step(prompt)]
        for _ in range(steps):
            logits.append(positions.step(logits[-1][:, -1].argmax(-1, keepdim=True)))
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("case", list(PADDED))
def test_a_left_padded_row_generates_what_it_generates_alone(case):
    """Prompts of 5, 9 and 12 tokens in one left-padded batch: each row's greedy tokens are
    the row's alone, and its logits at every real position (prompt and generated) those of
    the uncached forward over the row's tokens alone (fp64)."""
    attention, fields = PADDED[case]
    model = _model(attention, **fields)
    rows, prompt, mask = _left_padded()
    steps, width = 8, prompt.shape[1]
    batched = model.generate(prompt, steps, attention_mask=mask)
    logits = _stepped_logits(model, prompt, mask, steps)
    for i, row in enumerate(rows):
        pads = width - len(row)
        alone = model.generate(row[None], steps)  # (1, len + steps)
        assert torch.equal(batched[i, pads:], alone[0]), f"row {i}"
        with torch.no_grad():
            torch.testing.assert_close(logits[i, pads:], model(alone)[0])


def test_an_unpadded_mask_changes_nothing():
    model = _model("blockwise")  # it refuses padding, not a mask without pads
    prompt = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 5, dtype=torch.long)
    assert torch.equal(model.generate(prompt, 6, attention_mask=mask), model.generate(prompt, 6))


@pytest.mark.parametrize(
    ("attention", "options", "why"),
    [
        ("blockwise", {}, "absolute in position"),
        ("sliding_window", {"sink_tokens": 2}, "absolute in position"),
        ("routing", {}, "absolute in position"),
    ],
)
def test_a_kernel_whose_pattern_padding_moves_refuses_a_padded_batch(attention, options, why):
    model = _model(attention, attention_options=OPTIONS.get(attention, {}) | options)
    _, prompt, mask = _left_padded()
    with pytest.raises(ValueError, match=f"'{attention}' does not prefill a left-padded option "
                       f"'attention_mask': its pattern is {why}") as error:  # fmt: skip
        model.generate(prompt, 3, attention_mask=mask)
    assert "\n" not in str(error.value)
    assert [k.name for k in model.kernels()] == [attention] * 2  # kernels restored


def test_a_mask_that_is_not_left_padding_is_refused_in_one_line():
    model = _model("full")
    _, prompt, mask = _left_padded()
    with pytest.raises(ValueError, match="option 'attention_mask' must be left padding"):
        model.generate(prompt, 3, attention_mask=mask.flip(1))  # right padding
    empty = mask.clone()
    empty[0] = False
    with pytest.raises(ValueError, match="option 'attention_mask' must be left padding"):
        model.generate(prompt, 3, attention_mask=empty)  # a row of no token
    for bad in (mask[:, 1:], mask.double()):
        with pytest.raises(ValueError, match="option 'attention_mask' must be a bool .* shape"):
            model.generate(prompt, 3, attention_mask=bad)


@pytest.mark.parametrize("attention", ["full", "linear"])
def test_multihead_attention_prefills_a_left_padded_batch_as_each_row_alone(attention):
    """The layer's own prefill takes the mask: rotary positions count from a row's first
    real token, and decoding after it equals the row's forward alone."""
    torch.manual_seed(0)
    mha = variants.MultiheadAttention(16, 2, attention=attention, positions="rotary").double()
    mha.eval()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, :4] = False  # row 0's prompt: 2 real tokens behind 4 pads
    cache = mha.init_cache(2, max_len=10)
    with torch.no_grad():
        steps = [mha.prefill(x[:, :6], cache, attention_mask=mask)]
        steps += [mha.decode(x[:, t : t + 1], cache) for t in range(6, 10)]
        stepped = torch.cat(steps, dim=1)  # (2, 10, 16)
        torch.testing.assert_close(stepped[0, 4:], mha(x[:1, 4:])[0])
        torch.testing.assert_close(stepped[1], mha(x[1:])[0])
        bias = mha.out.bias.expand(4, -1)  # padded positions: the kernel's zeros, projected
        torch.testing.assert_close(stepped[0, :4], bias, rtol=0, atol=0)
