"""Specification of the policy that attaches to the loop (budget.py, machine.py): the early estimate,
the time budget's cut-off and plan, and the thread choice."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from test_trainer import lr_multiplier, tiny_people_dataset

import budget
import run
import utils
from machine import TRY_EVERY, TRY_EVERY_MAX, ThreadChooser
from model import GPT, GPTConfig
from trainer import Trainer, TrainerConfig, TrainState
from utils import torch_load_safe


def budget_trainer(
    budget_seconds: float | None, seconds_per_step: int = 10, max_epochs: int = 3, fit: bool = False, **config
) -> Trainer:
    """A tiny trainer whose clock advances seconds_per_step at every step, with a cosine over 3 epochs
    (planned: max_epochs may allow a fitted plan more) and a Pace (no thread choice) attached."""
    torch.manual_seed(0)
    ds = tiny_people_dataset()
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16))
    cfg = TrainerConfig(
        max_epochs=max_epochs, batch_size=8, learning_rate=1e-2, warmup_tokens=0, cosine_cap=True,
        final_tokens=3 * len(ds) * ds.example_length, **config,
    )  # fmt: skip
    trainer = Trainer(model, ds, cfg, torch.device("cpu"))
    trainer.clock = itertools.count(0, seconds_per_step).__next__
    budget.attach(trainer, budget_seconds, fit, threads=1)  # a fixed thread count: no thread choice
    return trainer


def test_budget_stops_training_once_the_time_is_spent():
    trainer = budget_trainer(budget_seconds=45)
    trainer.train()
    assert trainer.state.step == 5 and trainer.state.seconds == 50
    assert (trainer.state.epoch, trainer.state.batch_in_epoch) == (
        1,
        0,
    )  # 5 batches of 8: the first of three epochs, whole


def test_budget_cuts_the_planned_schedule_off_instead_of_compressing_it():
    lrs = []
    trainer = budget_trainer(budget_seconds=45)
    trainer.log = lambda name, value, step: lrs.append(value) if name == "train/lr" else None
    trainer.train()
    planned = [1e-2 * lr_multiplier(8 * 32 * step, 0, 3 * 40 * 32, cap=True) for step in range(1, 6)]
    assert lrs == pytest.approx(planned)  # the first 5 of the 15 planned steps, far above the 1e-3 floor
    assert lrs[-1] > 5e-3


def test_a_budget_the_run_fits_in_changes_nothing():
    unlimited = budget_trainer(budget_seconds=None, max_steps=6).train()
    generous = budget_trainer(budget_seconds=10_000, max_steps=6).train()
    assert generous == unlimited  # bitwise by design: a budget that is not reached changes no computation


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
    assert second.state.step == 5 and second.state.seconds == 50


def recorded_lrs(trainer: Trainer) -> list[float]:
    """The learning rate of every step `trainer` takes from now on (filled as it trains)."""
    lrs: list[float] = []
    trainer.log = lambda name, value, step: lrs.append(value) if name == "train/lr" else None
    return lrs


def test_budget_fit_plans_as_many_steps_as_97_percent_of_the_budget_holds_ending_inside_an_epoch():
    trainer = budget_trainer(budget_seconds=450, fit=True, max_epochs=10)  # 10 s per step: 436.5 s hold 43
    trainer.train()
    assert trainer.state.step == 43 and trainer.state.seconds == 430  # 8 epochs of 5 steps and 3 steps of the 9th
    assert trainer.state.max_epochs == 9 and (trainer.state.epoch, trainer.state.batch_in_epoch) == (8, 3)
    assert trainer.state.final_tokens == 43 * 8 * 31  # the cosine spans the 43 steps of 8 x 31 positions


def test_budget_fit_follows_the_plan_for_one_epoch_then_ends_its_longer_cosine_at_the_floor():
    trainer = budget_trainer(budget_seconds=450, fit=True, max_epochs=10)
    lrs = recorded_lrs(trainer)
    trainer.train()
    planned = [1e-2 * lr_multiplier(8 * 32 * step, 0, 3 * 40 * 32, cap=True) for step in range(1, 6)]
    assert lrs[:5] == pytest.approx(planned)  # the first epoch runs on the 3-epoch plan
    fitted = [1e-2 * lr_multiplier(8 * 32 * step, 0, 43 * 8 * 32, cap=True) for step in range(6, 44)]
    assert lrs[5:] == pytest.approx(fitted)
    assert lrs[-1] == pytest.approx(1e-3)  # annealed to the floor inside the budget


def test_budget_fit_plans_fewer_epochs_when_the_budget_holds_fewer_and_still_ends_annealed():
    trainer = budget_trainer(budget_seconds=120, fit=True)  # 116.4 s hold 11 steps of 10 s
    lrs = recorded_lrs(trainer)
    trainer.train()
    assert trainer.state.step == 11 and trainer.state.seconds == 110 and trainer.state.max_epochs == 3
    assert lrs[-1] == pytest.approx(1e-3)


def test_budget_fit_says_what_it_planned_after_the_first_epoch(capsys):
    budget_trainer(budget_seconds=450, fit=True, max_epochs=10).train()
    out = capsys.readouterr().out
    assert "at 50.0 s per epoch 97% of the 7.5-minute budget holds 8.6 epochs: training 8.6 of 10" in out


def test_budget_fit_never_plans_more_epochs_than_asked_for(capsys):
    trainer = budget_trainer(budget_seconds=450, fit=True, max_epochs=5)  # the budget holds 8
    trainer.train()
    assert trainer.state.max_epochs == 5 and trainer.state.epoch == 5
    assert trainer.state.final_tokens == 5 * 40 * 31  # the cosine still ends with the run
    assert "holds 8.6 epochs: training 5.0 (the most asked for)" in capsys.readouterr().out


def test_a_resumed_budget_fit_run_keeps_its_plan_and_ends_like_an_uninterrupted_one(tmp_path):
    ckpt = str(tmp_path / "a.ckpt")

    def trainer(**config) -> Trainer:  # one thread count throughout: a change alters float rounding
        return budget_trainer(budget_seconds=450, fit=True, max_epochs=10, **config)

    uninterrupted = trainer().train()
    trainer(max_steps=7, ckpt_path=ckpt).train()  # stops in epoch 2
    second = trainer()
    second.resume(torch_load_safe(ckpt))
    second.train()
    # Bitwise by design: the checkpoint restores every value and random state, and the same kernels replay the rest.
    assert second.state.max_epochs == 9 and second.state.losses == uninterrupted


def paced_clock(seconds_per_step: list[float]):
    """A clock that advances seconds_per_step[i] at its i-th reading after the first (the last one repeats)."""
    readings = itertools.accumulate(itertools.chain([0.0], seconds_per_step, itertools.repeat(seconds_per_step[-1])))
    return readings.__next__


def test_budget_fit_replans_when_other_work_slows_the_machine_and_still_ends_annealed_in_time(capsys):
    trainer = budget_trainer(budget_seconds=450, fit=True, max_epochs=10)  # 5 steps per epoch
    trainer.clock = paced_clock([10.0] * 5 + [20.0] * 15 + [10.0] * 5)  # epochs 2-4 run at half speed
    lrs = recorded_lrs(trainer)
    trainer.train()
    assert trainer.state.step == 24  # planned 43 steps after epoch 1, 29 and 24 once slowed
    assert trainer.state.seconds == 390 <= 450 * 0.97 and lrs[-1] == pytest.approx(1e-3)
    assert "the pace changed:" in capsys.readouterr().out


def test_budget_fit_plans_more_epochs_again_once_the_machine_is_free(capsys):
    trainer = budget_trainer(budget_seconds=450, fit=True, max_epochs=10)
    trainer.clock = paced_clock([20.0] * 5 + [10.0] * 5)  # a slow first epoch, then full speed
    lrs = recorded_lrs(trainer)
    trainer.train()
    assert trainer.state.step == 38  # 21 steps planned after epoch 1 at 100 s per epoch, then 29, then 38
    assert trainer.state.seconds == 430 <= 450 * 0.97 and lrs[-1] == pytest.approx(1e-3)


def threads_over_time(step_seconds, steps: int, sizes: list[int] | None = None) -> list[tuple[float, int, str | None]]:
    """Run a ThreadChooser starting at 2 threads for `steps` steps of `sizes` tokens (at random; 1000 when
    not given), each taking step_seconds(threads, now) seconds for 1000 tokens (in proportion, plus a fixed
    0.1 s, for others); returns (time, threads, printed line) of every step."""
    chooser, now, out, rng = ThreadChooser(2), 0.0, [], random.Random(0)
    torch.set_num_threads(2)
    for _ in range(steps):
        threads = torch.get_num_threads()
        tokens = rng.choice(sizes or [1000])
        seconds = step_seconds(threads, now) * (tokens / 1000 if sizes is None else 0.1 + tokens / 1000)
        now += seconds
        out.append((now, threads, chooser.after_step(seconds, tokens, now)))
    return out


def contended_step_seconds(busy_until: float):
    """Seconds per step on two cores, a busy process holding one of them until busy_until: two
    threads then wait for it at every synchronisation, one does not."""

    def seconds(threads: int, now: float) -> float:
        if now < busy_until:
            return 0.6 if threads == 2 else 0.3
        return 0.17 if threads == 2 else 0.27

    return seconds


def test_a_busy_core_moves_budgeted_training_to_half_its_threads_and_a_freed_one_moves_it_back(restore_threads):
    run = threads_over_time(contended_step_seconds(busy_until=180.0), 2000)
    busy = [threads for t, threads, _ in run if TRY_EVERY + 10 <= t < 180]
    freed = [threads for t, threads, _ in run if t >= 180 + TRY_EVERY_MAX + 10]
    assert busy.count(1) / len(busy) > 0.9 and freed.count(2) / len(freed) > 0.97
    lines = [line for _, _, line in run if line]
    assert lines[0].startswith("training on 1 thread instead of 2:") and len(lines) == 2
    assert lines[1].startswith("training on 2 threads instead of 1:")


def test_on_a_free_machine_budgeted_training_stays_on_all_threads_but_for_short_tries(restore_threads):
    run = threads_over_time(contended_step_seconds(busy_until=0.0), 3000)
    assert [threads for _, threads, _ in run].count(1) / len(run) < 0.03
    assert not any(line for _, _, line in run)


def test_batches_of_different_lengths_do_not_flip_the_choice_on_a_free_machine(restore_threads):
    run = threads_over_time(contended_step_seconds(busy_until=0.0), 3000, sizes=[256, 1024, 2048, 4064])
    assert not any(line for _, _, line in run)


def test_a_budgeted_cpu_run_switches_to_the_faster_thread_count_and_ends_on_the_one_it_started_with(
    restore_threads, capsys
):
    torch.set_num_threads(2)
    trainer = budget_trainer(budget_seconds=None, max_epochs=10)
    budget.attach(trainer, budget_seconds=2000, fit=True)
    readings = itertools.accumulate(5.0 * torch.get_num_threads() for _ in itertools.count())
    trainer.clock = lambda: next(readings)  # a step on 2 threads takes twice as long as on 1
    trainer.train()
    assert "training on 1 thread instead of 2" in capsys.readouterr().out
    assert torch.get_num_threads() == 2


def test_runs_without_a_budget_plan_keep_torchs_thread_count():
    trainer = budget_trainer(budget_seconds=None)
    assert budget.attach(trainer, budget_seconds=600, fit=False).threads is None
    assert budget.attach(trainer, budget_seconds=None, fit=True).threads is None


def test_the_first_estimate_leaves_out_the_first_step_of_each_batch_shape(capsys):
    pace = budget.Pace(TrainerConfig(max_epochs=2, batch_size=8, learning_rate=1e-3))
    state = TrainState(max_epochs=2, final_tokens=1e6, batches_per_epoch=100, lr=1e-3)
    for shape in [1000, 2000, 1000, 2000, 1000, 2000, 1000, 3000, 2000]:  # the 5th warm step is the 7th
        first = shape not in pace.seen_shapes
        state.step_positions, state.step_seconds = shape, (100.0 if first else shape / 1000)
        state.batch_in_epoch += 1
        pace.early_estimate(state)
    out = capsys.readouterr().out  # 1 ms per position, 10,000 positions in 7 steps: 143 s for 100 steps
    assert out == "a first guess from 5 steps after set-up: about 143 s per epoch, 5 min for 2 epochs\n"


def test_a_run_that_ends_on_its_plan_inside_an_epoch_removes_its_checkpoint(tmp_path):
    ckpt = tmp_path / "pt.params.ckpt"
    trainer = budget_trainer(budget_seconds=450, fit=True, max_epochs=10, ckpt_path=str(ckpt))
    trainer.train()
    assert trainer.state.batch_in_epoch == 3 and ckpt.is_file()  # the plan ended inside epoch 9
    assert run.end_of_run(trainer, ckpt) == ""
    assert not ckpt.exists()


def test_a_max_steps_stop_keeps_its_checkpoint_and_names_it(tmp_path):
    ckpt = tmp_path / "pt.params.ckpt"
    trainer = budget_trainer(budget_seconds=None, max_steps=7, ckpt_path=str(ckpt))
    trainer.train()
    line = run.end_of_run(trainer, ckpt)
    assert line.startswith(f"; kept {ckpt} (") and line.endswith("MB) for --resume") and ckpt.is_file()


def test_a_planned_run_that_ends_annealed_as_its_budget_runs_out_does_not_say_it_was_cut_off(capsys):
    trainer = budget_trainer(budget_seconds=65, fit=True)  # 63.05 s hold 6 steps at 10 s
    trainer.clock = paced_clock([10.0] * 5 + [20.0])  # the 6th step takes 20 s: the budget runs out with it
    lrs = recorded_lrs(trainer)
    trainer.train()
    assert trainer.state.step == 6 and trainer.state.seconds == 70 and lrs[-1] == pytest.approx(1e-3)
    assert "cut off" not in capsys.readouterr().out


def test_a_budget_that_stops_an_unplanned_schedule_says_it_was_cut_off(capsys):
    budget_trainer(budget_seconds=45).train()
    assert "the 0.75-minute budget was spent at step 5, after epoch 1 of 3" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# Progress lines of long steps that are not training (recitation)


def progress_lines(monkeypatch, capsys, updates: list[tuple[float, int]], total: int = 100) -> list[str]:
    """What a Progress of `total` printed for updates (clock seconds, done) after starting at 0 s."""
    clock = iter([0.0] + [t for t, _ in updates])
    monkeypatch.setattr(utils.time, "monotonic", lambda: next(clock))
    progress = utils.Progress("reciting", total, every=20)
    for _, done in updates:
        progress.update(done)
    return capsys.readouterr().out.splitlines()


def test_progress_estimates_the_time_left_from_the_pace_after_its_first_update(monkeypatch, capsys):
    # the first 10 items paid 30 s of warm-up; then 10 items every 5 s
    lines = progress_lines(monkeypatch, capsys, [(30, 10), (35, 20), (40, 30), (55, 60)])
    assert lines == ["reciting: 20/100 after 35 s, about 40 s left", "reciting: 60/100 after 55 s, about 20 s left"]


def test_progress_says_nothing_more_often_than_every_20_seconds_nor_at_the_end(monkeypatch, capsys):
    lines = progress_lines(monkeypatch, capsys, [(1, 10), (21, 20), (30, 30), (42, 40), (60, 100)])
    assert [line.split(":")[1].split()[0] for line in lines] == ["20/100", "40/100"]
