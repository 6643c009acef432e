"""Performer (FAVOR+) against exact softmax attention built here."""

from __future__ import annotations

import pytest
import torch

from tests.reference import (
    assert_causal,
    causal_mask,
    dense_attention,
    prefill_then_decode,
    qkv,
)
from variants import build_attention
from variants.attention.common.base import replaying
from variants.attention.performer import layer as performer


def relative_error(causal, n_features, seeds=3, scale=0.5, eps=0.0):
    """Mean over seeds of |performer - exact| / |exact|; q, k scaled so that softmax attention
    is far from uniform (uniform weights are 26 % off at scale 0.5) yet the estimator's
    variance, which grows like exp(|q + k|^2 / sqrt(d)), stays moderate. `eps`: the features'
    and the denominator's (0: the unbiased estimator)."""
    errors = []
    for seed in range(seeds):
        q, k, v = qkv(1, 2, 40, 8, seed=seed)
        q, k = q * scale, k * scale
        module = build_attention(
            "performer",
            causal=causal,
            n_features=n_features,
            seed=seed,
            head_dim=8,
            eps=eps,
            denominator_eps=eps / 100,
        ).double()
        exact = dense_attention(q, k, v, causal_mask(40) if causal else None)
        errors.append(float((module(q, k, v) - exact).norm() / exact.norm()))
    return sum(errors) / len(errors)


@pytest.mark.parametrize("causal", [False, True])
def test_error_against_exact_attention_falls_as_features_grow(causal):
    errors = [relative_error(causal, m) for m in (8, 64, 512, 4096)]
    assert errors == sorted(errors, reverse=True), errors
    assert errors[-1] < errors[1] / 4, errors  # about 1 / sqrt(m): sqrt(64) = 8 from 64 to 4096
    uniform = relative_error(causal, 4096, scale=0.0)  # exact at q = k = 0: every weight equal
    assert uniform < 1e-12


@pytest.mark.parametrize("causal", [False, True])
def test_eps_biases_the_estimate_little(causal):
    unbiased = relative_error(causal, 4096)
    assert relative_error(causal, 4096, eps=1e-4) < unbiased + 0.01
    assert relative_error(causal, 4096, eps=1e-1) > unbiased + 0.01  # the check can fail


def large_logit_gradients(causal, norm=30, **options):
    """Gradients of q, k, v at |q| = |k| = `norm`, head dim 16: at 30, logits q.k / sqrt(d) up
    to ~205; at 60 the key exponents span ~240, beyond float32's range of exponentials."""
    q, k, v = qkv(1, 2, 128, 16, seed=0, dtype=torch.float32)
    q, k = (norm * t / t.norm(dim=-1, keepdim=True) for t in (q, k))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    module = build_attention("performer", causal=causal, seed=0, head_dim=16, **options)
    module(q, k, v).square().sum().backward()
    return [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("norm", [30, 60])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_stay_finite_at_large_logits_with_eps(causal, norm):
    """The long-range preset's Performer reached logits of +-150 to +-291 and its gradients went
    NaN: the key features of whole rows underflowed in float32. With the default eps they are
    finite."""
    assert all(torch.isfinite(g).all() for g in large_logit_gradients(causal, norm))


def test_without_eps_causal_gradients_go_nan_at_large_logits():
    """What the default eps prevents (so the test above can fail): the running largest key
    exponent rises so far that the first keys' features underflow, and their queries' rows."""
    gradients = large_logit_gradients(True, 60, eps=0.0, denominator_eps=0.0)
    assert not all(torch.isfinite(g).all() for g in gradients)


def test_features_are_orthogonal_within_blocks_and_gaussian_in_length():
    features = performer.orthogonal_features(20, 8, torch.Generator().manual_seed(0), torch.float64)
    assert features.shape == (20, 8)
    for block in (features[:8], features[8:16], features[16:]):
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(torch.diagonal(gram)))
    lengths = performer.orthogonal_features(
        8000, 8, torch.Generator().manual_seed(1), torch.float64
    ).norm(dim=1)
    assert abs(float(lengths.square().mean()) - 8) < 0.3  # E |w|^2 = d for w ~ N(0, I)


def test_seed_reproduces_and_default_width_is_d_ln_d():
    first = build_attention("performer", seed=3, head_dim=16)
    assert first.n_features == round(16 * torch.log(torch.tensor(16.0)).item()) == 44
    assert torch.equal(first.features, build_attention("performer", seed=3, head_dim=16).features)
    assert not torch.equal(
        first.features, build_attention("performer", seed=4, head_dim=16).features
    )


