"""The base forward's contract on every registered variant, causal and (where supported)
bidirectional: float16 and bfloat16 inputs give finite outputs and gradients close to the
float32 ones, in the input's dtype; an empty batch gives an empty output that backward goes
through; integer inputs are refused with a one-line `ValueError` naming the variant and
dtype; a decoding cache for an empty batch is refused in one line; appending tokens leaves a
causal kernel's earlier outputs unchanged unless its spec says otherwise (`past_fixed`).

Half-precision inputs meet the kernel's float32 parameters and buffers as they are (no
autocast): the kernel-alone measurements and a model cast to half both call it so.
"""

from __future__ import annotations

import pytest
import torch

import variants
from tests.reference import Gated, qkv
from variants.attention.common.base import pattern_length, replaying, sample_gates
from variants.checks import UnsupportedCombination

# (B, H, L, D): L a multiple of no block, bucket or window size, and longer than routing's
# window (128), so its sorted chunks attend to a previous chunk.
SHAPE = (1, 2, 200, 16)
# Relative error to float32 allowed (measured at SHAPE: < 0.003 in float16, < 0.04 in bfloat16).
BOUND = {torch.float16: 0.01, torch.bfloat16: 0.05}
# Kernels that hash or route by content: a half-precision rounding may move a token to another
# bucket or cluster, which changes its keys, so their outputs may agree less closely.
BY_CONTENT = ("lsh", "routing")


def _cases():
    for name in variants.attention_names():
        spec = variants.attention_spec(name)
        for causal in (True, False):
            supported = spec.causal_supported if causal else spec.bidirectional_supported
            if supported:
                yield pytest.param(name, causal, id=f"{name}-{'causal' if causal else 'bidir'}")


CASES = list(_cases())


def _kernel(name: str, causal: bool) -> torch.nn.Module:
    """`name` as a model would build it for SHAPE, seeded, in eval mode (routing's centroids
    and Performer's features stay put between calls), gated with fixed gates if gated."""
    spec = variants.attention_spec(name)
    model_options = {
        "causal": causal,
        "n_heads": SHAPE[1],
        "head_dim": SHAPE[3],
        "max_seq_len": SHAPE[2],
        "shared_qk": spec.shared_qk_required,
    }
    options = {k: v for k, v in model_options.items() if k in spec.model_options}
    if "seed" in spec.options:
        options["seed"] = 0
    torch.manual_seed(0)
    return Gated(variants.build_attention(name, **options)).eval()


def _inputs(shape=SHAPE, dtype=torch.float32):
    """q, k, v and an output gradient, N(0, 1) drawn in float32 and then cast to `dtype`."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(shape, generator=generator).to(dtype) for _ in range(4)]


def _forward_backward(kernel, q, k, v, grad_out):
    """The output and the gradients of q (and k, unless keys are q) and v."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if kernel.applies_shared_qk:
        k = q
    out = kernel(q, k, v)
    out.backward(grad_out)
    grads = [q.grad, v.grad] if kernel.applies_shared_qk else [q.grad, k.grad, v.grad]
    return [out, *grads]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize(("name", "causal"), CASES)
def test_half_precision_inputs_give_finite_results_close_to_float32(name, causal, dtype):
    kernel = _kernel(name, causal)
    expected = _forward_backward(kernel, *_inputs())
    got = _forward_backward(kernel, *_inputs(dtype=dtype))
    bound = BOUND[dtype] * (5 if name in BY_CONTENT else 1)
    for label, a, b in zip(("out", "grad q", "grad k", "grad v"), got, expected, strict=False):
        assert a.dtype == dtype, (name, label, a.dtype)
        assert torch.isfinite(a).all(), (name, label, int((~torch.isfinite(a)).sum()))
        assert _relative(a, b) < bound, (name, label, _relative(a, b))


@pytest.mark.parametrize(("name", "causal"), CASES)
def test_an_empty_batch_gives_an_empty_output_and_backward_works(name, causal):
    kernel = _kernel(name, causal)
    empty = (0, *SHAPE[1:])
    out, *grads = _forward_backward(kernel, *_inputs(empty))
    assert out.shape == empty and out.dtype == torch.float32
    assert all(g.shape == empty for g in grads)


@pytest.mark.parametrize(("name", "causal"), CASES)
def test_integer_inputs_are_refused_in_one_line_naming_the_variant_and_dtype(name, causal):
    kernel = _kernel(name, causal)
    q, k, v = (torch.randint(-3, 4, SHAPE) for _ in range(3))
    variant = variants.attention_spec(name).variant
    with pytest.raises(ValueError, match="must be floating point") as error:
        kernel(q, q if kernel.applies_shared_qk else k, v)
    message = str(error.value)
    assert "\n" not in message and variant in message and "int64" in message


