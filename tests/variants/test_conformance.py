"""The conformance kit (variants/conformance.py) over every registered variant: the one suite of
the properties every kernel keeps, run on a user's variant by `python -m variants.conformance`."""

from __future__ import annotations

import pytest
import torch

import variants
from variants import conformance

NAMES = variants.attention_names()


@pytest.mark.parametrize("prop", list(conformance.PROPERTIES))
@pytest.mark.parametrize("name", NAMES)
def test_every_variant_keeps_every_property_it_claims(name, prop):
    (result,) = conformance.check(name, properties=[prop])
    assert result.status != conformance.FAILED, result.line()


class Peeking(variants.Attention):
    """Causal attention that also reads one token ahead: what the kit must catch."""

    name = "peeking"
    exact = False
    time_complexity = memory_complexity = "O(L^2)"

    def attend(self, q, k, v):
        length = q.shape[2]
        allowed = torch.ones(length, length, dtype=torch.bool).tril(diagonal=1)
        scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def flops(self, batch, heads, seq_len, head_dim):
        return 4 * batch * heads * seq_len * seq_len * head_dim


@pytest.fixture
def peeking():
    variants.register_attention(Peeking)
    yield Peeking.name
    variants.registry._ATTENTION._entries.pop(Peeking.name)


def test_a_kernel_that_sees_one_token_ahead_fails_causality(peeking):
    results = {r.name: r for r in conformance.check(peeking)}
    assert results["causal_gradient"].status == conformance.FAILED
    assert results["causal_gradient"].deviation > 1e-3
    assert results["causal_append"].status == conformance.FAILED
    assert results["shape_and_dtype"].status == conformance.HELD
    assert results["decode"].status == conformance.NOT_CLAIMED


def test_the_command_prints_a_line_per_property_and_exits_nonzero_on_a_failure(peeking, capsys):
    assert conformance.main([peeking]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(conformance.PROPERTIES) + 1
    assert any(line.startswith("FAILED causal_gradient") for line in lines)
    assert conformance.main(["full"]) == 0


def test_bad_arguments_are_one_line(capsys):
    assert conformance.main(["full", "--length", "4"]) == 2
    assert "'--length'" in capsys.readouterr().err
    assert conformance.main(["full", "--plugins", "no_such_module_x"]) == 2
    assert "no_such_module_x" in capsys.readouterr().err
    assert conformance.main(["nope"]) == 2
    assert "unknown attention variant 'nope'" in capsys.readouterr().err


class HeadScaled(variants.Attention):
    """Causal attention times a learned scale per head: independent heads only if each call
    reads its own heads' scales (`of_heads`); `rows` says how it reads them."""

    name = "head_scaled"
    exact = False
    time_complexity = memory_complexity = "O(L^2)"
    independent_heads = True
    rows = "of_heads"

    def __init__(self, *, causal: bool = True, n_heads: int = 4):
        super().__init__(causal=causal)
        self.scale = torch.nn.Parameter(torch.arange(1.0, n_heads + 1))

    def attend(self, q, k, v):
        heads = q.shape[1]
        scale = self.of_heads(self.scale) if self.rows == "of_heads" else self.scale[:heads]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return out * scale[:, None, None]  # (B, H, L, D)

    def flops(self, batch, heads, seq_len, head_dim):
        return 2 * batch * heads * seq_len * seq_len * head_dim


@pytest.mark.parametrize("rows, status", [("of_heads", "held"), ("first", "FAILED")])
def test_heads_apart_must_read_their_own_per_head_weights(rows, status, monkeypatch):
    monkeypatch.setattr(HeadScaled, "rows", rows)
    variants.register_attention(HeadScaled)
    try:
        (result,) = conformance.check(HeadScaled.name, properties=["independent_heads"])
    finally:
        variants.registry._ATTENTION._entries.pop(HeadScaled.name)
    assert result.status == status, result.line()
