"""Hugging Face models on attnbench variants: `register()` adds each variant to transformers'
attention interface and to its mask interface as `attnbench_<name>`.

    import variants.hf
    variants.hf.register()  # every variant, default options
    model = LlamaForCausalLM(LlamaConfig(..., attn_implementation="attnbench_linear"))

The optional extra `pip install -e .[hf]` installs transformers (5.x); nothing else in
`variants` imports this module. Masks: only the padding is passed on (True = a real token);
the kernel is built causal where the attention module is. `generate(...,
cache=KernelCache(max_len))` decodes on the kernels' own caches (a left-padded batch prefilled
where the kernel can); HF's default cache runs a causal forward per token. Gated, shared-QK,
parametrised and non-causal variants are refused when registered (`registry.hf_reason`).

Why both interfaces, decoding and what is refused, in full: docs/variants/hf.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import (
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
    prepare_padding_mask,
)

from variants.attention.common.base import MOVED_BY_LEFT_PADDING, Attention
from variants.checks import UnsupportedCombination
from variants.positions import check_tokens
from variants.registry import AttentionSpec, attention_names, attention_spec, hf_reason

PREFIX = "attnbench_"

# Options of each registered variant, by variant name (`register`).
_OPTIONS: dict[str, dict[str, Any]] = {}
# Kernels built so far, by (variant, options, model options, device, dtype).
_KERNELS: dict[tuple, Attention] = {}
# Keyword arguments some models pass that change the attention itself: refused when set.
_REFUSED_KWARGS = ("softcap", "sliding_window", "s_aux", "position_bias")
# The shape a variant is built for once when registered, to check its options' values.
PROBE_HEADS, PROBE_HEAD_DIM = 4, 64


def register(
    names: Iterable[str] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """Register variants `names` (default every one) with transformers as
    `attnbench_<name>`, each with its `options[name]` (default the variant's defaults).

    Returns the `attn_implementation` names registered. `ValueError` for an unknown variant
    (listing the names) or option (listing the variant's options) or an option's bad value
    (each variant is built once here), `UnsupportedCombination` for a named variant an HF model
    cannot run (`registry.hf_reason`; by default those are left out), and then nothing is
    registered. Registering a name
    again replaces its options and drops the kernels built with the old ones.
    """
    options = dict(options or {})
    explicit = names is not None
    names = attention_names() if names is None else list(names)
    for name in [*names, *options]:
        attention_spec(name)  # unknown -> lists the names
    stray = sorted(set(options) - set(names))
    if stray:
        raise ValueError(f"hf: option 'options' names {stray[0]!r}, which is not registered here")
    # Every name's options checked before any is registered: a refused call changes nothing.
    checked = {name: _checked_options(name, options.get(name, {})) for name in names}
    refused = {name: hf_reason(name, checked[name]) for name in names}
    if explicit:
        for name, reason in refused.items():
            if reason:
                raise UnsupportedCombination(f"hf: attention {name!r} is not supported: {reason}")
    names = [name for name in names if not refused[name]]
    registered = []
    for name in names:
        _OPTIONS[name] = checked[name]
        for key in [key for key in _KERNELS if key[0] == name]:
            del _KERNELS[key]
        implementation = PREFIX + name
        AttentionInterface.register(implementation, _attention_function(name))
        AttentionMaskInterface.register(implementation, padding_mask)
        registered.append(implementation)
    return registered


def _checked_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Variant `name`'s `options`, their names and values checked: the kernel built once, as
    `kernel_for` builds it for PROBE_HEADS heads of PROBE_HEAD_DIM (values are checked by the
    constructors), so that a bad value is a `ValueError` here and not at every later forward.
    `UnsupportedCombination` (valid options the model's shape or direction may decide) is left
    to the first forward, as the variants HF cannot run at all are."""
    spec = attention_spec(name)
    checked = spec.kernel_options(options)
    model = _model_options(spec, PROBE_HEADS, PROBE_HEAD_DIM, causal=spec.causal_supported)
    try:
        spec.built(checked, model)
    except UnsupportedCombination:
        pass
    return checked


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function=causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The mask interface's function for every attnbench variant (the signature of
    `transformers.masking_utils.sdpa_mask`): the padding alone, (B, 1, 1, kv_length) bool,
    True = a real token, or None when no key is padded. Causality is the kernel's.

    attention_mask: (B, >= kv_offset + kv_length) bool, the model's 2-D padding mask.
    `UnsupportedCombination` for another pattern than causal or bidirectional, or for keys that
    do not end where the queries end (a static or sliding cache)."""
    if (
        mask_function is not causal_mask_function
        and mask_function is not bidirectional_mask_function
    ):
        raise UnsupportedCombination(
            f"hf: mask function {getattr(mask_function, '__name__', mask_function)!r} is not "
            "supported: attnbench kernels take causal or bidirectional masks with padding "
            "(no sliding windows, packed sequences or custom mask functions)"
        )
    if int(q_offset) + q_length != kv_offset + kv_length:
        raise UnsupportedCombination(
            f"hf: queries at {int(q_offset)}..{int(q_offset) + q_length} over keys at "
            f"{kv_offset}..{kv_offset + kv_length}: the keys must end with the queries "
            "(no static or sliding caches; the default DynamicCache does)"
        )
    if attention_mask is None or bool(attention_mask.all()):
        return None
    keep = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    keep = keep[:, kv_offset : kv_offset + kv_length].bool()  # (B, L_kv)
    return keep[:, None, None, :]  # (B, 1, 1, L_kv)


def _attention_function(name: str):
    """The attention function of variant `name`, as transformers calls one."""

    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """query (B, H, L_q, D), key and value (B, H_kv, L_kv, D), H_kv dividing H ->
        ((B, L_q, H, D), None), the layout HF's attention functions return."""
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        _check_call(name, query, key, attention_mask, dropout, scaling, causal, kwargs)
        kernel = _kernel(name, query, causal=bool(causal)).train(module.training)
        layer = _cache_layer_of(key)  # before grouping: the keys its `update` returned
        head_dim = query.shape[-1]
        if scaling is not None and not math.isclose(scaling, head_dim**-0.5, rel_tol=1e-6):
            if not kernel.takes_scale:
                raise UnsupportedCombination(
                    f"hf: attention {name!r}: option 'scaling'={scaling} is not 1/sqrt(head_dim)"
                    f" = {head_dim**-0.5:.6g}, and the variant takes no other softmax scale"
                )
            query = query * (scaling * head_dim**0.5)  # the kernel's 1/sqrt(D) then gives it
        key, value = _grouped(kernel, query, key), _grouped(kernel, query, value)
        extras = {}
        if attention_mask is not None:
            if not getattr(kernel, "supports_padding_mask", False):
                raise UnsupportedCombination(
                    f"hf: attention {name!r} does not support padding masks "
                    "(option 'attention_mask')"
                )
            keep = attention_mask[:, 0, 0, :]  # (B, L_kv)
            if not kernel.shift_invariant and bool((~keep[:, :-1] & keep[:, 1:]).any()):
                raise UnsupportedCombination(
                    f"hf: attention {name!r} does not take left-padded batches: "
                    f"{MOVED_BY_LEFT_PADDING}; pad on the right or generate prompts one by one"
                )
            extras["attention_mask"] = keep
        if layer is not None:  # generation on the kernel's own cache (`KernelCache`)
            return layer.attend(kernel, query, key, value, extras.get("attention_mask"))
        q_length, kv_length = query.shape[2], key.shape[2]
        if q_length < kv_length:  # decoding: the new queries are the last positions
            before = query.new_zeros(*query.shape[:2], kv_length - q_length, query.shape[-1])
            query = torch.cat([before, query], dim=2)  # (B, H, L_kv, D)
        out = kernel(query, key, value, **extras)[:, :, -q_length:]  # (B, H, L_q, D)
        return out.transpose(1, 2).contiguous(), None  # (B, L_q, H, D)

    attention.__name__ = f"{PREFIX}{name}_attention"
    return attention


# The cache layer whose `update` returned the keys being attended, and those keys: the
# attention function is called right after its layer's `update` (HF's attention modules do).
_LAST_UPDATE: list = [None, None]


def _cache_layer_of(key: torch.Tensor) -> KernelCacheLayer | None:
    """The cache layer that returned `key`, taken once (no tensor is held past its call)."""
    layer, keys = _LAST_UPDATE
    _LAST_UPDATE[:] = [None, None]
    return layer if keys is key else None


class KernelCacheLayer(CacheLayerMixin):
    """One decoder layer's state in generation: its attention kernel's own decoding cache.

    `update` keeps nothing of HF's K/V: it passes the new keys on and counts them, and the
    attention function prefills (first call) or decodes (then) the kernel's cache with them."""

    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.seen = 0  # positions of the sequence so far
        self.kernel_cache = None

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        self.is_initialized = True
        self.seen += key_states.shape[2]
        _LAST_UPDATE[:] = [self, key_states]
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, self.seen  # the keys a call sees: the new ones, after `seen`

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.max_len

    def reset(self) -> None:
        self.seen, self.kernel_cache = 0, None

    def reorder_cache(self, beam_idx) -> None:
        raise UnsupportedCombination(
            "hf: KernelCache does not reorder for beam search (a kernel's state is not a list "
            "of keys); use num_beams=1"
        )

    def attend(self, kernel: Attention, query, key, value, keep) -> tuple[torch.Tensor, None]:
        """The new queries (B, H, T, D) over the kernel's cache, after adding key, value
        (B, H_kv, T, D): prefill on the first call, then one decode step per position.
        keep: None or (B, L_kv) bool, True = a real token: the prompt left-padded (the kernel
        refuses what it cannot take, `Attention.padded_prefill_reason`), every later position
        real."""
        if not kernel.supports_decode:
            raise UnsupportedCombination(
                f"hf: attention {kernel.name!r} cannot generate on its own cache: "
                f"{kernel.decode_reason}"
            )
        if self.kernel_cache is None:
            batch, heads, _, dim = query.shape
            self.kernel_cache = kernel.init_cache(
                batch, heads, dim, max_len=self.max_len, device=query.device,
                dtype=query.dtype, n_kv_heads=key.shape[1],
            )  # fmt: skip
            out = kernel.prefill(query, key, value, self.kernel_cache, attention_mask=keep)
        elif keep is not None and not bool(keep[:, -query.shape[2] :].all()):
            raise UnsupportedCombination(
                f"hf: attention {kernel.name!r}: KernelCache takes padding in the prompt only "
                "(option 'attention_mask' pads a new position)"
            )
        else:
            steps = [
                kernel.decode(
                    query[:, :, t : t + 1],
                    key[:, :, t : t + 1],
                    value[:, :, t : t + 1],
                    self.kernel_cache,
                )  # fmt: skip
                for t in range(query.shape[2])
            ]
            out = torch.cat(steps, dim=2)  # (B, H, T, D)
        return out.transpose(1, 2).contiguous(), None  # (B, T, H, D)


class KernelCache(Cache):
    """HF's cache object holding each layer's kernel cache (`KernelCacheLayer`), for
    `model.generate(..., cache=KernelCache(max_len=...))` on `attnbench_<name>`
    models: `max_len` bounds prompt plus new tokens."""

    def __init__(self, max_len: int):
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
            raise ValueError(f"hf: option 'max_len' must be a positive int, got {max_len!r}")
        super().__init__(layer_class_to_replicate=lambda: KernelCacheLayer(max_len))


def _check_call(name, query, key, attention_mask, dropout, scaling, causal, kwargs) -> None:
    """`UnsupportedCombination` for what the variant's kernel cannot compute as asked."""
    if dropout:
        raise UnsupportedCombination(
            f"hf: attention {name!r}: option 'dropout'={dropout}: kernels have no attention "
            "dropout (set attention_dropout=0)"
        )
    for option in _REFUSED_KWARGS:
        if kwargs.get(option) is not None:
            raise UnsupportedCombination(
                f"hf: attention {name!r}: option {option!r} is not supported"
            )
    if attention_mask is not None and (
        attention_mask.dtype != torch.bool
        or attention_mask.dim() != 4
        or attention_mask.shape[2] != 1
    ):
        raise UnsupportedCombination(
            f"hf: attention {name!r}: a prepared attention mask of shape "
            f"{tuple(attention_mask.shape)} and dtype {attention_mask.dtype} is not supported; "
            "pass the 2-D padding mask (attention_mask=(batch, seq_len))"
        )
    if query.shape[2] != key.shape[2] and not causal:
        raise UnsupportedCombination(
            f"hf: attention {name!r}: {query.shape[2]} queries over {key.shape[2]} keys needs a "
            "causal layer (cross-attention is not supported)"
        )


def _kernel(name: str, query: torch.Tensor, *, causal: bool) -> Attention:
    """Variant `name`'s kernel for queries shaped as `query` (B, H, L, D)."""
    return kernel_for(
        name, query.shape[1], query.shape[-1], causal=causal, device=query.device,
        dtype=query.dtype,
    )  # fmt: skip


def kernel_for(
    name: str,
    n_heads: int,
    head_dim: int,
    *,
    causal: bool,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Attention:
    """The kernel registered variant `name` runs for `n_heads` query heads of `head_dim`,
    built once and kept (`_KERNELS`), shared by every layer and call; `UnsupportedCombination`
    if it has parameters."""
    spec = attention_spec(name)
    model = _model_options(spec, n_heads, head_dim, causal=causal)
    options = _OPTIONS.get(name, {})
    device = torch.device(device)
    key = (name, repr(sorted(options.items())), repr(sorted(model.items())), device, dtype)
    if key not in _KERNELS:
        kernel = spec.built(options, model)  # `options` checked when registered
        if any(True for _ in kernel.parameters()):
            raise UnsupportedCombination(
                f"hf: attention {name!r} is not supported: its kernel has parameters, which "
                "would belong to no model (kernels are shared between layers)"
            )
        _KERNELS[key] = kernel.to(device=device, dtype=dtype)
    return _KERNELS[key]


def _model_options(spec: AttentionSpec, n_heads: int, head_dim: int, *, causal: bool) -> dict:
    """The model options `kernel_for` builds variant `spec` with (no shared QK here)."""
    model = {"causal": causal, "n_heads": n_heads, "head_dim": head_dim, "shared_qk": False}
    # Only those the variant declares (as `built` takes them) key its kernel: a variant that
    # does not take n_heads keeps one kernel for every head count.
    return {k: v for k, v in model.items() if k in spec.model_options}


def _grouped(kernel: Attention, query: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Keys or values x (B, H_kv, L, D) for queries (B, H, L_q, D): as they are for a kernel
    that takes grouped KV heads, else each KV head repeated for its H / H_kv query heads."""
    groups = query.shape[1] // x.shape[1]
    if groups == 1 or getattr(kernel, "supports_gqa", False):
        return x
    return x.repeat_interleave(groups, dim=1)  # (B, H, L, D)


class LlamaLM(nn.Module):
    """transformers' LlamaForCausalLM, randomly initialised from a `ModelConfig` with
    `family="hf_llama"`, its attention the config's variant (registered here with the config's
    attention options): the swap a user makes in their own HF model, trained from scratch.

    forward(tokens (B, L) int64) -> logits (B, L, vocab_size), as `TransformerLM`'s. The Llama:
    hidden d_model, `depth` layers, n_heads query heads over `kv_heads` key/value heads, a
    SwiGLU of width ff_mult * d_model, RMSNorm, rotary positions up to max_seq_len, biases in
    the attention projections as `projection_bias`, an untied head. `config` is the
    `ModelConfig`, `kernels()` yields the attention kernel once per layer (one kernel serves
    every layer, `kernel_for`). A variant HF cannot run (`registry.hf_reason`) raises
    `UnsupportedCombination` here, before anything is trained.
    """

    def __init__(self, config):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        if config.family != "hf_llama":
            raise ValueError(
                f"hf: LlamaLM builds option 'family'='hf_llama', got {config.family!r}"
            )
        register([config.attention], {config.attention: dict(config.attention_options)})
        self.config = config
        llama = LlamaConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            intermediate_size=config.ff_mult * config.d_model,
            num_hidden_layers=config.depth,
            num_attention_heads=config.n_heads,
            num_key_value_heads=config.kv_heads,
            max_position_embeddings=config.max_seq_len,
            attention_bias=config.projection_bias,
            attention_dropout=0.0,
            tie_word_embeddings=False,
            use_cache=False,
            attn_implementation=PREFIX + config.attention,
        )
        self.lm = LlamaForCausalLM(llama)
        next(self.kernels())  # a kernel with parameters is refused now, not at the first step

    def kernels(self):
        """The attention kernel, once per layer (the same kernel: HF layers share it), for the
        device the model is on."""
        device = next(self.lm.parameters()).device
        kernel = kernel_for(
            self.config.attention, self.config.n_heads, self.config.head_dim, causal=True,
            device=device,
        )  # fmt: skip
        return (kernel for _ in range(self.config.depth))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (B, L) int64 -> logits (B, L, vocab_size)."""
        check_tokens("LlamaLM", tokens, self.config.max_seq_len)
        return self.lm(input_ids=tokens, use_cache=False).logits  # (B, L, vocab_size)
