"""Generation with `TransformerLM`: the prompt through every layer's cache once, then one token
at a time (`TransformerLM.generate` calls `generate` here).

Only attention mixes positions; embeddings, blocks' feed-forwards, norms and the head are
position-wise. So a step runs the model's own modules on the new positions alone, with every
layer's kernel temporarily wrapped (`layers.CachedKernel`) so that the layer's q, k, v go to the
kernel's `prefill` (the prompt, empty cache) or `decode` (one new position) instead of its
forward. The sinusoidal positions are those of the tokens' places in the whole sequence and
the token shift (if on) takes the previous position's embedding, kept between steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from variants.attention.common.base import evaluating
from variants.layers import CachedKernel, kernels_swapped
from variants.model_config import OWNER


@contextmanager
def cached_kernels(model, batch_size: int, max_len: int) -> Iterator[None]:
    """Within the block every attention layer of `model` runs its kernel through a fresh cache
    of `max_len` positions; the kernels come back on leaving it, also on an error."""
    weight = model.head.weight
    layers = list(model._attention_layers())
    wrapped = [
        CachedKernel(
            layer.kernel,
            layer.init_cache(batch_size, max_len=max_len, device=weight.device, dtype=weight.dtype),
        )
        for layer in layers
    ]
    with kernels_swapped(layers, wrapped):
        yield


def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
) -> torch.Tensor:
    """prompt (B, T) int64 -> (B, T + max_new_tokens): the prompt and the generated tokens.

    temperature 0 is greedy (argmax); above 0 tokens are sampled from softmax(logits / t)
    with a generator seeded with `seed` (the global RNG if None). Runs without autograd and in
    eval mode. `ValueError` if a layer's kernel cannot decode (e.g. Linformer), the model is
    not causal or uses rotary positions, or T + max_new_tokens exceeds the model's `max_seq_len`.
    """
    from variants.model import sinusoidal_positions  # model imports this module's caller

    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(
            f"{OWNER}: prompt must have shape (batch, seq_len >= 1), got {tuple(prompt.shape)}"
        )
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(
            f"{OWNER}: option 'max_new_tokens' must be an int >= 0, got {max_new_tokens!r}"
        )
    if temperature < 0:
        raise ValueError(f"{OWNER}: option 'temperature' must be >= 0, got {temperature!r}")
    if model.config.positions != "sinusoidal":
        # A step sees only its new positions: rotary would need the cache's offset.
        raise ValueError(
            f"{OWNER}: option 'positions'={model.config.positions!r} is not supported; "
            "generation runs with positions='sinusoidal'"
        )
    batch, length = prompt.shape
    total = length + max_new_tokens
    if total > model.config.max_seq_len:
        raise ValueError(
            f"{OWNER}: prompt + max_new_tokens = {total} exceeds option "
            f"'max_seq_len'={model.config.max_seq_len}"
        )
    generator = None
    if seed is not None and temperature > 0:
        generator = torch.Generator(device=prompt.device).manual_seed(seed)
    tokens = [prompt]
    previous = None  # the last position's embedding, for the token shift
    with torch.no_grad(), evaluating(model), cached_kernels(model, batch, total):
        new, start = prompt, 0
        for _ in range(max_new_tokens):
            x = model.embed(new)  # (B, t, d_model)
            x = (
                x
                + sinusoidal_positions(start + new.shape[1], x.shape[-1], x.device, x.dtype)[start:]
            )
            if model.shift is not None:
                before = x[:, :1] * 0 if previous is None else previous  # (B, 1, d_model)
                shifted = torch.cat([before, x[:, :-1]], dim=1)  # x_{i-1}
                previous = x[:, -1:]
                x = x + model.shift(shifted)
            logits = model.head(model.norm(model.blocks(x)))[:, -1]  # (B, vocab)
            new = pick(logits, temperature, generator)  # (B, 1)
            tokens.append(new)
            start += x.shape[1]
    return torch.cat(tokens, dim=1)


def pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """The next token from (B, vocab) logits: argmax at temperature 0, else a sample."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    probs = F.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)  # (B, 1)
