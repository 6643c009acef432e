"""Decoding with a cache against the causal forward (fp64), for every variant that decodes.

The forward of each variant is itself checked against dense references in its own test file;
here token-by-token decoding from an empty cache, and a prefill followed by decoding, must give
its outputs at every position. LSH's decode rule differs from its forward by design and is
checked against a dense reference of that rule built here. Gated kernels (NSA, DeltaNet) get
the same per-position gates in the forward and, position by position, in decoding.
"""

from __future__ import annotations

import pytest
import torch

from tests.reference import delta_rule_recurrent, qkv, shared_qk_reference
from variants import attention_names, attention_spec, build_attention
from variants.attention.common.base import sample_gates

D = 8
LENGTH = 29  # odd, and not a multiple of any block, stride or factor below

# (variant, options): several option sets per variant, small blocks so that windows, strides,
# compressed blocks and random blocks all matter within LENGTH positions.
CASES = [
    ("full", {}),
    ("full", {"shared_qk": True}),
    ("blockwise", {"block_size": 4}),
    ("blockwise", {"block_size": 5, "look_backward": 2, "shared_qk": True}),
    ("strided", {"max_seq_len": LENGTH + 11}),  # stride auto: taken at max_seq_len (6)
    ("strided", {}),  # at the default max_seq_len (4096): a stride beyond the sequence
    ("strided", {"stride": 3}),
    ("compressed", {"factor": 3, "head_dim": D}),
    ("compressed", {"factor": 4, "method": "mean"}),
    ("compressed", {"factor": 2, "method": "max"}),
    ("combined", {"block_size": 4}),
    ("combined", {"parts": ["local", "strided"], "block_size": 4, "max_seq_len": LENGTH + 11}),
    ("combined", {"parts": ["random"], "block_size": 4, "n_random": 1}),  # empty rows
    ("longformer", {"block_size": 4}),
    # Random blocks drawn at max_seq_len.
    ("bigbird", {"block_size": 4, "n_global": 3, "n_random": 2, "max_seq_len": LENGTH + 11}),
    ("sparse_fixed", {"block_size": 8, "n_summary": 3}),
    ("routing", {"n_heads": 3, "head_dim": D, "window": 4, "n_clusters": 3}),
    ("routing", {"n_heads": 3, "head_dim": D, "window": 1, "n_clusters": 2}),
    ("linear", {}),
    ("performer", {"head_dim": D}),
    # Block selection: blocks that cut LENGTH unevenly, top_k beyond the number of blocks,
    # a block longer than the sequence (every prompt shorter than one block).
    ("moba", {"block_size": 4, "top_k": 2}),
    ("moba", {"block_size": 5, "top_k": 3}),
    ("moba", {"block_size": 3, "top_k": 20}),
    ("moba", {"block_size": 32, "top_k": 4}),
    ("nsa", {"block_size": 4, "n_select": 2, "window": 5, "compress": "mean"}),
    ("nsa", {"block_size": 5, "n_select": 3, "window": 7, "head_dim": D}),  # mlp
    ("nsa", {"block_size": 3, "n_select": 20, "window": 64, "compress": "mean"}),
    ("nsa", {"block_size": 16, "n_select": 2, "window": 3, "head_dim": D}),
    ("deltanet", {"chunk_size": 4}),
    ("deltanet", {"chunk_size": 64}),  # one chunk longer than the sequence
    ("gated_deltanet", {"chunk_size": 4}),
    ("gated_deltanet", {"chunk_size": 64}),
    ("mamba2", {"chunk_size": 4}),
    ("mamba2", {"chunk_size": 64}),
]


def _inputs(name, options, length=LENGTH, seed=0):
    """q, k, v (2, 3, length, D) and the gates of a gated variant (None for the others):
    sigmoid(N(0, 1)) per head and position, as the layer's projection gives them."""
    q, k, v = qkv(2, 3, length, D, seed=seed)
    if attention_spec(name).shared_qk_required or options.get("shared_qk"):
        k = q  # as the model hands shared-QK kernels their keys
    gates = None
    if attention_spec(name).n_gates:
        noise = torch.randn(2, 3, length, attention_spec(name).n_gates, dtype=torch.float64,
                            generator=torch.Generator().manual_seed(seed + 100))  # fmt: skip
        gates = torch.sigmoid(noise)
    return q, k, v, gates


def _at(gates, positions):
    return None if gates is None else gates[:, :, positions]


def _decode_all(kernel, q, k, v, cache, start=0, gates=None):
    steps = [slice(t, t + 1) for t in range(start, q.shape[2])]
    outs = [kernel.decode(q[:, :, t], k[:, :, t], v[:, :, t], cache, _at(gates, t)) for t in steps]
    return torch.cat(outs, dim=2)


def _kernel(name, options):
    torch.manual_seed(0)  # learned compressions (NSA's MLP, compressed's convs)
    return build_attention(name, causal=True, **options).double().eval()


@pytest.mark.parametrize(("name", "options"), CASES, ids=lambda x: str(x))
def test_decode_from_empty_cache_equals_the_causal_forward(name, options):
    kernel = _kernel(name, options)
    q, k, v, gates = _inputs(name, options)
    want = kernel(q, k, v, gates=gates)
    cache = kernel.init_cache(2, 3, D, max_len=LENGTH, dtype=torch.float64)
    got = _decode_all(kernel, q, k, v, cache, gates=gates)
    assert (got - want).abs().max() <= 1e-10
    assert cache.length == LENGTH


@pytest.mark.parametrize(("name", "options"), CASES, ids=lambda x: str(x))
@pytest.mark.parametrize("prompt", [1, 12, LENGTH - 1])
def test_prefill_then_decode_equals_the_causal_forward(name, options, prompt):
    kernel = _kernel(name, options)
    q, k, v, gates = _inputs(name, options, seed=1)
    want = kernel(q, k, v, gates=gates)
    cache = kernel.init_cache(2, 3, D, max_len=LENGTH, dtype=torch.float64)
    head = slice(0, prompt)
    first = kernel.prefill(q[:, :, head], k[:, :, head], v[:, :, head], cache, _at(gates, head))
    rest = _decode_all(kernel, q, k, v, cache, start=prompt, gates=gates)
    assert (torch.cat([first, rest], dim=2) - want).abs().max() <= 1e-10


@pytest.mark.parametrize(("name", "options"), CASES, ids=lambda x: str(x))
def test_a_cache_longer_than_the_sequence_decodes_the_causal_forward(name, options):
    # max_len up to the kernel's max_seq_len (as a model's generation has it): length-dependent
    # patterns are the forward's whatever the cache's length.
    kernel = _kernel(name, options)
    q, k, v, gates = _inputs(name, options, seed=2)
    want = kernel(q, k, v, gates=gates)
    cache = kernel.init_cache(2, 3, D, max_len=LENGTH + 11, dtype=torch.float64)
    head = slice(0, 12)
    first = kernel.prefill(q[:, :, head], k[:, :, head], v[:, :, head], cache, _at(gates, head))
    rest = _decode_all(kernel, q, k, v, cache, start=12, gates=gates)
    assert (torch.cat([first, rest], dim=2) - want).abs().max() <= 1e-10


def test_every_causal_variant_decodes_and_says_whether_it_matches_its_forward():
    for name in attention_names():
        spec = attention_spec(name)
        if spec.causal_supported:
            assert spec.supports_decode, name
        assert spec.decode_matches_forward == (spec.variant != "lsh"), name
    # Every decoding variant's decode = forward: the conformance kit (tests/variants/
    # test_conformance.py) runs it over the registry; CASES here add options worth their own.
    assert not attention_spec("linformer").supports_decode
    with pytest.raises(ValueError, match="linformer: cannot decode: it is not causal"):
        build_attention("linformer", max_seq_len=16).init_cache(1, 1, D, max_len=16)


