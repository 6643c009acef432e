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
        ("linformer", "causal LM needs causal=True"),
    ],
)
def test_unsupported_variants_say_why_when_registered(name, reason):
    """At register, before any model is built: by name, one line; by default, left out."""
    with pytest.raises(UnsupportedCombination, match=reason):
        hf.register([name])
    assert f"attnbench_{name}" not in hf.register()


def test_register_names_unknown_variants_and_options():
    with pytest.raises(ValueError, match="unknown attention variant 'nope'; available: full"):
        hf.register(["nope"])
    with pytest.raises(ValueError, match="no option 'size'; its options are: block_size"):
        hf.register(["blockwise"], options={"blockwise": {"size": 4}})


def test_a_bad_option_value_is_refused_at_register_leaving_nothing_registered(monkeypatch):
    """A bad option's value is a `ValueError` when registered (the kernel built once), not at
    the first forward, and the refused call changes nothing: a name it would have added stays
    unregistered, a name registered before keeps its options, later models run."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    monkeypatch.setattr(hf, "_OPTIONS", {n: o for n, o in hf._OPTIONS.items() if n != "linear"})
    for interface in (AttentionInterface, AttentionMaskInterface):
        mapping = dict(interface._global_mapping)
        mapping.pop("attnbench_linear", None)
        monkeypatch.setattr(interface, "_global_mapping", mapping)
    before = dict(hf._OPTIONS)
    with pytest.raises(ValueError, match="full: option 'impl' must be one of sdpa"):
        hf.register(["linear", "full"], {"full": {"impl": "bogus"}})
    assert hf._OPTIONS == before
    for interface in (AttentionInterface, AttentionMaskInterface):
        assert "attnbench_linear" not in interface._global_mapping
    with torch.no_grad():
        assert _llama("attnbench_full")(torch.zeros(1, 4, dtype=torch.long)).logits.isfinite().all()


def test_another_softmax_scale_is_the_kernels_or_refused():
    """A model's own softmax scale reaches a variant that takes one (as SDPA's `scale`); a
    variant without one (linear attention) refuses it by name."""
    tokens, _ = _padded_batch("left")
    models = [_llama(name) for name in ("sdpa", "attnbench_full", "attnbench_linear")]
    for model in models:
        for layer in model.model.layers:
            layer.self_attn.scaling = 0.5
    with torch.no_grad():
        torch.testing.assert_close(models[1](tokens).logits, models[0](tokens).logits)
    with pytest.raises(UnsupportedCombination, match="option 'scaling'=0.5"):
        models[2](tokens)


def _llama_config(attention: str, **fields):
    from variants.model_config import ModelConfig

    options = dict(
        vocab_size=100, d_model=64, n_heads=4, n_kv_heads=2, depth=2, ff_mult=2, max_seq_len=64,
        attention=attention, family="hf_llama", positions="rotary",
    )  # fmt: skip
    return ModelConfig(**{**options, **fields})


def test_build_lm_gives_the_llama_of_the_config_on_the_variant():
    """`model.family=hf_llama`: the same Llama as transformers builds from the mapped config,
    with the variant as its attention; full on it gives SDPA's logits for the same weights."""
    import variants

    model = variants.build_lm(_llama_config("full", projection_bias=False)).eval()
    assert isinstance(model, hf.LlamaLM)
    llama = model.lm.config
    assert (llama.hidden_size, llama.num_hidden_layers, llama.intermediate_size) == (64, 2, 128)
    assert (llama.num_attention_heads, llama.num_key_value_heads) == (4, 2)
    assert llama._attn_implementation == "attnbench_full"
    reference = _llama("sdpa")
    reference.load_state_dict(model.lm.state_dict())
    tokens, _ = _padded_batch("left")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens).logits, rtol=0, atol=1e-5)
    kernels = list(model.kernels())
    assert len(kernels) == 2 and kernels[0] is kernels[1]  # one kernel serves every layer


def test_a_llama_on_a_state_variant_trains():
    import variants

    model = variants.build_lm(_llama_config("linear"))
    tokens, _ = _padded_batch("left")
    logits = model(tokens)
    assert logits.shape == (3, 10, 100)
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_llama_refuses_what_hf_cannot_run_before_training():
    import variants

    with pytest.raises(UnsupportedCombination, match="shared QK"):
        variants.build_lm(_llama_config("lsh"))
    with pytest.raises(UnsupportedCombination, match="has parameters"):
        variants.build_lm(_llama_config("compressed"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("positions", "sinusoidal"), ("block", "reversible"), ("token_shift", True),
     ("dropout", 0.1), ("causal", False)],
)  # fmt: skip
def test_a_llama_config_names_the_field_it_cannot_vary(field, value):
    with pytest.raises(ValueError, match=f"option '{field}'=.* with 'family'='hf_llama'"):
        _llama_config("full", **{field: value})


