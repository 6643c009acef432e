"""The decay of gated_deltanet and mamba2 starts where the published layers start it.

Mamba-2 (mamba2_simple.py) and Gated DeltaNet (fla's GatedDeltaNet) initialise the decay's map
alpha = exp(-A softplus(x W + dt_bias)) with A ~ U(1, 16) (fla: U(0, 16)) and dt_bias the
softplus inverse of dt, dt log-uniform in [0.001, 0.1]: at x W = 0, alpha has its median near
0.93, a state that keeps a token for about ten positions. The sigmoid gate taken as the decay
(`decay="gate"`) starts at about 0.5, a state that forgets within one or two tokens; with it
neither variant learned recall (docs/variants.md), so the default is the published map.
"""

from __future__ import annotations

import math

import pytest
import torch

import variants
from variants.attention.common.recurrent import mamba_decay_init

HEADS = 20_000  # draws per distribution: a Kolmogorov-Smirnov distance of 0.02 is ~ 3 sigma


def _ks_uniform(values: torch.Tensor, low: float, high: float) -> float:
    """The largest distance between the empirical CDF of `values` and U(low, high)'s."""
    x = values.double().sort().values
    cdf = ((x - low) / (high - low)).clamp(0, 1)
    n = len(x)
    above = torch.arange(1, n + 1, dtype=torch.double) / n - cdf
    below = cdf - torch.arange(n, dtype=torch.double) / n
    return float(torch.maximum(above, below).max())


def test_a_is_uniform_on_1_16_and_dt_log_uniform_on_the_papers_range():
    torch.manual_seed(0)
    a_log, dt_bias = mamba_decay_init(HEADS)
    a = a_log.exp()
    dt = torch.nn.functional.softplus(dt_bias)
    assert 1.0 <= float(a.min()) and float(a.max()) <= 16.0
    assert _ks_uniform(a, 1.0, 16.0) < 0.02
    assert 1e-3 * (1 - 1e-5) <= float(dt.min()) and float(dt.max()) <= 0.1 * (1 + 1e-5)
    assert _ks_uniform(dt.log(), math.log(1e-3), math.log(0.1)) < 0.02


def test_the_initial_decay_at_a_zero_projection_is_the_papers():
    """alpha = exp(-A dt) at x W = 0: its quantiles are those of the paper's draws."""
    torch.manual_seed(0)
    a_log, dt_bias = mamba_decay_init(HEADS)
    ours = torch.exp(-a_log.exp() * torch.nn.functional.softplus(dt_bias))
    generator = torch.Generator().manual_seed(1)
    a = torch.empty(HEADS).uniform_(1.0, 16.0, generator=generator)
    low, high = math.log(1e-3), math.log(0.1)
    dt = torch.empty(HEADS).uniform_(low, high, generator=generator).exp()
    papers = torch.exp(-a * dt)
    levels = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95])
    gap = (torch.quantile(ours, levels) - torch.quantile(papers, levels)).abs()
    assert float(gap.max()) < 0.02, gap
    assert 0.90 < float(ours.median()) < 0.95


@pytest.mark.parametrize("name", ["gated_deltanet", "mamba2"])
def test_the_default_is_the_published_map_with_a_decay_per_head(name):
    assert variants.attention_spec(name).options["decay"] == "mamba"
    torch.manual_seed(0)
    model = variants.TransformerLM(vocab_size=11, d_model=32, n_heads=4, depth=1, attention=name)
    (kernel,) = model.kernels()
    assert kernel.decay == "mamba" and kernel.a_log.shape == kernel.dt_bias.shape == (4,)


@pytest.mark.parametrize("name", ["gated_deltanet", "mamba2"])
def test_a_model_starts_with_a_decay_that_keeps_tokens_the_gate_does_not(name):
    """At initialisation, over a batch: the default's median alpha is the paper's (~0.93);
    `decay="gate"` starts at ~0.5, half the state gone at every token."""
    index = 1 if name == "gated_deltanet" else 0  # (beta, alpha) or (a,)

    def median_alpha(decay: str) -> float:
        torch.manual_seed(0)
        model = variants.TransformerLM(
            vocab_size=64,
            d_model=64,
            n_heads=16,  # 16 heads x 2 layers: 32 draws of (A, dt)
            depth=2,
            attention=name,
            attention_options={"decay": decay},
        )
        alphas = []

        def keep(kernel, args, kwargs):
            gate = kwargs["gates"][..., index]
            alphas.append(kernel._log_decay(gate).exp().flatten())

        for kernel in model.kernels():
            kernel.register_forward_pre_hook(keep, with_kwargs=True)
        with torch.no_grad():
            model(torch.randint(64, (4, 64), generator=torch.Generator().manual_seed(2)))
        return float(torch.cat(alphas).median())

    assert median_alpha("mamba") > 0.85
    assert 0.4 < median_alpha("gate") < 0.6


@pytest.mark.parametrize("name", ["gated_deltanet", "mamba2"])
def test_dt_min_and_dt_max_set_the_initial_step_range(name):
    """Mamba-2's dt_min / dt_max: dt_h log-uniform in them, so a range ten times lower starts
    the decay ten times nearer 1 (alpha = exp(-A dt) at x W = 0)."""
    options = {"dt_min": 1e-4, "dt_max": 1e-3}
    torch.manual_seed(0)
    model = variants.TransformerLM(
        vocab_size=11, d_model=64, n_heads=16, depth=1, attention=name, attention_options=options
    )
    (kernel,) = model.kernels()
    dt = torch.nn.functional.softplus(kernel.dt_bias.detach())
    assert 1e-4 * (1 - 1e-5) <= float(dt.min()) and float(dt.max()) <= 1e-3 * (1 + 1e-5)
    assert float(torch.exp(-kernel.a_log.detach().exp() * dt).median()) > 0.99
    assert "dt_min=0.0001, dt_max=0.001" in repr(kernel)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"dt_min": 0.0}, "'dt_min'"),
        ({"dt_max": "x"}, "'dt_max'"),
        ({"dt_min": 0.5}, "<= 'dt_max'"),
    ],
)
def test_a_bad_step_range_is_refused_by_name(options, named):
    with pytest.raises(ValueError, match=named):
        variants.TransformerLM(vocab_size=11, attention="gated_deltanet", attention_options=options)
