"""SelfAttention and FeedForward against plain-autograd references written here."""

import math

import pytest
import torch
import torch.nn.functional as F

import variants
from experiments.measurement.memory import peak_memory_bytes
from tests.reference import causal_mask, dense_attention, shared_qk_reference
from tests.variants.attention.common.test_masking import (
    PADDED_SHAPE,
    PADDED_TAIL,
    SEVERAL_BLOCKS,
    padding_cases,
)
from variants.checks import UnsupportedCombination
from variants.layers import FeedForward, SelfAttention, rotary
from variants.model_config import ModelConfig


def attention_layer(d_model=None, n_heads=None, **fields):
    """The attention sublayer of a model of these ModelConfig fields, with the kernel the model
    builds for it."""
    sizes = {k: v for k, v in (("d_model", d_model), ("n_heads", n_heads)) if v is not None}
    config = ModelConfig(**sizes, **fields)
    return SelfAttention(config, config.kernel())


def feed_forward(d_model, **fields):
    return FeedForward(ModelConfig(d_model=d_model, n_heads=1, **fields))


def _reference_self_attention(layer, x, causal, normalise_keys=False, exclude_self=False):
    """Multi-head attention from the layer's weights, on explicit (L, L) scores.

    normalise_keys: keys are q / |q| (shared QK); exclude_self: also the Reformer's rule that a
    token attends to itself only when it has nothing else."""
    batch, length, d_model = x.shape
    heads, head_dim = layer.n_heads, d_model // layer.n_heads
    projected = F.linear(x, layer.qkv.weight, layer.qkv.bias)
    if layer.config.shared_qk:
        q, v = projected.split(d_model, dim=-1)
        k = q
    else:
        q, k, v = projected.split(d_model, dim=-1)

    def split_heads(t):
        return t.reshape(batch, length, heads, head_dim).permute(0, 2, 1, 3)

    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    mask = causal_mask(length) if causal else None
    if exclude_self:
        y = shared_qk_reference(q, v, mask)
    else:
        scale = 1.0 / math.sqrt(head_dim)
        if normalise_keys:
            k = k / k.norm(dim=-1, keepdim=True)
            scale = 1.0  # the Reformer's q . k_hat
        y = dense_attention(q, k, v, mask=mask, scale=scale)
    y = y.permute(0, 2, 1, 3).reshape(batch, length, d_model)
    return F.linear(y, layer.out.weight, layer.out.bias)


@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_matches_dense_reference(causal):
    torch.manual_seed(0)
    layer = attention_layer(24, 3, causal=causal).double()
    x = torch.randn(2, 11, 24, dtype=torch.float64)
    torch.testing.assert_close(layer(x), _reference_self_attention(layer, x, causal))


@pytest.mark.parametrize("attention", ["full", "blockwise"])
def test_shared_qk_kernels_get_unit_keys_and_skip_self(attention):
    torch.manual_seed(0)
    layer = attention_layer(24, 3, attention=attention, shared_qk=True).double()
    assert layer.qkv.out_features == 2 * 24  # one projection for queries and keys
    assert layer.kernel.shared_qk
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    expected = _reference_self_attention(layer, x, causal=True, exclude_self=True)
    torch.testing.assert_close(layer(x), expected)


def test_other_kernels_get_unit_keys_under_shared_qk_and_keep_self():
    torch.manual_seed(0)
    # stride 9 >= L: strided's local part covers every pair, so it is exact causal attention.
    layer = attention_layer(
        24, 3, attention="strided", attention_options={"stride": 9}, shared_qk=True
    ).double()
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    expected = _reference_self_attention(layer, x, causal=True, normalise_keys=True)
    torch.testing.assert_close(layer(x), expected)


def test_the_layer_runs_the_kernel_it_is_handed():
    config = ModelConfig(d_model=16, n_heads=4, attention="full")
    kernel = ModelConfig(d_model=16, n_heads=4, attention="linear").kernel()
    layer = SelfAttention(config, kernel).double()
    assert layer.kernel is kernel  # not rebuilt from the config's attention
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    q, k, v = (t.unflatten(-1, (4, 4)).transpose(1, 2) for t in layer.qkv(x).chunk(3, dim=-1))
    y = kernel(q, k, v).transpose(1, 2).flatten(-2)  # (B, L, d_model)
    torch.testing.assert_close(layer(x), layer.out(y))


def test_kernel_receives_only_the_model_options_it_declares():
    layer = attention_layer(16, 4, causal=False, attention_options={"impl": "math"})
    assert layer.kernel.causal is False and layer.kernel.impl == "math"


