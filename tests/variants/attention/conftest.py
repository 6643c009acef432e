"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest

from variants.attention import flash


@pytest.fixture(params=[True, False], ids=["fused", "explicit"])
def flash_kernels(request, monkeypatch):
    """Both paths of `variants.attention.flash`: PyTorch's fused CPU flash kernels and the
    explicit matmuls that other devices run."""
    monkeypatch.setattr(flash, "FUSED_CPU_KERNELS", request.param)
    return request.param