def test_decode_refuses_a_non_causal_kernel_and_an_overfull_cache():
    with pytest.raises(ValueError, match="full: decode needs option causal=True"):
        build_attention("full").init_cache(1, 1, D, max_len=4)
    kernel = _kernel("full", {})
    q, k, v = qkv(1, 1, 3, D)
    cache = kernel.init_cache(1, 1, D, max_len=2, dtype=torch.float64)
    with pytest.raises(ValueError, match="full: cache of option 'max_len'=2 cannot take 3"):
        kernel.prefill(q, k, v, cache)


def test_gated_decode_takes_the_positions_gates_and_nothing_else():
    kernel = _kernel("deltanet", {})
    q, k, v, gates = _inputs("deltanet", {}, length=2)
    cache = kernel.init_cache(2, 3, D, max_len=2, dtype=torch.float64)
    with pytest.raises(ValueError, match="deltanet: option 'gates' is required"):
        kernel.prefill(q, k, v, cache)
    with pytest.raises(ValueError, match=r"deltanet: option 'gates' must have shape"):
        kernel.decode(q[:, :, :1], k[:, :, :1], v[:, :, :1], cache, gates)
    full = _kernel("full", {})
    with pytest.raises(ValueError, match="full: option 'gates' is not taken"):
        full.decode(q[:, :, :1], k[:, :, :1], v[:, :, :1], cache, gates[:, :, :1])
    assert cache.length == 0
    with pytest.raises(ValueError, match="nsa: option 'head_dim'=64 must equal"):
        _kernel("nsa", {}).init_cache(1, 1, D, max_len=4)


def _cache_bytes_after(name, options, length, max_len=64):
    kernel = _kernel(name, options)
    q, k, v, gates = _inputs(name, options, length=length)
    cache = kernel.init_cache(2, 3, D, max_len=max_len, dtype=torch.float64)
    kernel.prefill(q, k, v, cache, gates)
    return cache.nbytes


@pytest.mark.parametrize(
    ("name", "options", "flat_after"),
    [
        ("blockwise", {"block_size": 4, "look_backward": 1}, 8),
        ("longformer", {"block_size": 4, "n_global": 2}, 3 * 4 + 2),  # look_backward 2
        ("routing", {"n_heads": 3, "head_dim": D, "window": 3, "n_clusters": 2}, None),
        ("linear", {}, 0),
        ("performer", {"head_dim": D}, 0),
        ("deltanet", {}, 0),
    ],
)
def test_window_and_state_caches_stop_growing(name, options, flat_after):
    """Window caches hold at most their window (plus global tokens); states never grow."""
    sizes = [_cache_bytes_after(name, options, length) for length in (20, 33, 64)]
    assert sizes[0] == sizes[1] == sizes[2]
    if flat_after:
        assert sizes[0] == 2 * 2 * 3 * flat_after * D * 8  # keys and values, fp64


def test_exact_compressed_block_and_state_caches_hold_what_they_say():
    full = _cache_bytes_after("full", {}, 33)
    assert full == 2 * 2 * 3 * 33 * D * 8
    # 33 positions in blocks of 4: 8 summaries and one open position.
    assert _cache_bytes_after("compressed", {"factor": 4, "method": "mean"}, 33) == full * 9 // 33
    # Block selection: every key and value, plus 8 ended blocks' mean keys (MoBA) or
    # compressed keys and values (NSA); the open block has no summary yet.
    summary = 2 * 3 * 8 * D * 8
    assert _cache_bytes_after("moba", {"block_size": 4}, 33) == full + summary
    nsa = {"block_size": 4, "compress": "mean"}
    assert _cache_bytes_after("nsa", nsa, 33) == full + 2 * summary
    assert _cache_bytes_after("deltanet", {}, 33) == 2 * 3 * D * D * 8  # S, D x D per head