def _reference_ff(ff, x):
    first, _, _, second = ff.net
    return F.linear(F.gelu(F.linear(x, first.weight, first.bias)), second.weight, second.bias)


@pytest.mark.parametrize("ff_chunks", [1, 3, 7, 12])
def test_ff_chunking_is_exact_in_output_and_gradients(ff_chunks):
    torch.manual_seed(0)
    ff = feed_forward(8, ff_mult=3, ff_chunks=ff_chunks).double()
    x = torch.randn(2, 10, 8, dtype=torch.float64, requires_grad=True)
    out = ff(x)
    expected = _reference_ff(ff, x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)

    cotangent = torch.randn_like(out)
    params = list(ff.parameters())
    grads = torch.autograd.grad(out, [x, *params], cotangent)
    expected_grads = torch.autograd.grad(expected, [x, *params], cotangent)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert all(p.grad is None for p in params)


def test_ff_chunk_recompute_replays_dropout():
    # Reference: the same pieces through plain autograd (no recompute), same seed.
    ff = feed_forward(8, ff_chunks=3, dropout=0.5).double()
    x = torch.randn(2, 10, 8, dtype=torch.float64, requires_grad=True)
    params = list(ff.parameters())
    torch.manual_seed(1)
    out = ff(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *params])
    torch.manual_seed(1)
    expected = torch.cat([ff.net(piece) for piece in torch.tensor_split(x, 3, dim=1)], dim=1)
    expected_grads = torch.autograd.grad(expected.square().sum(), [x, *params])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_ff_chunking_lowers_peak_memory_of_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(2, 512, 64, requires_grad=True)

    def peak(ff_chunks):
        ff = feed_forward(64, ff_chunks=ff_chunks)
        return peak_memory_bytes(lambda: ff(x).sum().backward())

    whole, chunked = peak(1), peak(8)
    # The (2, 512, 256) hidden layer is 1 MiB; unchunked, autograd keeps it and its GELU output.
    assert chunked < 0.6 * whole, (whole, chunked)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"d_model": 10, "n_heads": 3}, ["'d_model'", "'n_heads'"]),
        ({"d_model": 0, "n_heads": 1}, ["'d_model'", "positive"]),
        ({"d_model": 8, "n_heads": -2}, ["'n_heads'", "positive"]),
        ({"d_model": 8, "n_heads": 2, "dropout": 1.0}, ["'dropout'"]),
        ({"d_model": 8, "n_heads": 2, "attention": "nope"}, ["'nope'", "full"]),
        ({"d_model": 8, "n_heads": 2, "attention_options": {"causal": False}}, ["'causal'"]),
        ({"d_model": 8, "n_heads": 2, "attention_options": {"bogus": 1}}, ["'bogus'"]),
        ({"d_model": 8, "n_heads": 2, "shared_qk": "yes"}, ["'shared_qk'"]),
    ],
)
def test_self_attention_errors_name_the_option(kwargs, words):
    with pytest.raises(ValueError) as err:
        attention_layer(**kwargs)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"ff_mult": 0}, "'ff_mult'"),
        ({"ff_chunks": 0}, "'ff_chunks'"),
        ({"dropout": -0.1}, "'dropout'"),
    ],
)
def test_feed_forward_errors_name_the_option(kwargs, option):
    with pytest.raises(ValueError, match=option):
        feed_forward(8, **kwargs)


def test_lsh_requires_shared_qk():
    with pytest.raises(ValueError, match="'lsh'.*'shared_qk'"):
        attention_layer(16, 2, attention="lsh", shared_qk=False)
    layer = attention_layer(16, 2, attention="lsh", shared_qk=True)
    assert layer(torch.randn(1, 64, 16)).shape == (1, 64, 16)


