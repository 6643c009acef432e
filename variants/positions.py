"""Token positions, below the models that use them: the fixed sinusoidal encoding
(`TransformerLM`'s, and generation's at a sequence's later places) and the check that a batch
of tokens fits a model's `max_seq_len` (`TransformerLM`'s and `variants.hf.LlamaLM`'s)."""

from __future__ import annotations

import math

import torch


def check_tokens(owner: str, tokens: torch.Tensor, max_seq_len: int) -> None:
    """`ValueError` naming `owner` unless tokens are (batch, seq_len) with seq_len at most
    option `max_seq_len`."""
    if tokens.dim() != 2:
        raise ValueError(
            f"{owner}: tokens must have shape (batch, seq_len), got {tuple(tokens.shape)}"
        )
    if tokens.shape[1] > max_seq_len:
        raise ValueError(
            f"{owner}: seq_len {tokens.shape[1]} exceeds option 'max_seq_len'={max_seq_len}"
        )


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
