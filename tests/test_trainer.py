"""Specification of the learning-rate schedule, the optimizer groups and the loop."""

from __future__ import annotations

import itertools
import math
import random
import shutil
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trainer
from dataset import CharCorruptionDataset
from model import GPT, GPTConfig
from trainer import (
    Muon,
    MuonAdamW,
    Trainer,
    TrainerConfig,
    lr_multiplier,
    make_optimizer,
    orthogonalize,
    orthogonalize_spectral,
)
from utils import torch_load_safe

WARM, FINAL = 10_240, 1_000_000


def test_lr_warms_up_linearly():
    assert lr_multiplier(0, WARM, FINAL) == 0.0
    assert lr_multiplier(WARM / 2, WARM, FINAL) == pytest.approx(0.5)


def test_lr_follows_cosine_to_a_floor_of_one_tenth():
    assert lr_multiplier(WARM, WARM, FINAL) == pytest.approx(1.0)
    mid = WARM + (FINAL - WARM) / 2
    assert lr_multiplier(mid, WARM, FINAL) == pytest.approx(0.5)
    assert lr_multiplier(FINAL, WARM, FINAL) == pytest.approx(0.1)


def test_uncapped_lr_climbs_back_to_peak_at_twice_final_tokens_like_the_handout():
    peak_again = WARM + 2 * (FINAL - WARM)
    assert lr_multiplier(peak_again, WARM, FINAL) == pytest.approx(1.0)


def test_capped_lr_stays_at_the_floor_after_final_tokens():
    for t in (FINAL, 1.5 * FINAL, 2 * FINAL, 3 * FINAL):
        assert lr_multiplier(t, WARM, FINAL, cap=True) == pytest.approx(0.1)


def test_handout_schedule_peaks_again_near_epoch_400_of_650():
    block, docs = 128, 2937
    per_epoch = docs * (block - 1)
    final = 200 * docs * block
    mults = [lr_multiplier(e * per_epoch, 512 * 20, final) for e in range(651)]
    assert 395 <= int(np.argmax(mults[300:])) + 300 <= 410
    assert math.isclose(max(mults[300:]), 1.0, abs_tol=1e-3)


def test_weight_decay_applies_to_linear_weights_only():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=3, n_head=2, n_embd=8, perceiver=True, bottleneck_dim=4))
    opt = make_optimizer(model, TrainerConfig())
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in opt.param_groups[0]["params"]}
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    assert "head.weight" in decayed and "blocks.0.attn.key.weight" in decayed and "blocks.0.mlp.0.weight" in decayed
    for n in ("tok_emb.weight", "pos_emb", "down_block.C", "ln_f.weight", "blocks.0.attn.key.bias"):
        assert n not in decayed
    assert len(decayed) + len(opt.param_groups[1]["params"]) == len(names)


def test_fast_path_uses_the_fused_adamw_and_the_reference_path_the_default():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8))
    assert make_optimizer(model, TrainerConfig(impl="fast")).defaults["fused"] is True
    assert not make_optimizer(model, TrainerConfig(impl="reference")).defaults["fused"]


@pytest.mark.parametrize("shape", [(24, 24), (16, 48), (48, 16)])
def test_orthogonalize_keeps_the_singular_vectors_and_pushes_the_singular_values_towards_one(shape):
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape)))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape)))
    spread = torch.logspace(-1, 1, min(shape))  # singular values from 0.1 to 10
    out = orthogonalize(u @ torch.diag(spread) @ v.T)
    assert out.shape == shape
    inner = u.T @ out @ v  # diagonal when out has the same singular vectors
    assert (inner - torch.diag(inner.diagonal())).abs().max() < 1e-4
    assert inner.diagonal().min() > 0.6 and inner.diagonal().max() < 1.25


