"""The reversible stack against the same couplings run through plain autograd."""

import pytest
import torch
import torch.nn.functional as F

from experiments.measurement.memory import peak_memory_bytes
from variants import TransformerLM, build_block
from variants.attention.common.base import replaying
from variants.blocks import build_stack


def _blocks(depth=3, dtype=torch.float64, **options):
    torch.manual_seed(0)
    return [build_block("reversible", 16, 2, **options).to(dtype) for _ in range(depth)]


def _plain_coupling(blocks, x):
    """The reference: y1 = x1 + Attn(x2), y2 = x2 + FF(y1) per block, autograd keeps it all."""
    x1 = x2 = x
    for block in blocks:
        x1 = x1 + block.attn(x2)
        x2 = x2 + block.ff(x1)
    return (x1 + x2) / 2


def _params(blocks):
    # Unique parameters in order; a tied parameter appears once.
    return list({id(p): p for block in blocks for p in block.parameters()}.values())


def _outputs_and_grads(run, blocks, x, cotangent, seed):
    torch.manual_seed(seed)
    out = run(x)
    grads = torch.autograd.grad((out * cotangent).sum(), [x, *_params(blocks)])
    return out, grads


def _compare_with_plain(blocks, length=10, seed=5):
    x = torch.randn(2, length, 16, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn(2, length, 16, dtype=torch.float64)
    stack = build_stack("reversible", blocks)
    out, grads = _outputs_and_grads(stack, blocks, x, cotangent, seed)
    want_out, want_grads = _outputs_and_grads(
        lambda t: _plain_coupling(blocks, t), blocks, x, cotangent, seed
    )
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want)
    return stack


@pytest.mark.parametrize("ff_chunks", [1, 3])
def test_outputs_and_gradients_equal_plain_autograd_with_dropout(ff_chunks):
    blocks = _blocks(dropout=0.2, ff_chunks=ff_chunks)
    stack = _compare_with_plain(blocks)
    # autograd.grad returned every gradient; nothing was accumulated on the side.
    assert all(p.grad is None for p in stack.parameters())


def test_recompute_leaves_the_callers_rng_alone():
    blocks = _blocks(dropout=0.2)
    stack = build_stack("reversible", blocks)
    x = torch.randn(2, 10, 16, dtype=torch.float64, requires_grad=True)
    out = stack(x)
    state = torch.get_rng_state()
    out.sum().backward()
    assert torch.equal(torch.get_rng_state(), state)


def test_shared_parameters_get_the_sum_of_their_gradients():
    blocks = _blocks()
    blocks[2].ff.fn.net[0].weight = blocks[0].ff.fn.net[0].weight
    blocks[1].attn.norm.bias = blocks[0].attn.norm.bias
    _compare_with_plain(blocks)


def test_backward_reconstructs_every_blocks_inputs_in_float32():
    blocks = _blocks(depth=4, dtype=torch.float32)
    seen = {}  # (sublayer, phase) -> the input it received

    def record(name):
        def hook(module, args):
            phase = "backward" if torch.is_grad_enabled() else "forward"
            seen[(name, phase)] = args[0].detach().clone()

        return hook

    for i, block in enumerate(blocks):
        block.attn.register_forward_pre_hook(record(f"attn{i}"))
        block.ff.register_forward_pre_hook(record(f"ff{i}"))
    x = torch.randn(2, 32, 16, requires_grad=True)
    build_stack("reversible", blocks)(x).sum().backward()
    for i in range(4):
        for name in (f"attn{i}", f"ff{i}"):
            torch.testing.assert_close(
                seen[(name, "backward")], seen[(name, "forward")], rtol=0, atol=1e-5
            )


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_lsh_gradients_match_plain_autograd_with_the_same_buckets(dropout):
    options = {"attention": "lsh", "shared_qk": True, "attention_options": {"bucket_size": 4}}
    blocks = _blocks(dropout=dropout, **options)
    x = torch.randn(2, 16, 16, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn(2, 16, 16, dtype=torch.float64)
    # seed=None: hashing draws from the global RNG, so buckets differ between calls...
    assert not torch.allclose(_plain_coupling(blocks, x), _plain_coupling(blocks, x))
    # ...and the same seed gives the reference the reversible forward's buckets and masks.
    stack = build_stack("reversible", blocks)
    out, grads = _outputs_and_grads(stack, blocks, x, cotangent, seed=1)
    want_out, want_grads = _outputs_and_grads(
        lambda t: _plain_coupling(blocks, t), blocks, x, cotangent, seed=1
    )
    torch.testing.assert_close(out, want_out)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_double_backward_is_refused():
    blocks = _blocks(depth=1)
    x = torch.randn(1, 4, 16, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(build_stack("reversible", blocks)(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()


def test_second_backward_is_refused_clearly():
    blocks = _blocks(depth=1)
    x = torch.randn(1, 4, 16, dtype=torch.float64, requires_grad=True)
    out = build_stack("reversible", blocks)(x).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        out.backward()


def _training_step_peak(block, depth):
    torch.manual_seed(0)
    model = TransformerLM(16, d_model=64, n_heads=4, depth=depth, block=block, dropout=0.1)
    tokens = torch.randint(0, 16, (8, 256))
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def step():
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()

    # The step allocates one gradient per parameter; the rest is activations and workspace.
    peak = peak_memory_bytes(step)
    return peak, peak - param_bytes


def test_reversible_memory_is_nearly_flat_in_depth_while_residual_grows():
    # Measured (d=64, L=256, B=8), depth 1 -> 6: reversible 11.6 -> 13.7 MB, of which 1.0 MB is
    # the 5 extra blocks' gradients; residual 14.3 -> 69.7 MB, activation part x4.9.
    rev1, _ = _training_step_peak("reversible", 1)
    rev6, _ = _training_step_peak("reversible", 6)
    _, res1 = _training_step_peak("residual", 1)
    _, res6 = _training_step_peak("residual", 6)
    assert rev6 <= 1.5 * rev1, (rev1, rev6)
    assert res6 >= 3 * res1, (res1, res6)


def test_routing_gradients_match_plain_autograd_and_centroids_move_once_per_step():
    # The reversible forward routes and updates the centroids once per layer; its recompute
    # must reuse those clusters (the centroids have moved since) and update nothing.
    options = {"n_clusters": 2, "window": 4, "decay": 0.5}
    blocks = _blocks(attention="routing", shared_qk=True, attention_options=options)
    kernels = [block.attn.fn.kernel for block in blocks]
    x = torch.randn(2, 16, 16, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn(2, 16, 16, dtype=torch.float64)
    stack = build_stack("reversible", blocks)
    out, grads = _outputs_and_grads(stack, blocks, x, cotangent, seed=1)
    counts = [kernel.centroid_counts.clone() for kernel in kernels]
    assert all(count.sum() == 0.5 * 2 * 2 + 0.5 * 2 * 16 * 2 for count in counts)  # one step
    with replaying():  # the reference routes with the same clusters, updating nothing
        want_out, want_grads = _outputs_and_grads(
            lambda t: _plain_coupling(blocks, t), blocks, x, cotangent, seed=1
        )
    torch.testing.assert_close(out, want_out)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want)
    assert all(torch.equal(k.centroid_counts, c) for k, c in zip(kernels, counts, strict=True))
