"""Input validation shared by kernels, blocks and the model.

Every error is a `ValueError` whose message names the owner (a variant, block or model), the
offending option and the constraint it broke, so a config typo is fixed from the message alone.
Options that are each valid but that a variant cannot combine raise its subclass
`UnsupportedCombination`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: the config's checks import this without torch
    import torch


class UnsupportedCombination(ValueError):
    """Valid options that this variant cannot combine, e.g. a causal Linformer or LSH without
    shared QK: the runner records such a configuration as `skipped`, any other `ValueError` (an
    invalid option) as `error`."""


def require_positive_int(owner: str, option: str, value: Any) -> int:
    """Return `value` if it is an int > 0, else raise `ValueError` naming `owner` and `option`."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: option {option!r} must be a positive integer, got {value!r}")
    return value


def require_non_negative_int(owner: str, option: str, value: Any) -> int:
    """Return `value` if it is an int >= 0, else raise `ValueError` naming `owner` and `option`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"{owner}: option {option!r} must be a non-negative integer, got {value!r}"
        )
    return value


def require_positive_int_or_auto(owner: str, option: str, value: Any) -> int | str:
    """Return `value` if it is an int > 0 or the string 'auto', else raise `ValueError`."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(
            f"{owner}: option {option!r} must be a positive integer or 'auto', got {value!r}"
        )
    return value


def require_bool(owner: str, option: str, value: Any) -> bool:
    """Return `value` if it is a bool (not 0/1 or a string), else raise `ValueError`."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: option {option!r} must be true or false, got {value!r}")
    return value


def require_choice(owner: str, option: str, value: Any, choices: tuple[str, ...]) -> str:
    """Return `value` if it is one of `choices`, else raise `ValueError` listing them."""
    if value not in choices:
        raise ValueError(
            f"{owner}: option {option!r} must be one of {', '.join(choices)}; got {value!r}"
        )
    return value


def require_positive_number(owner: str, option: str, value: Any) -> float:
    """Return `value` as float if it is a number > 0 (not a bool), else raise `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{owner}: option {option!r} must be a positive number, got {value!r}")
    return float(value)


def require_probability(owner: str, option: str, value: Any) -> float:
    """Return `value` as float if 0 <= value < 1, else raise `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{owner}: option {option!r} must be in [0, 1), got {value!r}")
    return float(value)


def require_divisible(owner: str, option: str, value: int, divisor_option: str, divisor: int):
    """Raise `ValueError` unless `divisor` divides `value`."""
    if value % divisor:
        raise ValueError(
            f"{owner}: option {option!r}={value} must be divisible by {divisor_option!r}={divisor}"
        )


def check_qkv(
    owner: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, fewer_queries=False
) -> None:
    """Check q (batch, heads, seq_len, head_dim) and k, v (batch, kv_heads, seq_len, head_dim)
    are tensors of one floating dtype (integer inputs would fail deep in a kernel, or come back
    as integers), k and v of one shape, and kv_heads a divisor of heads (grouped KV heads: query
    head h reads key head h // (heads / kv_heads); kv_heads = heads is plain multi-head).
    `fewer_queries`: q may hold fewer positions than k (the last ones of the keys')."""
    for label, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{owner}: input {label} must have shape (batch, heads, seq_len, head_dim), "
                f"got {tuple(t.shape)}"
            )
    same_but_heads = q.shape[0] == k.shape[0] and q.shape[3] == k.shape[3]
    if fewer_queries:
        same_but_heads = same_but_heads and 0 < q.shape[2] <= k.shape[2]
    else:
        same_but_heads = same_but_heads and q.shape[2] == k.shape[2]
    if k.shape != v.shape or not same_but_heads:
        raise ValueError(
            f"{owner}: q, k and v must have the same shape (batch, heads, seq_len, head_dim), "
            f"but for k and v's heads (kv_heads dividing q's heads), got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"{owner}: k and v's heads ({k.shape[1]}) must divide q's heads ({q.shape[1]}) "
            "(grouped KV heads)"
        )
    if q.shape[2] == 0:
        raise ValueError(f"{owner}: seq_len must be positive, got 0")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(
            f"{owner}: q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not q.dtype.is_floating_point:
        raise ValueError(f"{owner}: q, k, v must be floating point, got {q.dtype}")


def token_mask(owner: str, attention_mask: Any, key_padding_mask: Any) -> Any:
    """The (batch, seq_len) bool mask of real tokens from `attention_mask` (True or 1 = a token:
    Hugging Face's and SDPA's convention; a 0/1 integer tensor is taken as bool). PyTorch's
    `key_padding_mask` means the opposite (True = padding), so it is refused by name rather
    than read either way."""
    import torch

    if key_padding_mask is not None:
        raise ValueError(
            f"{owner}: option 'key_padding_mask' is not taken: attnbench's mask is "
            "attention_mask, True/1 = a token (Hugging Face's and SDPA's convention); PyTorch's "
            "key_padding_mask (True = padding) is its negation: pass "
            "attention_mask=~key_padding_mask"
        )
    if (
        isinstance(attention_mask, torch.Tensor)
        and not attention_mask.dtype.is_floating_point
        and attention_mask.dtype != torch.bool
        and bool(((attention_mask == 0) | (attention_mask == 1)).all())
    ):
        return attention_mask.bool()
    return attention_mask


def check_attention_mask(owner: str, mask: Any, q: torch.Tensor) -> None:
    """Check `attention_mask` is a (batch, seq_len) bool tensor on q's device, True = a real
    token (the flash-attention / Hugging Face convention; PyTorch's MultiheadAttention uses the
    opposite)."""
    import torch

    wanted = (q.shape[0], q.shape[2])
    if (
        not isinstance(mask, torch.Tensor)
        or mask.dtype != torch.bool
        or tuple(mask.shape) != wanted
    ):
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else repr(mask)
        raise ValueError(
            f"{owner}: option 'attention_mask' must be a bool (or 0/1) tensor of shape (batch, "
            f"seq_len) = {wanted} with True = a real token (keep), False = padding; got {got}"
        )
    if mask.device != q.device:
        raise ValueError(f"{owner}: option 'attention_mask' is on {mask.device}, q on {q.device}")


def check_segment_ids(owner: str, ids: Any, q: torch.Tensor) -> None:
    """Check `segment_ids` is a (batch, seq_len) integer tensor on q's device, non-decreasing
    along the sequence (each document one contiguous run of positions)."""
    import torch

    wanted = (q.shape[0], q.shape[2])
    if (
        not isinstance(ids, torch.Tensor)
        or ids.dtype.is_floating_point
        or ids.dtype.is_complex
        or ids.dtype == torch.bool
        or tuple(ids.shape) != wanted
    ):
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else repr(ids)
        raise ValueError(
            f"{owner}: option 'segment_ids' must be an integer tensor of shape (batch, seq_len)"
            f" = {wanted} (document ids of packed sequences); got {got}"
        )
    if ids.device != q.device:
        raise ValueError(f"{owner}: option 'segment_ids' is on {ids.device}, q on {q.device}")
    if bool((ids[:, 1:] < ids[:, :-1]).any()):
        raise ValueError(
            f"{owner}: option 'segment_ids' must be non-decreasing along seq_len (each "
            "document one contiguous run of positions)"
        )
