"""Specification: every variant computes what the course's own model computes.

Each test builds a small model the way the course's starter code describes it,
written here from the handouts' instructions and independently of src/ (the
2023 handout for vanilla and the perceiver, the 2024 handout for rope), loads
this project's params into it strictly, and compares logits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import rotary_table, rotate
from model import GPT, GPTConfig

SPEC_DIR = Path(__file__).resolve().parents[2] / "shared" / "spec"


# ---------------------------------------------------------------------------
# The course's models, as the handouts describe them


def course_rope_cache(block_size: int, head_dim: int) -> torch.Tensor:
    """(block_size, head_dim/2, 2): (cos tθ_i, sin tθ_i), θ_i = 10000^(-2i/head_dim)."""
    theta = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(block_size).float(), theta)
    return torch.stack([torch.cos(freqs), torch.sin(freqs)], dim=-1)


def course_apply_rope(x: torch.Tensor, rope_cache: torch.Tensor) -> torch.Tensor:
    """Consecutive pairs of x (B, nh, T, hs) as complex numbers, multiplied by the cache's."""
    as_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    turn = torch.view_as_complex(rope_cache[: x.size(-2)].contiguous())
    return torch.view_as_real(as_complex * turn).flatten(-2)


class CourseAttention(nn.Module):
    """Self-attention (x_q is x_kv) or the perceiver's causal cross-attention, with the handout's names."""

    def __init__(self, c: GPTConfig, size: int, rope: bool = False):
        super().__init__()
        self.key, self.query, self.value, self.proj = (nn.Linear(c.n_embd, c.n_embd) for _ in range(4))
        self.n_head, self.rope = c.n_head, rope
        if rope:
            self.register_buffer("rope_cache", course_rope_cache(size, c.n_embd // c.n_head))
        self.register_buffer("mask", torch.tril(torch.ones(size, size)).view(1, 1, size, size))

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        return x.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def forward(self, x_kv: torch.Tensor, x_q: torch.Tensor) -> torch.Tensor:
        k, q, v = self.heads(self.key(x_kv)), self.heads(self.query(x_q)), self.heads(self.value(x_kv))
        if self.rope:
            q, k = course_apply_rope(q, self.rope_cache), course_apply_rope(k, self.rope_cache)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, : q.size(2), : k.size(2)] == 0, -1e10)
        y = F.softmax(att, dim=-1) @ v
        B, _, Tq, _ = y.size()
        return self.proj(y.transpose(1, 2).contiguous().view(B, Tq, -1))


def course_mlp(c: GPTConfig) -> nn.Sequential:
    return nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))


