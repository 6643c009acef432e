"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest

from variants.attention.common import flash


@pytest.fixture(params=[True, False], ids=["fused", "explicit"])
def flash_kernels(request, monkeypatch):
    """Both paths of `variants.attention.common.flash`: PyTorch's fused CPU flash kernels and the
    explicit matmuls that other devices run."""
    monkeypatch.setattr(flash, "FUSED_CPU_KERNELS", request.param)
    return request.param


@pytest.fixture
def eager_flex(monkeypatch):
    """impl=flex through eager `flex_attention` (the same function; torch.compile takes ~30 s
    per shape on CPU), its warning about the unfused path silenced."""
    import warnings

    from variants.attention.common import flex

    monkeypatch.setattr(flex, "COMPILE", False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield
