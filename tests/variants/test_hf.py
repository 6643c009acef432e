"""Hugging Face models on attnbench variants (variants/hf.py): a tiny randomly initialised Llama
(nothing downloaded) against its own SDPA path, with padding, grouped KV heads and generate."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from variants import hf  # noqa: E402  (after the skip: it imports transformers)
from variants.checks import UnsupportedCombination  # noqa: E402

hf.register(options={"blockwise": {"block_size": 4}})


def _llama(attn_implementation: str, **fields):
    """A 2-layer Llama, hidden 64, 4 query heads over 2 KV heads, vocab 100, seeded weights."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn_implementation,
        **fields,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _padded_batch(side: str):
    """Tokens (3, 10) and their attention mask, rows padded by 0, 3 and 6 on `side`."""
    tokens = torch.randint(1, 100, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 10, dtype=torch.long)
    for row, pad in enumerate((0, 3, 6)):
        at = slice(0, pad) if side == "left" else slice(10 - pad, 10)
        mask[row, at] = 0
        tokens[row, at] = 0
    return tokens, mask


def test_full_matches_sdpa_without_padding():
    tokens, _ = _padded_batch("left")
    with torch.no_grad():
        expected = _llama("sdpa")(tokens).logits
        got = _llama("attnbench_full")(tokens).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_causal_masking_reaches_the_kernel():
    """The mask interface is registered too: a later token never changes an earlier logit
    (registering the attention function alone would run the kernel bidirectional)."""
    model = _llama("attnbench_full")
    tokens, _ = _padded_batch("left")
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 100
    with torch.no_grad():
        before, after = model(tokens).logits, model(changed).logits
    torch.testing.assert_close(before[:, :-1], after[:, :-1], rtol=0, atol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_full_matches_sdpa_on_a_padded_batch(side):
    tokens, mask = _padded_batch(side)
    with torch.no_grad():
        expected = _llama("sdpa")(tokens, attention_mask=mask).logits
        got = _llama("attnbench_full")(tokens, attention_mask=mask).logits
    real = mask.bool()  # padded positions' outputs are the kernel's convention, not HF's
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)


def test_an_efficient_variant_trains_and_generates():
    model = _llama("attnbench_blockwise").train()
    tokens, mask = _padded_batch("left")
    loss = model(tokens[:1], labels=tokens[:1]).loss
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert torch.isfinite(loss) and all(g is not None and torch.isfinite(g).all() for g in grads)
    model.eval()
    prompt = tokens[:1, :6]
    with torch.no_grad():
        cached = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
        uncached = model.generate(
            prompt, max_new_tokens=4, do_sample=False, pad_token_id=0, use_cache=False
        )
    # HF's KV cache hands the kernel the new query over every cached key: the same tokens as
    # re-running the whole prefix each step.
    assert cached.shape == (1, 10) and torch.equal(cached, uncached)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("nsa", "gates per token"),
        ("deltanet", "gates per token"),
        ("lsh", "shared QK"),
        ("compressed", "has parameters"),
    ],
)
def test_unsupported_variants_say_why(name, reason):
    hf.register([name])
    model = _llama(f"attnbench_{name}")
    with pytest.raises(UnsupportedCombination, match=reason):
        model(torch.zeros(1, 4, dtype=torch.long))


def test_register_names_unknown_variants_and_options():
    with pytest.raises(ValueError, match="unknown attention variant 'nope'; available: full"):
        hf.register(["nope"])
    with pytest.raises(ValueError, match="no option 'size'; its options are: block_size"):
        hf.register(["blockwise"], options={"blockwise": {"size": 4}})


def test_another_softmax_scale_is_refused():
    model = _llama("attnbench_full")
    for layer in model.model.layers:
        layer.self_attn.scaling = 0.5
    with pytest.raises(UnsupportedCombination, match="option 'scaling'=0.5"):
        model(torch.zeros(1, 4, dtype=torch.long))