@pytest.mark.parametrize("prompt", [5, 19])
def test_deltanet_prefill_leaves_the_recurrences_state(prompt):
    kernel = _kernel("deltanet", {"chunk_size": 4})
    q, k, v, gates = _inputs("deltanet", {}, length=prompt, seed=3)
    cache = kernel.init_cache(2, 3, D, max_len=prompt, dtype=torch.float64)
    kernel.prefill(q, k, v, cache, gates)
    _, state = delta_rule_recurrent(q, k, v, gates[..., 0], return_state=True)  # S: (B, H, D, D)
    assert (cache.state.transpose(-1, -2) - state).abs().max() <= 1e-12  # the cache holds S^T


# --- LSH: its own decode rule, against a dense reference of that rule -----------------------


def lsh_rule_reference(q, v, rotations, dedup):
    """Every earlier key sharing the query's bucket in some round (argmax([xR; -xR]) with the
    given rotations, one hash per round); with dedup each such key once, without once per round
    it shares; the query itself only when no key qualifies. q, v: (B, H, L, D)."""
    projected = torch.einsum("bhld,drc->bhrlc", q, rotations)  # (B, H, R, L, n/2)
    buckets = torch.cat([projected, -projected], dim=-1).argmax(dim=-1)  # (B, H, R, L)
    shares = buckets[..., :, None] == buckets[..., None, :]  # (B, H, R, L, L)
    length = q.shape[2]
    earlier = torch.ones(length, length, dtype=torch.bool).tril(-1)
    counts = (shares & earlier).sum(dim=2)  # (B, H, L, L) rounds that share
    allowed = (counts > 0) | torch.eye(length, dtype=torch.bool)
    return shared_qk_reference(q, v, allowed, None if dedup else counts.to(q.dtype))


@pytest.mark.parametrize(("n_hashes", "dedup"), [(1, True), (3, True), (3, False)])
def test_lsh_decode_follows_its_rule(n_hashes, dedup):
    kernel = _kernel("lsh", {"n_hashes": n_hashes, "bucket_size": 4, "dedup": dedup, "seed": 3})
    q, _, v = qkv(2, 3, LENGTH, D, seed=2)
    cache = kernel.init_cache(2, 3, D, max_len=LENGTH, dtype=torch.float64)
    prompt = 10
    first = kernel.prefill(q[:, :, :prompt], q[:, :, :prompt], v[:, :, :prompt], cache)
    torch.testing.assert_close(first, kernel(q[:, :, :prompt], q[:, :, :prompt], v[:, :, :prompt]))
    got = _decode_all(kernel, q, q, v, cache, start=prompt)
    want = lsh_rule_reference(q, v, cache.rotations, dedup)[:, :, prompt:]
    assert (got - want).abs().max() <= 1e-10
    assert cache.n_buckets == 2 * 32 // 4  # the forward's default at max_len (padded to 32)


def test_routing_decode_leaves_the_centroids_alone():
    kernel = build_attention("routing", causal=True, n_heads=3, head_dim=D, window=4).double()
    kernel.train()
    before = kernel.centroid_sums.clone()
    q, _, v = qkv(2, 3, 9, D)
    cache = kernel.init_cache(2, 3, D, max_len=9, dtype=torch.float64)
    kernel.prefill(q[:, :, :5], q[:, :, :5], v[:, :, :5], cache)
    _decode_all(kernel, q, q, v, cache, start=5)
    assert torch.equal(kernel.centroid_sums, before)
    assert kernel.training  # its mode is restored


# --- A call that does not fit the cache is refused before it touches it --------------------

DECODING = [n for n in attention_names() if attention_spec(n).supports_decode]
HEADS, MAX_LEN, PROMPT = 2, 8, 5


def _registry_kernel(name, dtype=torch.float64):
    """`name` as a model of HEADS heads of dim D would build it, causal, seeded, in eval."""
    spec = attention_spec(name)
    model = {"causal": True, "n_heads": HEADS, "head_dim": D, "max_seq_len": MAX_LEN,
             "shared_qk": spec.shared_qk_required}  # fmt: skip
    options = {k: v for k, v in model.items() if k in spec.model_options}
    if "seed" in spec.options:
        options["seed"] = 0
    torch.manual_seed(0)
    return build_attention(name, **options).to(dtype).eval()


