"""The model's settings as one typed object, built once and handed to every module.

As nanoGPT's `GPTConfig`: `TransformerLM` and the layers each take the same `ModelConfig` and
read what they need from it (the blocks only wire the layers the model builds); nothing copies its
fields into a signature of its own. Building one validates every field (a `ValueError` naming the
option), looks the attention variant up once and checks the kernel's options once
(`AttentionSpec.kernel_options`), so that `ModelConfig.kernel` builds each layer's kernel from
`config.spec` unchecked; the model hands the built kernel to its layer, which never reads the
attention options.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from variants.checks import (
    UnsupportedCombination,
    require_bool,
    require_choice,
    require_divisible,
    require_positive_int,
    require_probability,
)
from variants.registry import AttentionSpec, attention_spec

if TYPE_CHECKING:  # the kernels start torch; this module does not (experiments' --help)
    from variants.attention.common.base import Attention

OWNER = "TransformerLM"
POSITIONS = ("sinusoidal", "rotary")
# Which model the config builds (`variants.build_lm`): ours, or transformers' Llama with the
# variant as its attention implementation (variants/hf.py, the `hf` extra).
FAMILIES = ("attnbench", "hf_llama")
# What the logits at each position are read from (`TransformerLM`): that position's state
# (`tokens`, a language model), or the last position's state with the position's sinusoid
# through an MLP (`pooled`, MAD's autoencoder for its compression task).
READOUTS = ("tokens", "pooled")
# What a Llama is regardless of the config: the fields it cannot vary, at the one value it has.
HF_LLAMA_FIXED = {
    "block": "residual",
    "positions": "rotary",
    "causal": True,
    "token_shift": False,
    "dropout": 0.0,
    "ff_chunks": 1,
    "loss_chunks": 1,
    "attention_chunks": 1,
    "readout": "tokens",
}


def resolve_shared_qk(attention: str | AttentionSpec, shared_qk: bool | None) -> bool:
    """`shared_qk`, None resolved: what variant `attention` (a name or its spec) requires (True
    for LSH and routing, False otherwise). `ValueError` for an unknown variant. The one rule:
    the model (`ModelConfig`) and the app (experiments/job_config.py) both resolve with it."""
    if shared_qk is None:
        spec = attention if isinstance(attention, AttentionSpec) else attention_spec(attention)
        return spec.shared_qk_required
    return shared_qk


@dataclass(frozen=True)
class ModelConfig:
    """What a `TransformerLM` is: sizes, the attention variant and its options, the block type.

    - `attention_options`: the kernel's own options (`conf/attention/<name>.yaml`); the model
      options a variant declares (causal, n_heads, head_dim, max_seq_len, shared_qk) come from
      this config, not from here.
    - `shared_qk`: None resolves, on construction, to what the variant requires; an explicit
      False for a variant that requires it is refused when the kernels are built (`kernel`).
    - `max_seq_len`: the longest sequence the model accepts (a hard limit only for variants with
      per-position weights, Linformer).
    - `token_shift`: add a learned map of the previous position's embedding (smeared keys).
    - `projection_bias`: biases in the attention layers' q/k/v, gate and output projections
      (the published DeltaNet layer has none).
    - `positions`: `sinusoidal` (absolute, added to the embedding) or `rotary` (RoPE: q and k
      rotated by their position in every layer, so scores depend on offsets only and carry to
      lengths never trained on); rotary needs an even head_dim.
    - `n_kv_heads`: grouped KV heads (GQA): the keys and values have this many heads, each
      shared by n_heads / n_kv_heads query heads; None (default) = n_heads, plain multi-head.
      Refused (`UnsupportedCombination`, when the kernels are built) with shared QK (the keys
      are the queries), with `attention_chunks` > 1, and by a variant without `supports_gqa`.
    - `family`: `attnbench` (`TransformerLM`) or `hf_llama` (transformers' LlamaForCausalLM,
      SwiGLU of width ff_mult * d_model, RMSNorm, its own rotary positions, the variant
      registered as its attention; `variants.hf.LlamaLM`); the fields a Llama cannot vary
      (`HF_LLAMA_FIXED`) must be at its value, a `ValueError` naming the field otherwise.
    - `readout`: `tokens` (default: the logits at a position read that position's state) or
      `pooled` (MAD's autoencoder, for its compression task: every position's logits read the
      last position's state plus the position's sinusoid, through a two-layer MLP of width
      d_model, so all a position can know of the input is what the last state holds). The
      task sets it (experiments/training/tasks/mad.py), not `model:`.
    - `loss_chunks`, `attention_chunks`: memory switches for very long sequences, 1 (off) by
      default so that no default step changes: the LM loss computed over `loss_chunks` pieces of
      the sequence under checkpointing (`TransformerLM.loss`), and the attention sublayer run
      over `attention_chunks` groups of heads under checkpointing, for kernels whose spec
      declares `independent_heads` (`layers.SelfAttention`; other kernels run whole).
    """

    vocab_size: int = 256
    d_model: int = 256
    n_heads: int = 4
    depth: int = 2
    ff_mult: int = 4
    dropout: float = 0.0
    ff_chunks: int = 1
    max_seq_len: int = 4096
    attention: str = "full"
    attention_options: Mapping[str, Any] = field(default_factory=dict)
    block: str = "residual"
    shared_qk: bool | None = None
    causal: bool = True
    token_shift: bool = False
    projection_bias: bool = True
    positions: str = "sinusoidal"
    loss_chunks: int = 1
    attention_chunks: int = 1
    n_kv_heads: int | None = None
    family: str = "attnbench"
    readout: str = "tokens"

    def __post_init__(self):
        for name in (
            "vocab_size",
            "d_model",
            "n_heads",
            "depth",
            "ff_mult",
            "ff_chunks",
            "loss_chunks",
            "attention_chunks",
        ):
            require_positive_int(OWNER, name, getattr(self, name))
        require_divisible(OWNER, "d_model", self.d_model, "n_heads", self.n_heads)
        require_positive_int(OWNER, "max_seq_len", self.max_seq_len)
        if self.n_kv_heads is not None:
            require_positive_int(OWNER, "n_kv_heads", self.n_kv_heads)
            require_divisible(OWNER, "n_heads", self.n_heads, "n_kv_heads", self.n_kv_heads)
        set_field = object.__setattr__  # frozen: normalised once, here
        set_field(self, "dropout", require_probability(OWNER, "dropout", self.dropout))
        for name in ("causal", "token_shift", "projection_bias"):
            require_bool(OWNER, name, getattr(self, name))
        require_choice(OWNER, "positions", self.positions, POSITIONS)
        require_choice(OWNER, "family", self.family, FAMILIES)
        require_choice(OWNER, "readout", self.readout, READOUTS)
        if self.family == "hf_llama":
            for name, value in HF_LLAMA_FIXED.items():
                if getattr(self, name) != value:
                    raise ValueError(
                        f"{OWNER}: option {name!r}={getattr(self, name)!r} is not available "
                        f"with 'family'='hf_llama': transformers' Llama has {name}={value!r}"
                    )
        if self.positions == "rotary" and self.head_dim % 2:
            raise ValueError(
                f"{OWNER}: option 'positions'='rotary' needs an even head_dim "
                f"(d_model / n_heads), got {self.head_dim}"
            )
        set_field(self, "_spec", attention_spec(self.attention))  # unknown -> lists the variants
        # The kernel's options, checked here once (`kernel` builds with them unchecked).
        set_field(self, "attention_options", self.spec.kernel_options(self.attention_options))
        shared_qk = resolve_shared_qk(self.spec, self.shared_qk)
        set_field(self, "shared_qk", require_bool(OWNER, "shared_qk", shared_qk))

    @property
    def spec(self) -> AttentionSpec:
        """The attention variant's spec, looked up once when the config was built."""
        return self._spec

    @property
    def head_dim(self) -> int:
        """Width of one head: d_model / n_heads."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Heads of the keys and values: `n_kv_heads`, or n_heads when None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def model_options(self) -> dict[str, Any]:
        """The values of the model options (`registry.MODEL_OPTIONS`) a kernel may declare."""
        return {
            "causal": self.causal,
            "n_heads": self.n_heads,
            "head_dim": self.head_dim,
            "max_seq_len": self.max_seq_len,
            "shared_qk": self.shared_qk,
        }

    def kernel(
        self, spec: AttentionSpec | None = None, options: Mapping[str, Any] | None = None
    ) -> Attention:
        """The kernel a layer of this model runs (`TransformerLM` builds one per layer and hands
        it to the layer): variant `spec` (default the config's) with its own `options` (default
        `attention_options`) and the model options it declares, at this config's values
        (`model_options`), built by `AttentionSpec.built`. `ValueError` for options it cannot
        take; `UnsupportedCombination` for a variant that needs shared QK this config does not
        have, or grouped KV heads (`n_kv_heads`) with shared QK, with `attention_chunks` > 1 or
        on a variant without them."""
        if spec is None and options is None:  # the config's own, checked when it was built
            spec, options = self.spec, self.attention_options
        else:  # a replacement's (`TransformerLM.kernels_replaced`), checked here, once
            spec = self.spec if spec is None else spec
            options = spec.kernel_options(options or {})
        if spec.shared_qk_required and not self.shared_qk:
            raise UnsupportedCombination(
                f"{OWNER}: attention {spec.name!r} requires option 'shared_qk'=True "
                f"(its keys are the normalised queries)"
            )
        kernel = spec.built(options, self.model_options())
        if self.kv_heads != self.n_heads:
            if self.shared_qk:
                raise UnsupportedCombination(
                    f"{OWNER}: option 'n_kv_heads'={self.n_kv_heads} cannot combine with "
                    "'shared_qk'=True (the keys are the queries, one per query head)"
                )
            if self.attention_chunks > 1:
                raise UnsupportedCombination(
                    f"{OWNER}: option 'n_kv_heads'={self.n_kv_heads} cannot combine with "
                    f"'attention_chunks'={self.attention_chunks} (groups of query heads would "
                    "need their share of the key heads)"
                )
            kernel.refuse_unsupported("n_kv_heads")
        return kernel
