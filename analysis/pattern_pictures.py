"""Pictures of the attention patterns: which keys each query sees, at a small length.

    python -m analysis.pattern_pictures --out report/patterns
    # writes patterns.png/.svg, vocabulary.png/.svg

Every variant with a fixed pattern (`blockwise`, `strided`, `combined` and its presets) and
every pattern of the vocabulary (`variants.patterns`) is drawn at 64 tokens, bidirectional and
causal, from the same predicates the kernels, FLOP counts and tests use. Sizes are scaled so
that a block is 8 tokens (a preset's block of 64 or 128 would cover the whole picture); the
panel titles give the options drawn.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

import variants
from variants import patterns
from variants.attention.common.base import Attention

LENGTH = 64
BLOCK = 8  # every block-sized option is drawn at this size
FORMATS = ("png", "svg")
_COLORS = ListedColormap(["#f4f4f4", "#1f4e79"])  # hidden, allowed


def variant_patterns(length: int = LENGTH) -> dict[str, tuple[str, dict[bool, patterns.Pattern]]]:
    """name -> (options drawn, {causal: pattern}) for every variant that has a fixed pattern."""
    drawn = {}
    for name in variants.attention_names():
        spec = variants.attention_spec(name)
        if spec.cls.pattern is Attention.pattern:  # keys that are not positions: no picture
            continue
        options = scaled_options(spec.options)
        by_causal = {}
        for causal in (False, True):
            if causal and not spec.causal_supported:
                continue
            # A model of `length` tokens at most: causal auto strides and random blocks are
            # taken at its max_seq_len, which is then the picture's length.
            model = {"max_seq_len": length} if "max_seq_len" in spec.model_options else {}
            kernel = variants.build_attention(name, causal=causal, **options, **model)
            by_causal[causal] = kernel.pattern(length)
        shown = {k: v for k, v in options.items() if k in _shown(spec.variant, options)}
        drawn[name] = (", ".join(f"{k}={_short(v)}" for k, v in shown.items()), by_causal)
    return drawn


def vocabulary_patterns(
    length: int = LENGTH,
) -> dict[str, tuple[str, dict[bool, patterns.Pattern]]]:
    """name -> (options drawn, {causal: pattern}) for each pattern of the vocabulary."""
    b = BLOCK

    def both(make):
        return {causal: make(causal) for causal in (False, True)}

    def cut(pattern, causal):
        return pattern & patterns.Causal() if causal else pattern

    return {
        "causal": ("j <= i", {True: patterns.Causal()}),
        "local": (
            f"block {b}, back 1, forward 1",
            both(lambda c: cut(patterns.Local(b, 1, 0 if c else 1), c)),
        ),
        "strided": (f"stride {b}", both(lambda c: cut(patterns.Strided(b), c))),
        "global": ("first 4", both(lambda c: cut(patterns.Global(4, c), c))),
        "random": (
            f"2 blocks of {b}, seed 0",
            both(lambda c: cut(patterns.Random.draw(length, b, 2, 0, causal=c), c)),
        ),
        "summary": (f"last 2 of each block of {b}", both(lambda c: cut(patterns.Summary(b, 2), c))),
        "band": ("width 4", both(lambda c: cut(patterns.Band(4), c))),
    }


_SIZES = ("block_size", "n_global", "n_summary")
# The options each combined part uses: only those of the parts drawn go in a panel's title.
_PART_OPTIONS = {
    "local": ("look_backward", "look_forward"),
    "strided": ("stride",),
    "global": ("n_global",),
    "random": ("n_random",),
    "summary": ("n_summary",),
}


def _shown(variant: str, options: dict) -> tuple[str, ...]:
    """The options worth a panel title (the rest are defaults or inert)."""
    if variant == "combined":
        parts = options["parts"]
        return ("parts", "block_size", *(o for p in parts for o in _PART_OPTIONS[p]))
    return tuple(k for k in options if k != "shared_qk")


def scaled_options(options: dict) -> dict:
    """`options` with block-sized ones scaled so that a block is BLOCK tokens (at least 1)."""
    scaled = {k: v for k, v in options.items() if k not in ("impl", "seed")}
    if "block_size" not in options:
        return scaled
    factor = BLOCK / options["block_size"]
    for key in _SIZES:
        if key in scaled:
            scaled[key] = max(1, round(scaled[key] * factor))
    if "seed" in options:
        scaled["seed"] = 0
    return scaled


def _short(value) -> str:
    return "+".join(value) if isinstance(value, (list, tuple)) else str(value)


def figure(drawn: dict, title: str, length: int = LENGTH) -> Figure:
    """One row per pattern, columns bidirectional and causal; query i is row i, key j column j."""
    fig = Figure(figsize=(6.4, 3.0 * len(drawn)), layout="constrained")
    axes = fig.subplots(len(drawn), 2, squeeze=False)
    for row, (name, (options, by_causal)) in zip(axes, drawn.items(), strict=True):
        for ax, causal in zip(row, (False, True), strict=True):
            ax.set_xticks([0, length - 1])
            ax.set_yticks([0, length - 1])
            if causal not in by_causal:
                ax.axis("off")
                continue
            mask = by_causal[causal].dense(length)
            pairs = int(mask.sum())
            ax.imshow(mask.numpy(), cmap=_COLORS, vmin=0, vmax=1, interpolation="nearest")
            kind = "causal" if causal else "bidirectional"
            ax.set_title(
                f"{name} ({kind})\n{textwrap.fill(options, 48)}\n{pairs} of {length**2} pairs",
                fontsize=8,
            )
            ax.set_xlabel("key j", fontsize=7)
            ax.set_ylabel("query i", fontsize=7)
            ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    return fig


def write(out_dir: str | Path, length: int = LENGTH) -> list[Path]:
    """Draw both figures into `out_dir` as PNG and SVG; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, drawn, title in (
        ("patterns", variant_patterns(length), f"Attention patterns at {length} tokens"),
        ("vocabulary", vocabulary_patterns(length), f"The pattern vocabulary at {length} tokens"),
    ):
        fig = figure(drawn, title, length)
        for fmt in FORMATS:
            path = out_dir / f"{stem}.{fmt}"
            fig.savefig(path, dpi=110 if fmt == "png" else "figure")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.pattern_pictures", description=__doc__
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for the figures")
    parser.add_argument("--length", type=int, default=LENGTH, help="tokens drawn")
    args = parser.parse_args(argv)
    for path in write(args.out, args.length):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
