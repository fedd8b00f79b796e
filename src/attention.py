"""Attention: the maths in one place.

On CPU `attend` is a plain matmul-softmax, whose backward beat the fused kernel's (bench/RESEARCH.md, "Engineering").
Parameters and the `mask` buffer keep the handout's names (model.py); its code, which the tests compare against, is
in bench/course.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# CUDA uses only the math kernel, which computes bf16 inputs in fp32. Under bf16 autocast the other kernels gave NaN
# gradients or stalled pretraining, and none is faster at this model's size (bench/RESEARCH.md, "GPU kernels").
CUDA_ATTENTION_KERNELS = [SDPBackend.MATH]


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, dropout_p: float = 0.0
) -> torch.Tensor:
    """Scaled dot-product attention: q (B, nh, Tq, hs), k and v (B, nh, Tk, hs) -> (B, nh, Tq, hs); the bool mask
    (B, nh, Tq, Tk), broadcast, is True where a query may see a key, at least one each."""
    if q.is_cuda:
        with sdpa_kernel(CUDA_ATTENTION_KERNELS):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, Tq, Tk)
    if mask is not None:
        att = att.masked_fill(~mask, float("-inf"))
    return dropout(F.softmax(att, dim=-1), dropout_p) @ v  # (B, nh, Tq, hs)


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """F.dropout(x, p), but run eagerly on CPU, where `bernoulli_` was a large share of a step (bench/RESEARCH.md),
    an element is dropped when 15 random bits fall below round(p * 2**15), a rate within 2**-16 of p."""
    if p == 0.0:
        return x
    if x.is_cuda or torch.compiler.is_compiling():  # a compiled graph draws its own random bits
        return F.dropout(x, p=p)
    n = x.numel()
    # random_() fills an int64 with 63 random bits, so every 16-bit lane has 15 random low bits.
    bits = torch.empty(n // 4 + 1, dtype=torch.int64, device=x.device).random_().view(torch.int16)[:n]
    threshold = round(p * 32768)
    keep = (bits.view(x.shape) & 0x7FFF) >= threshold
    return x * (keep.to(x.dtype) * (32768 / (32768 - threshold)))


class Dropout(nn.Dropout):
    """nn.Dropout computed by `dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p if self.training else 0.0)


def rotary_table(length: int, head_dim: int) -> torch.Tensor:
    """Rotary angles, the 2024 handout's `rope_cache` (length, head_dim/2, 2): table[t, i] = (cos tθ_i, sin tθ_i),
    θ_i = 10000^(-2i/head_dim)."""
    assert head_dim % 2 == 0, "rotary embedding needs an even head size"
    theta = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (hs/2,)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * theta[None, :]  # (length, hs/2)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: x (..., T, hs) and its positions' `table` rows (..., T, hs/2, 2) -> (..., T, hs). Each pair
    (2i, 2i+1), as a complex number, is multiplied by cos tθ_i + i sin tθ_i, so q·k depends only on relative
    position; in whole rows, far faster on CPU than pair by pair."""
    cos = table[..., 0].repeat_interleave(2, dim=-1).to(x.dtype)  # (..., T, hs): cos tθ_i at 2i and 2i+1
    sin = torch.stack((-table[..., 1], table[..., 1]), dim=-1).flatten(-2).to(x.dtype)  # -sin at 2i, +sin at 2i+1
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x_2i+1, x_2i) at (2i, 2i+1)
    return x * cos + swapped * sin


def causal_mask(size: int) -> torch.Tensor:
    """(1, 1, size, size): 1.0 where query i may see key j <= i, else 0.0."""
    return torch.tril(torch.ones(size, size)).view(1, 1, size, size)


class MultiHeadAttention(nn.Module):
    """Multi-head attention without a built-in mask: forward(x_q (B, Tq, C), x_kv (B, Tk, C), mask, cache) ->
    (B, Tq, C). With a `KVCache`, Tk includes the cached keys. AddSub uses it directly."""

    def __init__(self, n_embd: int, n_head: int, attn_pdrop: float = 0.1, resid_pdrop: float = 0.1):
        super().__init__()
        assert n_embd % n_head == 0, "n_embd must be divisible by n_head"
        self.key = nn.Linear(n_embd, n_embd)
        self.query = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.attn_pdrop = attn_pdrop
        self.resid_drop = Dropout(resid_pdrop)
        self.n_head = n_head

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, nh, T, hs)"""
        B, T, C = x.shape
        return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def attend_projected(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attend, merge the heads and project -> (B, Tq, C)."""
        y = attend(q, k, v, mask, dropout_p=self.attn_pdrop if self.training else 0.0)  # (B, nh, Tq, hs)
        B, nh, Tq, hs = y.shape
        return self.resid_drop(self.proj(y.transpose(1, 2).contiguous().view(B, Tq, nh * hs)))

    def forward(
        self, x_q: torch.Tensor, x_kv: torch.Tensor, mask: torch.Tensor | None = None, cache: KVCache | None = None
    ) -> torch.Tensor:
        k, v = self.split_heads(self.key(x_kv)), self.split_heads(self.value(x_kv))
        if cache is not None:
            k, v = cache.write(k, v)
        return self.attend_projected(self.split_heads(self.query(x_q)), k, v, mask)


class CausalSelfAttention(MultiHeadAttention):
    """Causal self-attention: forward(x (B, T, C), cache=None) -> (B, T, C), x the T positions after any cached.
    With rope=True, the 2024 handout's variant, queries and keys are rotated."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        block_size: int,
        attn_pdrop: float = 0.1,
        resid_pdrop: float = 0.1,
        rope: bool = False,
    ):
        super().__init__(n_embd, n_head, attn_pdrop, resid_pdrop)
        self.rope = rope
        # Persistent buffers, in the handout's order.
        if rope:
            self.register_buffer("rope_cache", rotary_table(block_size, n_embd // n_head))
        self.register_buffer("mask", causal_mask(block_size))

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        q, k, v = (self.split_heads(layer(x)) for layer in (self.query, self.key, self.value))
        start = cache.length if cache is not None else 0
        end = start + x.size(1)
        if self.rope:
            q, k = rotate(q, self.rope_cache[start:end]), rotate(k, self.rope_cache[start:end])
        if cache is not None:
            k, v = cache.write(k, v)
        return self.attend_projected(q, k, v, self.mask[:, :, start:end, :end].bool())


class CausalCrossAttention(MultiHeadAttention):
    """The perceiver's causal cross-attention, query i (from q_start) seeing keys j <= i: forward(x_kv (B, Tk, C),
    x_q (B, Tq, C), cache=None, q_start=0) -> (B, Tq, C), in the handout's argument order."""

    def __init__(self, n_embd: int, n_head: int, block_size: int, attn_pdrop: float = 0.1, resid_pdrop: float = 0.1):
        super().__init__(n_embd, n_head, attn_pdrop, resid_pdrop)
        self.register_buffer("mask", causal_mask(block_size))

    def forward(  # type: ignore[override]
        self, x_kv: torch.Tensor, x_q: torch.Tensor, cache: KVCache | None = None, q_start: int = 0
    ) -> torch.Tensor:
        keys = x_kv.size(1) + (cache.length if cache is not None else 0)
        return super().forward(x_q, x_kv, self.mask[:, :, q_start : q_start + x_q.size(1), :keys].bool(), cache)


class KVCache:
    """One attention layer's keys and values of `length` decoded positions, in storage for `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.length = capacity, 0
        self.k: torch.Tensor | None = None  # (B, nh, capacity, hs)
        self.v: torch.Tensor | None = None

    def write(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, nh, T, hs) at the next T positions; return all cached (B, nh, length, hs)."""
        if self.k is None:
            self.k = k.new_zeros(*k.shape[:2], self.capacity, k.size(-1))
            self.v = torch.zeros_like(self.k)
        start, self.length = self.length, self.length + k.size(2)
        self.k[:, :, start : self.length], self.v[:, :, start : self.length] = k, v
        return self.k[:, :, : self.length], self.v[:, :, : self.length]
