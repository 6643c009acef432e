"""Full attention against explicit softmax references, including the shared-QK conventions."""

import pytest
import torch
import torch.nn.functional as F

from tests.reference import causal_mask, dense_attention, qkv, shared_qk_reference
from variants.attention.full.layer import PINNED
from variants.checks import UnsupportedCombination
from variants.registry import build_attention


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_dense_reference(impl, causal):
    q, k, v = qkv(length=13)
    mask = causal_mask(13) if causal else None
    out = build_attention("full", causal=causal, impl=impl)(q, k, v)
    torch.testing.assert_close(out, dense_attention(q, k, v, mask))


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("causal", [False, True])
def test_shared_qk_uses_unit_keys_and_skips_self_unless_alone(impl, causal):
    q, _, v = qkv(length=11, seed=4)
    out = build_attention("full", causal=causal, impl=impl, shared_qk=True)(q, q, v)
    expected = shared_qk_reference(q, v, causal_mask(11) if causal else None)
    torch.testing.assert_close(out, expected)
    if causal:  # the first token has no other key, so it attends to itself alone
        torch.testing.assert_close(out[:, :, 0], v[:, :, 0])


def test_shared_qk_single_token_attends_to_itself():
    q, _, v = qkv(length=1)
    out = build_attention("full", shared_qk=True)(q, q, v)
    torch.testing.assert_close(out, v)


@pytest.mark.parametrize("causal", [False, True])
def test_shared_qk_equals_lsh_with_one_round_and_one_chunk(causal):
    """LSH with every key in one chunk is exact shared-QK attention: the two kernels must agree,
    so a model trained with one can be evaluated with the other."""
    q, _, v = qkv(length=16, seed=5)
    full = build_attention("full", causal=causal, shared_qk=True)
    lsh = build_attention("lsh", causal=causal, n_hashes=1, bucket_size=16, seed=0)
    torch.testing.assert_close(full(q, q, v), lsh(q, q, v))


def test_shared_qk_gradients_match_reference():
    q, _, v = qkv(length=9, seed=6, requires_grad=True)
    out = build_attention("full", causal=True, shared_qk=True)(q, q, v)
    grads = torch.autograd.grad(out.square().sum(), (q, v))
    expected = shared_qk_reference(q, v, causal_mask(9))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, v))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_shared_qk_must_be_a_bool():
    with pytest.raises(ValueError, match="full: option 'shared_qk' must be true or false"):
        build_attention("full", shared_qk=1)


# --- impl: PyTorch's choice of SDPA backend, or one pinned, so every machine times one kernel ---
CPU_KERNEL_OPS = {  # the aten op each CPU backend runs, as the profiler names it
    "flash": "aten::_scaled_dot_product_flash_attention_for_cpu",
    "math": "aten::_scaled_dot_product_attention_math",
}


def runs_here(impl: str) -> bool:
    """Whether the pinned backend of `impl` runs float64 inputs on this CPU build."""
    try:
        build_attention("full", impl=impl).sdpa_backend((2, 3, 16, 8), "cpu", torch.float64)
    except UnsupportedCombination:
        return False
    return True


def ops_run(kernel, *inputs) -> set[str]:
    with torch.profiler.profile() as profile:
        kernel(*inputs)
    return {event.key for event in profile.key_averages()} & set(CPU_KERNEL_OPS.values())


@pytest.mark.parametrize("causal", [False, True])
def test_impl_sdpa_is_the_plain_call_bit_for_bit(causal):
    q, k, v = qkv(length=13, dtype=torch.float32)
    out = build_attention("full", causal=causal, impl="sdpa")(q, k, v)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))


@pytest.mark.parametrize("impl", ["sdpa_math", "sdpa_flash"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_pinned_cpu_backend_matches_the_dense_reference_forward_and_backward(impl, causal):
    if not runs_here(impl):
        pytest.skip(f"this torch build's CPU has no {impl} backend")
    q, k, v = qkv(length=13, seed=7, requires_grad=True)  # float64
    mask = causal_mask(13) if causal else None
    out = build_attention("full", causal=causal, impl=impl)(q, k, v)
    expected = dense_attention(q, k, v, mask)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("impl", ["sdpa_math", "sdpa_flash"])
def test_a_pinned_backend_takes_masks_and_grouped_heads(impl):
    if not runs_here(impl):
        pytest.skip(f"this torch build's CPU has no {impl} backend")
    q, _, _ = qkv(length=12, heads=4, seed=8)
    _, k, v = qkv(length=12, heads=2, seed=9)  # grouped: 2 KV heads for 4 query heads
    padding = torch.ones(2, 12, dtype=torch.bool)
    padding[1, 9:] = False
    kernel = build_attention("full", causal=True, impl=impl)
    out = kernel(q, k, v, attention_mask=padding)
    plain = build_attention("full", causal=True, impl="sdpa")(q, k, v, attention_mask=padding)
    torch.testing.assert_close(out, plain)


@pytest.mark.parametrize("impl", ["sdpa", "sdpa_math", "sdpa_flash"])
def test_the_backend_named_is_the_one_that_ran(impl):
    if impl != "sdpa" and not runs_here(impl):
        pytest.skip(f"this torch build's CPU has no {impl} backend")
    kernel = build_attention("full", causal=True, impl=impl)
    named = kernel.sdpa_backend((2, 3, 16, 8), "cpu", torch.float32)
    assert named in CPU_KERNEL_OPS, named  # on CPU: the same with and without gradients
    if impl != "sdpa":
        assert named == impl.removeprefix("sdpa_")
    assert ops_run(kernel, *qkv(dtype=torch.float32)) == {CPU_KERNEL_OPS[named]}


def test_impl_math_calls_no_sdpa_backend():
    assert build_attention("full", impl="math").sdpa_backend((1, 1, 4, 2), "cpu", None) is None


@pytest.mark.parametrize("impl", [i for i in PINNED if i not in ("sdpa_math", "sdpa_flash")])
def test_a_backend_this_cpu_lacks_is_refused_naming_the_option_and_the_backend(impl):
    if runs_here(impl):
        pytest.skip(f"{impl} runs on this CPU build: nothing to refuse")
    backend = PINNED[impl][0]
    kernel = build_attention("full", impl=impl)
    words = f"full: option attention.impl={impl!r} pins SDPA's {backend} backend"
    with pytest.raises(UnsupportedCombination, match=words):
        kernel(*qkv())
    with pytest.raises(UnsupportedCombination, match="attention.impl=sdpa to let PyTorch"):
        kernel.sdpa_backend((2, 3, 16, 8), "cpu", torch.float32)


def test_a_bad_impl_names_the_choices():
    with pytest.raises(ValueError) as caught:
        build_attention("full", impl="flash")
    message = str(caught.value)
    assert "full: option 'impl' must be one of" in message and "'flash'" in message
    for impl in ("sdpa", "sdpa_math", "sdpa_flash", "sdpa_efficient", "math"):
        assert impl in message


def test_sdpa_math_is_explicit_and_the_fused_backends_are_fused():
    path = {i: build_attention("full", impl=i).kernel_path("cpu", torch.float32) for i in PINNED}
    assert path.pop("sdpa_math") == "explicit"
    assert set(path.values()) == {"fused"}
