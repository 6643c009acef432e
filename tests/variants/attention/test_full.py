"""Full attention against explicit softmax references, including the shared-QK conventions."""

import pytest
import torch

from tests.reference import causal_mask, dense_attention, qkv, shared_qk_reference
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
