"""Fitting a kernel's learned state to the frozen reference model
(experiments/measurement/reference_model.py), so that its approximation error measures the
kernel, not its initialisation: a kernel with learned state (parameters, or buffers that a
training forward updates: routing's centroids; `learns`) gets `fit_steps` Adam steps minimising
its relative output error against exact attention on the reference's training-split q, k, v
(`fit_kernel`), at the length `fit_length` gives for the job's, and `fitted_kernel` caches the
fitted state beside the reference as `reference/<digest>/kernel-<key>.pt` (the reference's
cache: locked, written atomically, a damaged file moved aside and rebuilt), where `kernel_key`
covers every setting that shapes the fitted kernel.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

import variants
from experiments.measurement.reference_model import (
    _FIT_FIELDS,
    ReferenceConfig,
    ReferenceModel,
    _cached,
    attention_inputs,
    for_kernel,
)
from variants.attention.common.base import Attention, sample_gates

log = logging.getLogger("attnbench")

# Bump when the kernel-fitting recipe changes what a cached fitted kernel is.
FIT_VERSION = 2


def learns(kernel: Attention, sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> bool:
    """Whether `kernel` has learned state: trainable parameters, or buffers that one training
    forward on `sample` (q, k, v) changes (routing's centroids; not Performer's fixed draw).
    The check runs on a copy; `kernel` is untouched."""
    if any(p.requires_grad for p in kernel.parameters()):
        return True
    if not any(True for _ in kernel.buffers()):
        return False
    probe = copy.deepcopy(kernel).train()
    before = [b.clone() for b in probe.buffers()]
    with torch.no_grad():
        probe(*sample)
    return any(not torch.equal(a, b) for a, b in zip(before, probe.buffers(), strict=True))


# Steps between the fit's checks on held-out inputs (and one before the first step).
FIT_CHECK_EVERY = 20


def fit_kernel(
    kernel: Attention,
    exact: Attention,
    inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    steps: int,
    lr: float,
    held_out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
) -> int:
    """Fit `kernel` in place: `steps` steps minimising its mean relative squared output error
    ||kernel(q,k,v) - exact(q,k,v)||² / ||exact(q,k,v)||² over `inputs` (cycled, one triple
    per step), in training mode, so buffers a training forward updates (routing's centroids)
    follow the inputs too. Adam on its trainable parameters, if any. A gated kernel (NSA,
    DeltaNet) gets sigmoid(N(0, 1)) gates, the same ones for each triple every time it comes
    round.

    With `held_out` triples, the same error on them is checked before the first step, every
    FIT_CHECK_EVERY steps and after the last, and the kernel ends in the best checked state:
    a fit on a few sequences can over-fit them (compressed's convolution did, ending worse
    than it started), and a fit that ends worse than its start measures the fit, not the
    kernel. Returns the step count of the state kept (`steps` without `held_out`); the kernel
    ends in eval mode."""
    targets, gates = _fit_targets(kernel, exact, inputs, seed=0)
    checks = None
    if held_out:
        checks = (held_out, *_fit_targets(kernel, exact, held_out, seed=len(inputs)))
    parameters = [p for p in kernel.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=lr) if parameters else None
    best_step, best_error, best_state = steps, math.inf, None
    for step in range(steps + 1):
        if checks is not None and (step % FIT_CHECK_EVERY == 0 or step == steps):
            error = _fit_error(kernel, *checks)
            if error < best_error:
                best_step, best_error = step, error
                best_state = copy.deepcopy(kernel.state_dict())
        if step == steps:
            break
        kernel.train()
        index = step % len(inputs)
        (q, k, v), target = inputs[index], targets[index]
        if optimizer is None:
            with torch.no_grad():
                kernel(q, k, v, gates=gates[index])
            continue
        loss = _relative_squared_error(kernel(q, k, v, gates=gates[index]), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if best_state is not None:
        kernel.load_state_dict(best_state)
    kernel.eval()
    return best_step


def _fit_targets(kernel, exact, triples, *, seed: int):
    """Exact attention's outputs on `triples` and the gates `kernel` gets on each (seeded from
    `seed` on, one generator per triple)."""
    with torch.no_grad():
        targets = [exact(q, k, v) for q, k, v in triples]
    gates = [
        sample_gates(kernel, q, torch.Generator().manual_seed(seed + i))
        for i, (q, _, _) in enumerate(triples)
    ]
    return targets, gates


def _relative_squared_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).pow(2).sum() / target.pow(2).sum()


@torch.no_grad()
def _fit_error(kernel, triples, targets, gates) -> float:
    """The fit's loss on `triples`, in eval mode (no buffer moves), averaged over them."""
    kernel.eval()
    errors = [
        float(_relative_squared_error(kernel(q, k, v, gates=g), target))
        for (q, k, v), target, g in zip(triples, targets, gates, strict=True)
    ]
    return sum(errors) / len(errors)


