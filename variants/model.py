"""A small transformer language model whose attention kernel and block type are chosen by name."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from variants.attention.base import Attention
from variants.blocks import block_names, build_block, build_stack
from variants.checks import (
    require_bool,
    require_choice,
    require_positive_int,
    require_probability,
)
from variants.registry import attention_spec


class TransformerLM(nn.Module):
    """Token embedding + sinusoidal positions -> `depth` blocks -> LayerNorm -> linear head.

    forward(tokens (batch, seq_len) int64) -> logits (batch, seq_len, vocab_size).

    - Positions: fixed sinusoids computed on the fly for the actual length (no table, no
      parameters); sequences longer than `max_seq_len` are refused with a `ValueError`.
    - Head: untied from the embedding (as in the Reformer's LM), so the embedding keeps the unit
      scale of the sinusoids it is added to while the logits start small.
    - Layers: each layer's kernel is tied to the first layer's (`Attention.tie_to`), which is a
      no-op except for variants that share parameters across layers (Linformer layerwise).
    - `shared_qk`: None (the default) is what the variant requires (True for LSH, False
      otherwise); an explicit False for a variant that requires it raises.
    - `token_shift`: each position also receives a learned linear map of the previous
      position's embedding (zero for the first), x_i + W x_{i-1}, before the first block. This
      is the "smeared key" of Olsson et al. (2022): a model then needs no attention head to
      find the token before a key, which a two-layer model otherwise has to learn first (an
      induction head), so recall tasks measure what the kernel retrieves from far away, not
      how fast a previous-token head forms. Causal; off by default.

    Every option is validated; errors are `ValueError`s naming the option. `config` holds the
    constructor arguments, `kernels()` yields the attention kernels, one per layer.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        n_heads: int = 4,
        depth: int = 2,
        ff_mult: int = 4,
        dropout: float = 0.0,
        ff_chunks: int = 1,
        max_seq_len: int = 4096,
        attention: str = "full",
        attention_options: dict[str, Any] | None = None,
        block: str = "residual",
        shared_qk: bool | None = None,
        causal: bool = True,
        token_shift: bool = False,
    ):
        super().__init__()
        owner = "TransformerLM"
        require_positive_int(owner, "vocab_size", vocab_size)
        require_positive_int(owner, "d_model", d_model)
        require_positive_int(owner, "depth", depth)
        require_positive_int(owner, "max_seq_len", max_seq_len)
        dropout = require_probability(owner, "dropout", dropout)
        require_choice(owner, "block", block, tuple(block_names()))
        require_bool(owner, "token_shift", token_shift)
        spec = attention_spec(attention)  # unknown name -> ValueError listing the variants
        if shared_qk is None:
            shared_qk = spec.shared_qk_required
        # The layers validate the remaining options (n_heads, ff_mult, ff_chunks, shared_qk, ...).
        self.config = {
            "vocab_size": vocab_size,
            "d_model": d_model,
            "n_heads": n_heads,
            "depth": depth,
            "ff_mult": ff_mult,
            "dropout": dropout,
            "ff_chunks": ff_chunks,
            "max_seq_len": max_seq_len,
            "attention": attention,
            "attention_options": dict(attention_options or {}),
            "block": block,
            "shared_qk": shared_qk,
            "causal": causal,
            "token_shift": token_shift,
        }
        self.max_seq_len = max_seq_len
        self.d_model = d_model

        self.embed = nn.Embedding(vocab_size, d_model)
        self.shift = nn.Linear(d_model, d_model, bias=False) if token_shift else None
        self.dropout = nn.Dropout(dropout)
        layers = [
            build_block(
                block,
                d_model,
                n_heads,
                attention=attention,
                attention_options=attention_options,
                ff_mult=ff_mult,
                dropout=dropout,
                ff_chunks=ff_chunks,
                causal=causal,
                shared_qk=shared_qk,
                max_seq_len=max_seq_len,
            )
            for _ in range(depth)
        ]
        self.blocks = build_stack(block, layers)
        first, *rest = self.kernels()
        for kernel in rest:
            kernel.tie_to(first)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def kernels(self) -> Iterator[Attention]:
        """The attention kernels, one per layer, in layer order."""
        return (m for m in self.blocks.modules() if isinstance(m, Attention))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) int64 -> logits (B, L, vocab_size)."""
        if tokens.dim() != 2:
            raise ValueError(
                f"TransformerLM: tokens must have shape (batch, seq_len), got {tuple(tokens.shape)}"
            )
        length = tokens.shape[1]
        if length > self.max_seq_len:
            raise ValueError(
                f"TransformerLM: seq_len {length} exceeds option 'max_seq_len'={self.max_seq_len}"
            )
        x = self.embed(tokens)  # (B, L, d_model)
        x = x + sinusoidal_positions(length, self.d_model, x.device, x.dtype)  # (B, L, d_model)
        if self.shift is not None:
            previous = F.pad(x[:, :-1], (0, 0, 1, 0))  # (B, L, d_model): x_{i-1}, zeros at 0
            x = x + self.shift(previous)
        x = self.dropout(x)
        x = self.blocks(x)  # (B, L, d_model)
        x = self.norm(x)
        return self.head(x)  # (B, L, vocab_size)


def sinusoidal_positions(
    length: int, d_model: int, device=None, dtype=torch.float32
) -> torch.Tensor:
    """Fixed positional encoding (L, d_model): [sin(p w_i), cos(p w_i)], w_i = 10000^(-2i/d).

    Sines fill the first half of the features and cosines the second (an odd d_model drops the
    last cosine).
    """
    n_freqs = (d_model + 1) // 2
    freqs = torch.exp(
        torch.arange(n_freqs, device=device, dtype=torch.float32)
        * (-2 * math.log(10000.0) / d_model)
    )  # (d_model/2,)
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * freqs  # (L, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)[:, :d_model].to(dtype)  # (L, d_model)
