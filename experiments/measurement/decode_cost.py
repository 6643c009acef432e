"""What a variant costs to generate with: prefill a context, then decode token by token.

`measure_decode` runs the job's attention kernel alone at the job's shape
(`measure.decode_scope=kernel`, the default): the job's seq_len positions of random q, k, v
prefilled into a cache reserved for seq_len + warm-up + timed steps, then one position at a time
decoded onto it, each step timed on its own (gated kernels get gates drawn as the model would
give them, `base.sample_gates`). `measure_model_decode` (`measure.decode_scope=model`) decodes
with the whole model instead, each layer through its own kernel's cache (`variants.generation`),
so a hybrid stack's decode is its layers' together. Next to each step a copy of a tensor the
size of the decoder's state is timed: decoding is memory-bound, and the copy is the machine's
bandwidth, as the matmul rate is its compute.

The columns (`decode_prefill_ms`, `decode_state_bytes`, `decode_ms_per_token`,
`decode_bandwidth_fraction`, ...): docs/measurements.md and the record schema's "decode" block.
`state_columns` (`measure.decode_state`): `decode_state_bytes` alone, untimed (the frontier).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import torch
from torch import nn

from experiments.measurement.memory import peak_memory_bytes
from variants import TransformerLM
from variants.attention.common.base import Attention, evaluating, sample_gates
from variants.generation import Positions, cached_kernels


def measure_decode(
    kernel: Attention,
    shape: tuple[int, int, int, int],
    device: torch.device,
    dtype: torch.dtype,
    *,
    steps: int,
    warmup: int,
    kv_heads: int | None = None,
) -> dict[str, Any]:
    """The decode columns of `kernel` at shape (B, H, context, D); `steps` timed decode steps
    after `warmup` untimed ones. `kv_heads` (default H): the heads of k and v (grouped KV heads,
    `model.n_kv_heads`), which the cache of a `native_gqa_decode` variant holds, so
    `decode_state_bytes` and the read per token are the grouped cache's. `ValueError` if the kernel
    cannot decode; `UnsupportedCombination` if it takes no grouped KV heads."""
    _require_decodable(kernel, "measure.decode")
    prefill, step = _kernel_decoder(kernel, shape, device, dtype, warmup + steps, kv_heads)
    return _timed(prefill, step, lambda cache: cache.nbytes, device, steps=steps, warmup=warmup)


def _kernel_decoder(kernel, shape, device, dtype, new: int, kv_heads: int | None):
    """`prefill()` (the cache of `kernel` at shape (B, H, context, D), reserved for `new` more
    positions, with the prompt prefilled) and `step(cache, t)` (the t-th new position)."""
    batch, heads, context, head_dim = shape
    kv_heads = heads if kv_heads is None else kv_heads
    max_len = context + new
    generator = torch.Generator(device="cpu").manual_seed(0)

    def draw(length):
        q, k, v = (
            torch.randn(batch, n, length, head_dim, generator=generator).to(device, dtype)
            for n in (heads, kv_heads, kv_heads)
        )  # q (B, H, length, D); k, v (B, H_kv, length, D)
        gates = sample_gates(kernel, q, generator)  # (B, H, length, n_gates) or None
        return ((q, q, v) if kernel.applies_shared_qk else (q, k, v)), gates

    (prompt, prompt_gates), (following, following_gates) = draw(context), draw(new)

    def prefill():
        cache = kernel.init_cache(
            batch, heads, head_dim, max_len=max_len, device=device, dtype=dtype,
            n_kv_heads=kv_heads,
        )  # fmt: skip
        kernel.prefill(*prompt, cache, prompt_gates)
        return cache

    def step(cache, t):
        q, k, v = (x[:, :, t : t + 1] for x in following)
        gates = None if following_gates is None else following_gates[:, :, t : t + 1]
        kernel.decode(q, k, v, cache, gates)

    return prefill, step


def measure_model_decode(
    model: nn.Module,
    batch: int,
    context: int,
    device: torch.device,
    *,
    steps: int,
    warmup: int,
) -> dict[str, Any]:
    """The decode columns of the whole `model` (a `variants.TransformerLM`; a hybrid stack's
    layers each through its own kernel's cache) for `batch` sequences at a context of `context`
    tokens: the prompt prefilled, then `steps` timed single-token steps after `warmup` untimed
    ones; `decode_state_bytes` is every layer's cache summed. `ValueError` if the model cannot
    decode (a layer's kernel, a model of another family)."""
    _require_ours(model)
    # Past the model's max_seq_len (the job's seq_len) as the kernel alone decodes past it: a
    # hard limit only for Linformer, which cannot decode (its cache refuses).
    new = warmup + steps
    generator = torch.Generator(device="cpu").manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
    following = torch.randint(0, vocab, (batch, new), generator=generator).to(device)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(evaluating(model))
        caches = stack.enter_context(cached_kernels(model, batch, context + new))
        positions = Positions(model)

        def prefill():
            positions.step(prompt)
            return caches

        def step(_caches, t):
            positions.step(following[:, t : t + 1])

        def state_bytes(every):
            return sum(cache.nbytes for cache in every)

        return _timed(prefill, step, state_bytes, device, steps=steps, warmup=warmup)


def state_columns(
    kernel: Attention,
    model: nn.Module,
    shape: tuple[int, int, int, int],
    device: torch.device,
    dtype: torch.dtype,
    *,
    scope: str,
    kv_heads: int | None = None,
) -> dict[str, Any]:
    """`decode_state_bytes` alone, untimed: what the decoder keeps after prefilling the
    context of shape (B, H, context, D), the kernel's cache (`scope` "kernel", as
    `measure_decode`) or every layer's summed (`scope` "model", as `measure_model_decode`;
    B sequences of context random tokens). `ValueError`, as those, if it cannot decode."""
    batch, _, context, _ = shape
    if scope == "model":
        _require_ours(model)
        generator = torch.Generator(device="cpu").manual_seed(0)
        prompt = torch.randint(0, model.config.vocab_size, (batch, context), generator=generator)
        with torch.no_grad(), evaluating(model), cached_kernels(model, batch, context + 1) as c:
            Positions(model).step(prompt.to(device))
            return {"decode_state_bytes": sum(cache.nbytes for cache in c)}
    _require_decodable(kernel, "measure.decode_state")
    prefill, _ = _kernel_decoder(kernel, shape, device, dtype, 1, kv_heads)
    with torch.no_grad():
        return {"decode_state_bytes": prefill().nbytes}


def _require_decodable(kernel: Attention, option: str) -> None:
    """`ValueError` naming `option` (true) unless `kernel` decodes (causal, with a cache)."""
    if not kernel.supports_decode or not kernel.causal:
        reason = kernel.decode_reason if not kernel.supports_decode else "it is not causal"
        raise ValueError(
            f"attention {kernel.name!r}: option {option}=true, but it cannot decode: {reason}"
        )


def _require_ours(model: nn.Module) -> None:
    """`ValueError` unless `model` is attnbench's TransformerLM (whose layers decode)."""
    if not isinstance(model, TransformerLM):
        raise ValueError(
            f"option measure.decode_scope='model' decodes with attnbench's TransformerLM, not "
            f"{type(model).__name__} (model.family={model.config.family!r}); use "
            "measure.decode_scope=kernel"
        )


def _timed(prefill, step, state_bytes, device, *, steps: int, warmup: int) -> dict[str, Any]:
    """The decode columns: `prefill()` (returns the state) timed once while its memory is
    profiled, then `step(state, t)` for t < warmup + steps, each timed beside a copy of a tensor
    of `state_bytes(state)` bytes; the first `warmup` steps untimed."""
    # One prefill, timed while its memory is profiled: a prefill at long contexts is the
    # costliest call of a decode job (minutes for exact attention at 64K on 2 cores), and the
    # profiler's per-operator overhead is small next to it.
    filled = []
    start = _now(device)
    peak = peak_memory_bytes(lambda: filled.append(prefill()), device)
    columns: dict[str, Any] = {
        "decode_prefill_ms": (_now(device) - start) * 1e3,
        "decode_prefill_peak_bytes": peak,
    }
    state = filled[0]
    nbytes = state_bytes(state)
    columns["decode_state_bytes"] = nbytes
    # Filled with ones: a calloc'd tensor would read the kernel's shared zero page, not memory.
    source = torch.ones(max(nbytes, 1), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    decode_s, copy_s = [], []
    for t in range(warmup + steps):
        start = _now(device)
        step(state, t)
        decoded = _now(device)
        target.copy_(source)
        copied = _now(device)
        if t >= warmup:
            decode_s.append(decoded - start)
            copy_s.append(copied - decoded)
    q1, median, q3 = statistics.quantiles(decode_s, n=4, method="inclusive")
    copy = statistics.median(copy_s)
    columns["decode_ms_per_token"] = median * 1e3
    columns["decode_iqr_ms_per_token"] = (q3 - q1) * 1e3
    columns["decode_copy_gb_per_s"] = 2 * nbytes / copy / 1e9
    columns["decode_read_gb_per_s"] = nbytes / median / 1e9
    columns["decode_bandwidth_fraction"] = (
        columns["decode_read_gb_per_s"] / columns["decode_copy_gb_per_s"]
    )
    return columns


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
