"""Specification of the learning-rate schedule, the optimizer groups and the loop."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

import machine
import trainer as loop
from bench import course
from dataset import CharCorruptionDataset, micro_batches
from machine import on_device
from model import GPT, GPTConfig
from trainer import Trainer, TrainerConfig, TrainState, learning_rate
from utils import epoch_line_due

WARM, FINAL = 10_240, 1_000_000


def lr_multiplier(tokens: float, warmup: float, final: float, cap: bool = False) -> float:
    """The schedule's rate after `tokens` tokens of a plan ending at `final`, over the peak rate."""
    config = TrainerConfig(max_epochs=1, batch_size=1, learning_rate=2.0, warmup_tokens=warmup, cosine_cap=cap)
    return learning_rate(config, TrainState(1, final, 1, 2.0, tokens=tokens)) / 2.0


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


def tiny_people_dataset(people: int = 40) -> CharCorruptionDataset:
    """Span-corruption examples (block 32) of `people` one-line documents "person i was born in place i % 5 ..."."""
    text = "".join(f"person {i} was born in place {i % 5} long ago .\n" for i in range(people))
    return CharCorruptionDataset(text, 32)


def tiny_run(
    seed: int = 0,
    steps: int = 6,
    dropout: float = 0.1,
    device: torch.device | None = None,
    dtype=torch.float32,
    variant: str = "vanilla",
    **config,
) -> list[float]:
    torch.manual_seed(seed)
    ds = tiny_people_dataset()
    drops = {"embd_pdrop": dropout, "resid_pdrop": dropout, "attn_pdrop": dropout}
    sizes = {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 16, "variant": variant}
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, **sizes, **drops)).to(dtype)
    cfg = TrainerConfig(max_epochs=3, batch_size=8, learning_rate=1e-2, seed=seed, max_steps=steps, **config)
    random.seed(seed)
    return Trainer(model, ds, cfg, device or torch.device("cpu")).train()


def test_training_reduces_the_loss():
    losses = tiny_run(steps=15)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


# The trainer's step against the handout's loop, from the same float64 model on the same batch, in two
# halves. Gradients: the handout's rope rotates in fp32 (its complex view calls .float()), whose 2**-24
# relative rounding through a few dozen operations stays within GRADIENT_SCALE of the largest value taking
# part: the loss, or the largest gradient (the other variants agree to float64's rounding; a gradient that
# is zero in exact arithmetic, as a key bias's is, holds only rounding noise of that scale). The optimizer step, given the same gradients: a
# parameter moves by lr * g / (sqrt(v) + eps), whose rounding a gradient near eps (1e-8) amplifies by up to
# lr / eps = 1e6; float64's 1e-16 keeps that far below STEP_TOLERANCE (fp32's 1e-7 would not).
GRADIENT_SCALE = 1e-5
STEP_TOLERANCE = {"atol": 1e-10, "rtol": 1e-9}