def fitted_kernel(
    reference: ReferenceModel,
    kernel_config: variants.ModelConfig,
    *,
    seq_len: int,
    device: torch.device,
    directory: Path,
    exact: Attention,
) -> tuple[Attention, int, int | None]:
    """A fresh kernel of `kernel_config`'s variant (seeded by the reference's seed), fitted to
    the reference if it has learned state (`fit_kernel`, its best state on a held-out
    training-split batch kept), the step count of that state (0: as initialised, or no learned
    state) and the length it was fitted at (`fit_length`; None without a fit). Fitted states
    are cached beside the reference, keyed by the kernel's config, that length and the fitting
    settings (`kernel_key`), so one fit serves every job length at or above `fit_max_len`."""
    config = reference.config
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        kernel = kernel_config.kernel().to(device)
    stateless = not any(True for _ in kernel.parameters()) and not any(
        True for _ in kernel.buffers()
    )
    if config.fit_steps == 0 or stateless:
        return kernel.eval(), 0, None
    length = fit_length(kernel_config.attention, seq_len, config)
    # The fit's training batches, then one more training-split batch held out to pick its
    # best state (the error itself is measured on the eval split).
    batches = [
        [
            for_kernel(triple, kernel, shared_qk=config.shared_qk)
            for triple in attention_inputs(
                reference, seq_len=length, batch_size=1, index=index, device=device, split="train"
            )
        ]
        for index in range(config.fit_batches + 1)
    ]
    inputs = [triple for batch in batches[:-1] for triple in batch]
    if not learns(kernel, inputs[0]):
        return kernel.eval(), 0, None
    key = kernel_key(kernel_config, length, config)
    path = reference.path.with_suffix("") / f"kernel-{key}.pt"
    # A cached state that did not fit (`_cached`) may have been loaded in part: a fit starts
    # from the state as initialised all the same.
    initial = {k: v.clone() for k, v in kernel.state_dict().items()}

    def build() -> dict[str, Any]:
        kernel.load_state_dict(initial)
        started = time.perf_counter()
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            kept = fit_kernel(
                kernel,
                exact,
                inputs,
                steps=config.fit_steps,
                lr=config.fit_lr,
                held_out=batches[-1],
            )
        log.info(
            "fitted %s to the reference in %.0f s (kept step %d of %d, best on held-out text)",
            kernel.name,
            time.perf_counter() - started,
            kept,
            config.fit_steps,
        )
        return {
            "state_dict": {k: v.cpu() for k, v in kernel.state_dict().items()},
            "kept_step": kept,
        }

    def fill(saved: dict[str, Any]) -> None:
        kernel.load_state_dict(saved["state_dict"])
        int(saved["kept_step"])

    saved = _cached(path, build, required=("state_dict", "kept_step"), load=fill)
    return kernel.eval(), int(saved["kept_step"]), length


def fit_length(attention: str, seq_len: int, config: ReferenceConfig) -> int:
    """The length a kernel is fitted at for a job of `seq_len`: the job's own when its learned
    state is per position (`bounded_length`, e.g. Linformer's projections over max_seq_len)
    or `fit_max_len` is 0, else at most `fit_max_len`. Block pooling weights, gate projections
    and cluster centroids fitted on 1024-token windows serve longer inputs as they are, and a
    fit at 4096 tokens cost most of a scaling job's time (NSA: 67 s of 86 s)."""
    if config.fit_max_len == 0 or variants.attention_spec(attention).bounded_length:
        return seq_len
    return min(seq_len, config.fit_max_len)


def kernel_key(kernel_config: variants.ModelConfig, seq_len: int, config: ReferenceConfig) -> str:
    """12 hex digits naming a fitted kernel: its variant and options, the model options it
    is built with, the length it is fitted at and the fitting settings."""
    model = kernel_config.model_options()
    # The length bound shapes learned state only where it is per position (Linformer); left in
    # the key elsewhere it gave each job length a fit of its own at the same `seq_len`.
    if not variants.attention_spec(kernel_config.attention).bounded_length:
        del model["max_seq_len"]
    blob = json.dumps(
        {
            "attention": kernel_config.attention,
            "options": dict(kernel_config.attention_options),
            "model": model,
            "seq_len": seq_len,
            "fit": {name: getattr(config, name) for name in _FIT_FIELDS},
            "recipe": FIT_VERSION,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
