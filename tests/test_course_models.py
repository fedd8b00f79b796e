"""Specification: every variant computes what the course's own model computes.

Each test builds the course's model as the handouts describe it (bench/course.py,
written from their instructions and independently of src/: the 2023 handout for
vanilla and the perceiver, the 2024 handout for rope), loads this project's
params into it strictly, and compares logits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import FP32_EPS, forward_terms, rounding_tolerance

from attention import rotary_table, rotate
from bench.course import apply_rope, course_copy
from model import GPT, GPTConfig

SPEC_DIR = Path(__file__).resolve().parents[2] / "shared" / "spec"


# ---------------------------------------------------------------------------
# The specification

CONFIGS = {
    "vanilla": {},
    "perceiver": {"variant": "perceiver", "bottleneck_dim": 6},
    "rope": {"variant": "rope"},
}
TERMS = forward_terms(n_layer=4, n_embd=16, n_head=2, length=16)  # the sums in trained_looking's logits


def trained_looking(variant: str, seed: int = 0) -> GPT:
    """A small model of `variant` whose every parameter is random and far from its start, eval mode."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=30, block_size=16, n_layer=4, n_head=2, n_embd=16, **CONFIGS[variant])
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "ln" not in name else 1.0))
    return model


@pytest.mark.parametrize("length", [16, 9, 3], ids=["full", "past_bottleneck", "inside_bottleneck"])
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_params_give_the_course_models_logits_and_loss(variant, length):
    model = trained_looking(variant)
    idx, targets = torch.randint(0, 30, (3, length)), torch.randint(0, 30, (3, length))
    ours, loss = model(idx, targets)
    course, course_loss = course_copy(model)(idx, targets)
    logits = course.abs().max()
    torch.testing.assert_close(ours, course, **rounding_tolerance(TERMS, logits))
    # The loss moves by at most twice its logits' rounding, and its own sums add 30 logits' exponentials and the
    # 3 * length targets' losses.
    torch.testing.assert_close(loss, course_loss, **rounding_tolerance(2 * TERMS + 30 + 3 * length, logits))


@pytest.mark.parametrize("variant", list(CONFIGS))
def test_course_model_params_load_strictly_and_give_the_same_logits(variant):
    course = course_copy(trained_looking(variant, seed=1))
    with torch.no_grad():
        for p in course.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = trained_looking(variant, seed=2)
    ours.load_state_dict(course.state_dict())  # strict
    idx = torch.randint(0, 30, (2, 12))
    theirs = course(idx)[0]
    torch.testing.assert_close(ours(idx)[0], theirs, **rounding_tolerance(TERMS, theirs.abs().max()))


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
        # Computed in float64, then rounded once to fp32: off by half an eps at most, for values at most 1.
        assert table[t, i, 0].item() == pytest.approx(math.cos(t * theta), abs=FP32_EPS)
        assert table[t, i, 1].item() == pytest.approx(math.sin(t * theta), abs=FP32_EPS)


def test_rotating_equals_multiplying_consecutive_pairs_as_complex_numbers():
    x = torch.randn(2, 3, 10, 8)
    table = rotary_table(10, 8)
    # The same table: each output sums two products of values of x and a cosine or sine (at most 1).
    torch.testing.assert_close(rotate(x, table), apply_rope(x, table), **rounding_tolerance(2, 2 * x.abs().max()))


def test_rope_attention_scores_depend_on_relative_positions_only():
    q, k = torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    table = rotary_table(40, 8)
    scores = rotate(q, table[:7]) @ rotate(k, table[:7]).transpose(-2, -1)
    # A rotated value sums two products of values of x and the table's cosines and sines, each rounded once to fp32
    # (3 eps of at most 2 max |x| in all); a score sums 8 products of rotated values: 3 + 3 + 8 eps of its scale.
    scale = 8 * (2 * q.abs().max()) * (2 * k.abs().max())
    for shift in (1, 5, 33):
        moved = rotate(q, table[shift : shift + 7]) @ rotate(k, table[shift : shift + 7]).transpose(-2, -1)
        torch.testing.assert_close(moved, scores, **rounding_tolerance(3 + 3 + 8, scale))


def test_rope_model_sees_positions_only_through_its_rotations():
    # Without the rotations a rope model is blind to order beyond the causal mask:
    # two sequences ending in the same token with the same multiset before it would agree.
    model = trained_looking("rope")
    idx = torch.tensor([[3, 4, 5, 6]])
    swapped = torch.tensor([[4, 3, 5, 6]])
    assert not torch.allclose(model(idx)[0][0, -1], model(swapped)[0][0, -1], atol=1e-4)