def _rotary_by_complex_numbers(x: torch.Tensor) -> torch.Tensor:
    """Rotary positions written independently: feature pairs (i, i + D/2) as complex numbers,
    multiplied by exp(i p theta_i), theta_i = 10000^(-2i/D). x: (B, H, L, D)."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half], x[..., half:])  # (B, H, L, D/2)
    theta = 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / x.shape[-1])  # (D/2,)
    p = torch.arange(x.shape[-2], dtype=torch.float64)[:, None]  # (L, 1)
    z = z * torch.polar(torch.ones_like(p * theta), p * theta)
    return torch.cat([z.real, z.imag], dim=-1)


def test_rotary_matches_complex_rotation_and_scores_depend_on_offsets_only():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 40, 8, dtype=torch.float64)
    torch.testing.assert_close(rotary(x), _rotary_by_complex_numbers(x))
    # One query vector a and one key vector b placed at every position: the rotated score of
    # (query at m, key at n) is a function of m - n alone, and a . b when m = n.
    a, b = torch.randn(2, 8, dtype=torch.float64)
    qa = rotary(a.expand(1, 1, 40, 8))[0, 0]  # (L, D): a at every position
    kb = rotary(b.expand(1, 1, 40, 8))[0, 0]
    scores = qa @ kb.T  # (L, L)
    for offset in (-7, 0, 1, 13):
        diagonal = torch.diagonal(scores, offset=-offset)  # pairs with m - n = offset
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal))
    torch.testing.assert_close(torch.diagonal(scores), (a @ b).expand(40))
    assert not torch.allclose(scores[5, 1], scores[5, 2])  # and it does depend on the offset


@pytest.mark.parametrize("attention, shared_qk", [("full", False), ("full", True), ("lsh", None)])
def test_rotary_layer_hands_the_kernel_rotated_queries_and_keys(attention, shared_qk):
    torch.manual_seed(0)
    layer = attention_layer(16, 2, positions="rotary", attention=attention, shared_qk=shared_qk)
    plain = attention_layer(16, 2, attention=attention, shared_qk=shared_qk)
    plain.load_state_dict(layer.state_dict())
    seen = {}
    layer.kernel.register_forward_pre_hook(lambda _m, args: seen.update(rotated=args))
    plain.kernel.register_forward_pre_hook(lambda _m, args: seen.update(plain=args))
    x = torch.randn(2, 12, 16)
    layer(x), plain(x)
    (q, k, v), (q0, k0, v0) = seen["rotated"], seen["plain"]
    torch.testing.assert_close(q, rotary(q0))
    torch.testing.assert_close(k, rotary(k0))  # shared QK: k = q stays k = q, unit keys stay unit
    torch.testing.assert_close(v, v0)
    if layer.config.shared_qk:
        assert torch.equal(k, q) or torch.allclose(k.norm(dim=-1), k0.norm(dim=-1))


def test_token_positions_count_the_real_tokens_before_each_in_its_document():
    from variants.attention.common.masking import token_positions

    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    segments = torch.tensor([[0, 0, 0, 1, 1, 2], [3, 3, 4, 4, 4, 4]])
    for m, s in ((mask, None), (None, segments), (mask, segments)):
        expected = torch.zeros(2, 6, dtype=torch.long)
        for b in range(2):  # the reference: a loop counting real tokens since the document began
            seen, doc = 0, None
            for t in range(6):
                if s is not None and s[b, t] != doc:
                    seen, doc = 0, s[b, t]
                real = m is None or bool(m[b, t])
                expected[b, t] = max(seen + real - 1, 0)
                seen += real
        assert torch.equal(token_positions(m, s), expected), (m, s)
    assert token_positions(None, None) is None


@pytest.mark.parametrize("attention", ["linear", "full"])
@pytest.mark.parametrize("chunks", [1, 2])
def test_rotary_positions_of_a_padded_row_or_packed_document_are_its_own(attention, chunks):
    """Linear attention's feature map is not rotation invariant: its outputs move if a row's
    positions shift. A left-padded row and a packed document each equal themselves alone."""
    torch.manual_seed(0)
    layer = attention_layer(
        16, 2, positions="rotary", attention=attention, attention_chunks=chunks
    ).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :3] = False  # row 0 left-padded by 3
    out = layer(x, attention_mask=mask)
    torch.testing.assert_close(out[0, 3:], layer(x[:1, 3:])[0])
    torch.testing.assert_close(out[1], layer(x[1:])[0])
    segments = torch.tensor([[0] * 4 + [1] * 5, [2] * 9])
    packed = layer(x, segment_ids=segments)
    torch.testing.assert_close(packed[0, 4:], layer(x[:1, 4:])[0])
    if attention == "linear":  # absolute positions would have moved the padded row
        assert not torch.allclose(layer(x[:1])[0, 3:], layer(x[:1, 3:])[0])


def test_positions_option_is_checked():
    with pytest.raises(ValueError, match="'positions'"):
        ModelConfig(positions="alibi")
    with pytest.raises(ValueError, match="'positions'='rotary' needs an even head_dim"):
        ModelConfig(d_model=9, n_heads=3, positions="rotary")


# --- MultiheadAttention: the layer from its sizes ----------------------------------------------


def test_multihead_attention_is_the_layer_from_its_sizes():
    torch.manual_seed(0)
    layer = variants.MultiheadAttention(24, 3, attention="full").double()
    assert isinstance(layer, SelfAttention) and layer.kernel.causal
    x = torch.randn(2, 11, 24, dtype=torch.float64)
    torch.testing.assert_close(layer(x), _reference_self_attention(layer, x, causal=True))


def test_multihead_attention_owns_the_gates_and_the_kernels_extras():
    layer = variants.MultiheadAttention(
        16, 2, "deltanet", bias=False, chunk_size=4, short_conv=3, output_norm=True
    )
    assert layer.gates.out_features == 2 and layer.qkv.bias is None  # beta per head and token
    names = {name for name, _ in layer.named_parameters()}
    assert {"kernel.conv.weight", "kernel.norm_weight", "gates.weight"} <= names
    assert layer(torch.randn(2, 9, 16)).shape == (2, 9, 16)


@pytest.mark.parametrize(
    ("attention", "options"),
    [("blockwise", {"block_size": 4}), ("deltanet", {"chunk_size": 4, "short_conv": 3})],
)
def test_multihead_attention_prefill_and_decode_equal_its_forward(attention, options):
    torch.manual_seed(0)
    layer = variants.MultiheadAttention(16, 2, attention, **options).double().eval()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    cache = layer.init_cache(2, max_len=13)
    with torch.no_grad():
        expected = layer(x)
    got = torch.cat([layer.prefill(x[:, :6], cache), layer.decode(x[:, 6:], cache)], dim=1)
    torch.testing.assert_close(got, expected)
    assert cache.length == 13


@pytest.mark.parametrize("attention", ["full", "linear"])
def test_multihead_attention_padded_rows_equal_the_rows_alone(attention):
    """Right padding under a causal layer: a row's real positions are the row run alone."""
    torch.manual_seed(0)
    layer = variants.MultiheadAttention(16, 2, attention).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 6:] = False
    y = layer(x, attention_mask=keep)
    torch.testing.assert_close(y[1, :6], layer(x[1:, :6])[0])
    torch.testing.assert_close(y[0], layer(x[:1])[0])