@pytest.mark.parametrize("shape", [(48, 48), (24, 96), (96, 24)])
@pytest.mark.parametrize("smallest", [1e-1, 1e-4, 1e-6])
def test_orthogonalize_spectral_equals_the_newton_schulz_iteration(shape, smallest):
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape)))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape)))
    matrix = u @ torch.diag(torch.logspace(0, math.log10(smallest), min(shape))) @ v.T
    iterated, spectral = orthogonalize(matrix), orthogonalize_spectral(matrix)
    assert spectral.shape == shape and spectral.dtype == matrix.dtype
    # fp32 eigenvectors of tiny, nearly equal eigenvalues cost up to 2e-3 here; the iteration itself lands
    # 20-30% away from the exact orthogonal factor, so that is far below what it approximates anyway.
    assert (spectral - iterated).norm() / iterated.norm() < 5e-3


def test_orthogonalize_spectral_falls_back_to_the_iteration_when_the_eigensolver_fails(monkeypatch):
    def fail(matrix):
        raise torch.linalg.LinAlgError("did not converge")

    matrix = torch.randn(8, 12)
    monkeypatch.setattr(torch.linalg, "eigh", fail)
    assert torch.equal(orthogonalize_spectral(matrix), orthogonalize(matrix))


def test_muon_is_spectral_on_the_cpu_fast_path_without_native_bf16_only(monkeypatch):
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8))
    monkeypatch.setattr(trainer, "bf16_supported", lambda device: False)
    assert make_optimizer(model, TrainerConfig(optimizer="muon", impl="fast")).muon.spectral
    assert not make_optimizer(model, TrainerConfig(optimizer="muon", impl="reference")).muon.spectral
    monkeypatch.setattr(trainer, "bf16_supported", lambda device: True)
    assert not make_optimizer(model, TrainerConfig(optimizer="muon", impl="fast")).muon.spectral
    assert make_optimizer(model, TrainerConfig(optimizer="muon", impl="fast", bf16=False)).muon.spectral


def test_spectral_muon_training_follows_the_iterated_muon_loss_curve(monkeypatch):
    monkeypatch.setattr(trainer, "bf16_supported", lambda device: False)
    spectral = tiny_run("fast", steps=8, dropout=0.0, optimizer="muon")
    monkeypatch.setattr(trainer, "orthogonalize_spectral", orthogonalize)  # the fp32 iteration instead
    iterated = tiny_run("fast", steps=8, dropout=0.0, optimizer="muon")
    assert spectral != iterated  # the patch took effect
    np.testing.assert_allclose(spectral, iterated, rtol=1e-3)


@pytest.mark.parametrize("shape", [(32, 32), (16, 64), (64, 16)])
def test_a_muon_step_has_the_rms_of_a_typical_adamw_step_whatever_the_shape(shape):
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(shape))
    weight.grad = torch.randn(shape)
    before = weight.detach().clone()
    Muon([weight], lr=1e-3).step()
    rms = (weight.detach() - before).pow(2).mean().sqrt().item()
    assert 0.15e-3 < rms < 0.25e-3  # AdamW's steps have an RMS of about 0.2 * lr


def test_muon_decays_its_weights_like_adamw():
    weight = torch.nn.Parameter(torch.ones(4, 4))
    weight.grad = torch.zeros(4, 4)  # no gradient: only the decay moves the weights
    Muon([weight], lr=0.1, weight_decay=0.5).step()
    assert torch.allclose(weight.detach(), torch.full((4, 4), 0.95))


def test_muon_optimizer_gives_the_hidden_matrices_to_muon_and_the_rest_to_adamw():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=3, n_head=2, n_embd=8, perceiver=True, bottleneck_dim=4))
    opt = make_optimizer(model, TrainerConfig(optimizer="muon"))
    assert isinstance(opt, MuonAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for group in opt.muon.param_groups for p in group["params"]}
    adamw = {names[id(p)] for group in opt.adamw.param_groups for p in group["params"]}
    assert "blocks.0.attn.key.weight" in muon and "blocks.0.mlp.0.weight" in muon
    assert "down_block.attn.query.weight" in muon and "up_block.mlp.2.weight" in muon
    for n in ("head.weight", "tok_emb.weight", "pos_emb", "down_block.C", "ln_f.weight", "blocks.0.attn.key.bias"):
        assert n in adamw
    assert not muon & adamw and len(muon) + len(adamw) == len(names)
    assert all(group["weight_decay"] == 0.1 for group in opt.muon.param_groups)
    assert {names[id(p)] for p in opt.adamw.param_groups[0]["params"]} == {"head.weight"}  # the decayed group


