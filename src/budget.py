"""What a run's time buys: the Pace, Trainer callbacks that say early what the run will cost, and after the first
whole epoch how long the rest takes. With a budget it stops the run once the budget is spent or, with `fit`,
re-plans it after every whole epoch so that the cosine ends as the budget does, whatever the machine's load.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from tqdm import tqdm

from machine import ThreadChooser
from trainer import Trainer, TrainerConfig, TrainState, learning_rate
from utils import plural

# The plan fills this share of the budget: the last epochs may run slower than those that set the pace.
FIT_SHARE = 0.97
# The pace: the median of this many latest whole epochs (one slow epoch does not shrink the plan).
PACE_EPOCHS = 3
# Steps on seen batch shapes the first estimate waits for: a new shape's first step sets up kernels.
WARM_STEPS = 5


class Pace:
    """The callbacks for the run `config` describes."""

    def __init__(self, config: TrainerConfig, budget_seconds: float | None = None, fit: bool = False):
        self.config, self.budget_seconds = config, budget_seconds
        self.fit = fit and budget_seconds is not None
        self.reported = False  # the projection or first plan is printed once
        self.seen_shapes: set[int] = set()
        self.warm: list[tuple[float, int]] = []  # (seconds, positions) of steps on a seen shape
        self.cold: list[tuple[float, int]] = []  # ... and of the others but the first step
        self.estimated = False
        self.replans = 0  # plan changes printed
        self.cut_off = False  # the budget stopped the run before its schedule ended
        self.steps, self.positions = 0, 0  # trained by this process
        self.threads: ThreadChooser | None = None  # set by attach()

    def on_batch_end(self, s: TrainState) -> None:
        spent = self.budget_seconds is not None and s.seconds >= self.budget_seconds
        planned_done = self.fit and s.planned and s.tokens >= s.final_tokens  # maybe inside an epoch
        self.cut_off = spent and not planned_done
        s.stop = s.stop or spent or planned_done
        if not self.reported:
            self.early_estimate(s)

    def early_estimate(self, s: TrainState) -> None:
        """Print once, early, what an epoch and the run cost at the pace of WARM_STEPS steps on shapes seen before,
        or after twice as many steps, of every step but the first."""
        positions = s.step_positions  # one batch shape per count of positions
        self.steps, self.positions = self.steps + 1, self.positions + positions
        timed = self.warm if positions in self.seen_shapes else self.cold
        if self.steps > 1:
            timed.append((s.step_seconds, positions))
        self.seen_shapes.add(positions)
        warm = len(self.warm) >= WARM_STEPS
        if self.estimated or not (warm or self.steps > 2 * WARM_STEPS) or s.batch_in_epoch >= s.batches_per_epoch:
            return  # not yet, or the epoch's own line says it now
        steps = self.warm if warm else self.warm + self.cold
        per_position = sum(t for t, _ in steps) / sum(p for _, p in steps)
        epoch = per_position * self.positions / self.steps * s.batches_per_epoch
        whole = epoch * s.max_epochs
        how = f"{len(steps)} steps after set-up" if warm else f"{len(steps)} steps, most on new batch shapes (slower)"
        tqdm.write(
            f"a first guess from {how}: about {epoch:.0f} s per epoch, "
            + (f"{whole / 3600:.1f} hours" if whole >= 3600 else f"{whole / 60:.0f} min")
            + f" for {plural(s.max_epochs, 'epoch')}"
            + (" (before the time budget's plan)" if self.fit else "")
        )
        self.estimated = True

    def on_epoch_end(self, s: TrainState) -> None:
        if not s.whole_epoch:
            return
        plan = self.fit_to_budget(s, float(np.median(s.epoch_seconds[-PACE_EPOCHS:]))) if self.fit else None
        if plan or (not self.reported and s.epoch < s.max_epochs):
            tqdm.write(plan or self.projection(s, s.epoch_seconds[-1]))
        self.reported = True

    def on_train_end(self, s: TrainState) -> None:
        if self.cut_off:
            where = f"in epoch {s.epoch + 1}" if s.batch_in_epoch else f"after epoch {s.epoch}"
            tqdm.write(
                f"the {self.budget_seconds / 60:g}-minute budget was spent at step {s.step}, {where} of "
                f"{s.max_epochs}; the learning-rate schedule was cut off there"
            )

    def fit_to_budget(self, s: TrainState, epoch_seconds: float) -> str | None:
        """Plan as many steps as FIT_SHARE of the budget holds at `epoch_seconds` per epoch (at most the config's
        epochs), the cosine ending at the last; a line to print if the plan is new or moved by an epoch."""
        n_batches, asked = s.batches_per_epoch, self.config.max_epochs
        tokens_per_epoch = s.tokens / s.epoch  # every epoch counts the same tokens
        left = max(0.0, self.budget_seconds * FIT_SHARE - s.seconds)
        held_steps = s.epoch * n_batches + math.floor(left / epoch_seconds * n_batches)
        planned = max(s.epoch * n_batches, min(asked * n_batches, held_steps)) / n_batches
        was = s.final_tokens / tokens_per_epoch if s.planned else None
        s.max_epochs, s.final_tokens = math.ceil(planned), round(tokens_per_epoch * planned)
        s.planned = True
        if was is not None and abs(was - planned) < 1:
            return None
        budget = f"{FIT_SHARE:.0%} of the {self.budget_seconds / 60:g}-minute budget holds {held_steps / n_batches:.1f}"
        most = " (the most asked for)" if held_steps >= asked * n_batches else f" of {asked}"
        line = (
            f"at {epoch_seconds:.1f} s per epoch {budget} epochs: training {planned:.1f}{most}, with the cosine "
            f"ending at their end (about {(planned - s.epoch) * epoch_seconds / 60:.0f} min left)"
        )
        if was is None:
            return line
        self.replans += 1
        return f"the pace changed: {line} (planned {was:.1f} before)"

    def projection(self, s: TrainState, epoch_seconds: float) -> str:
        """How long the epochs left take at `epoch_seconds` each; for a shorter budget, how many it holds and where the
        cosine then stands."""
        cfg, budget, left = self.config, self.budget_seconds, s.max_epochs - s.epoch
        line = (
            f"at {epoch_seconds:.1f} s per epoch the {left} epochs left take about {left * epoch_seconds / 60:.0f} min"
        )
        if budget is None or s.seconds + left * epoch_seconds <= budget:
            return line
        held = s.epoch + (budget - s.seconds) / epoch_seconds
        line += f"; the {budget / 60:g}-minute budget holds about {held:.0f} of {s.max_epochs}"
        tokens = s.tokens / s.epoch * held
        progress = min(1.0, (tokens - cfg.warmup_tokens) / max(1, s.final_tokens - cfg.warmup_tokens))
        rate = learning_rate(cfg, dataclasses.replace(s, tokens=tokens)) / cfg.learning_rate
        return line + f", where the planned cosine is {progress:.0%} done and the rate {rate:.2f} of its peak"


def attach(trainer: Trainer, budget_seconds: float | None, fit: bool, threads: int | None = None) -> Pace:
    """A Pace attached to `trainer`; a planned run on several CPU threads also gets the thread choice, unless
    `threads` fixes their count."""
    pace = Pace(trainer.config, budget_seconds, fit)
    for event in ("on_batch_end", "on_epoch_end", "on_train_end"):
        trainer.add_callback(event, getattr(pace, event))
    if pace.fit and trainer.device.type == "cpu" and torch.get_num_threads() > 1 and not threads:
        pace.threads = chooser = ThreadChooser(started := torch.get_num_threads())

        def after_step(s: TrainState) -> None:  # its training ends on the count it started with
            line = chooser.after_step(s.step_seconds, s.step_positions, s.seconds)
            trainer.log("train/threads", torch.get_num_threads(), s.step)
            if line:
                tqdm.write(line)

        trainer.add_callback("on_batch_end", after_step)
        trainer.add_callback("on_train_end", lambda s: torch.set_num_threads(started))
    return pace
