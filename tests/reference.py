"""Independent references for the tests: dense masks and explicit softmax, nothing from variants."""

from __future__ import annotations

import contextlib
import math

import torch


def dense_attention(q, k, v, mask=None, scale=None):
    """softmax(q k^T * scale, masked) v on explicit (L, L) scores; mask True = may attend.

    q, k, v: (B, H, L, D); mask: bool broadcastable to (B, H, L, L). Rows with no allowed key
    return zeros.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return probs @ v


def causal_mask(length, device=None):
    """(L, L) bool, True where j <= i."""
    idx = torch.arange(length, device=device)
    return idx[None, :] <= idx[:, None]


def shared_qk_reference(q, v, allowed=None, multiplicity=None):
    """The Reformer's shared-QK attention on explicit scores: unit keys k_j = q_j / |q_j|,
    scores q_i . k_j (no 1/sqrt(D)), and key i offered to query i only when `allowed` leaves
    it no other key.

    q, v: (B, H, L, D); allowed: (L, L) or (B, H, L, L) bool pattern (True = may attend), None
    for all pairs. `multiplicity` (same shape, counts) weighs each pair's exp(score) by how
    many times it is counted; None counts every pair once.
    """
    length = q.shape[2]
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool)
    eye = torch.eye(length, dtype=torch.bool)
    others = allowed & ~eye
    alone = ~others.any(dim=-1, keepdim=True)
    mask = others | (eye & alone)
    keys = q / q.norm(dim=-1, keepdim=True)
    scores = q @ keys.transpose(-1, -2)
    if multiplicity is not None:
        scores = scores + multiplicity.clamp_min(1).log()
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return probs @ v


def qkv(batch=2, heads=3, length=16, head_dim=8, seed=0, dtype=torch.float64, requires_grad=False):
    """Random q, k, v (B, H, L, D); float64 by default so equality tests can be tight."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, length, head_dim)
    return tuple(
        torch.randn(shape, generator=g, dtype=dtype).requires_grad_(requires_grad) for _ in range(3)
    )


def assert_causal(module, length=24, t=10, head_dim=8, seed=0, replay=False):
    """Changing q, k, v after position t leaves outputs at positions <= t unchanged.

    replay=True runs the second call inside `replaying()`, so a stochastic kernel reuses the
    random choices (LSH buckets) of the first.
    """
    from variants.attention.common.base import replaying

    q, k, v = qkv(1, 2, length, head_dim, seed=seed)
    out = module(q, k, v)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :]) * 3
    with replaying() if replay else contextlib.nullcontext():
        out2 = module(q2, k2, v2)
    torch.testing.assert_close(out[:, :, : t + 1], out2[:, :, : t + 1])
    assert not torch.allclose(out[:, :, t + 1 :], out2[:, :, t + 1 :])


def assert_layout_independent(attend, tensors, replay=False):
    """attend(*tensors) gives the same outputs and gradients on (B, H, L, D) views of
    (B, L, H, D) tensors, the layout the model hands a kernel, as on contiguous copies.

    tensors: (1, H, L, D) each (with batch 1, flattening B*H gives a strided view, not a copy).
    replay: as in `assert_causal`, for the second call.
    """
    from variants.attention.common.base import replaying

    views = [x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in tensors]
    dense = [x.detach().clone().requires_grad_() for x in tensors]
    assert not views[0].is_contiguous()
    out_views = attend(*views)
    with replaying() if replay else contextlib.nullcontext():
        out_dense = attend(*dense)
    torch.testing.assert_close(out_views, out_dense)
    weights = torch.randn_like(out_dense)
    got = torch.autograd.grad((out_views * weights).sum(), views)
    want = torch.autograd.grad((out_dense * weights).sum(), dense)
    torch.testing.assert_close(got, want)


# --- Hand-written dense masks of the pattern vocabulary (variants.patterns), one rule per
# pattern on python ints, written from the definitions and never from the library's code.


def rule_mask(length, rule):
    """(L, L) bool with [i, j] = rule(i, j), evaluated pair by pair."""
    return torch.tensor([[bool(rule(i, j)) for j in range(length)] for i in range(length)])


