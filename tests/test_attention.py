"""Specification of the attention maths against a plain loop, and of the KV cache."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import rounding_tolerance

from attention import CausalCrossAttention, CausalSelfAttention, Dropout, KVCache, attend, causal_mask, dropout


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


def attention_tolerance(q, k, v) -> dict:
    """assert_close's tolerance for two computations of attention: a score's sum over the head's dimensions rounds by
    as many eps of the sum of its terms' sizes, which the softmax turns into as much relative error of its weights;
    then the softmax and the weighted sum add over the keys, of the values' size."""
    head_size, keys = q.size(-1), k.size(-2)
    scores = (q.abs() @ k.abs().transpose(-2, -1)).max().item() / math.sqrt(head_size)
    return rounding_tolerance(head_size * scores + 2 * keys, v.abs().max())


@pytest.mark.parametrize(("tq", "tk"), [(5, 5), (3, 7), (7, 3)])
def test_attend_matches_a_plain_loop(tq, tk):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, t, 4, generator=g) for t in (tq, tk, tk))
    mask = causal_mask(max(tq, tk))[:, :, :tq, :tk].bool()
    torch.testing.assert_close(attend(q, k, v, mask), loop_attention(q, k, v, mask), **attention_tolerance(q, k, v))


def test_attend_without_mask_sees_every_key():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 4, 3, generator=g) for _ in range(3))
    torch.testing.assert_close(attend(q, k, v, None), loop_attention(q, k, v, None), **attention_tolerance(q, k, v))


def test_kv_cache_steps_equal_one_full_pass():
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 4, block_size=8).eval()
    x = torch.randn(2, 6, 16)
    full = attn(x)
    cache = KVCache(capacity=8)
    steps = [attn(x[:, :3], cache)] + [attn(x[:, t : t + 1], cache) for t in range(3, 6)]
    # Sums over 16 inputs (query, key, value), 4 dimensions (scores), 6 keys (softmax, weighted sum), 16 (projection).
    torch.testing.assert_close(
        torch.cat(steps, dim=1), full, **rounding_tolerance(16 + 4 + 6 + 6 + 16, full.abs().max())
    )


def test_cross_attention_query_i_ignores_keys_after_i():
    torch.manual_seed(0)
    attn = CausalCrossAttention(16, 2, block_size=8).eval()
    x_q, x_kv = torch.randn(1, 4, 16), torch.randn(1, 6, 16)
    changed = x_kv.clone()
    changed[:, 3:] = torch.randn(1, 3, 16)
    a, b = attn(x_kv, x_q), attn(changed, x_q)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3], b[:, 3])


def test_dropout_zeroes_about_p_and_keeps_the_mean():
    torch.manual_seed(0)
    x = torch.ones(400_000)
    y = dropout(x, 0.1)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.003  # 0.1 +- 6 standard errors
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, kept[0].item()))  # one scale for every kept element
    assert abs(y.mean().item() - 1.0) < 0.005


def test_dropout_drops_different_elements_in_every_lane_and_call():
    torch.manual_seed(0)
    x = torch.ones(4, 10_000)
    a, b = dropout(x, 0.5), dropout(x, 0.5)
    for lane in range(4):  # the four 16-bit lanes of each random 64-bit number drop independently at rate p
        assert abs((a.view(-1, 4)[:, lane] == 0).float().mean().item() - 0.5) < 0.03
    assert ((a == 0) != (b == 0)).any()  # the two calls dropped different elements


def test_dropout_gradient_is_the_same_mask_and_scale():
    torch.manual_seed(0)
    x = torch.randn(3, 50, requires_grad=True)
    y = dropout(x, 0.3)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.where(y != 0, y / x.detach(), 0.0))


def test_dropout_module_is_the_identity_in_eval_mode():
    module = Dropout(0.5)
    x = torch.randn(8, 8)
    assert torch.equal(module.eval()(x), x)  # bitwise by design: the identity computes nothing
    assert (module.train()(x) == 0).any()  # in training mode it drops