def tiny_run(
    impl: str, seed: int = 0, steps: int = 6, dropout: float = 0.1, device: torch.device | None = None, **config
) -> list[float]:
    torch.manual_seed(seed)
    text = "".join(f"person {i} was born in place {i % 5} long ago .\n" for i in range(40))
    ds = CharCorruptionDataset(text, 32)
    drops = {"embd_pdrop": dropout, "resid_pdrop": dropout, "attn_pdrop": dropout}
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=16, **drops))
    cfg = TrainerConfig(max_epochs=3, batch_size=8, learning_rate=1e-2, impl=impl, seed=seed, max_steps=steps, **config)
    random.seed(seed)
    return Trainer(model, ds, cfg, device or torch.device("cpu")).train()


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_training_reduces_the_loss(impl):
    losses = tiny_run(impl, steps=15)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_training_with_muon_reduces_the_loss():
    losses = tiny_run("fast", steps=15, optimizer="muon")
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_same_seed_gives_identical_loss_curves():
    assert tiny_run("fast", seed=3) == tiny_run("fast", seed=3)


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
def test_compiled_training_follows_the_eager_loss_curve():
    eager = tiny_run("fast", steps=4, dropout=0.0, bf16=False)  # compiled dropout draws other random masks
    compiled = tiny_run("fast", steps=4, dropout=0.0, bf16=False, compile=True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-3)


def test_token_weighted_loss_is_the_sum_of_token_losses_over_the_mean_targets_per_batch():
    text = "".join(f"person {i} was born in place {i % 5} long ago .\n" for i in range(40))
    ds = CharCorruptionDataset(text, 32)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    trainer = Trainer(model, ds, TrainerConfig(batch_size=8, token_weighted=True), torch.device("cpu"))
    ys = [y for _, y in trainer.batches(0)]
    per_batch = trainer.mean_targets_per_batch()
    assert per_batch == pytest.approx(sum(int((y != 0).sum()) for y in ys) * 8 / len(ds))
    x, y = next(iter(trainer.batches(0)))
    logits, loss = model(x, y)
    token_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(trainer.training_loss(loss, y, per_batch), token_sum / per_batch)
    assert trainer.training_loss(loss, y, None) is loss


def test_token_weighted_training_reduces_the_loss():
    losses = tiny_run("fast", steps=15, token_weighted=True)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_max_steps_stops_training():
    assert len(tiny_run("fast", steps=4)) == 4


def budget_trainer(budget_seconds: float | None, seconds_per_step: int = 10, **config) -> Trainer:
    """A tiny trainer whose clock advances seconds_per_step at every step, with a cosine over 3 epochs."""
    torch.manual_seed(0)
    text = "".join(f"person {i} was born in place {i % 5} long ago .\n" for i in range(40))
    ds = CharCorruptionDataset(text, 32)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    cfg = TrainerConfig(
        max_epochs=3, batch_size=8, learning_rate=1e-2, lr_decay=True, warmup_tokens=0, cosine_cap=True,
        final_tokens=3 * len(ds) * ds.example_length, budget_seconds=budget_seconds, **config,
    )  # fmt: skip
    trainer = Trainer(model, ds, cfg, torch.device("cpu"))
    trainer.clock = itertools.count(0, seconds_per_step).__next__
    return trainer


def test_budget_stops_training_once_the_time_is_spent():
    trainer = budget_trainer(budget_seconds=45)
    trainer.train()
    assert trainer.step == 5 and trainer.seconds == 50
    assert trainer.epoch == 0  # an epoch has 5 batches of 8: stopped inside the first of three


def test_budget_cuts_the_planned_schedule_off_instead_of_compressing_it():
    lrs = []
    trainer = budget_trainer(budget_seconds=45)
    trainer.log = lambda name, value, step: lrs.append(value) if name == "train/lr" else None
    trainer.train()
    planned = [1e-2 * lr_multiplier(8 * 32 * step, 0, 3 * 40 * 32, cap=True) for step in range(1, 6)]
    assert lrs == pytest.approx(planned)  # the first 5 of the 15 planned steps, far above the 1e-3 floor
    assert lrs[-1] > 5e-3