class CourseBlock(nn.Module):
    def __init__(self, c: GPTConfig, size: int, rope: bool = False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn, self.mlp = CourseAttention(c, size, rope), course_mlp(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h)
        return x + self.mlp(self.ln2(x))


class CourseDownProjectBlock(nn.Module):
    """2023 handout: cross-attention between x_input and C, the layernorms on C, then on the MLP's input."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.C = nn.Parameter(torch.zeros(1, c.bottleneck_dim, c.n_embd))
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn, self.mlp = CourseAttention(c, c.block_size), course_mlp(c)

    def forward(self, x_input: torch.Tensor) -> torch.Tensor:
        x = self.C + self.attn(x_input, self.ln1(self.C))
        return x + self.mlp(self.ln2(x))


class CourseUpProjectBlock(nn.Module):
    """2023 handout: cross-attention between y and x_input, the layernorms on y, then on the MLP's input."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn, self.mlp = CourseAttention(c, c.block_size), course_mlp(c)

    def forward(self, y: torch.Tensor, x_input: torch.Tensor) -> torch.Tensor:
        x = x_input + self.attn(self.ln1(y), x_input)
        return x + self.mlp(self.ln2(x))


class CourseGPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        if c.variant != "rope":
            self.pos_emb = nn.Parameter(torch.zeros(1, c.block_size, c.n_embd))
        if c.variant == "perceiver":
            self.down_block = CourseDownProjectBlock(c)
            self.blocks = nn.Sequential(*[CourseBlock(c, c.bottleneck_dim) for _ in range(c.n_layer - 2)])
            self.up_block = CourseUpProjectBlock(c)
        else:
            self.blocks = nn.Sequential(*[CourseBlock(c, c.block_size, c.variant == "rope") for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x_input = self.tok_emb(idx)
        if self.c.variant != "rope":
            x_input = x_input + self.pos_emb[:, : idx.size(1)]
        if self.c.variant == "perceiver":
            x = self.up_block(self.blocks(self.down_block(x_input)), x_input)
        else:
            x = self.blocks(x_input)
        return self.head(self.ln_f(x))


# ---------------------------------------------------------------------------
# The specification

CONFIGS = {
    "vanilla": {},
    "perceiver": {"variant": "perceiver", "bottleneck_dim": 6},
    "rope": {"variant": "rope"},
}


def trained_looking(variant: str, seed: int = 0) -> GPT:
    """A small model of `variant` whose every parameter is random and far from its start, eval mode."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=30, block_size=16, n_layer=4, n_head=2, n_embd=16, **CONFIGS[variant])
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "ln" not in name else 1.0))
    return model


def course_copy(model: GPT) -> CourseGPT:
    course = CourseGPT(model.config).eval()
    course.load_state_dict(model.state_dict())  # strict: same keys, shapes and buffers
    return course


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("length", [16, 9, 3], ids=["full", "past_bottleneck", "inside_bottleneck"])
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_params_give_the_course_models_logits(variant, length, impl):
    model = trained_looking(variant)
    model.set_impl(impl)
    idx = torch.randint(0, 30, (3, length))
    ours, _ = model(idx)
    torch.testing.assert_close(ours, course_copy(model)(idx), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_course_model_params_load_strictly_and_give_the_same_logits(variant):
    course = course_copy(trained_looking(variant, seed=1))
    with torch.no_grad():
        for p in course.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = trained_looking(variant, seed=2)
    ours.load_state_dict(course.state_dict())  # strict
    idx = torch.randint(0, 30, (2, 12))
    torch.testing.assert_close(ours(idx)[0], course(idx), atol=2e-5, rtol=2e-5)


def test_perceiver_down_projection_reads_the_input_without_a_layernorm():
    # The course's blocks normalise C (down) and y (up) only: scaling the input's
    # residual stream by a constant must therefore change the bottleneck.
    model = trained_looking("perceiver")
    x = torch.randn(2, 9, 16)
    assert not torch.allclose(model.down_block(x), model.down_block(3 * x), atol=1e-3)


def test_rope_state_dict_keys_and_shapes_equal_the_2024_handout_model():
    path = SPEC_DIR / "handout2024_rope_state_dict.json"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    spec = json.loads(path.read_text())["rope"]
    model = GPT(GPTConfig(vocab_size=spec["vocab_size"], variant="rope"))
    assert [[k, list(v.shape)] for k, v in model.state_dict().items()] == spec["state_dict"]
    assert sum(p.numel() for p in model.parameters()) == spec["num_parameters"]


def test_rope_cache_holds_cos_and_sin_of_position_times_theta():
    table = rotary_table(128, 32)
    assert table.shape == (128, 16, 2)
    for t, i in [(0, 0), (1, 0), (5, 3), (77, 15), (127, 8)]:
        theta = 10000 ** (-2 * i / 32)
        assert table[t, i, 0].item() == pytest.approx(math.cos(t * theta), abs=1e-6)
        assert table[t, i, 1].item() == pytest.approx(math.sin(t * theta), abs=1e-6)


def test_rotating_equals_multiplying_consecutive_pairs_as_complex_numbers():
    x = torch.randn(2, 3, 10, 8)
    table = rotary_table(10, 8)
    torch.testing.assert_close(rotate(x, table), course_apply_rope(x, table))


def test_rope_attention_scores_depend_on_relative_positions_only():
    q, k = torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    table = rotary_table(40, 8)
    scores = rotate(q, table[:7]) @ rotate(k, table[:7]).transpose(-2, -1)
    for shift in (1, 5, 33):
        moved = rotate(q, table[shift : shift + 7]) @ rotate(k, table[shift : shift + 7]).transpose(-2, -1)
        torch.testing.assert_close(moved, scores, atol=1e-4, rtol=1e-4)


def test_rope_model_sees_positions_only_through_its_rotations():
    # Without the rotations a rope model is blind to order beyond the causal mask:
    # two sequences ending in the same token with the same multiset before it would agree.
    model = trained_looking("rope")
    idx = torch.tensor([[3, 4, 5, 6]])
    swapped = torch.tensor([[4, 3, 5, 6]])
    assert not torch.allclose(model(idx)[0][0, -1], model(swapped)[0][0, -1], atol=1e-4)
