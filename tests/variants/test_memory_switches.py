"""The long-sequence memory switches, each against the unswitched model (float64): the chunked
LM loss (`model.loss_chunks`), heads in groups (`model.attention_chunks`) and the Performer's
head-by-head features."""

import pytest
import torch
import torch.nn.functional as F

from variants import TransformerLM, attention_spec
from variants.attention.performer import layer as performer

VOCAB = 13


def _pair(base=None, **switched):
    """Two float64 models with the same weights: plain, and with the `switched` options."""
    options = {"vocab_size": VOCAB, "d_model": 16, "n_heads": 4, "depth": 2} | (base or {})
    torch.manual_seed(0)
    plain = TransformerLM(**options).double()
    other = TransformerLM(**options, **switched).double()
    other.load_state_dict(plain.state_dict())
    return plain, other


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _batch(batch=2, length=23, seed=1):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch, length), generator=generator)
    targets = torch.randint(0, VOCAB, (batch, length), generator=generator)
    mask = torch.rand(batch, length, generator=generator) < 0.6
    return tokens, targets, mask


@pytest.mark.parametrize("chunks", [1, 4, 50])
def test_chunked_loss_is_plain_cross_entropy_in_loss_and_every_gradient(chunks):
    plain, chunked = _pair(loss_chunks=chunks)
    tokens, targets, mask = _batch()
    # The reference: the whole logits, cross-entropy over the masked positions.
    expected = F.cross_entropy(plain(tokens)[mask], targets[mask])
    expected.backward()
    loss = chunked.loss(tokens, targets, mask)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    reference = _grads(plain)
    for name, grad in _grads(chunked).items():
        torch.testing.assert_close(grad, reference[name], msg=name)


def test_chunked_loss_never_holds_the_whole_logits(monkeypatch):
    _, chunked = _pair(loss_chunks=5)
    tokens, targets, mask = _batch(batch=1, length=40)
    widest = []
    head = chunked.head.forward
    monkeypatch.setattr(chunked.head, "forward", lambda x: widest.append(x.shape[1]) or head(x))
    chunked.loss(tokens, targets, mask).backward()
    assert widest and max(widest) == 8  # forward and recompute, one piece at a time


def test_training_uses_the_chunked_loss_only_when_switched_on():
    from experiments.training.tasks import Batch
    from experiments.training.train import masked_loss_and_hits, training_loss

    plain, chunked = _pair(loss_chunks=3)
    tokens, targets, mask = _batch()
    batch = Batch(inputs=tokens, targets=targets, loss_mask=mask)
    calls = []
    chunked.loss = lambda *a: calls.append(a) or TransformerLM.loss(chunked, *a)
    expected = masked_loss_and_hits(plain(tokens), batch)[0]  # float32, as training computes
    torch.testing.assert_close(training_loss(chunked, batch).float(), expected)
    plain.loss = lambda *a: pytest.fail("the default step must not change")
    training_loss(plain, batch)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "attention, options, block",
    [
        ("blockwise", {"block_size": 4, "look_backward": 1}, "residual"),
        ("linear", {}, "reversible"),
        ("performer", {"seed": 0}, "residual"),
        ("full", {}, "checkpoint"),
        # Gated kernels: each group gets its own heads' gates.
        ("moba", {"block_size": 4, "top_k": 2}, "residual"),
        ("nsa", {"block_size": 4, "n_select": 2, "window": 6}, "residual"),
        ("deltanet", {"chunk_size": 4}, "checkpoint"),
        # Per-head weights (convolution, A_h and dt_bias_h, D_h, sink logits): each group
        # reads its own heads' rows.
        ("deltanet", {"chunk_size": 4, "short_conv": 4}, "residual"),
        ("gated_deltanet", {"chunk_size": 4, "short_conv": 4, "output_norm": True}, "residual"),
        ("mamba2", {"chunk_size": 4, "short_conv": 4, "d_skip": True}, "checkpoint"),
        ("sliding_window", {"window": 4, "sink_tokens": 2}, "residual"),
        ("sliding_window", {"window": 4, "learned_sink": True}, "residual"),
    ],
)
@pytest.mark.parametrize("groups", [2, 3])
def test_heads_in_groups_equal_all_heads_at_once(attention, options, block, groups):
    base = {"attention": attention, "attention_options": options, "block": block}
    plain, grouped = _pair(base, attention_chunks=groups)
    with torch.no_grad():  # per-head weights that differ by head (sinks start at zero, D at 1)
        for weight in plain.parameters():
            weight.add_(0.3 * torch.randn_like(weight))
    grouped.load_state_dict(plain.state_dict())
    tokens, targets, mask = _batch(length=16)
    expected = plain.loss(tokens, targets, mask)
    expected.backward()
    loss = grouped.loss(tokens, targets, mask)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    reference = _grads(plain)
    for name, grad in _grads(grouped).items():
        torch.testing.assert_close(grad, reference[name], msg=name)