def test_budget_cooldown_anneals_the_cut_off_schedule_to_its_floor_as_the_budget_runs_out():
    lrs = []
    trainer = budget_trainer(budget_seconds=45, budget_cooldown=0.4)  # the cool-down starts at 27 s
    trainer.log = lambda name, value, step: lrs.append(value) if name == "train/lr" else None
    trainer.train()
    planned = [1e-2 * lr_multiplier(8 * 32 * step, 0, 3 * 40 * 32, cap=True) for step in range(1, 6)]
    assert lrs[:2] == pytest.approx(planned[:2])  # 10 s and 20 s: before the cool-down, as planned
    left = [(45 - 30) / 18, (45 - 40) / 18]  # the share of the cool-down still to run after steps 3 and 4
    assert lrs[2:4] == pytest.approx([max(1e-3, p * f) for p, f in zip(planned[2:4], left)])
    assert lrs[-1] == pytest.approx(1e-3)  # the budget is spent: the floor, 0.1 of the peak


def test_a_budget_cooldown_that_the_run_ends_before_changes_nothing():
    unlimited = budget_trainer(budget_seconds=None, max_steps=6).train()
    generous = budget_trainer(budget_seconds=10_000, budget_cooldown=0.5, max_steps=6).train()
    assert generous == unlimited


def test_a_budget_the_run_fits_in_changes_nothing():
    unlimited = budget_trainer(budget_seconds=None, max_steps=6).train()
    generous = budget_trainer(budget_seconds=10_000, max_steps=6).train()
    assert generous == unlimited


def test_first_epoch_projects_how_many_planned_epochs_the_budget_holds(capsys):
    budget_trainer(budget_seconds=120).train()  # 50 s per epoch of 5 steps: 2.4 of the 3 planned epochs fit
    out = capsys.readouterr().out
    assert "at 50.0 s per epoch the 2 epochs left take about 2 min" in out
    assert "the 2-minute budget holds about 2 of 3, where the planned cosine is 80% done" in out
    assert "the rate 0.10 of its peak" in out  # 0.5 * (1 + cos(0.8 pi)) = 0.095, held at the 0.1 floor


def test_first_epoch_projection_names_no_budget_limit_when_the_epochs_fit(capsys):
    budget_trainer(budget_seconds=10_000).train()
    out = capsys.readouterr().out
    assert "at 50.0 s per epoch the 2 epochs left take about 2 min\n" in out
    assert "budget holds" not in out


def test_resume_carries_the_time_already_spent():
    first = budget_trainer(budget_seconds=45, max_steps=2)
    first.train()
    second = budget_trainer(budget_seconds=45)
    second.resume(first.checkpoint())
    second.train()
    assert second.step == 5 and second.seconds == 50


def recorded_lrs(trainer: Trainer) -> list[float]:
    """The learning rate of every step `trainer` takes from now on (filled as it trains)."""
    lrs: list[float] = []
    trainer.log = lambda name, value, step: lrs.append(value) if name == "train/lr" else None
    return lrs


def test_budget_fit_plans_as_many_epochs_as_92_percent_of_the_budget_holds():
    trainer = budget_trainer(budget_seconds=450, budget_fit=True)  # 50 s per epoch: 414 s hold 8 epochs
    trainer.train()
    assert trainer.config.max_epochs == 8 and trainer.epoch == 8 and trainer.seconds == 400
    assert trainer.config.final_tokens == 8 * 40 * 31  # the cosine spans the 8 epochs of 40 x 31 positions


def test_budget_fit_follows_the_plan_for_one_epoch_then_ends_its_longer_cosine_at_the_floor():
    trainer = budget_trainer(budget_seconds=450, budget_fit=True)
    lrs = recorded_lrs(trainer)
    trainer.train()
    planned = [1e-2 * lr_multiplier(8 * 32 * step, 0, 3 * 40 * 32, cap=True) for step in range(1, 6)]
    assert lrs[:5] == pytest.approx(planned)  # the first epoch runs on the 3-epoch plan
    fitted = [1e-2 * lr_multiplier(8 * 32 * step, 0, 8 * 40 * 32, cap=True) for step in range(6, 41)]
    assert lrs[5:] == pytest.approx(fitted)
    assert lrs[-1] == pytest.approx(1e-3)  # annealed to the floor inside the budget