def float64_step(variant: str, **config) -> tuple[dict, dict, GPT, nn.Module, Trainer]:
    """One optimizer step of the trainer and of the course's loop from the same float64 model on the same batch,
    the course's optimizer given the trainer's gradients: ({name: (our loss or gradient, theirs)}, the same for
    the parameters after the step, our model, theirs, the trainer)."""
    torch.manual_seed(0)
    ds = tiny_people_dataset()
    no_dropout = {"embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0}
    model = GPT(GPTConfig(ds.vocab_size, 32, 2, 2, 16, variant=variant, bottleneck_dim=24, **no_dropout)).double()
    theirs = course.course_copy(model).double()
    cfg = TrainerConfig(max_epochs=1, learning_rate=1e-2, decay="all_but_biases", **config)
    trainer, their_optimizer = Trainer(model, ds, cfg, torch.device("cpu")), course.optimizer(theirs, cfg)
    x, y = next(iter(trainer.batches(0)))
    step, trainer.optimizer.step = trainer.optimizer.step, lambda: None  # the gradients first
    loss = trainer.optimize(x, y)
    _, their_loss = theirs(x, y)
    their_loss.backward()
    torch.nn.utils.clip_grad_norm_(theirs.parameters(), cfg.grad_norm_clip)
    ours, their_params = dict(model.named_parameters()), dict(theirs.named_parameters())
    gradients = {"loss": (loss, their_loss.detach())} | {n: (p.grad, their_params[n].grad) for n, p in ours.items()}
    for name, p in their_params.items():
        p.grad = ours[name].grad.clone()
    step()
    their_optimizer.step()
    stepped = {name: (p.detach(), their_params[name].detach()) for name, p in ours.items()}
    return gradients, stepped, model, theirs, trainer


def assert_same_step(gradients: dict, stepped: dict) -> None:
    (loss, their_loss), largest = gradients.pop("loss"), max(theirs.abs().max() for _, theirs in gradients.values())
    assert abs(loss - their_loss) <= GRADIENT_SCALE * their_loss
    for name, (ours, theirs) in gradients.items():
        assert (ours - theirs).abs().max() <= GRADIENT_SCALE * largest, name
    for name, (ours, theirs) in stepped.items():
        torch.testing.assert_close(ours, theirs, **STEP_TOLERANCE, msg=name)


@pytest.mark.parametrize("variant", ["vanilla", "perceiver", "rope"])
def test_a_step_gives_the_loss_gradients_and_update_of_the_course_loops_step(variant):
    # The trainer's step (fused AdamW, the perceiver's trimmed bottleneck) against the handout's
    # (torch's default AdamW, all of the bottleneck).
    gradients, stepped, *_ = float64_step(variant, batch_size=8)
    assert_same_step(gradients, stepped)


@pytest.mark.parametrize("variant", ["vanilla", "perceiver", "rope"])
def test_a_step_in_length_grouped_micro_batches_gives_the_course_loops_step_on_the_whole_batch(variant):
    gradients, stepped, _, _, trainer = float64_step(variant, batch_size=16, order="file", micro_batch=4)
    assert trainer.state.step_positions < 16 * 31  # the padding after each group's last target was left out
    assert_same_step(gradients, stepped)


def test_micro_batches_group_rows_by_their_last_target_crop_each_group_and_weigh_it_by_its_targets():
    ends = [2, 0, 16, 1, 3]  # row i's targets are its first ends[i] positions (row 1 has none)
    y = torch.stack([(torch.arange(16) < end).long() * 5 for end in ends])  # (5, 16)
    x = torch.arange(5)[:, None].expand(5, 16)  # row i's inputs are all i
    parts = micro_batches(x, y, 2)
    assert [xs[:, 0].tolist() for xs, _, _ in parts] == [[1, 3], [0, 4], [2]]  # by their last target
    assert [tuple(xs.shape) for xs, _, _ in parts] == [(2, 8), (2, 8), (1, 16)]  # cropped to a multiple of 8
    assert [round(float(share) * 22) for _, _, share in parts] == [1, 5, 16]  # of the batch's 22 targets


def test_training_with_muon_reduces_the_loss():
    losses = tiny_run(steps=15, optimizer="muon")
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_same_seed_gives_identical_loss_curves():
    # Bitwise by design: the same kernels replay the same operations in the same order on the same random numbers.
    assert tiny_run(seed=3) == tiny_run(seed=3)


def test_max_steps_stops_training():
    assert len(tiny_run(steps=4)) == 4


def test_losses_read_from_the_device_every_few_steps_are_every_steps_loss_in_order(monkeypatch):
    read_in_batches = tiny_run(steps=loop.LOSS_EVERY + 5)
    monkeypatch.setattr(loop, "LOSS_EVERY", 1)
    # Bitwise by design: when the losses are read changes no computation.
    assert read_in_batches == tiny_run(steps=len(read_in_batches))


def test_an_epochs_batches_copied_in_one_transfer_keep_their_values_and_shapes():
    ds = tiny_people_dataset()
    batches = list(ds.epoch_batches(8, np.random.default_rng(0), "bucketed"))
    copied = on_device(batches, torch.device("cpu"))
    assert len({x.size(1) for x, _ in batches}) > 1  # batches of several widths
    assert all(torch.equal(x, cx) and torch.equal(y, cy) for (x, y), (cx, cy) in zip(batches, copied, strict=True))


def test_a_run_prints_a_line_for_its_first_and_last_epoch_and_each_tenth_between():
    assert [e for e in range(1, 651) if epoch_line_due(e, 650)] == [1, *range(65, 651, 65)]
    assert [e for e in range(1, 6) if epoch_line_due(e, 5)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("variant", ["vanilla", "perceiver", "rope"])
def test_a_compiled_model_on_batches_padded_to_one_width_trains_as_the_eager_one(monkeypatch, variant):
    monkeypatch.setattr(machine, "COMPILE_BACKEND", "aot_eager")  # the same graph, without generating code
    torch._dynamo.reset()
    eager = tiny_run(steps=6, dropout=0.0, dtype=torch.float64, variant=variant)
    compiled = tiny_run(steps=6, dropout=0.0, dtype=torch.float64, variant=variant, compile=True)
    # Matmuls of another width may round differently: float64's 1e-16, grown by six steps (STEP_TOLERANCE)
    assert compiled == pytest.approx(eager, rel=STEP_TOLERANCE["rtol"])


def test_a_compiled_model_trains_with_the_handouts_dropout(monkeypatch):
    monkeypatch.setattr(machine, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    losses = tiny_run(steps=10, dropout=0.1, compile=True)
    assert all(math.isfinite(x) for x in losses) and np.mean(losses[-3:]) < np.mean(losses[:3])


def test_bucketed_batches_group_an_epochs_examples_by_length_unlike_the_file_order():
    ds = tiny_people_dataset(64)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))

    def real_lengths(order: str) -> list[np.ndarray]:
        trainer = Trainer(
            model, ds, TrainerConfig(max_epochs=1, batch_size=8, learning_rate=1e-3, order=order), torch.device("cpu")
        )
        return [(y != 0).sum(1).numpy() for _, y in trainer.batches(0)]

    bucketed, unbucketed = real_lengths("bucketed"), real_lengths("file")
    assert len(np.concatenate(bucketed)) == len(np.concatenate(unbucketed)) == len(ds)  # every example once
    spread = lambda batches: np.mean([b.max() - b.min() for b in batches])  # noqa: E731
    assert spread(bucketed) < spread(unbucketed)


def test_file_order_batches_the_same_documents_in_the_same_order_every_epoch():
    text = "".join(chr(ord("a") + i) * 20 + "\n" for i in range(20))  # document i is one letter repeated
    ds = CharCorruptionDataset(text, 32)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    trainer = Trainer(
        model, ds, TrainerConfig(max_epochs=1, batch_size=8, learning_rate=1e-3, order="file"), torch.device("cpu")
    )

    def documents(epoch: int) -> list[list[int]]:
        return [[ord(ds.vocab.decode([int(t) for t in row if t > 1])[0]) - ord("a") for row in x]
                for x, _ in trainer.batches(epoch)]  # fmt: skip

    expected = [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    assert documents(0) == expected
    assert documents(1) == expected
