"""Specification of the learning-rate schedule, the optimizer groups and the loop."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from bench import course
from config import resolve, trainer_config
from dataset import CharCorruptionDataset
from model import GPT, GPTConfig
from trainer import Trainer, TrainerConfig, lr_multiplier

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


def tiny_people_dataset(people: int = 40) -> CharCorruptionDataset:
    """Span-corruption examples (block 32) of `people` one-line documents "person i was born in place i % 5 ..."."""
    text = "".join(f"person {i} was born in place {i % 5} long ago .\n" for i in range(people))
    return CharCorruptionDataset(text, 32)


def tiny_run(
    seed: int = 0, steps: int = 6, dropout: float = 0.1, device: torch.device | None = None, **config
) -> list[float]:
    torch.manual_seed(seed)
    ds = tiny_people_dataset()
    drops = {"embd_pdrop": dropout, "resid_pdrop": dropout, "attn_pdrop": dropout}
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=16, **drops))
    cfg = TrainerConfig(max_epochs=3, batch_size=8, learning_rate=1e-2, seed=seed, max_steps=steps, **config)
    random.seed(seed)
    return Trainer(model, ds, cfg, device or torch.device("cpu")).train()


def test_training_reduces_the_loss():
    losses = tiny_run(steps=15)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


@pytest.mark.parametrize("variant", ["vanilla", "perceiver", "rope"])
def test_an_fp32_step_gives_the_loss_and_parameters_of_the_course_loops_step(variant):
    # The same batch and starting point: the trainer's step (fused AdamW, the perceiver's trimmed
    # bottleneck) against the handout's (torch's default AdamW, all of the bottleneck).
    torch.manual_seed(0)
    ds = tiny_people_dataset()
    no_dropout = {"embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0}
    config = GPTConfig(ds.vocab_size, 32, 2, 2, 16, variant=variant, bottleneck_dim=24, **no_dropout)
    model = GPT(config)
    theirs = course.course_copy(model)
    cfg = TrainerConfig(batch_size=8, learning_rate=1e-2, decay="all_but_biases", bf16=False)
    trainer = Trainer(model, ds, cfg, torch.device("cpu"))
    x, y = next(iter(trainer.batches(0)))
    loss = trainer.optimize(x, y)
    their_loss = course.train_step(theirs, course.optimizer(theirs, cfg), x, y, cfg.grad_norm_clip)
    torch.testing.assert_close(loss, their_loss)
    their_state = theirs.state_dict()
    for name, ours in model.state_dict().items():
        torch.testing.assert_close(ours, their_state[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("variant", ["vanilla", "perceiver", "rope"])
def test_a_step_in_length_grouped_micro_batches_gives_the_course_loops_step_on_the_whole_batch(variant):
    torch.manual_seed(0)
    ds = tiny_people_dataset()
    no_dropout = {"embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0}
    model = GPT(GPTConfig(ds.vocab_size, 32, 2, 2, 16, variant=variant, bottleneck_dim=24, **no_dropout))
    theirs = course.course_copy(model)
    cfg = TrainerConfig(batch_size=16, learning_rate=1e-2, decay="all_but_biases", bf16=False, order="file",
                        micro_batch=4)  # fmt: skip
    trainer = Trainer(model, ds, cfg, torch.device("cpu"))
    x, y = next(iter(trainer.batches(0)))
    loss = trainer.optimize(x, y)
    assert trainer.step_positions < x.numel()  # the padding after each group's last target was left out
    their_loss = course.train_step(theirs, course.optimizer(theirs, cfg), x, y, cfg.grad_norm_clip)
    torch.testing.assert_close(loss, their_loss)
    their_state = theirs.state_dict()
    for name, ours in model.state_dict().items():
        torch.testing.assert_close(ours, their_state[name], atol=1e-5, rtol=1e-4, msg=name)


def test_the_handouts_order_trains_in_micro_batches_on_a_cpu_and_whole_batches_on_a_gpu(monkeypatch):
    args = resolve({"function": "pretrain", "variant": "vanilla", "pretrain_corpus_path": "wiki.txt"})
    assert args.order == "file" and trainer_config(args, 2937).micro_batch == 32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # device auto: the GPU
    assert trainer_config(args, 2937).micro_batch == 0


def test_micro_batches_group_rows_by_their_last_target_crop_each_group_and_weigh_it_by_its_targets():
    cfg = TrainerConfig(micro_batch=2)
    trainer = Trainer(GPT(GPTConfig(10, 16, 1, 1, 8)), tiny_people_dataset(), cfg, torch.device("cpu"))
    ends = [2, 0, 16, 1, 3]  # row i's targets are its first ends[i] positions (row 1 has none)
    y = torch.stack([(torch.arange(16) < end).long() * 5 for end in ends])  # (5, 16)
    x = torch.arange(5)[:, None].expand(5, 16)  # row i's inputs are all i
    parts = trainer.micro_batches(x, y)
    assert [xs[:, 0].tolist() for xs, _, _ in parts] == [[1, 3], [0, 4], [2]]  # by their last target
    assert [tuple(xs.shape) for xs, _, _ in parts] == [(2, 8), (2, 8), (1, 16)]  # cropped to a multiple of 8
    assert [round(float(share) * 22) for _, _, share in parts] == [1, 5, 16]  # of the batch's 22 targets


def test_training_with_muon_reduces_the_loss():
    losses = tiny_run(steps=15, optimizer="muon")
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_same_seed_gives_identical_loss_curves():
    assert tiny_run(seed=3) == tiny_run(seed=3)


def test_max_steps_stops_training():
    assert len(tiny_run(steps=4)) == 4


def test_unbucketed_fast_batches_follow_the_shuffled_order_and_bucketed_ones_sort_by_length():
    ds = tiny_people_dataset(64)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))

    def real_lengths(order: str) -> list[np.ndarray]:
        trainer = Trainer(model, ds, TrainerConfig(batch_size=8, order=order), torch.device("cpu"))
        return [(y != 0).sum(1).numpy() for _, y in trainer.batches(0)]

    bucketed, unbucketed = real_lengths("bucketed"), real_lengths("shuffled")
    assert sorted(np.concatenate(bucketed)) == sorted(np.concatenate(unbucketed))  # the same examples
    spread = lambda batches: np.mean([b.max() - b.min() for b in batches])  # noqa: E731
    assert spread(bucketed) < spread(unbucketed)


def test_file_order_batches_the_same_documents_in_the_same_order_every_epoch():
    text = "".join(chr(ord("a") + i) * 20 + "\n" for i in range(20))  # document i is one letter repeated
    ds = CharCorruptionDataset(text, 32)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    trainer = Trainer(model, ds, TrainerConfig(batch_size=8, order="file"), torch.device("cpu"))

    def documents(epoch: int) -> list[list[int]]:
        return [[ord(ds.vocab.decode([int(t) for t in row if t > 1])[0]) - ord("a") for row in x]
                for x, _ in trainer.batches(epoch)]  # fmt: skip

    expected = [list(range(0, 8)), list(range(8, 16)), list(range(16, 20))]
    assert documents(0) == expected
    assert documents(1) == expected