def test_budget_fit_plans_fewer_epochs_when_the_budget_holds_fewer_and_still_ends_annealed():
    trainer = budget_trainer(budget_seconds=120, budget_fit=True)  # 110.4 s hold 2 epochs of 50 s
    lrs = recorded_lrs(trainer)
    trainer.train()
    assert trainer.config.max_epochs == 2 and trainer.epoch == 2 and trainer.seconds == 100
    assert lrs[-1] == pytest.approx(1e-3)


def test_budget_fit_says_what_it_planned_after_the_first_epoch(capsys):
    budget_trainer(budget_seconds=450, budget_fit=True).train()
    out = capsys.readouterr().out
    assert "at 50.0 s per epoch, 92% of the 7.5-minute budget holds 8 epochs: planned 3, now 8" in out


def test_a_resumed_budget_fit_run_keeps_its_plan_and_ends_like_an_uninterrupted_one(tmp_path):
    uninterrupted = budget_trainer(budget_seconds=450, budget_fit=True).train()
    ckpt = str(tmp_path / "a.ckpt")
    first = budget_trainer(budget_seconds=450, budget_fit=True, max_steps=7, ckpt_path=ckpt)  # stops in epoch 2
    first.train()
    second = budget_trainer(budget_seconds=450, budget_fit=True, seconds_per_step=5)  # a faster machine now
    second.resume(torch_load_safe(ckpt))
    second.train()
    assert second.config.max_epochs == 8 and second.losses == uninterrupted


def slowing_clock(steps_at_first: int, first: int, then: int) -> Callable[[], int]:
    """A clock read once before training and once per step: steps take `first` seconds, then `then`."""
    durations = itertools.chain([0], itertools.repeat(first, steps_at_first), itertools.repeat(then))
    return itertools.accumulate(durations).__next__


def test_budget_replan_plans_what_is_left_of_the_budget_less_one_epoch():
    trainer = budget_trainer(budget_seconds=600, budget_fit=True, budget_replan=True)  # 50 s per epoch
    trainer.train()
    assert trainer.config.max_epochs == 11 and trainer.epoch == 11  # (600 - 50) / 50 - 1 = 10 more after the first
    assert trainer.seconds == 550


def test_budget_fit_is_cut_off_when_the_machine_slows_down():
    trainer = budget_trainer(budget_seconds=600, budget_fit=True)
    trainer.clock = slowing_clock(10, 10, 15)  # two epochs of 50 s, then 75 s each
    trainer.train()
    assert trainer.config.max_epochs == 11  # planned on the first epoch's pace
    assert trainer.epoch == 8 and trainer.seconds == 610  # cut off 4 steps into epoch 9 of 11


def test_budget_replan_follows_a_machine_that_slows_down_and_ends_annealed_inside_the_budget():
    trainer = budget_trainer(budget_seconds=600, budget_fit=True, budget_replan=True)
    trainer.clock = slowing_clock(10, 10, 15)
    lrs = recorded_lrs(trainer)
    trainer.train()
    # 11 planned after epochs 1 and 2; the median pace reaches 75 s after epoch 4, and the plan shrinks to 7
    assert trainer.config.max_epochs == 7 and trainer.epoch == 7 and trainer.seconds == 475
    assert lrs[-1] == pytest.approx(1e-3)


def test_budget_replan_says_when_it_changes_the_plan(capsys):
    trainer = budget_trainer(budget_seconds=600, budget_fit=True, budget_replan=True)
    trainer.clock = slowing_clock(10, 10, 15)
    trainer.train()
    out = capsys.readouterr().out
    assert "at 50.0 s per epoch (median of the last 1), the 9.2 minutes left of the budget hold 10 more" in out
    assert "at 75.0 s per epoch (median of the last 3), the 5.8 minutes left of the budget hold 3 more" in out
    assert out.count("minutes left of the budget") == 3  # epochs 1, 3 and 4: the others left the plan as it was


