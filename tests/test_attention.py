"""Specification of the attention maths against a plain loop, and of the KV cache."""

from __future__ import annotations

import math

import pytest
import torch

from attention import CausalCrossAttention, CausalSelfAttention, KVCache, attend, causal_mask


def loop_attention(q, k, v, mask):
    """One query at a time, one key at a time: the definition, with no batching tricks."""
    B, H, Tq, hs = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                allowed = [j for j in range(k.shape[2]) if mask is None or mask[0, 0, i, j]]
                scores = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(hs) for j in allowed])
                weights = torch.softmax(scores, dim=0)
                out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, allowed))
    return out


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize(("tq", "tk"), [(5, 5), (3, 7), (7, 3)])
def test_attend_matches_a_plain_loop(impl, tq, tk):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, t, 4, generator=g) for t in (tq, tk, tk))
    mask = causal_mask(max(tq, tk))[:, :, :tq, :tk].bool()
    torch.testing.assert_close(attend(q, k, v, mask, impl=impl), loop_attention(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_attend_without_mask_sees_every_key():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 4, 3, generator=g) for _ in range(3))
    torch.testing.assert_close(attend(q, k, v, None), loop_attention(q, k, v, None), atol=1e-5, rtol=1e-5)


def test_kv_cache_steps_equal_one_full_pass():
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, block_size=8).eval()
    x = torch.randn(2, 6, 16)
    full = attn(x)
    cache = KVCache(capacity=8)
    steps = [attn(x[:, :3], cache)] + [attn(x[:, t : t + 1], cache) for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=1e-5)


def test_cross_attention_query_i_ignores_keys_after_i():
    torch.manual_seed(0)
    attn = CausalCrossAttention(16, 2, block_size=8).eval()
    x_q, x_kv = torch.randn(1, 4, 16), torch.randn(1, 6, 16)
    changed = x_kv.clone()
    changed[:, 3:] = torch.randn(1, 3, 16)
    a, b = attn(x_kv, x_q), attn(changed, x_q)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3], b[:, 3])