def test_transformer_lm_refuses_another_family():
    import variants

    with pytest.raises(ValueError, match="option 'family'='hf_llama' is not this model's"):
        variants.TransformerLM(_llama_config("full"))


@pytest.mark.parametrize("name", ["full", "linear", "blockwise", "sliding_window", "moba"])
def test_generation_on_the_kernels_own_cache_equals_the_uncached_forward(name):
    """KernelCache: each layer keeps its kernel's decoding cache (no K/V of HF's); greedy
    tokens are the uncached model's and its logits equal within float32 rounding."""
    model = _llama(f"attnbench_{name}")
    tokens = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    settings = {"max_new_tokens": 6, "do_sample": False, "output_logits": True}
    settings |= {"return_dict_in_generate": True, "attention_mask": torch.ones_like(tokens)}
    with torch.no_grad():
        cached = model.generate(tokens, cache=hf.KernelCache(max_len=32), **settings)
        plain = model.generate(tokens, use_cache=False, **settings)
    assert torch.equal(cached.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(plain.logits))


def _left_padded_prompts(lengths=(5, 9, 12)):
    """Rows of `lengths` tokens, left-padded with 0 to the longest: the rows, the batch (B, T)
    and its attention mask (B, T) of 0/1, as a tokenizer gives them for generation."""
    generator = torch.Generator().manual_seed(5)
    rows = [torch.randint(1, 100, (n,), generator=generator) for n in lengths]
    width = max(lengths)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, width - len(row) :], mask[i, width - len(row) :] = row, 1
    return rows, tokens, mask


@pytest.mark.parametrize("name", ["full", "sliding_window", "strided", "linear", "performer"])
def test_kernel_cache_generates_a_left_padded_batch_as_each_prompt_alone(name):
    """HF's `generate(input_ids, attention_mask=...)` on KernelCache: prompts of 5, 9 and 12
    tokens left-padded in one batch give each prompt's greedy tokens alone and its logits
    within float32 rounding (HF counts a row's rotary positions from its first real token)."""
    model = _llama(f"attnbench_{name}")
    rows, tokens, mask = _left_padded_prompts()
    settings = {"max_new_tokens": 6, "do_sample": False, "output_logits": True}
    settings |= {"return_dict_in_generate": True, "pad_token_id": 0}
    with torch.no_grad():
        batched = model.generate(
            tokens, attention_mask=mask, cache=hf.KernelCache(max_len=32), **settings
        )
        for i, row in enumerate(rows):
            alone = model.generate(
                row[None], attention_mask=torch.ones(1, len(row), dtype=torch.long),
                cache=hf.KernelCache(max_len=32), **settings,
            )  # fmt: skip
            generated = batched.sequences[i, tokens.shape[1] :]
            assert torch.equal(generated, alone.sequences[0, len(row) :])
            got = torch.stack([step[i] for step in batched.logits])  # (steps, vocab)
            torch.testing.assert_close(got, torch.stack(alone.logits)[:, 0])


def test_kernel_cache_refuses_a_padded_batch_its_kernel_cannot_take_in_one_line():
    """blockwise's blocks are absolute positions: a left-padded batch is refused (by the
    attention function, before any cache); `max_len` is checked when the cache is built."""
    model = _llama("attnbench_blockwise")
    _, tokens, mask = _left_padded_prompts()
    with pytest.raises(UnsupportedCombination, match="'blockwise' does not take left-padded") as e:
        model.generate(tokens, attention_mask=mask, cache=hf.KernelCache(max_len=32),
                       max_new_tokens=2, do_sample=False, pad_token_id=0)  # fmt: skip
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="option 'max_len' must be a positive int"):
        hf.KernelCache(max_len=0)


@pytest.mark.parametrize("name", ["full", "linear", "strided", "blockwise", "moba"])
def test_a_left_padded_row_equals_the_row_alone_or_the_batch_is_refused(name):
    """Batched prompts: where the kernel is shift-invariant a left-padded row's logits are the
    row's alone; where its pattern is absolute (blocks), the padded batch is refused."""
    model = _llama(f"attnbench_{name}")
    tokens, mask = _padded_batch("left")
    kernel = hf.kernel_for(name, 4, 16, causal=True)
    with torch.no_grad():
        if not kernel.shift_invariant:
            with pytest.raises(UnsupportedCombination, match="left-padded batches"):
                model(tokens, attention_mask=mask)
            return
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate gives a padded batch
        batched = model(tokens, attention_mask=mask, position_ids=positions).logits
        alone = model(tokens[2:, 6:]).logits
    torch.testing.assert_close(batched[2, 6:], alone[0], rtol=0, atol=1e-5)