def test_redraws_only_in_training_outside_replays():
    module = build_attention("performer", seed=0, redraw_interval=2, head_dim=8)
    q, k, v = qkv(1, 1, 6, 8, dtype=torch.float32)
    draws = []
    for _ in range(5):
        module(q, k, v)
        draws.append(module.features.clone())
    # Forwards 0-1 use draw 0, 2-3 draw 1, 4 draw 2.
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[2], draws[3])
    assert not torch.equal(draws[1], draws[2]) and not torch.equal(draws[3], draws[4])
    state = module.features.clone()
    with replaying():
        for _ in range(4):
            module(q, k, v)
    module.eval()
    for _ in range(4):
        module(q, k, v)
    assert torch.equal(module.features, state)
    rng = torch.get_rng_state()
    module.train()
    for _ in range(4):
        module(q, k, v)
    assert torch.equal(torch.get_rng_state(), rng)  # redraws never touch the global RNG


def test_causal():
    module = build_attention("performer", causal=True, seed=0, head_dim=8).double()
    assert_causal(module, length=90, t=70)


def test_half_precision_inputs_give_finite_outputs_in_their_dtype():
    q, k, v = qkv(1, 2, 30, 8, dtype=torch.bfloat16)
    out = build_attention("performer", causal=True, seed=0, head_dim=8)(q * 4, k * 4, v)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_flops_count_projections_and_state():
    module = build_attention("performer", n_features=100, head_dim=64)
    assert module.flops(1, 4, 1024, 64) == 4 * 4 * 1024 * 64 * 100 + 4 * 4 * 1024 * 100 * 65


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_features": 0}, "performer: option 'n_features' must be a positive integer, got 0"),
        ({"seed": -1}, "performer: option 'seed' must be a non-negative integer, got -1"),
        ({"redraw_interval": 0}, "performer: option 'redraw_interval' must be a positive"),
        ({"head_dim": 0}, "performer: option 'head_dim' must be a positive integer, got 0"),
        ({"eps": -1e-4}, "performer: option 'eps' must be a number >= 0, got -0.0001"),
        ({"denominator_eps": "x"}, "performer: option 'denominator_eps' must be a number >= 0"),
    ],
)
def test_bad_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        build_attention("performer", **options)


def test_head_dim_must_match_the_inputs():
    q, k, v = qkv(1, 1, 4, 8)
    with pytest.raises(ValueError, match="performer: option 'head_dim'=64 must equal"):
        build_attention("performer")(q, k, v)


HEAD_DIMS = [64, 128, 160, 192, 256]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_float32_matches_float64_at_every_head_dim(causal, head_dim):
    """Key features once underflowed in float32 from head dim ~160 (causal: every output row 0)
    and lost most digits at 128: the float32 estimate must be the float64 one's, no row zero."""
    q, k, v = qkv(1, 2, 64, head_dim, seed=0)
    module = build_attention("performer", causal=causal, seed=0, head_dim=head_dim)
    out = module(q.float(), k.float(), v.float())
    assert torch.isfinite(out).all()
    assert (out.abs().amax(dim=-1) > 0).all()
    want = module.double()(q, k, v)
    assert float((out.double() - want).norm() / want.norm()) < 1e-4


def exact_error(causal, head_dim=128, seeds=3, scale=0.3):
    """Mean relative error of float32 performer against exact attention, 64 positions."""
    errors = []
    for seed in range(seeds):
        q, k, v = qkv(1, 2, 64, head_dim, seed=seed)
        q, k = q * scale, k * scale
        module = build_attention("performer", causal=causal, seed=seed, head_dim=head_dim)
        got = module(q.float(), k.float(), v.float()).double()
        exact = dense_attention(q, k, v, causal_mask(64) if causal else None)
        errors.append(float((got - exact).norm() / exact.norm()))
    return sum(errors) / len(errors)


def test_causal_error_is_not_much_worse_than_bidirectional_at_head_dim_128():
    bidirectional, causal = exact_error(False), exact_error(True)
    assert causal < 1.5 * bidirectional, (causal, bidirectional)


@pytest.mark.parametrize("head_dim", [64, 192, 256])
def test_float32_decode_equals_the_forward_at_large_head_dims(head_dim):
    q, k, v = qkv(1, 2, 24, head_dim, seed=1, dtype=torch.float32)
    module = build_attention("performer", causal=True, seed=0, head_dim=head_dim).eval()
    want = module(q, k, v)
    cache = module.init_cache(1, 2, head_dim, max_len=24)
    got = prefill_then_decode(module, q, k, v, cache, prompt=10)
    assert (got.abs().amax(dim=-1) > 0).all()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