def causal_rule(i, j):
    return j <= i


def local_rule(block, back, forward):
    """Key block within [query block - back, query block + forward]."""
    return lambda i, j: i // block - back <= j // block <= i // block + forward


def band_rule(width):
    return lambda i, j: abs(i - j) < width


def strided_rule(stride):
    return lambda i, j: (i - j) % stride == 0


def global_rule(n_global, causal):
    """The first n_global keys for everyone; unless causal, every key for the first queries."""
    return lambda i, j: j < n_global or (not causal and i < n_global)


def summary_rule(block, width):
    """The last `width` positions of every block."""
    return lambda i, j: j % block >= block - width


def block_table_rule(table, block):
    """Query block qb sees key block kb where table[qb][kb] (random blocks, given the draw)."""
    return lambda i, j: bool(table[i // block][j // block])


def union_rule(*rules):
    return lambda i, j: any(rule(i, j) for rule in rules)


# --- MoBA, NSA, DeltaNet: per-query rules written from the definitions, on explicit
# scores (fp64, short lengths), nothing from variants.


def moba_mask(q, k, block, top_k, causal):
    """(B, H, L, L) bool: MoBA's keys per query. Causally query i scores every block ending
    before its own block by q_i . (mean of the block's keys), keeps the top_k - 1 best (all if
    fewer) and its own block up to i; bidirectionally every other block is a candidate (a short
    block scored by the mean of its real keys) and its own block is whole."""
    batch, heads, length, _ = q.shape
    starts = list(range(0, length, block))
    means = torch.stack([k[:, :, s : s + block].mean(dim=2) for s in starts], dim=2)
    mask = torch.zeros(batch, heads, length, length, dtype=torch.bool)
    for i in range(length):
        own = i // block
        candidates = [c for c in range(len(starts)) if (c < own if causal else c != own)]
        for b in range(batch):
            for h in range(heads):
                scores = [float(q[b, h, i] @ means[b, h, c]) for c in candidates]
                ranked = [c for _, c in sorted(zip(scores, candidates, strict=True), reverse=True)]
                for c in ranked[: top_k - 1]:
                    mask[b, h, i, c * block : (c + 1) * block] = True
                end = i + 1 if causal else (own + 1) * block
                mask[b, h, i, own * block : end] = True
    return mask


def nsa_reference(q, k, v, gates, block, n_select, window, compress_keys, compress_values, group=1):
    """NSA's three branches on explicit scores (scale 1/sqrt(d)), gated and summed.

    compress_keys/values: (B, H, L, D) -> (B, H, n, D) block summaries (the test gives the
    mean, or the module's MLP written out); gates: (B, H, L, 3). Compressed: blocks with
    (c + 1) b - 1 <= i (none: 0). Selected: own block (causal) plus the n_select - 1 blocks
    before it with the largest compressed-branch probability; with `group` > 1 (k, v: a KV
    head repeated to each of its `group` query heads) the probability summed over the query
    heads of h's group, h // group. Window: i - window < j <= i.
    """
    batch, heads, length, dim = q.shape
    scale = dim**-0.5
    ck, cv = compress_keys(k), compress_values(v)  # (B, H, n, D)
    n = ck.shape[2]
    out = torch.zeros_like(q)
    probs, o_cmps = {}, {}  # per (b, h, i): {block: its compressed-branch probability}
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                qi = q[b, h, i]
                visible = [c for c in range(n) if (c + 1) * block - 1 <= i]
                o_cmps[b, h, i] = torch.zeros_like(qi)
                probs[b, h, i] = {}
                if visible:
                    s = torch.stack([qi @ ck[b, h, c] for c in visible]) * scale
                    p = torch.softmax(s, dim=0)
                    o_cmps[b, h, i] = p @ cv[b, h, visible]
                    probs[b, h, i] = {c: float(p[j].detach()) for j, c in enumerate(visible)}
    for b in range(batch):
        for h in range(heads):
            mates = range(h // group * group, (h // group + 1) * group)
            for i in range(length):
                qi, o_cmp = q[b, h, i], o_cmps[b, h, i]
                visible = list(probs[b, h, i])
                own = i // block
                others = [c for c in visible if c != own]
                score = {c: sum(probs[b, m, i][c] for m in mates) for c in others}
                ranked = sorted(others, key=lambda c: score[c], reverse=True)[: n_select - 1]
                keys = [j for c in ranked for j in range(c * block, (c + 1) * block)]
                keys += list(range(own * block, i + 1))
                o_sel = dense_softmax_row(qi, k[b, h, keys], v[b, h, keys], scale)
                keys = list(range(max(0, i - window + 1), i + 1))
                o_win = dense_softmax_row(qi, k[b, h, keys], v[b, h, keys], scale)
                g = gates[b, h, i]
                out[b, h, i] = g[0] * o_cmp + g[1] * o_sel + g[2] * o_win
    return out


def dense_softmax_row(qi, keys, values, scale):
    """softmax(scale keys qi) values for one query: (D,), (n, D), (n, D) -> (D,)."""
    return torch.softmax((keys @ qi) * scale, dim=0) @ values


def delta_rule_recurrent(q, k, v, beta, return_state=False):
    """DeltaNet position by position: unit q, k; S_t = S_{t-1}(I - b k k^T) + b v k^T,
    o_t = S_t q_t. q, k, v: (B, H, L, D); beta: (B, H, L). With `return_state` also the last
    state S_L (B, H, D, D)."""
    q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    batch, heads, length, dim = q.shape
    state = q.new_zeros(batch, heads, dim, dim)
    eye = torch.eye(dim, dtype=q.dtype)
    outs = []
    for t in range(length):
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None, None]
        outer = kt[..., :, None] * kt[..., None, :]  # (B, H, D, D)
        state = state @ (eye - bt * outer) + bt * vt[..., :, None] * kt[..., None, :]
        outs.append((state @ q[:, :, t, :, None]).squeeze(-1))
    out = torch.stack(outs, dim=2)
    return (out, state) if return_state else out


class Gated(torch.nn.Module):
    """A kernel called as kernel(q, k, v): a gated one (spec `n_gates`) gets fixed gates,
    sigmoid(N(0, 1)) drawn from `seed` for the inputs' (B, H, L), the same on every call, so
    causality and device tests compare like with like; others are called as they are.
    Attributes other than `kernel` are the kernel's."""

    def __init__(self, kernel, seed=0):
        super().__init__()
        self.kernel = kernel
        self.seed = seed

    def forward(self, q, k, v, **masks):
        if not self.kernel.n_gates:
            return self.kernel(q, k, v, **masks)
        g = torch.Generator().manual_seed(self.seed)
        noise = torch.randn(*q.shape[:3], self.kernel.n_gates, generator=g, dtype=torch.float64)
        gates = torch.sigmoid(noise).to(device=q.device, dtype=q.dtype)
        return self.kernel(q, k, v, gates=gates, **masks)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["kernel"], name)


def document_reference_mask(keep, segments):
    """(B, 1, L, L) bool: True where query i may attend key j as far as padding and documents
    go, written out directly: key j real (`keep` (B, L) bool, True = real) and in i's document
    (`segments` (B, L)); either may be None. Rows of padded queries allow every key (their
    outputs are zeroed afterwards: any row keeps their gradients zero)."""
    some = keep if keep is not None else segments
    batch, length = some.shape
    mask = torch.ones(batch, length, length, dtype=torch.bool)
    if segments is not None:
        mask &= segments[:, :, None] == segments[:, None, :]
    if keep is not None:
        mask &= keep[:, None, :]
        mask |= ~keep[:, :, None]
    return mask[:, None]


def padded_zero(out, keep):
    """out (B, H, L, D) with padded queries' rows (keep False) set to 0."""
    return out if keep is None else out * keep[:, None, :, None]


def padding_and_documents(batch=2, length=24, seed=0):
    """A key padding mask (True = real; a padded tail and a padded run inside) and segment
    ids of three or four documents per sequence, (B, L) each."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.ones(batch, length, dtype=torch.bool)
    keep[0, -5:] = False
    if batch > 1:
        keep[1, 7:10] = False
    cuts = torch.sort(torch.randperm(length - 2, generator=g)[:3] + 1).values
    segments = torch.zeros(batch, length, dtype=torch.int64)
    for cut in cuts.tolist():
        segments[0, cut:] += 1
    if batch > 1:
        segments[1, length // 2 :] = 1
    return keep, segments


def each_document_alone(fn, inputs, keep, segments, with_padding=False):
    """(B, H, L, D): fn run on every document of every sequence alone, the outputs put back at
    the document's positions, every other row 0.

    inputs: (B, H, L, *) each, sliced to (1, H, n, *) at a document's positions; `segments`
    (B, L) ids and `keep` (B, L) bool (True = real), either None. with_padding=False: a
    document is its real positions only, fn(*slices); True: all of its positions, and fn also
    gets `real`, their (n,) bool of keep.
    """
    some = keep if keep is not None else segments
    batch, length = some.shape
    out = torch.zeros_like(inputs[0])
    for b in range(batch):
        ids = torch.zeros(length, dtype=torch.int64) if segments is None else segments[b]
        real = torch.ones(length, dtype=torch.bool) if keep is None else keep[b]
        for doc in ids.unique():
            where = ((ids == doc) & (real | with_padding)).nonzero().squeeze(-1)
            if not real[where].any():
                continue
            one = [x[b : b + 1, :, where] for x in inputs]
            extra = {"real": real[where]} if with_padding else {}
            out[b : b + 1, :, where] = fn(*one, **extra)
    return out


def assert_same_outputs_and_grads(fn, reference, inputs, seed=1, params=()):
    """fn(*inputs) and reference(*inputs) give the same outputs and the same gradients of
    (out * w).sum() for a random w of the output's shape (drawn from `seed`), with respect to
    `inputs` and to `params` (a kernel's own parameters, which both read)."""
    weight = torch.randn(
        inputs[0].shape, generator=torch.Generator().manual_seed(seed), dtype=inputs[0].dtype
    )
    out, grads = _outputs_and_grads(fn, inputs, weight, params)
    expected, expected_grads = _outputs_and_grads(reference, inputs, weight, params)
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)


def _outputs_and_grads(fn, inputs, weight, params=()):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*inputs)
    grads = torch.autograd.grad((out * weight).sum(), [*inputs, *params])
    return out, grads