def test_a_resumed_budget_replan_run_ends_like_an_uninterrupted_one(tmp_path):
    uninterrupted = budget_trainer(budget_seconds=600, budget_fit=True, budget_replan=True).train()
    ckpt = str(tmp_path / "a.ckpt")
    first = budget_trainer(budget_seconds=600, budget_fit=True, budget_replan=True, max_steps=7, ckpt_path=ckpt)
    first.train()
    second = budget_trainer(budget_seconds=600, budget_fit=True, budget_replan=True)
    second.resume(torch_load_safe(ckpt))
    second.train()
    assert second.epoch_seconds[0] == 50 and second.losses == uninterrupted


def test_unbucketed_fast_batches_follow_the_shuffled_order_and_bucketed_ones_sort_by_length():
    text = "".join(f"person {i} was born in place {i % 5} long ago .\n" for i in range(64))
    ds = CharCorruptionDataset(text, 32)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))

    def real_lengths(order: str) -> list[np.ndarray]:
        trainer = Trainer(model, ds, TrainerConfig(batch_size=8, order=order), torch.device("cpu"))
        return [(y != 0).sum(1).numpy() for _, y in trainer.batches(0)]

    bucketed, unbucketed = real_lengths("bucketed"), real_lengths("shuffled")
    assert sorted(np.concatenate(bucketed)) == sorted(np.concatenate(unbucketed))  # the same examples
    spread = lambda batches: np.mean([b.max() - b.min() for b in batches])  # noqa: E731
    assert spread(bucketed) < spread(unbucketed)


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_file_order_batches_the_same_documents_in_the_same_order_every_epoch(impl):
    text = "".join(chr(ord("a") + i) * 20 + "\n" for i in range(20))  # document i is one letter repeated
    ds = CharCorruptionDataset(text, 32)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    trainer = Trainer(model, ds, TrainerConfig(batch_size=8, order="file", impl=impl), torch.device("cpu"))

    def documents(epoch: int) -> list[list[int]]:
        return [[ord(ds.vocab.decode([int(t) for t in row if t > 1])[0]) - ord("a") for row in x]
                for x, _ in trainer.batches(epoch)]  # fmt: skip

    expected = [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    assert documents(0) == expected
    assert documents(1) == expected


def test_handout_decay_shrinks_every_parameter_but_the_biases():
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16))
    optimizer = make_optimizer(model, TrainerConfig(decay="all_but_biases"))
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names == {n for n, _ in model.named_parameters() if not n.endswith("bias")}
    assert {"tok_emb.weight", "pos_emb", "ln_f.weight"} <= names


def test_default_decay_shrinks_only_matmul_weights():
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16))
    optimizer = make_optimizer(model, TrainerConfig())
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names and all(n.endswith(".weight") and ".ln" not in n and "emb" not in n for n in names)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_training_leaves_frozen_parameters_exactly_as_they_were(optimizer):
    torch.manual_seed(0)
    text = "".join(f"person {i} was born in place {i % 5} long ago .\n" for i in range(40))
    ds = CharCorruptionDataset(text, 32)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=16))
    model.freeze_lower(1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = TrainerConfig(max_epochs=1, batch_size=8, learning_rate=1e-2, max_steps=3, optimizer=optimizer)
    Trainer(model, ds, cfg, torch.device("cpu")).train()
    for n, p in model.named_parameters():
        if n.startswith(("tok_emb", "pos_emb", "blocks.0.")):
            assert torch.equal(p, before[n]), n
    assert not torch.equal(model.blocks[1].mlp[0].weight, before["blocks.1.mlp.0.weight"])


def test_the_optimizer_holds_no_frozen_parameter():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=8))
    model.freeze_lower(2)
    opt = make_optimizer(model, TrainerConfig(optimizer="muon"))  # every hidden matrix frozen: AdamW alone
    held = {id(p) for group in opt.param_groups for p in group["params"]}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert held == trainable and trainable
