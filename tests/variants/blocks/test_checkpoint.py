"""The checkpointed block: same outputs and gradients as the residual block, less memory."""

import pytest
import torch
import torch.nn.functional as F

from experiments.measurement.memory import peak_memory_bytes
from variants import TransformerLM, build_block
from variants.blocks import build_stack


def _twin_stacks(depth=2, **options):
    """A checkpoint stack and a residual stack holding the same weights."""
    torch.manual_seed(0)
    ckpt = [build_block("checkpoint", 16, 2, **options).double() for _ in range(depth)]
    plain = [build_block("residual", 16, 2, **options).double() for _ in range(depth)]
    for c, p in zip(ckpt, plain, strict=True):
        p.load_state_dict(c.state_dict())
    return build_stack("checkpoint", ckpt), build_stack("residual", plain)


def _outputs_and_grads(stack, x, cotangent, seed):
    torch.manual_seed(seed)
    out = stack(x)
    grads = torch.autograd.grad((out * cotangent).sum(), [x, *stack.parameters()])
    return out, grads


@pytest.mark.parametrize("ff_chunks", [1, 3])
def test_checkpoint_equals_residual_with_dropout(ff_chunks):
    ckpt, plain = _twin_stacks(dropout=0.2, ff_chunks=ff_chunks)
    x = torch.randn(2, 10, 16, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn(2, 10, 16, dtype=torch.float64)
    out, grads = _outputs_and_grads(ckpt, x, cotangent, seed=3)
    want_out, want_grads = _outputs_and_grads(plain, x, cotangent, seed=3)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want)
    # autograd.grad returns the gradients and leaves .grad alone.
    assert all(p.grad is None for p in ckpt.parameters())


def test_parameters_get_gradients_when_the_input_needs_none():
    ckpt, _ = _twin_stacks()
    ckpt(torch.randn(1, 5, 16, dtype=torch.float64)).sum().backward()
    assert all(p.grad is not None for p in ckpt.parameters())


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_lsh_recompute_reuses_the_forward_buckets(dropout):
    options = {"attention": "lsh", "shared_qk": True, "attention_options": {"bucket_size": 4}}
    ckpt, plain = _twin_stacks(dropout=dropout, **options)
    x = torch.randn(2, 16, 16, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn(2, 16, 16, dtype=torch.float64)
    # seed=None: hashing draws from the global RNG, so buckets differ between calls...
    assert not torch.allclose(plain(x), plain(x))
    # ...and the same seed gives the reference the checkpointed forward's buckets and masks.
    out, grads = _outputs_and_grads(ckpt, x, cotangent, seed=1)
    want_out, want_grads = _outputs_and_grads(plain, x, cotangent, seed=1)
    torch.testing.assert_close(out, want_out)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want)


def _training_step_peak(block, depth):
    torch.manual_seed(0)
    model = TransformerLM(16, d_model=64, n_heads=4, depth=depth, block=block)
    tokens = torch.randint(0, 16, (8, 256))

    def step():
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()

    return peak_memory_bytes(step)


def test_checkpointing_saves_most_activation_memory_at_depth():
    # Measured (d=64, L=256, B=8): residual ~70 MB, checkpoint ~17 MB at depth 6.
    residual, checkpointed = (
        _training_step_peak("residual", 6),
        _training_step_peak("checkpoint", 6),
    )
    assert checkpointed < 0.4 * residual, (residual, checkpointed)
