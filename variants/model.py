"""A small transformer language model whose attention kernel and block type are chosen by name."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from variants.attention.common.base import Attention
from variants.blocks import block_names, build_stack, wire
from variants.checks import require_choice
from variants.generation import generate
from variants.layers import SelfAttention, kernels_swapped, pre_norm_sublayers
from variants.model_config import OWNER, ModelConfig
from variants.positions import check_tokens, sinusoidal_positions
from variants.registry import attention_spec


def build_lm(config: ModelConfig) -> nn.Module:
    """The language model `config` describes: a `TransformerLM`, or with
    `family="hf_llama"` transformers' Llama on the variant (`variants.hf.LlamaLM`; `ImportError`
    naming the extra when transformers is not installed). Both take tokens (B, L) int64 to
    logits (B, L, vocab_size) and carry `config` and `kernels()`."""
    if config.family == "hf_llama":
        try:
            from variants.hf import LlamaLM
        except ModuleNotFoundError as error:
            raise ImportError(
                f"{OWNER}: option 'family'='hf_llama' needs transformers: pip install -e .[hf]"
            ) from error
        return LlamaLM(config)
    return TransformerLM(config)


class TransformerLM(nn.Module):
    """Token embedding + sinusoidal positions -> `depth` blocks -> LayerNorm -> linear head.

    forward(tokens (batch, seq_len) int64) -> logits (batch, seq_len, vocab_size).

    - Positions: fixed sinusoids computed on the fly for the actual length (no table, no
      parameters), or with `positions="rotary"` none here and rotary ones applied to q and k
      in every layer (`variants.layers.rotary`); sequences longer than `max_seq_len` are
      refused with a `ValueError`.
    - Head: untied from the embedding (as in the Reformer's LM), so the embedding keeps the unit
      scale of the sinusoids it is added to while the logits start small.
    - Layers: each layer's kernel is tied to the first layer's (`Attention.tie_to`), which is a
      no-op except for variants that share parameters across layers (Linformer layerwise).
    - Hybrid stacks (`layers`, e.g. 3 deltanet : 1 full): each layer runs its entry's kernel
      (`ModelConfig.layer_kernel`) with its own projections (gates sized for that kernel), in
      any block type; a kernel is tied to the first layer of the same entry. Generation gives
      each layer its own kernel's cache.
    - `shared_qk`: None (the default) is what the variant requires (True for LSH, False
      otherwise); an explicit False for a variant that requires it raises.
    - `token_shift`: each position also receives a learned linear map of the previous
      position's embedding (zero for the first), x_i + W x_{i-1}, before the first block. This
      is the "smeared key" of Olsson et al. (2022): a model then needs no attention head to
      find the token before a key, which a two-layer model otherwise has to learn first (an
      induction head), so recall tasks measure what the kernel retrieves from far away, not
      how fast a previous-token head forms. Causal; off by default.

    `TransformerLM(config)` takes a `ModelConfig` (variants/model_config.py);
    `TransformerLM(**fields)` builds one from its fields, e.g. `TransformerLM(vocab_size=256,
    attention="lsh")` (as before, vocab_size may come first without its name). Every
    option is validated; errors are `ValueError`s naming the option. `config` is the
    `ModelConfig` (shared_qk resolved), `kernels()` yields the attention kernels, one per layer.
    """

    def __init__(self, config: ModelConfig | int | None = None, **fields: Any):
        super().__init__()
        if not isinstance(config, ModelConfig):  # the fields, vocab_size maybe positional
            vocab_size = {} if config is None else {"vocab_size": config}
            config = ModelConfig(**vocab_size, **fields)
        elif fields:
            raise TypeError("TransformerLM: pass a ModelConfig or its fields, not both")
        require_choice(OWNER, "block", config.block, tuple(block_names()))
        if config.family != "attnbench":
            raise ValueError(
                f"{OWNER}: option 'family'={config.family!r} is not this model's "
                "(attnbench); build it with variants.build_lm"
            )
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.shift = (
            nn.Linear(config.d_model, config.d_model, bias=False) if config.token_shift else None
        )
        self.dropout = nn.Dropout(config.dropout)
        # The layers are built here, from the config, each with the kernel built for it here
        # (`ModelConfig.kernel`) just before its projections, so parameters draw from the seed
        # in layer order; a block only wires them (variants.blocks).
        layers = [
            wire(config.block, *pre_norm_sublayers(config, config.layer_kernel(i)))
            for i in range(config.depth)
        ]
        self.blocks = build_stack(config.block, layers)
        _tie(self.kernels(), config.layer_groups())
        # MAD's autoencoder readout (`readout="pooled"`): a non-expanding two-layer MLP.
        self.decoder = (
            nn.Sequential(
                nn.LayerNorm(config.d_model),
                nn.Linear(config.d_model, config.d_model),
                nn.GELU(),
                nn.LayerNorm(config.d_model),
                nn.Linear(config.d_model, config.d_model),
                nn.GELU(),
            )
            if config.readout == "pooled"
            else None
        )
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def kernels(self) -> Iterator[Attention]:
        """The attention kernels, one per layer, in layer order."""
        return (layer.kernel for layer in self.attention_layers())

    @contextmanager
    def kernels_replaced(
        self, attention: str, attention_options: Mapping[str, Any] | None = None
    ) -> Iterator[None]:
        """Within the block every layer runs variant `attention` with `attention_options`.

        The kernels are built as the model built its own (`config.kernel`, the model options
        from `config`), one per layer on that layer's device and dtype
        (`SelfAttention.as_replacement`), and tied as the model ties its own (Linformer's
        layerwise sharing); the projections stay as trained, as in the Reformer's Table 2 (train
        with one attention, evaluate with another). The model's own kernels come back on leaving
        the block, also on an error. A kernel the config or the layers refuse raises
        `ValueError` (`UnsupportedCombination`) before any is replaced.
        """
        spec = attention_spec(attention)
        options = attention_options or {}
        layers = list(self.attention_layers())
        replacements = [layer.as_replacement(self.config.kernel(spec, options)) for layer in layers]
        _tie(replacements)
        with kernels_swapped(layers, replacements):
            yield

    def attention_layers(self) -> Iterator[SelfAttention]:
        """The attention sublayers, one per layer, in layer order."""
        return (m for m in self.blocks.modules() if isinstance(m, SelfAttention))

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) int64 -> the last block's output (B, L, d_model), before the final
        norm and the head."""
        check_tokens(OWNER, tokens, self.config.max_seq_len)
        length = tokens.shape[1]
        x = self.embed(tokens)  # (B, L, d_model)
        if self.config.positions == "sinusoidal":  # rotary positions live in the layers
            x = x + sinusoidal_positions(length, self.config.d_model, x.device, x.dtype)
        if self.shift is not None:
            previous = F.pad(x[:, :-1], (0, 0, 1, 0))  # (B, L, d_model): x_{i-1}, zeros at 0
            x = x + self.shift(previous)
        x = self.dropout(x)
        return self.blocks(x)  # (B, L, d_model)

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) int64 -> what the head reads at each position (B, L, d_model): the
        last block's output, or with `readout="pooled"` the decoder MLP of the last position's
        output plus each position's sinusoid (so a position's logits know only what the last
        state holds: MAD's compression)."""
        x = self.hidden(tokens)  # (B, L, d_model)
        if self.decoder is None:
            return x
        length = tokens.shape[1]
        positions = sinusoidal_positions(length, self.config.d_model, x.device, x.dtype)
        return self.decoder(x[:, -1:] + positions)  # (B, L, d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) int64 -> logits (B, L, vocab_size)."""
        return self.head(self.norm(self.features(tokens)))  # (B, L, vocab_size)

    def loss(
        self, tokens: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor
    ) -> torch.Tensor:
        """Mean cross-entropy of `targets` over the `loss_mask` positions, in float32 (float64
        for a float64 model).

        tokens, targets: (B, L) int64; loss_mask: (B, L) bool. Equal to
        `F.cross_entropy(self(tokens)[loss_mask].float(), targets[loss_mask])`. With
        `config.loss_chunks` > 1 the final norm, the head and the cross-entropy run over that
        many pieces of the sequence (sizes differ by at most one) under activation
        checkpointing: no (B, L, vocab_size) logits are ever live, only one piece's, in forward
        and in backward; the price is one more norm and head per step. A mask with no position
        gives NaN, as the plain form.
        """
        x = self.features(tokens)  # (B, L, d_model)
        count = loss_mask.sum()
        n_pieces = min(self.config.loss_chunks, x.shape[1])
        if n_pieces == 1:
            logits = self.head(self.norm(x))  # (B, L, vocab_size)
            return F.cross_entropy(_at_least_float32(logits[loss_mask]), targets[loss_mask])
        total = 0.0
        pieces = zip(
            torch.tensor_split(x, n_pieces, dim=1),
            torch.tensor_split(targets, n_pieces, dim=1),
            torch.tensor_split(loss_mask, n_pieces, dim=1),
            strict=True,
        )  # each piece (B, ~L/n_pieces, ...)
        for piece, piece_targets, piece_mask in pieces:
            if torch.is_grad_enabled():
                summed = checkpoint(
                    self._summed_loss, piece, piece_targets, piece_mask, use_reentrant=False
                )
            else:
                summed = self._summed_loss(piece, piece_targets, piece_mask)
            total = total + summed
        return total / count

    def _summed_loss(
        self, x: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor
    ) -> torch.Tensor:
        """Summed cross-entropy of a piece (at least float32): x (B, l, d_model), targets and
        loss_mask (B, l) -> scalar."""
        logits = _at_least_float32(self.head(self.norm(x))[loss_mask])  # (n, vocab_size)
        return F.cross_entropy(logits, targets[loss_mask], reduction="sum")

    def generate(
        self,
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
        """prompt (B, T) int64 -> (B, T + n) tokens, through every layer's decoding cache:
        greedy at temperature 0, else sampled (top_k, top_p; seeded with `seed`); a row that
        produced `eos_token_id` continues with it, and generation stops once every row has.
        `attention_mask` (B, T), True = a real token: prompts of different lengths
        left-padded, each row generating what it generates alone.
        See `variants.generation.generate`. A `pooled` readout does not generate (its logits
        are not next-token predictions): `ValueError`."""
        if self.config.readout != "tokens":
            raise ValueError(
                f"{OWNER}: readout={self.config.readout!r} does not generate "
                "(only readout='tokens' predicts next tokens)"
            )
        return generate(
            self, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            eos_token_id=eos_token_id, seed=seed, attention_mask=attention_mask,
        )  # fmt: skip


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits in float32 (the softmax of half logits loses most of its digits)."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _tie(kernels: Iterable[Attention], groups: Iterable[int] | None = None) -> None:
    """Tie every kernel to the first of its group (`Attention.tie_to`; `groups`: one per kernel,
    default all one group, a hybrid's `ModelConfig.layer_groups`): a no-op except for variants
    that share parameters across layers (Linformer layerwise)."""
    kernels = list(kernels)
    groups = [0] * len(kernels) if groups is None else list(groups)
    firsts: dict[int, Attention] = {}
    for kernel, group in zip(kernels, groups, strict=True):
        first = firsts.setdefault(group, kernel)
        if first is not kernel:
            kernel.tie_to(first)
