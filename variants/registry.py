"""The attention registry: variants by name, their options and their capabilities.

Every attention variant is a subclass of `variants.attention.common.base.Attention` decorated with
`register_attention`. Its options are its constructor's keyword arguments, and their defaults are
the code's defaults, which `conf/attention/<name>.yaml` mirrors (a test checks that they agree).
A preset (`register_preset`) is a variant under another name with other defaults, e.g. `bigbird`
is `combined` with BigBird's published shape: it builds, records and plots under its own name.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from variants.checks import UnsupportedCombination
from variants.registry_base import Registry

# Every variant and preset by name; importing variants.attention registers the built-in ones.
_ATTENTION: Registry[AttentionSpec] = Registry(
    "attention variant", builtins=["variants.attention"], order=lambda spec: _family_rank(spec.cls)
)

# Options that describe the model the kernel lives in rather than the kernel itself. A model
# hands `AttentionSpec.built` its values of them, which builds with those the variant declares;
# they are not part of `conf/attention/*.yaml`.
MODEL_OPTIONS = ("causal", "n_heads", "head_dim", "max_seq_len", "shared_qk")


@dataclass(frozen=True)
class AttentionSpec:
    """What a variant is and can do, read by the layer, the runner and the README table."""

    name: str
    cls: type
    summary: str
    exact: bool
    causal_supported: bool
    shared_qk_required: bool
    bounded_length: bool  # True if `max_seq_len` is a hard limit (learned per-position weights)
    bidirectional_supported: bool  # False: causal only (causal=False is refused)
    n_gates: int  # per-token gates the layer projects and passes as attn(q, k, v, gates=g)
    time_complexity: str
    memory_complexity: str
    supports_decode: bool  # has init_cache / prefill / decode (causal only)
    decode_matches_forward: bool  # decoding gives the causal forward's outputs
    past_fixed: bool  # causally, an output never changes when tokens are appended
    preset: dict[str, Any] = field(default_factory=dict)  # a preset's own defaults
    # Heads computed independently (`Attention.independent_heads`): `model.attention_chunks`
    # may run groups of heads as separate calls.
    independent_heads: bool = False
    # The kernel contract's optional inputs (`Attention.forward`): a key padding mask, document
    # ids of packed sequences, and k, v with fewer heads than q (`native_gqa`: without
    # repeating them).
    supports_padding_mask: bool = False
    supports_segments: bool = False
    supports_gqa: bool = True
    native_gqa: bool = False
    # The work is a set of (query block, key block) pairs (`Attention.block_sparse_work`):
    # a mask that empties a block could skip it (benchmarks/mask_cost.py's bound).
    block_sparse_work: bool = False
    knobs: tuple[str, ...] = ()  # options that set how close to exact (`Attention.knobs`)
    smaller_is_finer: tuple[str, ...] = ()
    published_as: Mapping[str, str] = field(default_factory=dict)  # `Attention.published_as`

    @property
    def variant(self) -> str:
        """The registered variant this name builds (itself, unless it is a preset)."""
        return self.cls.name

    @cached_property
    def defaults(self) -> dict[str, Any]:
        """Every build option and its default, in signature order (model options included)."""
        params = list(inspect.signature(self.cls.__init__).parameters.values())[1:]
        defaults = {
            p.name: p.default for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        }
        return defaults | self.preset

    @property
    def options(self) -> dict[str, Any]:
        """The kernel's own options and defaults (what `conf/attention/<name>.yaml` holds)."""
        return {k: v for k, v in self.defaults.items() if k not in MODEL_OPTIONS}

    @property
    def model_options(self) -> tuple[str, ...]:
        """The model-level options (causal, n_heads, ..., shared_qk) this variant takes."""
        return tuple(k for k in self.defaults if k in MODEL_OPTIONS)

    def kernel_options(self, options: Any) -> dict[str, Any]:
        """`options` as this variant's own options (`conf/attention/<name>.yaml`, a model's
        `attention_options`), as a dict: the one place a kernel's options are checked. A
        `ValueError` names the option unless `options` is a mapping of options the variant has,
        none of them a model option (`MODEL_OPTIONS`: the model sets those)."""
        if not isinstance(options, Mapping):
            raise ValueError(
                f"attention {self.name!r}: option 'attention_options' must be a mapping of the "
                f"kernel's options, got {options!r}"
            )
        clashing = sorted(set(options) & set(MODEL_OPTIONS))
        if clashing:
            raise ValueError(
                f"attention {self.name!r}: attention_options may not set model option "
                f"{clashing[0]!r}; it is set by the model"
            )
        _refuse_unknown(self.name, options, self.options)
        return dict(options)

    def build(self, **options: Any):
        """This variant built with `options` (its own and the model options it declares); raises
        as `build_attention` does. (A model checks its options once, with `kernel_options`, and
        builds its layers' kernels with `built`: `ModelConfig.kernel`.)"""
        _refuse_unknown(self.name, options, self.defaults)
        own = {k: v for k, v in options.items() if k not in self.model_options}
        model = {k: v for k, v in options.items() if k in self.model_options}
        return self.built(own, model)

    def built(self, options: Mapping[str, Any], model: Mapping[str, Any]):
        """This variant built with its own `options`, already checked (`kernel_options`), and
        the model options it declares (`model_options`) at their values in `model`, the model
        options (`MODEL_OPTIONS`) of the model it runs in; a declared one that `model` leaves
        out keeps its default. The one place a kernel is built: `build`, `ModelConfig.kernel`
        (a model's layers) and variants/hf.py call it. `UnsupportedCombination` for a direction
        (causal or not) the variant cannot run."""
        declared = {k: model[k] for k in self.model_options if k in model}
        options = {**options, **declared}
        if options.get("causal", False) and not self.causal_supported:
            raise UnsupportedCombination(
                f"attention {self.name!r} does not support option causal=True: "
                f"{self.cls.causal_reason}"
            )
        causal = (self.preset | options).get("causal", self.defaults.get("causal", False))
        if not causal and not self.bidirectional_supported:
            raise UnsupportedCombination(
                f"attention {self.name!r} does not support option causal=False: "
                f"{self.cls.bidirectional_reason}"
            )
        return self.cls(**(self.preset | options))