@pytest.mark.parametrize("attention, options", [("full", {}), ("nsa", {"block_size": 4})])
def test_heads_in_groups_without_projection_biases(attention, options):
    """`attention_chunks` with `projection_bias=False`: the groups' projections take no bias
    (gates' too), and loss and gradients are the unchunked model's."""
    base = {"attention": attention, "attention_options": options, "projection_bias": False}
    plain, grouped = _pair(base, attention_chunks=2)
    tokens, targets, mask = _batch(length=16)
    expected = plain.loss(tokens, targets, mask)
    expected.backward()
    loss = grouped.loss(tokens, targets, mask)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    reference = _grads(plain)
    assert not any(name.endswith("bias") and "qkv" in name for name in reference)
    for name, grad in _grads(grouped).items():
        torch.testing.assert_close(grad, reference[name], msg=name)


def test_heads_in_groups_with_shared_qk_keys():
    base = {"attention": "blockwise", "shared_qk": True, "attention_options": {"block_size": 4}}
    plain, grouped = _pair(base, attention_chunks=4)
    tokens = _batch(length=16)[0]
    torch.testing.assert_close(grouped(tokens), plain(tokens))


def test_groups_call_the_kernel_once_per_group_and_only_if_heads_are_independent():
    assert attention_spec("blockwise").independent_heads
    assert not attention_spec("routing").independent_heads  # per-head centroids
    assert not attention_spec("lsh").independent_heads  # one bucket cache per call
    for attention, options, expected in (
        ("blockwise", {}, [2, 2]),
        ("routing", {}, [4]),
        ("nsa", {}, [2, 2]),
        ("deltanet", {}, [2, 2]),
        ("deltanet", {"short_conv": 4}, [2, 2]),  # per-head weights: the group's rows
        ("mamba2", {"short_conv": 4, "d_skip": True}, [2, 2]),
        ("sliding_window", {"learned_sink": True}, [2, 2]),
    ):
        base = {"attention": attention, "attention_options": options, "depth": 1}
        _, model = _pair(base, attention_chunks=2)
        seen = []
        kernel = next(model.kernels())
        kernel.register_forward_pre_hook(lambda _, args, seen=seen: seen.append(args[0].shape[1]))
        with torch.no_grad():
            model(_batch(length=16)[0])
        assert seen == expected


def test_performer_head_by_head_equals_all_heads(monkeypatch):
    torch.manual_seed(0)
    kernel = performer.PerformerAttention(causal=True, head_dim=8, n_features=12, seed=3)
    q, k, v = (torch.randn(2, 3, 10, 8, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    expected = kernel(q, k, v)
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    calls = []
    inner = kernel._features_attention
    monkeypatch.setattr(kernel, "_features_attention", lambda *a: calls.append(1) or inner(*a))
    monkeypatch.setattr(performer, "HEAD_BY_HEAD_BYTES", 1)
    out = kernel(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert len(calls) == 6  # three heads, each recomputed once in backward
    torch.testing.assert_close(out, expected)
    for grad, reference in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, reference)


def test_switches_are_off_by_default_and_validated():
    model = TransformerLM(vocab_size=VOCAB)
    assert (model.config.loss_chunks, model.config.attention_chunks) == (1, 1)
    with pytest.raises(ValueError, match="attention_chunks"):
        TransformerLM(vocab_size=VOCAB, attention_chunks=0)
