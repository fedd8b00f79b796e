"""Specification of the GPU path: on a GPU it computes what the CPU and the course's model compute.

On CUDA the path differs from the CPU one: attention is PyTorch's
`scaled_dot_product_attention` on its math kernel (with the perceiver's causal
cross mask), dropout is PyTorch's own, and bf16 autocast is on. Every test here is skipped where no
CUDA GPU is present, as on CI; on a GPU machine run `pytest tests/test_cuda.py`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL, forward_terms, gpt_next_logits, greedy_lead, rounding, rounding_tolerance
from test_attention import loop_attention
from test_model import TINY_TERMS, VARIANTS, tiny
from test_trainer import tiny_run

import run
import trainer
from attention import attend, causal_mask
from bench.course import course_copy, sample
from decode import continue_prompts
from machine import autocast

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32_matmuls():
    """TF32 would round fp32 matmuls to 10-bit mantissas and hide real differences; keep it off."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def on_gpu(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of model on the GPU, in eval mode (the CPU original stays where it is)."""
    clone = tiny(model.config.variant, bottleneck_dim=model.config.bottleneck_dim)
    clone.load_state_dict(model.state_dict())
    return clone.to(CUDA).eval()


@pytest.mark.parametrize(("tq", "tk"), [(5, 5), (3, 7), (7, 3)])
def test_gpu_attention_matches_a_plain_loop(tq, tk):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, t, 4, generator=g) for t in (tq, tk, tk))
    mask = causal_mask(max(tq, tk))[:, :, :tq, :tk].bool()
    got = attend(q.to(CUDA), k.to(CUDA), v.to(CUDA), mask.to(CUDA)).cpu()
    torch.testing.assert_close(got, loop_attention(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_gpu_attention_gradients_in_bf16_match_float64_even_for_extreme_scores():
    # The case of pytorch/pytorch#196678, where cuDNN's kernel returns NaN gradients: a masked
    # length of 64 mod 128 and rows whose every score is very negative. On an H100, an earlier
    # form of this test (float64 reference before bf16 rounding, gradient of ones) failed with
    # both fused kernels; the memory-efficient kernel's gradients were finite but 4x the norm
    # of the true ones, away from 0 where a query sees one key only. Both broke training in
    # bf16 (see attention.CUDA_ATTENTION_KERNELS). This form has not yet run on a GPU; run on
    # the CPU through SDPA's math kernel it gave 0.24% error (plain bf16 matmuls: 317%).
    g = torch.Generator().manual_seed(0)
    length, hs = 64, 32
    q, k = torch.randn(2, 2, length, hs, generator=g) * 0.1, torch.randn(2, 2, length, hs, generator=g) * 0.1
    v = torch.randn(2, 2, length, hs, generator=g)
    q[..., 0], k[..., 0] = 1.0, -120 * hs**0.5
    q, k, v = (t.bfloat16() for t in (q, k, v))  # both sides start from the same bf16 values
    mask = causal_mask(length).bool()
    grad_out = torch.randn(2, 2, length, hs, generator=g)
    grads = {}
    for device, dtype in ((CUDA, torch.bfloat16), (torch.device("cpu"), torch.float64)):
        qkv = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
        attend(*qkv, mask.to(device)).float().backward(grad_out.to(device))
        grads[device.type] = [t.grad.double().cpu() for t in qkv]
    for gpu, exact in zip(grads["cuda"], grads["cpu"], strict=True):
        assert torch.isfinite(gpu).all()
        assert (gpu - exact).norm() / exact.norm() < 2e-2


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_gives_the_course_models_cpu_logits_and_loss(variant):
    torch.manual_seed(0)
    model = tiny(variant, bottleneck_dim=6)
    x, y = torch.randint(1, 20, (3, 14)), torch.randint(0, 20, (3, 14))
    logits, loss = course_copy(model)(x, y)
    gpu_logits, gpu_loss = on_gpu(model)(x.to(CUDA), y.to(CUDA))
    torch.testing.assert_close(gpu_logits.cpu(), logits, **rounding_tolerance(TINY_TERMS, logits.abs().max()))
    # The loss (about 3) moves by at most twice its logits' rounding (they are smaller than one), and its own sums add
    # 20 logits' exponentials and 42 targets' losses.
    torch.testing.assert_close(gpu_loss.cpu(), loss, **rounding_tolerance(TINY_TERMS + 20 + 42, loss))


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_cached_decoding_logits_equal_the_cpu_full_recompute(variant):
    torch.manual_seed(0)
    model = tiny(variant, bottleneck_dim=6)
    x = torch.randint(0, 20, (2, 10))
    full, _ = model(x)
    gpu, xg = on_gpu(model), x.to(CUDA)
    caches = gpu.new_caches()
    first, _ = gpu(xg[:, :4], caches=caches)
    rest = [gpu(xg[:, t : t + 1], caches=caches)[0] for t in range(4, 10)]
    tolerance = rounding_tolerance(TINY_TERMS, full.abs().max())
    torch.testing.assert_close(torch.cat([first, *rest], dim=1).cpu(), full, **tolerance)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_batched_greedy_decoding_equals_the_cpu_one_prompt_at_a_time(variant):
    torch.manual_seed(0)
    model = tiny(variant, bottleneck_dim=8)
    model.head.weight.data *= 20  # sharp logits
    prompts = [torch.randint(1, 20, (n,)).tolist() for n in (2, 7, 4, 5, 11, 3, 7, 13)]
    for prompt in prompts:  # no near-ties, which the two devices' rounding could break differently
        assert greedy_lead(gpt_next_logits(model), prompt, min(6, 16 - len(prompt))) > 4 * rounding(TINY_TERMS)
    batched = continue_prompts(on_gpu(model), prompts, lambda n: min(6, 16 - n), CUDA, stop_id=3)
    for prompt, got in zip(prompts, batched, strict=True):
        alone = sample(model, torch.tensor([prompt]), min(6, 16 - len(prompt)))[0, len(prompt) :].tolist()
        until_stop = alone[: alone.index(3) + 1] if 3 in alone else alone
        assert got == alone[: len(got)] and len(got) >= len(until_stop)  # it may run on past its stop


def test_gpu_fp32_training_follows_the_cpu_loss_curve():
    cpu = tiny_run(steps=6, dropout=0.0, precision="fp32")  # the same batches; attention differs
    gpu = tiny_run(steps=6, dropout=0.0, precision="fp32", device=CUDA)
    # fp32 rounding of the forward pass's sums and of the backward pass's, about as many terms again.
    np.testing.assert_allclose(gpu, cpu, rtol=2 * rounding(forward_terms(n_layer=2, n_embd=16, n_head=2, length=32)))


def test_gpu_bf16_training_stays_near_the_fp32_loss_curve(monkeypatch):
    fp32 = tiny_run(steps=6, dropout=0.0, precision="fp32", device=CUDA)
    autocasts = []
    monkeypatch.setattr(trainer, "autocast", lambda device, p: autocasts.append(p) or autocast(device, p))
    bf16 = tiny_run(steps=6, dropout=0.0, precision="bf16", device=CUDA)
    assert autocasts and set(autocasts) == {"bf16"}  # every step ran under bf16 autocast
    # bf16 rounds each matmul's products by 2**-8 relatively; the logits pass through 17 (eight in each of two blocks,
    # and the head), and a loss moves by at most twice their error: 2 * 17 * 2**-8 of logits below 0.4 in size.
    np.testing.assert_allclose(bf16, fp32, atol=0.05)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_training_compiled_into_cuda_graphs_follows_the_eager_loss_curve(variant):
    torch._dynamo.reset()
    eager = tiny_run(steps=20, dropout=0.0, device=CUDA, variant=variant)
    compiled = tiny_run(steps=20, dropout=0.0, device=CUDA, variant=variant, compile=True)
    np.testing.assert_allclose(compiled, eager, atol=0.05)  # both bf16: the bf16-against-fp32 curve's tolerance


def test_gpu_training_compiled_into_cuda_graphs_with_dropout_reduces_the_loss():
    torch._dynamo.reset()
    losses = tiny_run(steps=15, device=CUDA, compile=True)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_gpu_training_with_dropout_reduces_the_loss():
    losses = tiny_run(steps=15, device=CUDA)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_gpu_training_with_muon_reduces_the_loss():
    losses = tiny_run(steps=15, optimizer="muon", device=CUDA)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


@pytest.mark.parametrize("variant", VARIANTS)
def test_params_trained_on_the_gpu_predict_the_same_on_the_cpu(
    variant, tiny_corpus, tiny_train_tsv, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    ft = ["finetune", variant, tiny_corpus, "--writing_params_path", "ft.params", "--finetune_corpus_path"]
    ft += [tiny_train_tsv, "--max_steps", "40", "--batch_size", "4", "--finetune_lr", "3e-3", "--device", "cuda"]
    assert run.main([str(a) for a in ft + TINY_MODEL]) == 0
    ev = ["evaluate", variant, tiny_corpus, "--reading_params_path", "ft.params", "--eval_corpus_path", tiny_train_tsv]
    for device in ("cuda", "cpu"):
        argv = ev + ["--outputs_path", f"{device}.predictions", "--device", device] + TINY_MODEL
        assert run.main([str(a) for a in argv]) == 0
    gpu = Path("cuda.predictions").read_text(encoding="utf-8")
    assert gpu == Path("cpu.predictions").read_text(encoding="utf-8")
    assert len(set(gpu.splitlines())) > 1 or gpu.splitlines()[0] != ""