@pytest.mark.parametrize(
    "name", [n for n in variants.attention_names() if variants.attention_spec(n).supports_decode]
)
def test_a_decoding_cache_for_an_empty_batch_is_refused_in_one_line(name):
    kernel = _kernel(name, causal=True).kernel
    with pytest.raises(ValueError, match="'batch_size' must be a positive integer, got 0") as error:
        kernel.init_cache(0, SHAPE[1], SHAPE[3], max_len=SHAPE[2])
    message = str(error.value)
    assert "\n" not in message and variants.attention_spec(name).variant in message


# L tokens, then the same L and EXTRA more: 500 -> 523 moves round(sqrt(L)) (22 -> 23) and
# the number of 64-blocks (8 -> 9) past bigbird's 3 random ones, so a pattern taken at the
# input's length shows.
PAST, EXTRA = 500, 23


def _past_cases():
    for name in variants.attention_names():
        spec = variants.attention_spec(name)
        if not spec.causal_supported:
            continue
        yield pytest.param(name, {}, id=name)
        if "max_seq_len" in spec.model_options:  # the tightest model: the longer input
            yield pytest.param(name, {"max_seq_len": PAST + EXTRA}, id=f"{name}-max_seq_len")
    yield pytest.param("strided", {"stride": "auto"}, id="strided-auto")
    yield pytest.param("combined", {"parts": ["local", "strided"]}, id="combined-strided-auto")


@pytest.mark.parametrize(("name", "options"), list(_past_cases()))
def test_appending_tokens_leaves_the_causal_past_unchanged(name, options):
    spec = variants.attention_spec(name)
    model = {"causal": True, "n_heads": 2, "head_dim": 8, "shared_qk": spec.shared_qk_required}
    torch.manual_seed(0)
    options = {**options, **{k: v for k, v in model.items() if k in spec.model_options}}
    kernel = variants.build_attention(name, **options).double().eval()
    q, k, v = qkv(1, 2, PAST + EXTRA, 8, seed=3)
    if kernel.applies_shared_qk:
        k = q
    gates = sample_gates(kernel, q, torch.Generator().manual_seed(4))
    first = slice(0, PAST)
    short = kernel(q[:, :, first], k[:, :, first], v[:, :, first],
                   None if gates is None else gates[:, :, first])  # fmt: skip
    moved = (kernel(q, k, v, gates)[:, :, first] - short).abs().max().item()
    if spec.past_fixed:
        assert moved <= 1e-10, (name, moved)
    else:  # the flag is honest: LSH's chunk boundaries move
        assert moved > 1e-3, (name, moved)


def test_length_dependent_patterns_are_taken_at_the_model_length():
    assert [pattern_length(n, 100, True) for n in (1, 100, 101)] == [100, 100, 101]
    assert [pattern_length(n, 100, False) for n in (1, 100, 101)] == [100, 100, 101]
    assert [n for n in variants.attention_names()
            if not variants.attention_spec(n).past_fixed] == ["lsh"]  # fmt: skip


@pytest.mark.parametrize("name", variants.attention_names())
def test_scale_is_sdpas_where_the_variant_takes_it_and_refused_elsewhere(name):
    """`scale=` as SDPA's: for exact attention the same numbers as SDPA's scale; for every
    variant that takes it the output of queries scaled by scale * sqrt(D); others refuse."""
    spec = variants.attention_spec(name)
    model = {"n_heads": 2, "head_dim": 8, "max_seq_len": 64}
    model = {k: v for k, v in model.items() if k in spec.model_options}
    kernel = variants.build_attention(name, **model).double().eval()
    q, k, v = qkv(1, 2, 16, 8, seed=5)
    if kernel.applies_shared_qk:
        k = q
    gates = sample_gates(kernel, q, torch.Generator().manual_seed(4))
    if not spec.cls.takes_scale:
        with pytest.raises(UnsupportedCombination, match="option 'scale'"):
            kernel(q, k, v, gates, scale=0.3)
        return
    with replaying():
        got = kernel(q, k, v, gates, scale=0.3)
        want = kernel(q * (0.3 * 8**0.5), k, v, gates)
    torch.testing.assert_close(got, want)
    if name == "full":
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3)
        torch.testing.assert_close(got, sdpa)


@pytest.mark.parametrize("name", variants.attention_names())
def test_queries_shorter_than_keys_are_the_last_positions_or_refused(name):
    spec = variants.attention_spec(name)
    if not spec.causal_supported:
        return
    model = {"n_heads": 2, "head_dim": 8, "max_seq_len": 64, "causal": True}
    model = {k: v for k, v in model.items() if k in spec.model_options}
    kernel = variants.build_attention(name, **model).double().eval()
    q, k, v = qkv(1, 2, 24, 8, seed=6)
    supported = not (spec.n_gates or kernel.applies_shared_qk or not spec.past_fixed)
    if not supported:
        with pytest.raises(UnsupportedCombination, match="q of 5 positions over k of 24"):
            kernel(q[:, :, -5:], k, v, sample_gates(kernel, q[:, :, -5:]))
        return
    torch.testing.assert_close(kernel(q[:, :, -5:], k, v), kernel(q, k, v)[:, :, -5:])