@pytest.mark.parametrize("fill", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("name, causal", list(padding_cases()))
def test_multihead_attention_padded_positions_values_never_reach_real_outputs(name, causal, fill):
    """NaN or inf in x at padded positions: the outputs and the gradients of x and of every
    parameter are bit for bit those of zeros there, hence finite."""
    batch, heads, length, head_dim = PADDED_SHAPE
    torch.manual_seed(0)
    layer = (
        variants.MultiheadAttention(
            heads * head_dim,
            heads,
            name,
            causal=causal,
            max_seq_len=length,
            **SEVERAL_BLOCKS.get(name, {}),
        )
        .double()
        .eval()
    )
    keep = torch.ones(batch, length, dtype=torch.bool)
    keep[1, -PADDED_TAIL:] = False
    x = torch.randn(batch, length, heads * head_dim, dtype=torch.float64)
    weight = torch.randn_like(x)

    def run(value):
        padded = x.masked_fill(~keep[..., None], value).requires_grad_()
        y = layer(padded, attention_mask=keep)
        return y, torch.autograd.grad((y * weight).sum(), [padded, *layer.parameters()])

    y, grads = run(fill)
    expected, expected_grads = run(0.0)
    assert torch.isfinite(expected).all() and torch.equal(y, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert torch.isfinite(expected_grad).all() and torch.equal(grad, expected_grad)


def test_multihead_attention_projects_keys_and_values_to_fewer_heads():
    torch.manual_seed(0)
    layer = variants.MultiheadAttention(16, 4, "full", n_kv_heads=1, bias=False).double()
    full = variants.MultiheadAttention(16, 4, "full", bias=False)
    projections = sum(p.numel() for p in layer.parameters())
    assert projections == sum(p.numel() for p in full.parameters()) - 2 * 16 * 12  # k, v: 4 -> 1
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    cache = layer.init_cache(2, max_len=7)
    with torch.no_grad():
        expected = layer(x)
    got = torch.cat([layer.prefill(x[:, :3], cache), layer.decode(x[:, 3:], cache)], dim=1)
    torch.testing.assert_close(got, expected)


def test_multihead_attention_errors_name_the_option():
    with pytest.raises(ValueError, match="unknown attention variant 'nope'; available: full"):
        variants.MultiheadAttention(16, 2, "nope")
    with pytest.raises(ValueError, match="no option 'size'; its options are: block_size"):
        variants.MultiheadAttention(16, 2, "blockwise", size=4)
    with pytest.raises(ValueError, match="MultiheadAttention: option 'd_model'=16 must be"):
        variants.MultiheadAttention(16, 3, "full")
    with pytest.raises(ValueError, match="MultiheadAttention: option 'n_heads'=4 must be"):
        variants.MultiheadAttention(16, 4, "full", n_kv_heads=3)
    with pytest.raises(UnsupportedCombination, match="'n_kv_heads'=2 cannot combine with 'sha"):
        variants.MultiheadAttention(16, 4, "lsh", n_kv_heads=2)
    layer = variants.MultiheadAttention(16, 2, "linear")
    with pytest.raises(ValueError, match="decode needs a prefilled cache"):
        layer.decode(torch.randn(1, 1, 16), layer.init_cache(1, max_len=4))


@pytest.mark.parametrize(
    "x, words",
    [
        (
            torch.randn(2, 5, 8),
            r"must have shape \(batch, seq_len, d_model\) with option 'd_model'=16",
        ),
        (torch.randn(5, 16), r"must have shape \(batch, seq_len, d_model\).*got \(5, 16\)"),
        (
            torch.randn(2, 5, 16, dtype=torch.float64),
            "is torch.float64, the layer's parameters torch.float32",
        ),
    ],
    ids=["d_model", "2-d", "dtype"],
)
def test_multihead_attention_bad_inputs_are_value_errors_naming_the_constraint(x, words):
    layer = variants.MultiheadAttention(16, 2, "blockwise", block_size=4)
    with pytest.raises(ValueError, match=f"MultiheadAttention: input 'x' .*{words}") as e:
        layer(x)
    assert "\n" not in str(e.value)


def test_multihead_attention_takes_other_dtypes_under_autocast():
    layer = variants.MultiheadAttention(16, 2, "full")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(2, 5, 16).bfloat16()).shape == (2, 5, 16)


@pytest.mark.parametrize("causal", [True, False])
def test_grouped_kv_heads_project_fewer_keys_and_match_a_dense_reference(causal):
    torch.manual_seed(0)
    layer = attention_layer(24, 4, causal=causal, n_kv_heads=2).double()
    assert layer.qkv.out_features == 24 + 2 * 2 * 6  # q of 4 heads, k and v of 2 heads of 6
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    q, k, v = F.linear(x, layer.qkv.weight, layer.qkv.bias).split([24, 12, 12], dim=-1)
    q = q.unflatten(-1, (4, 6)).transpose(1, 2)  # (B, 4, L, 6)
    k, v = (t.unflatten(-1, (2, 6)).transpose(1, 2).repeat_interleave(2, dim=1) for t in (k, v))
    y = dense_attention(q, k, v, mask=causal_mask(9) if causal else None)
    expected = F.linear(y.transpose(1, 2).reshape(2, 9, 24), layer.out.weight, layer.out.bias)
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"attention": "lsh"}, "'n_kv_heads'=2 cannot combine with 'shared_qk'=True"),
        ({"attention_chunks": 2}, "'attention_chunks'=2"),
    ],
)
def test_grouped_kv_heads_refused_where_they_cannot_be_taken(fields, words):
    from variants.checks import UnsupportedCombination

    with pytest.raises(UnsupportedCombination, match=words):
        attention_layer(16, 4, n_kv_heads=2, **fields)


def test_kv_heads_must_divide_the_heads():
    with pytest.raises(ValueError, match="'n_heads'=4 must be divisible by 'n_kv_heads'=3"):
        ModelConfig(d_model=16, n_heads=4, n_kv_heads=3)


def test_pytorchs_key_padding_mask_is_refused_by_name_and_hf_masks_are_taken():
    """One mask convention a PyTorch user cannot get wrong: `attention_mask` True/1 = a token;
    `key_padding_mask` (PyTorch's, True = padding) is refused naming both conventions."""
    mha = variants.MultiheadAttention(32, 4, attention="full", causal=False)
    x = torch.randn(2, 6, 32)
    keep = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="'key_padding_mask' is not taken.*~key_padding_mask"):
        mha(x, key_padding_mask=keep == 0)
    with pytest.raises(ValueError, match="'key_padding_mask' is not taken"):
        mha.kernel(*(torch.randn(2, 4, 6, 8) for _ in range(3)), key_padding_mask=keep == 0)
    torch.testing.assert_close(mha(x, attention_mask=keep), mha(x, attention_mask=keep.bool()))
