"""Generation with `TransformerLM`: the prompt through every layer's cache once, then one token
at a time (`TransformerLM.generate` calls `generate` here).

Only attention mixes positions; embeddings, blocks' feed-forwards, norms and the head are
position-wise. So a step runs the model's own modules on the new positions alone, with every
layer's kernel temporarily wrapped (`layers.CachedKernel`) so that the layer's q, k, v go to the
kernel's `prefill` (the prompt, empty cache) or `decode` (one new position) instead of its
forward. The sinusoidal positions are those of the tokens' places in the whole sequence and
the token shift (if on) takes the previous position's embedding, kept between steps.

Prompts of different lengths go in one batch left-padded, with their `attention_mask` (B, T),
True = a real token (Hugging Face's convention): each row's positions count from its first
real token, its pads' embeddings are zeros (the token shift's "before the first token"), and
every kernel takes the mask in its prefill (`Attention.prefill`), so that each row generates
what it generates alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from variants.attention.common.base import evaluating
from variants.attention.common.masking import left_pads
from variants.checks import token_mask
from variants.layers import CachedKernel, kernels_swapped
from variants.model_config import OWNER
from variants.positions import sinusoidal_positions


@contextmanager
def cached_kernels(
    model, batch_size: int, max_len: int, attention_mask: torch.Tensor | None = None
) -> Iterator[list]:
    """Within the block every attention layer of `model` runs its kernel through a fresh cache
    of `max_len` positions (each layer its own kernel's: a hybrid stack's differ), prefilled
    with the prompt's `attention_mask` (B, T) if given; yields the caches, in layer order.
    The kernels come back on leaving it, also on an error."""
    weight = model.head.weight
    layers = list(model.attention_layers())
    wrapped = [
        CachedKernel(
            layer.kernel,
            layer.init_cache(batch_size, max_len=max_len, device=weight.device, dtype=weight.dtype),
            attention_mask,
        )
        for layer in layers
    ]
    with kernels_swapped(layers, wrapped):
        yield [kernel.cache for kernel in wrapped]


def check_decodable(model, total: int) -> None:
    """`ValueError` unless `model` can decode `total` positions through its caches: `total`
    within its `max_seq_len`. A kernel that cannot decode raises when its cache is made
    (`cached_kernels`)."""
    if total > model.config.max_seq_len:
        raise ValueError(
            f"{OWNER}: prompt + max_new_tokens = {total} exceeds option "
            f"'max_seq_len'={model.config.max_seq_len}"
        )


class Positions:
    """Runs `model` on the next positions of a sequence whose earlier positions are in the
    layers' caches (inside `cached_kernels`, without autograd): `step(new)` takes the tokens
    (B, t) that follow and returns their logits (B, t, vocab_size). It keeps the offset (the
    sinusoidal positions are the tokens' places in the whole sequence; rotary ones are each
    layer's, offset by its cache) and the last position's embedding, which the token shift (if
    on) reads at the next step. `attention_mask` (B, T): the first step's, a left-padded
    prompt's (each row's positions then count from its first real token)."""

    def __init__(self, model, attention_mask: torch.Tensor | None = None):
        self.model = model
        self.start = 0
        self.previous = None  # the last position's embedding, for the token shift
        self.attention_mask = attention_mask
        self.pads = left_pads(OWNER, attention_mask)  # (B,) or None

    def step(self, new: torch.Tensor) -> torch.Tensor:
        """new (B, t) int64 -> logits (B, t, vocab_size)."""
        model, start = self.model, self.start
        x = model.embed(new)  # (B, t, d_model)
        if model.config.positions == "sinusoidal":  # rotary ones: each layer's, offset
            where = sinusoidal_positions(start + new.shape[1], x.shape[-1], x.device, x.dtype)
            if self.pads is None:
                x = x + where[start:]
            else:  # each row's own: its pads' (negative) read as 0, zeroed below
                at = torch.arange(start, start + new.shape[1], device=x.device)
                x = x + where[(at - self.pads[:, None]).clamp_min(0)]  # (B, t, d_model)
        if self.pads is not None and start == 0:
            x = x.masked_fill(~self.attention_mask[..., None], 0.0)  # pads: as before a row
        if model.shift is not None:
            before = x[:, :1] * 0 if self.previous is None else self.previous  # (B, 1, d_model)
            shifted = torch.cat([before, x[:, :-1]], dim=1)  # x_{i-1}
            self.previous = x[:, -1:]
            x = x + model.shift(shifted)
        self.start += new.shape[1]
        return model.head(model.norm(model.blocks(x)))  # (B, t, vocab_size)


def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    seed: int | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """prompt (B, T) int64 -> (B, T + n): the prompt and the generated tokens, n at most
    `max_new_tokens` (fewer once every row has produced `eos_token_id`; a finished row is
    padded with it).

    attention_mask: (B, T) bool or 0/1, True = a real token, for prompts of different lengths
    left-padded (each row's pads first): each row generates what it generates alone (its
    positions counted from its first real token). A kernel that cannot take the padding
    refuses it in one line (`Attention.padded_prefill_reason`).

    temperature 0 is greedy (argmax); above 0 tokens are sampled from softmax(logits / t),
    among the `top_k` most likely and the smallest set whose probability reaches `top_p`
    (nucleus), with a generator seeded with `seed` (the global RNG if None). Runs without
    autograd and in eval mode. `ValueError` if a layer's kernel cannot decode (e.g.
    Linformer), the model is not causal, or T + max_new_tokens exceeds its `max_seq_len`.
    """
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
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"{OWNER}: option 'top_k' must be an int >= 1 or None, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"{OWNER}: option 'top_p' must be in (0, 1] or None, got {top_p!r}")
    if attention_mask is not None:
        attention_mask = token_mask(OWNER, attention_mask, None)
        if (
            not isinstance(attention_mask, torch.Tensor)
            or attention_mask.dtype != torch.bool
            or attention_mask.shape != prompt.shape
            or attention_mask.device != prompt.device
        ):
            got = attention_mask
            if isinstance(got, torch.Tensor):
                got = f"{got.dtype} {tuple(got.shape)} on {got.device}"
            raise ValueError(
                f"{OWNER}: option 'attention_mask' must be a bool (or 0/1) tensor of the "
                f"prompt's shape {tuple(prompt.shape)} on its device, got {got}"
            )
        left_pads(OWNER, attention_mask)  # left padding, or a one-line error
    batch, length = prompt.shape
    total = length + max_new_tokens
    check_decodable(model, total)
    generator = None
    if seed is not None and temperature > 0:
        generator = torch.Generator(device=prompt.device).manual_seed(seed)
    tokens = [prompt]
    done = torch.zeros(batch, 1, dtype=torch.bool, device=prompt.device)  # rows past their eos
    with torch.no_grad(), evaluating(model), cached_kernels(model, batch, total, attention_mask):
        positions, new = Positions(model, attention_mask), prompt
        for _ in range(max_new_tokens):
            logits = positions.step(new)[:, -1]  # (B, vocab)
            new = pick(logits, temperature, generator, top_k=top_k, top_p=top_p)  # (B, 1)
            if eos_token_id is not None:
                new = new.masked_fill(done, eos_token_id)
                done = done | (new == eos_token_id)
            tokens.append(new)
            if eos_token_id is not None and bool(done.all()):
                break
    return torch.cat(tokens, dim=1)


def pick(
    logits: torch.Tensor, temperature: float, generator, *, top_k=None, top_p=None
) -> torch.Tensor:
    """The next token from (B, vocab) logits: argmax at temperature 0, else a sample among the
    `top_k` most likely and the nucleus of probability `top_p`."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)  # (B, vocab)
        probs = F.softmax(ordered, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # the probability of the likelier tokens
        # Keep a token while the probability before it is below top_p (the first always).
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before >= top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)  # (B, 1)