def _refuse_unknown(name: str, options: Mapping[str, Any], known: Mapping[str, Any]) -> None:
    """`ValueError` naming the first of `options` not among `known` (variant `name`'s)."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"attention {name!r} has no option {unknown[0]!r}; "
            f"its options are: {', '.join(known) or 'none'}"
        )


def register_attention(cls: type) -> type:
    """Class decorator: add an `Attention` subclass to the registry under `cls.name`."""
    _ATTENTION.add(cls.name, _spec(cls.name, cls, {}, None))
    return cls


def register_preset(
    name: str,
    variant: type,
    summary: str,
    *,
    published_as: Mapping[str, str] | None = None,
    **options: Any,
) -> None:
    """Register `name` as `variant` (a registered class) with `options` as its defaults; every
    other option keeps the variant's default and any option can still be overridden.
    `published_as`: the published model the preset is per suite (`Attention.published_as`)."""
    spec = _spec(name, variant, dict(options), summary)
    if published_as is not None:
        spec = dataclasses.replace(spec, published_as=dict(published_as))
    _ATTENTION.add(name, spec)


def _spec(name: str, cls: type, preset: dict[str, Any], summary: str | None) -> AttentionSpec:
    return AttentionSpec(
        name=name,
        cls=cls,
        summary=summary or ((cls.__doc__ or "").strip().splitlines() or [cls.name])[0],
        exact=cls.exact,
        causal_supported=cls.causal_supported,
        shared_qk_required=cls.shared_qk_required,
        bounded_length=cls.bounded_length,
        bidirectional_supported=cls.bidirectional_supported,
        n_gates=cls.n_gates,
        time_complexity=cls.time_complexity,
        memory_complexity=cls.memory_complexity,
        supports_decode=cls.supports_decode,
        decode_matches_forward=cls.decode_matches_forward,
        past_fixed=cls.past_fixed,
        preset=preset,
        independent_heads=cls.independent_heads,
        supports_padding_mask=cls.supports_padding_mask,
        supports_segments=cls.supports_segments,
        supports_gqa=cls.supports_gqa,
        native_gqa=cls.native_gqa,
        block_sparse_work=cls.block_sparse_work,
        knobs=tuple(cls.knobs),
        smaller_is_finer=tuple(cls.smaller_is_finer),
        published_as=dict(cls.published_as),
    )


# The survey's taxonomy (Tay et al.), then today's families: the registry's order.
FAMILIES = (
    "exact",
    "fixed",
    "combined",
    "learnable",
    "low_rank",
    "kernel",
    "selection",
    "recurrent",
    "other",
)


def attention_names() -> list[str]:
    """Names of all registered attention variants, family by family (`FAMILIES`), each family
    in registration order."""
    return _ATTENTION.names()


def _family_rank(cls: type) -> int:
    family = getattr(cls, "family", "other")
    return FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)


# A million tokens: a variant runs the `million` preset's step when its own FLOP model
# (`Attention.flops`, causal, at its defaults, 4 heads of 64) puts a forward at 2^20 tokens at
# most MILLION_FLOPS. The count is extrapolated from 8K and 16K by its growth between them (the
# plans some models build at 2^20 take seconds each): exact for the linear and quadratic ones,
# 4-5x low for MoBA and NSA, whose L^2/b terms grow late. NSA (1.5e13 counted at 2^20, about
# half an hour of a core) is the costliest that ran; the quadratic ones are 1.2e14 and more.
MILLION_TOKENS = 2**20
MILLION_FLOPS = 5e13


def forward_flops(spec: AttentionSpec, seq_len: int, heads: int = 4, head_dim: int = 64):
    """A causal forward's FLOPs at `seq_len` (batch 1) by the variant's own FLOP model, at its
    defaults; None when it cannot be causal or has no FLOP model."""
    if not spec.causal_supported:
        return None
    try:
        return spec.build(causal=True).flops(1, heads, seq_len, head_dim)
    except NotImplementedError:
        return None


def million_flops(spec: AttentionSpec) -> float | None:
    """`forward_flops` at MILLION_TOKENS, extrapolated from 8K and 16K; None where
    `forward_flops` is."""
    at_8k, at_16k = (forward_flops(spec, n) for n in (2**13, 2**14))
    if not at_8k or not at_16k:
        return None
    return at_16k * (at_16k / at_8k) ** 6  # six doublings from 2^14 to 2^20


def _runs_a_million(spec: AttentionSpec) -> bool:
    flops = million_flops(spec)
    return flops is not None and flops <= MILLION_FLOPS


# What `select` filters on: each word a predicate on a spec. `published`: a variant measured
# through the presets registered for it (combined -> longformer, bigbird, sparse_fixed) is left
# out, its presets stay.
CAPABILITIES = {
    "all": lambda spec: True,
    "causal": lambda spec: spec.causal_supported,
    "bidirectional": lambda spec: spec.bidirectional_supported,
    "decodes": lambda spec: spec.supports_decode,
    "approximate": lambda spec: not spec.exact,
    "gqa": lambda spec: spec.supports_gqa,
    "padding": lambda spec: spec.supports_padding_mask,
    "documents": lambda spec: spec.supports_segments,
    "million": _runs_a_million,
    "published": lambda spec: (
        bool(spec.preset)
        or not any(
            attention_spec(o).variant == spec.name for o in attention_names() if o != spec.name
        )
    ),
}


def select(*words: str) -> list[str]:
    """Registered names by capability: every variant for which each capability word holds
    (`CAPABILITIES`), in registry order, after the variant names among `words` (an order to
    run first, e.g. the ones a reference model is trained for); `ValueError` naming a word that
    is neither."""
    names = attention_names()
    first = [w for w in words if w in names]
    filters = [w for w in words if w not in names]
    unknown = [w for w in filters if w not in CAPABILITIES]
    if unknown:
        raise ValueError(
            f"variants: {unknown[0]!r} is neither a registered attention variant nor a "
            f"capability ({', '.join(CAPABILITIES)})"
        )
    chosen = [n for n in names if all(CAPABILITIES[w](attention_spec(n)) for w in filters)]
    return list(dict.fromkeys([*first, *chosen]))


def attention_spec(name: str) -> AttentionSpec:
    """The spec of variant `name`; `ValueError` listing the available names if unknown."""
    return _ATTENTION[name]


def build_attention(name: str, **options: Any):
    """Build attention variant `name` with `options`; returns an `nn.Module`.

    The module maps q, k, v of shape (batch, heads, seq_len, head_dim) to an output of the same
    shape. Unknown names and unknown options raise `ValueError` naming the variant and the option;
    unsupported combinations (e.g. `causal=True` on a variant that cannot be causal) raise its
    subclass `UnsupportedCombination`.
    """
    return attention_spec(name).build(**options)


def hf_reason(name: str, options: Mapping[str, Any] | None = None) -> str | None:
    """Why variant `name` (with `options`) cannot run as a Hugging Face model's attention
    function (variants/hf.py), or None: an attention function gets q, k, v alone, its kernel is
    shared by every layer, and the model is a causal LM."""
    spec = attention_spec(name)
    if spec.n_gates:
        return (
            f"it takes gates per token ({spec.n_gates} per head), projected from the layer's "
            "input, which an attention function never receives"
        )
    if spec.shared_qk_required:
        return "it requires shared QK (its keys are the normalised queries)"
    if not spec.causal_supported:
        return f"a causal LM needs causal=True: {spec.cls.causal_reason}"
    model = {"causal": True, "n_heads": 4, "head_dim": 64, "max_seq_len": 4096, "shared_qk": False}
    kernel = spec.built(dict(options or {}), model)
    if any(True for _ in kernel.parameters()):
        return "its kernel has parameters, which would belong to no model (shared by every layer)"
    return None


def hf_column(name: str) -> str:
    """The registry table's Hugging Face cell: `generates` (on its own cache), `runs` (no
    decoding), or `no: ...` (the first words of `hf_reason`)."""
    reason = hf_reason(name)
    if reason is not None:
        return "no: " + reason.split(",")[0].split(" (")[0].split(":")[0].removeprefix("it ")
    return "generates" if attention_spec(name).supports_decode else "runs"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def registry_table() -> str:
    """The README's registry table (markdown), generated from the specs so it cannot drift.

    `padding`, `documents`: whether the variant takes a key padding mask and segment ids
    (`Attention.forward`); `GQA`: grouped KV heads, `native` (the repeated keys never
    materialised), `repeated` (the keys repeated to q's heads first) or `no`; `Hugging Face`:
    whether it runs in an HF model and generates there on its own cache (`hf_column`)."""
    rows = [
        "| variant | options (defaults) | time | memory | causal | exact | padding | documents "
        "| GQA | Hugging Face |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in attention_names():
        spec = attention_spec(name)
        shown = spec.preset or spec.options  # a preset: what it sets; the rest is the variant's
        options = ", ".join(f"`{k}={v!r}`" for k, v in shown.items()) or "—"
        if spec.preset:
            options = f"`{spec.variant}` with {options}"
        needs = ", ".join(f"`{k}`" for k in spec.model_options if k != "causal")
        if needs:
            options += f"; model: {needs}"
        if spec.n_gates:
            options += f"; gates: {spec.n_gates} per head and token"
        causal = "yes" if spec.causal_supported else "no"
        if not spec.bidirectional_supported:
            causal = "only"
        exact = "exact" if spec.exact else "approximate"
        if spec.shared_qk_required:
            exact += " (shared QK)"
        gqa = ("native" if spec.native_gqa else "repeated") if spec.supports_gqa else "no"
        rows.append(
            f"| `{name}` | {options} | {spec.time_complexity} | {spec.memory_complexity} "
            f"| {causal} | {exact} | {_yes(spec.supports_padding_mask)} "
            f"| {_yes(spec.supports_segments)} | {gqa} | {hf_column(name)} |"
        )
    return "\n".join(rows)