def _registry_inputs(kernel, length=MAX_LEN):
    """q, k, v (2, HEADS, length, D) float64 and the kernel's gates (None if ungated)."""
    q, k, v = qkv(2, HEADS, length, D, seed=5)
    gates = sample_gates(kernel, q, torch.Generator().manual_seed(6))
    return q, (q if kernel.applies_shared_qk else k), v, gates


def _cache_state(cache):
    """Every attribute of the cache, tensors cloned: what a refused call must leave alone."""
    return {
        key: value.clone() if isinstance(value, torch.Tensor) else value
        for key, value in vars(cache).items()
    }


def _assert_same_state(cache, state):
    assert vars(cache).keys() == state.keys()
    for key, value in state.items():
        now = getattr(cache, key)
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(now, value, rtol=0, atol=0, equal_nan=True, msg=key)
        elif not callable(value):
            assert now == value, key


MISFITS = {
    "batch": lambda x: x[:1],
    "heads": lambda x: x[:, :1],
    "head_dim": lambda x: x[..., :4],
    "dtype": lambda x: x.float(),
    "device": lambda x: x.to("meta"),
}


@pytest.mark.parametrize("misfit", list(MISFITS))
@pytest.mark.parametrize("name", DECODING)
def test_a_decode_that_does_not_fit_the_cache_is_refused_and_leaves_it_as_it_was(name, misfit):
    """Refused before any hook runs: the cache's length once advanced over a slot never written
    (full: then off by 1e30 or NaN), and routing took a batch-1 decode into a batch-2 cache."""
    kernel = _registry_kernel(name)
    q, k, v, gates = _registry_inputs(kernel)

    def call(cache, at, change=lambda x: x):
        inputs = [change(x[:, :, at]) for x in (q, k, v)]
        gate = None if gates is None else gates[:, :, at]
        if gate is not None and misfit != "head_dim":  # gates (B, H, T, n) have no head_dim
            gate = change(gate)
        method = kernel.prefill if at.start == 0 else kernel.decode
        return method(*inputs, cache, gate)

    prompt, steps = slice(0, PROMPT), [slice(t, t + 1) for t in range(PROMPT, MAX_LEN)]
    fresh = kernel.init_cache(2, HEADS, D, max_len=MAX_LEN, dtype=torch.float64)
    want = [call(fresh, prompt), *(call(fresh, at) for at in steps)]
    cache = kernel.init_cache(2, HEADS, D, max_len=MAX_LEN, dtype=torch.float64)
    got = [call(cache, prompt)]
    state = _cache_state(cache)
    with pytest.raises(ValueError, match=rf"{misfit}.*init_cache") as error:
        call(cache, steps[0], MISFITS[misfit])
    assert "\n" not in str(error.value) and attention_spec(name).variant in str(error.value)
    _assert_same_state(cache, state)
    got += [call(cache, at) for at in steps]
    for mine, theirs in zip(got, want, strict=True):
        assert torch.equal(mine, theirs)
    # A full cache refuses one more position, naming max_len, and stays full.
    state = _cache_state(cache)
    with pytest.raises(ValueError, match="max_len"):
        call(cache, slice(MAX_LEN - 1, MAX_LEN))
    _assert_same_state(cache, state)


