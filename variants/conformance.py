"""The conformance kit: the properties every attention kernel keeps, checked on small fp64 inputs.

    python -m variants.conformance NAME [--plugins MOD ...] [--option KEY=VALUE ...]
    python -m variants.conformance --table       every registered variant, one row each

prints one line per property (held, FAILED with its largest deviation, or n/a where the
variant does not claim it) and exits 1 if any failed. The project's tests run the same kit over
every registered variant (tests/variants/test_conformance.py). Each property compares the
kernel with itself under a change that must not matter (appended tokens, padded values, other
documents, repeated heads, a cache), so it needs no reference implementation of the variant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import yaml

from variants import plugins, registry
from variants.attention.common.base import Attention, replaying
from variants.checks import UnsupportedCombination

HELD, FAILED, NOT_CLAIMED = "held", "FAILED", "n/a"
# Differences below this are fp64 rounding (outputs and gradients are O(1)).
TOLERANCE = 1e-8
BATCH, HEADS, HEAD_DIM = 2, 4, 8


@dataclass(frozen=True)
class Result:
    """One property's verdict: `status` (held, FAILED, n/a), the largest deviation measured
    (None where a property has none), and what was checked or why it is not claimed."""

    name: str
    status: str
    deviation: float | None = None
    detail: str = ""

    def line(self) -> str:
        shown = "" if self.deviation is None else f"  max deviation {self.deviation:.2e}"
        return f"{self.status:6s} {self.name:18s}{shown}  {self.detail}".rstrip()


@dataclass
class Subject:
    """A variant under test: how to build it at a length, and its inputs."""

    name: str
    options: Mapping[str, Any]
    length: int
    seed: int = 0

    @property
    def spec(self) -> registry.AttentionSpec:
        return registry.attention_spec(self.name)

    def build(self, causal: bool) -> Attention:
        """The kernel, its model options at the kit's shapes; the same weights at every call."""
        model = {"n_heads": HEADS, "head_dim": HEAD_DIM, "max_seq_len": 2 * self.length}
        torch.manual_seed(self.seed)  # `built` takes the model options the variant declares
        kernel = self.spec.built(self.spec.kernel_options(self.options), model | {"causal": causal})
        return kernel.to(torch.float64)

    def inputs(self, length: int | None = None, batch: int = BATCH, seed: int | None = None):
        """q, k, v (B, H, L, D) and gates (B, H, L, n_gates) or None, fp64, from a seed."""
        g = torch.Generator().manual_seed(self.seed if seed is None else seed)
        shape = (batch, HEADS, length or self.length, HEAD_DIM)
        q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
        gates = None
        if self.spec.n_gates:
            noise = torch.randn((*shape[:3], self.spec.n_gates), generator=g, dtype=torch.float64)
            gates = torch.sigmoid(noise)
        return q, k, v, gates

    def directions(self) -> list[bool]:
        """causal=True and/or False, as the variant supports them."""
        return [c for c in (True, False) if self.claims_direction(c)]

    def claims_direction(self, causal: bool) -> bool:
        return self.spec.causal_supported if causal else self.spec.bidirectional_supported


def call(kernel: Attention, q, k, v, gates, **masks) -> torch.Tensor:
    """kernel(q, k, v) with its gates and masks; under shared QK its keys are the queries."""
    if kernel.applies_shared_qk:
        k = q
    return kernel(q, k, v, gates=gates, **masks)


