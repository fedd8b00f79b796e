"""Specification of the GPT variants: handout compatibility, causality, shapes, cropping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import forward_terms, gpt_next_logits, greedy_lead, rounding, rounding_tolerance

from bench.course import course_copy, sample
from model import GPT, GPTConfig

SPEC = Path(__file__).resolve().parents[2] / "shared" / "spec" / "handout_state_dict.json"


VARIANTS = ["vanilla", "perceiver", "rope"]
TINY_TERMS = forward_terms(n_layer=3, n_embd=16, n_head=2, length=16)  # the sums in `tiny`'s logits


def tiny(variant: str = "vanilla", **kw) -> GPT:
    """A small model of the named variant (eval mode); kw go to GPTConfig, e.g. bottleneck_dim."""
    cfg = GPTConfig(vocab_size=20, block_size=16, n_layer=3, n_head=2, n_embd=16, variant=variant, **kw)
    return GPT(cfg).eval()


@pytest.fixture(scope="module")
def spec() -> dict:
    if not SPEC.is_file():
        pytest.skip(f"{SPEC} not present")
    return json.loads(SPEC.read_text())


@pytest.mark.parametrize("case", ["vanilla", "perceiver_bottleneck_64", "perceiver_bottleneck_32"])
def test_state_dict_keys_and_shapes_equal_the_handout_model(spec, case):
    s = spec[case]
    cfg = GPTConfig(vocab_size=s["vocab_size"], variant=s["variant"])
    if s["bottleneck_dim"]:
        cfg.bottleneck_dim = s["bottleneck_dim"]
    model = GPT(cfg)
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == s["state_dict"]
    assert sum(p.numel() for p in model.parameters()) == s["num_parameters"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_future_tokens_do_not_change_past_logits(variant):
    torch.manual_seed(0)
    model = tiny(variant, bottleneck_dim=6)
    x = torch.randint(0, 20, (2, 12))
    for cut in (1, 4, 9):
        changed = x.clone()
        changed[:, cut:] = torch.randint(0, 20, (2, 12 - cut))
        a, _ = model(x)
        b, _ = model(changed)
        torch.testing.assert_close(a[:, :cut], b[:, :cut])


def test_perceiver_maps_input_length_to_bottleneck_and_back():
    model = tiny("perceiver", bottleneck_dim=5)
    x = model.drop(model.tok_emb(torch.randint(0, 20, (3, 11))) + model.pos_emb[:, :11])
    y = model.down_block(x)
    assert y.shape == (3, 5, 16)
    assert model.up_block(model.blocks(y), x).shape == (3, 11, 16)
    logits, _ = model(torch.randint(0, 20, (3, 11)))
    assert logits.shape == (3, 11, 20)
    assert len(model.blocks) == 1  # n_layer - 2


@pytest.mark.parametrize("variant", VARIANTS)
def test_loss_of_a_cropped_batch_equals_the_full_length_loss(variant):
    torch.manual_seed(0)
    model = tiny(variant, bottleneck_dim=6)
    x = torch.randint(2, 20, (3, 15))
    y = torch.randint(2, 20, (3, 15))
    x[:, 9:] = 0
    y[:, 8:] = 0  # PAD targets beyond position 8
    _, full = model(x, y)
    _, cropped = model(x[:, :9], y[:, :9])
    # The loss (about 3) moves by at most twice its logits' rounding (they are smaller than one), and its own sums add
    # 20 logits' exponentials and up to 45 targets' losses.
    torch.testing.assert_close(full, cropped, **rounding_tolerance(TINY_TERMS + 20 + 45, full))


def test_perceiver_trims_the_bottleneck_to_a_shorter_input_without_changing_logits():
    torch.manual_seed(0)
    model = tiny("perceiver", bottleneck_dim=12)
    x = torch.randint(0, 20, (2, 7))  # shorter than the bottleneck
    assert model.down_block(model.tok_emb(x)).shape == (2, 7, 16)
    untrimmed, _ = course_copy(model)(x)  # the handout's computes all 12 bottleneck positions
    torch.testing.assert_close(model(x)[0], untrimmed, **rounding_tolerance(TINY_TERMS, untrimmed.abs().max()))


def test_loss_ignores_pad_targets():
    model = tiny()
    x = torch.randint(0, 20, (2, 8))
    y = torch.randint(1, 20, (2, 8))
    logits, loss = model(x, y)
    y_pad = y.clone()
    y_pad[:, 4:] = 0
    _, loss_pad = model(x, y_pad)
    expected = torch.nn.functional.cross_entropy(logits[:, :4].reshape(-1, 20), y[:, :4].reshape(-1))
    # The same logits: the two differ only in how they add the 20 logits' exponentials and the 8 targets' losses.
    torch.testing.assert_close(loss_pad, expected, **rounding_tolerance(20 + 8, expected))
    assert not torch.isclose(loss, loss_pad)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_logits_equal_full_recompute(variant):
    torch.manual_seed(0)
    model = tiny(variant, bottleneck_dim=6)  # the perceiver's steps run past its bottleneck length
    x = torch.randint(0, 20, (2, 10))
    full, _ = model(x)
    caches = model.new_caches()
    first, _ = model(x[:, :4], caches=caches)
    rest = [model(x[:, t : t + 1], caches=caches)[0] for t in range(4, 10)]
    torch.testing.assert_close(
        torch.cat([first, *rest], dim=1), full, **rounding_tolerance(TINY_TERMS, full.abs().max())
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_batched_greedy_decoding_equals_one_prompt_at_a_time(variant):
    from decode import continue_prompts

    torch.manual_seed(0)
    model = tiny(variant, bottleneck_dim=8)
    model.head.weight.data *= 20  # sharp logits
    prompts = [torch.randint(1, 20, (n,)).tolist() for n in (2, 7, 4, 5, 11, 4, 7, 13)]  # some of one length
    for prompt in prompts:  # no near-ties, which the two paths' rounding could break differently
        assert greedy_lead(gpt_next_logits(model), prompt, min(6, 16 - len(prompt))) > 4 * rounding(TINY_TERMS)
    batched = continue_prompts(model, prompts, lambda n: min(6, 16 - n), "cpu", stop_id=3)
    for prompt, got in zip(prompts, batched, strict=True):
        alone = sample(model, torch.tensor([prompt]), min(6, 16 - len(prompt)))[0, len(prompt) :].tolist()
        until_stop = alone[: alone.index(3) + 1] if 3 in alone else alone
        assert got == alone[: len(got)] and len(got) >= len(until_stop)  # it may run on past its stop


def test_generation_ends_once_every_row_has_produced_the_stop_token():
    torch.manual_seed(0)
    model = tiny()
    idx = torch.randint(2, 20, (3, 4))
    free = model.generate(idx, 10)[:, 4:]
    stop = free[0, 2].item()  # row 0 produces it by its third token
    out = model.generate(idx, 10, stop_id=stop)[:, 4:]
    last = max(row.tolist().index(stop) if stop in row else 9 for row in free)
    assert torch.equal(out, free[:, : last + 1])  # bitwise by design: the same steps on the same batch until the stop


def test_bf16_autocast_stays_close_to_fp32():
    torch.manual_seed(0)
    model = tiny()
    x = torch.randint(0, 20, (2, 10))
    logits, loss32 = model(x, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss16 = model(x, x)
    # bf16 keeps 8 bits: each matmul's operands round by 2**-9, its products by 2**-8, relatively. The logits pass
    # through 25 matmuls (in each of three blocks query, key, value, scores, weighted sum, projection and the MLP's
    # two; then the head) and the loss moves by at most twice their error.
    assert abs(loss32.item() - loss16.item()) < 2 * 25 * 2**-8 * logits.abs().max().item()


def test_cpu_info_reads_the_first_processors_fields(tmp_path):
    from bench.research import cpu_info

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel\t\t: 49\n"
    )
    info = cpu_info(cpuinfo)
    assert (info["cpu family"], info["model"], info["model name"]) == ("23", "1", "AMD EPYC")
    assert info["flags"].split() == ["fpu", "avx2"]
    assert cpu_info(tmp_path / "absent") == {}


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generate_equals_the_handouts_sampler_past_the_block(variant):
    torch.manual_seed(0)
    model = tiny(variant, bottleneck_dim=8)
    with torch.no_grad():
        model.head.weight.mul_(50)  # sharp logits
    idx = torch.randint(2, 20, (3, 5))
    for prompt in idx.tolist():  # no near-ties, which the two paths' rounding could break differently
        assert greedy_lead(gpt_next_logits(model), prompt, 20) > 4 * rounding(TINY_TERMS)
    ours = model.generate(idx, 20)  # 25 tokens: the last 9 cropped to the block of 16
    assert torch.equal(ours, sample(model, idx, 20))


def test_generate_never_chooses_a_token_its_constraint_rules_out():
    torch.manual_seed(0)
    model = tiny()
    idx = torch.randint(2, 20, (4, 3))
    free = model.generate(idx, 10)[:, 3:]
    banned = sorted(set(free.flatten().tolist()))[:3]
    out = model.generate(idx, 10, constrain=lambda logits, idx: logits.index_fill(1, torch.tensor(banned), -1e9))
    assert not set(out[:, 3:].flatten().tolist()) & set(banned)


def test_sampling_among_the_top_1_is_greedy():
    torch.manual_seed(0)
    model = tiny("rope")
    idx = torch.randint(2, 20, (2, 4))
    # Bitwise by design: the same forward passes on the same batch, and the top 1 of their logits is their argmax.
    assert torch.equal(model.generate(idx, 8, temperature=0.7, do_sample=True, top_k=1), model.generate(idx, 8))


@pytest.mark.parametrize("training", [True, False])
def test_generate_leaves_the_model_in_the_mode_it_found(training):
    model = GPT(GPTConfig(vocab_size=10, block_size=16, n_layer=1, n_head=1, n_embd=8)).train(training)
    model.generate(torch.zeros(2, 3, dtype=torch.long), 4)
    assert model.training is training