@pytest.mark.parametrize("name", DECODING)
def test_a_prompt_longer_than_the_cache_is_refused_and_leaves_it_empty(name):
    """64 and 70 positions: past bigbird's first random-block table row (blocks of 64)."""
    kernel = _registry_kernel(name)
    q, k, v, gates = _registry_inputs(kernel, length=70)
    fresh = kernel.init_cache(2, HEADS, D, max_len=64, dtype=torch.float64)
    head = slice(0, 64)
    want = kernel.prefill(q[:, :, head], k[:, :, head], v[:, :, head], fresh, _at(gates, head))
    cache = kernel.init_cache(2, HEADS, D, max_len=64, dtype=torch.float64)
    state = _cache_state(cache)
    with pytest.raises(ValueError, match="max_len'=64 cannot take 70 positions"):
        kernel.prefill(q, k, v, cache, gates)
    _assert_same_state(cache, state)
    got = kernel.prefill(q[:, :, head], k[:, :, head], v[:, :, head], cache, _at(gates, head))
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", DECODING)
def test_a_float64_cache_refuses_float32_inputs_naming_dtype(name):
    kernel = _registry_kernel(name, torch.float32)
    q, k, v, gates = (None if x is None else x.float() for x in _registry_inputs(kernel))
    cache = kernel.init_cache(2, HEADS, D, max_len=MAX_LEN, dtype=torch.float64)
    message = (
        r"got dtype torch\.float32 but the cache holds dtype torch\.float64 \(init_cache dtype\)"
    )
    with pytest.raises(ValueError, match=message):
        kernel.prefill(q, k, v, cache, gates)
    with pytest.raises(ValueError, match=message):
        kernel.decode(q[:, :, :1], k[:, :, :1], v[:, :, :1], cache, _at(gates, slice(0, 1)))
    assert cache.length == 0


def test_grouped_heads_are_checked_against_the_heads_the_cache_holds():
    """A native_gqa_decode cache holds n_kv_heads heads, the others n_heads (keys repeated)."""
    q, k, v = qkv(1, 4, 1, D)
    grouped = _kernel("full", {})  # native: its cache holds the KV heads
    cache = grouped.init_cache(1, 4, D, max_len=4, dtype=torch.float64, n_kv_heads=2)
    grouped.decode(q, k[:, :2], v[:, :2], cache)
    with pytest.raises(
        ValueError, match=r"got kv heads 4 but the cache holds kv heads 2 \(init_cache n_kv_heads\)"
    ):
        grouped.decode(q, k, v, cache)
    with pytest.raises(
        ValueError, match=r"got heads 2 but the cache holds heads 4 \(init_cache n_heads\)"
    ):
        grouped.decode(q[:, :2], k[:, :2], v[:, :2], cache)
    assert cache.length == 1
    repeated = _kernel("deltanet", {})  # not native: its cache holds all 4 heads
    assert not repeated.native_gqa_decode
    cache = repeated.init_cache(1, 4, D, max_len=4, dtype=torch.float64, n_kv_heads=2)
    gates = torch.full((1, 4, 1, 1), 0.5, dtype=torch.float64)
    repeated.decode(q, k[:, :2], v[:, :2], cache, gates)  # the keys repeated to 4 heads
    repeated.decode(q, k, v, cache, gates)  # as repeated already
    assert cache.heads == cache.query_heads == 4 and cache.length == 2


def test_a_hook_that_raises_halfway_leaves_the_cache_length_as_it_was(monkeypatch):
    kernel = _kernel("full", {})
    q, k, v = qkv(1, 1, 3, D)
    fresh = kernel.init_cache(1, 1, D, max_len=3, dtype=torch.float64)
    want = [kernel.decode(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], fresh)
            for t in range(3)]  # fmt: skip
    cache = kernel.init_cache(1, 1, D, max_len=3, dtype=torch.float64)
    kernel.decode(q[:, :, :1], k[:, :, :1], v[:, :, :1], cache)

    def fails_after_appending(q, k, v, cache):
        cache.append(k * float("nan"), v)
        raise RuntimeError("a fault past the checks")

    monkeypatch.setattr(kernel, "decode_step", fails_after_appending)
    with pytest.raises(RuntimeError, match="a fault past the checks"):
        kernel.decode(q[:, :, 1:2], k[:, :, 1:2], v[:, :, 1:2], cache)
    monkeypatch.undo()
    assert cache.length == 1
    got = [kernel.decode(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], cache)
           for t in (1, 2)]  # fmt: skip
    assert torch.equal(torch.cat(got, 2), torch.cat(want[1:], 2))