def deviation(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| (NaN if either holds a NaN where the other does not)."""
    if a.numel() == 0:
        return 0.0
    return float((a.detach() - b.detach()).abs().max())


def worse(*devs: float) -> float:
    """The largest deviation, NaN first (Python's max drops a NaN)."""
    return float("nan") if any(d != d for d in devs) else max(devs)


def verdict(name: str, dev: float, detail: str, tolerance: float = TOLERANCE) -> Result:
    ok = dev == dev and dev <= tolerance  # NaN is a failure
    return Result(name, HELD if ok else FAILED, dev, detail)


# --- the properties ---------------------------------------------------------------------------
def shape_and_dtype(s: Subject) -> Result:
    devs = []
    for causal in s.directions():
        q, k, v, g = s.inputs()
        out = call(s.build(causal), q, k, v, g)
        if out.shape != q.shape or out.dtype != q.dtype:
            return Result("shape_and_dtype", FAILED, None, f"got {tuple(out.shape)} {out.dtype}")
        devs.append(0.0 if torch.isfinite(out).all() else float("nan"))
    return verdict("shape_and_dtype", worse(*devs), "out (B, H, L, D) as q, finite")


def causal_gradient(s: Subject) -> Result:
    """d out_i / d (q, k, v, gates)_j = 0 for every j > i."""
    if not s.spec.causal_supported:
        return Result("causal_gradient", NOT_CLAIMED, None, "not causal")
    kernel = s.build(True)
    q, k, v, g = (x.requires_grad_() if x is not None else None for x in s.inputs())
    out = call(kernel, q, k, v, g)
    worst = 0.0
    for i in sorted({0, s.length // 3, s.length // 2, s.length - 2}):
        grads = torch.autograd.grad(
            out[:, :, i].sum(),
            [x for x in (q, k, v, g) if x is not None],
            retain_graph=True,
            allow_unused=True,
        )
        for grad in grads:
            if grad is not None:
                worst = worse(worst, deviation(grad[:, :, i + 1 :], torch.zeros(())))
    return verdict("causal_gradient", worst, "no gradient from a later position")


def causal_append(s: Subject) -> Result:
    """The outputs at the first L positions do not change when tokens are appended."""
    if not s.spec.causal_supported:
        return Result("causal_append", NOT_CLAIMED, None, "not causal")
    if not s.spec.past_fixed:
        return Result("causal_append", NOT_CLAIMED, None, s.spec.cls.past_fixed_reason)
    kernel = s.build(True)
    q, k, v, g = s.inputs(length=s.length + 23)
    cut = s.length
    with replaying():  # a stochastic kernel keeps its draws between the two calls
        longer = call(kernel, q, k, v, g)
        shorter = call(kernel, *(x[:, :, :cut] if x is not None else None for x in (q, k, v, g)))
    return verdict("causal_append", deviation(shorter, longer[:, :, :cut]), "+23 tokens")


def padding(s: Subject) -> Result:
    """Padded positions' values never reach a real output (NaN included), padded queries' rows
    are zero, and (bidirectionally, unless the pattern depends on every token: `past_fixed`)
    a padded tail gives the unpadded run's outputs."""
    if not s.spec.supports_padding_mask:
        return Result("padding", NOT_CLAIMED, None, "supports_padding_mask=False")
    keep = torch.ones(BATCH, s.length, dtype=torch.bool)
    keep[0, -s.length // 4 :] = False  # a padded tail
    keep[1, s.length // 3 : s.length // 3 + 3] = False  # a padded run inside
    worst = 0.0
    for causal in s.directions():
        kernel = s.build(causal)
        q, k, v, g = s.inputs()
        with replaying():
            base = call(kernel, q, k, v, g, attention_mask=keep)
            for fill in (1e3, float("nan")):
                filled = [x.masked_fill(~keep[:, None, :, None], fill) for x in (q, k, v)]
                other = call(kernel, *filled, g, attention_mask=keep)
                real = keep[:, None, :, None].expand_as(base)
                worst = worse(worst, deviation(base[real], other[real]))
            worst = worse(worst, deviation(base[~real], torch.zeros(())))
            if not causal and s.spec.past_fixed:  # the tail's row alone, unpadded
                n = int(keep[0].sum())
                alone = call(
                    kernel, *(x[:1, :, :n] if x is not None else None for x in (q, k, v, g))
                )
                worst = worse(worst, deviation(alone, base[:1, :, :n]))
    return verdict("padding", worst, "padded values ignored (1e3, NaN); tail = unpadded run")


def left_padding(s: Subject) -> Result:
    """A causal row behind left padding (a batch of prompts of different lengths) gives the
    outputs of the row alone, where the kernel is `shift_invariant`."""
    if not (s.spec.supports_padding_mask and s.spec.causal_supported):
        return Result("left_padding", NOT_CLAIMED, None, "not causal with padding masks")
    kernel = s.build(True)
    if not kernel.shift_invariant:
        return Result("left_padding", NOT_CLAIMED, None, "shift_invariant=False")
    pad = 13
    q, k, v, g = s.inputs(batch=1)
    filler = s.inputs(length=pad, batch=1, seed=s.seed + 7)
    padded = [
        None if x is None else torch.cat([f, x], dim=2)
        for f, x in zip(filler, (q, k, v, g), strict=True)
    ]
    keep = torch.ones(1, s.length + pad, dtype=torch.bool)
    keep[:, :pad] = False
    with replaying():
        alone = call(kernel, q, k, v, g)
        behind = call(kernel, *padded, attention_mask=keep)[:, :, pad:]
    return verdict("left_padding", deviation(alone, behind), "13 pads before a row = the row alone")


def documents(s: Subject) -> Result:
    """No query reads another document (no gradient crosses a boundary); and, unless the
    kernel's pattern depends on every token (`past_fixed` False: LSH's sorted chunks), changing
    one document's inputs leaves every other position's output unchanged and the first
    document equals its run alone."""
    if not s.spec.supports_segments:
        return Result("documents", NOT_CLAIMED, None, "supports_segments=False")
    cuts = (s.length // 3, s.length // 3 + s.length // 4)
    segments = torch.zeros(BATCH, s.length, dtype=torch.long)
    for cut in cuts:
        segments[:, cut:] += 1
    worst = 0.0
    for causal in s.directions():
        kernel = s.build(causal)
        q, k, v, g = s.inputs()
        inside = (segments == 1)[:, None, :, None]  # the middle document
        reading = [x.clone().requires_grad_() for x in (q, k, v)]
        with replaying():
            out = call(kernel, *reading, g, segment_ids=segments)
            outside = (~inside).expand_as(out)
            for grad in torch.autograd.grad(out[outside].sum(), reading, allow_unused=True):
                if grad is not None:
                    worst = worse(worst, deviation(grad[inside.expand_as(grad)], torch.zeros(())))
            if not s.spec.past_fixed:
                continue
            changed = [x.masked_fill(inside, 0.0) + inside * torch.randn_like(x) for x in (q, k, v)]
            base = call(kernel, q, k, v, g, segment_ids=segments)
            other = call(kernel, *changed, g, segment_ids=segments)
            worst = worse(worst, deviation(base[outside], other[outside]))
            n = cuts[0]
            alone = call(kernel, *(x[:, :, :n] if x is not None else None for x in (q, k, v, g)))
            worst = worse(worst, deviation(alone, base[:, :, :n]))
    detail = "no gradient across documents"
    if s.spec.past_fixed:
        detail += "; other documents' values ignored; first = run alone"
    return verdict("documents", worst, detail)


def grouped_heads(s: Subject) -> Result:
    """k, v of H / 2 heads give what the same kernel gives them repeated to H heads."""
    kernel = s.build(s.directions()[0])
    if not s.spec.supports_gqa or kernel.applies_shared_qk:
        return Result("grouped_heads", NOT_CLAIMED, None, "supports_gqa=False (or shared QK)")
    q, k, v, g = s.inputs()
    k, v = k[:, ::2], v[:, ::2]  # (B, H/2, L, D)
    with replaying():
        grouped = kernel(q, k, v, gates=g)
        repeated = kernel(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), gates=g)
    return verdict("grouped_heads", deviation(grouped, repeated), "H_kv = H / 2 vs repeated")


def independent_heads(s: Subject) -> Result:
    """Where claimed: heads called apart (one, then the other three, each inside
    `computing_heads`) give the one call's outputs and the gradients of its weights."""
    kernel = s.build(s.directions()[0])
    if not kernel.independent_heads:
        return Result("independent_heads", NOT_CLAIMED, None, "independent_heads=False")
    q, k, v, g = s.inputs()
    weights = [w for w in kernel.parameters() if w.requires_grad]
    probe = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=q.dtype)

    def outputs_and_grads(groups):
        parts = []
        with replaying():
            for heads in groups:
                with kernel.computing_heads(heads):
                    parts.append(call(kernel, *(None if x is None else x[:, heads]
                                                for x in (q, k, v, g))))  # fmt: skip
        out = torch.cat(parts, dim=1)  # (B, H, L, D)
        return out, torch.autograd.grad((out * probe).sum(), weights) if weights else ()

    whole, whole_grads = outputs_and_grads([torch.arange(HEADS)])
    apart, apart_grads = outputs_and_grads(torch.tensor_split(torch.arange(HEADS), [1]))
    worst = worse(deviation(apart, whole), *map(deviation, apart_grads, whole_grads))
    return verdict("independent_heads", worst, "heads {0} and {1, 2, 3} apart = at once")


def decode(s: Subject) -> Result:
    """Prefill half, then decode token by token, into a cache of `max_len` above the length:
    the causal forward's outputs at every position."""
    if not s.spec.supports_decode:
        return Result("decode", NOT_CLAIMED, None, s.spec.cls.decode_reason)
    kernel = s.build(True).eval()
    q, k, v, g = s.inputs()
    if kernel.applies_shared_qk:
        k = q
    forward = kernel(q, k, v, gates=g)
    cache = kernel.init_cache(BATCH, HEADS, HEAD_DIM, max_len=s.length + 8, dtype=torch.float64)
    half = s.length // 2

    def at(x, a, b):
        return None if x is None else x[:, :, a:b]

    outs = [kernel.prefill(at(q, 0, half), at(k, 0, half), at(v, 0, half), cache, at(g, 0, half))]
    for t in range(half, s.length):
        outs.append(
            kernel.decode(at(q, t, t + 1), at(k, t, t + 1), at(v, t, t + 1), cache, at(g, t, t + 1))
        )
    decoded = torch.cat(outs, dim=2)
    if not s.spec.decode_matches_forward:
        finite = 0.0 if torch.isfinite(decoded).all() else float("nan")
        return verdict("decode", finite, "decodes (its own rule: decode_matches_forward=False)")
    return verdict("decode", deviation(decoded, forward), "prefill + decode = forward")


def padded_decode(s: Subject) -> Result:
    """A batch of a left-padded row and a full one, prefilled then decoded: each row's outputs
    are those of the row alone (padded queries' zeros), where the kernel takes left-padded
    prompts (`padded_prefill_reason`); elsewhere prefill refuses them."""
    if not s.spec.supports_decode:
        return Result("padded_decode", NOT_CLAIMED, None, s.spec.cls.decode_reason)
    kernel = s.build(True).eval()
    pad = 5
    length = s.length + pad
    q, k, v, g = s.inputs(length=length)  # (2, H, L + pad, D): row 0 behind `pad` pads
    keep = torch.ones(BATCH, length, dtype=torch.bool)
    keep[0, :pad] = False
    cut = pad + s.length // 2  # the prompt: row 0's first half behind its pads

    def decoded(rows: slice, first: int, mask=None) -> torch.Tensor:
        """Prefill positions [first, cut) of `rows`, then decode the rest one by one."""
        x = [None if t is None else t[rows, :, first:] for t in (q, k, v, g)]
        if kernel.applies_shared_qk:
            x[1] = x[0]
        batch = x[0].shape[0]
        cache = kernel.init_cache(batch, HEADS, HEAD_DIM, max_len=length, dtype=torch.float64)
        at = [lambda a, b, t=t: None if t is None else t[:, :, a:b] for t in x]
        outs = [kernel.prefill(*(f(0, cut - first) for f in at[:3]), cache, at[3](0, cut - first),
                               attention_mask=mask)]  # fmt: skip
        for t in range(cut - first, length - first):
            outs.append(kernel.decode(*(f(t, t + 1) for f in at[:3]), cache, at[3](t, t + 1)))
        return torch.cat(outs, dim=2)  # (batch, H, length - first, D)

    probe = kernel.init_cache(BATCH, HEADS, HEAD_DIM, max_len=length, dtype=torch.float64)
    reason = kernel.padded_prefill_reason(probe)
    if reason is not None:
        try:
            decoded(slice(None), 0, keep[:, :cut])
        except UnsupportedCombination:
            return Result("padded_decode", NOT_CLAIMED, None, f"refused: {reason}")
        return Result("padded_decode", FAILED, None, f"took a padded prompt though {reason}")
    batched = decoded(slice(None), 0, keep[:, :cut])
    worst = worse(
        deviation(batched[:1, :, pad:], decoded(slice(0, 1), pad)),
        deviation(batched[1:], decoded(slice(1, 2), 0)),
        deviation(batched[:1, :, :pad], torch.zeros(())),
    )
    return verdict("padded_decode", worst, f"{pad} pads before a row: prefill + decode = alone")


def finite_gradients(s: Subject) -> Result:
    worst = 0.0
    for causal in s.directions():
        kernel = s.build(causal)
        inputs = [x.requires_grad_() if x is not None else None for x in s.inputs()]
        out = call(kernel, *inputs)
        weights = torch.randn(
            out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype
        )
        grads = torch.autograd.grad((out * weights).sum(), [inputs[0], inputs[2]])
        if not all(torch.isfinite(grad).all() for grad in grads):
            worst = float("nan")
        elif all(float(grad.abs().max()) == 0 for grad in grads):
            return Result("finite_gradients", FAILED, None, "every gradient is zero")
    return verdict("finite_gradients", worst, "finite, non-zero gradients of q and v")


def empty_batch(s: Subject) -> Result:
    kernel = s.build(s.directions()[0])
    inputs = [x.requires_grad_() if x is not None else None for x in s.inputs(batch=0)]
    out = call(kernel, *inputs)
    if out.shape != inputs[0].shape:
        return Result("empty_batch", FAILED, None, f"got {tuple(out.shape)}")
    out.sum().backward()
    return Result("empty_batch", HELD, None, "batch 0 in, batch 0 out, backward runs")


def clear_errors(s: Subject) -> Result:
    """Bad inputs raise a ValueError that names the variant: a 3-D q, k of another head dim,
    integer inputs."""
    kernel = s.build(s.directions()[0])
    q, k, v, g = s.inputs()
    cases = {
        "3-D q": (q[0], k[0], v[0], g),
        "head dim": (q, k[..., :-1], v, g),
        "integer q": (q.long(), k.long(), v.long(), g),
    }
    for case, args in cases.items():
        try:
            kernel(*args[:3], gates=args[3])
        except ValueError as error:
            if s.name not in str(error) and kernel.name not in str(error):
                return Result("clear_errors", FAILED, None, f"{case}: {error} (names no variant)")
            continue
        except Exception as error:  # noqa: BLE001 — any other error is the failure reported
            return Result("clear_errors", FAILED, None, f"{case}: {type(error).__name__}: {error}")
        return Result("clear_errors", FAILED, None, f"{case}: accepted")
    return Result("clear_errors", HELD, None, ", ".join(cases) + ": ValueError naming it")


PROPERTIES: dict[str, Callable[[Subject], Result]] = {
    f.__name__: f
    for f in (
        shape_and_dtype,
        causal_gradient,
        causal_append,
        padding,
        left_padding,
        documents,
        grouped_heads,
        independent_heads,
        decode,
        padded_decode,
        finite_gradients,
        empty_batch,
        clear_errors,
    )
}


def check(
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    length: int = 64,
    properties: Sequence[str] | None = None,
) -> list[Result]:
    """Every property (or those named) of variant `name` built with `options` (default: its
    `small_options`, which exercise several blocks or chunks at short lengths)."""
    spec = registry.attention_spec(name)
    options = dict(spec.cls.small_options if options is None else options)
    subject = Subject(name, options, length)
    results = []
    for prop in properties or PROPERTIES:
        try:
            results.append(PROPERTIES[prop](subject))
        except Exception as error:  # noqa: BLE001 — a property that raises has failed
            detail = f"raised {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            results.append(Result(prop, FAILED, None, detail))
    return results


def table(names: Sequence[str]) -> str:
    """A Markdown table of every property (held, FAILED, n/a) of each of `names` at its
    `small_options`: docs/variants.md's, regenerated by `python -m variants.conformance --table`."""
    rows = [
        "| variant | " + " | ".join(PROPERTIES) + " |",
        "|---|" + "---|" * len(PROPERTIES),
    ]
    for name in names:
        cells = [r.status for r in check(name)]
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m variants.conformance", description=__doc__)
    parser.add_argument("name", nargs="?", help="a registered attention variant")
    parser.add_argument("--table", action="store_true", help="every variant's verdicts, Markdown")
    parser.add_argument("--plugins", nargs="*", default=[], help="modules to import first")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a build option (YAML value); default: the variant's small_options",
    )
    parser.add_argument("--length", type=int, default=64, help="tokens per sequence (>= 16)")
    args = parser.parse_args(argv)
    if args.table:
        plugins.load(args.plugins)
        print(table([args.name] if args.name else registry.attention_names()))
        return 0
    if args.name is None:
        parser.error("give a variant's name (or --table)")
    try:
        plugins.load(args.plugins)
        if args.length < 16:
            raise ValueError(f"option '--length' must be >= 16, got {args.length}")
        options = None
        if args.option:
            pairs = [o.partition("=") for o in args.option]
            bad = [o for o, (_, sep, _) in zip(args.option, pairs, strict=True) if not sep]
            if bad:
                raise ValueError(f"option '--option' takes KEY=VALUE, got {bad[0]!r}")
            spec = registry.attention_spec(args.name)
            options = dict(spec.cls.small_options) | {k: yaml.safe_load(v) for k, _, v in pairs}
        results = check(args.name, options, length=args.length)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for result in results:
        print(result.line())
    failed = sum(r.status == FAILED for r in results)
    print(
        f"{args.name}: {len(results) - failed} of {len(results)} properties held or n/a, "
        f"{failed} failed"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