def mask_kwargs(keep, segments):
    """The forward's mask keywords for a key padding mask and segment ids, either None."""
    masks = {}
    if keep is not None:
        masks["attention_mask"] = keep
    if segments is not None:
        masks["segment_ids"] = segments
    return masks


def assert_grouped_equals_repeated(kernel, q, k, v, masks=None, params=()):
    """kernel(q, k, v) with k, v of H_kv heads dividing q's H gives the outputs and gradients
    of the same kernel on k, v repeated to H heads (query head h on key head h // (H / H_kv),
    as `repeat_kv`). masks: the forward's mask keywords (`mask_kwargs`)."""
    masks = masks or {}
    group = q.shape[1] // k.shape[1]

    def grouped(q, k, v):
        return kernel(q, k, v, **masks)

    def repeated(q, k, v):
        return kernel(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), **masks)

    assert_same_outputs_and_grads(grouped, repeated, (q, k, v), params=params)


def prefill_then_decode(kernel, q, k, v, cache, prompt, gates=None):
    """The causal outputs (B, H, L, D) of prefilling positions [0, prompt) into `cache` and
    decoding the rest one position at a time; gates (B, H, L, n) for a gated kernel."""

    def at(positions):
        return () if gates is None else (gates[:, :, positions],)

    first = slice(0, prompt)
    outs = [kernel.prefill(q[:, :, first], k[:, :, first], v[:, :, first], cache, *at(first))]
    for t in range(prompt, q.shape[2]):
        step = slice(t, t + 1)
        outs.append(kernel.decode(q[:, :, step], k[:, :, step], v[:, :, step], cache, *at(step)))
    return torch.cat(outs, dim=2)
