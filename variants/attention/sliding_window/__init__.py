"""Sliding-window attention with attention sinks (Mistral, gpt-oss; StreamingLLM)."""

from variants.attention.sliding_window.layer import SlidingWindowAttention

__all__ = ["SlidingWindowAttention"]
