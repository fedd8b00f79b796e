"""What a run's time buys: machine policy, attached to the Trainer as callbacks (`attach`).

- `Pace` says early what the run will cost, and after the first whole epoch how long the rest
  takes. With a budget it stops the run once the budget is spent or, with `fit`, plans the run
  to the budget after every whole epoch, from the pace measured, so that the cosine ends
  annealed as the budget ends, even when other work slows the machine down or stops doing so.
- `ThreadChooser` keeps torch's CPU thread count at the faster of all threads and half of them,
  as measured (a planned CPU run only: a run whose thread count changes repeats only to rounding).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from tqdm import tqdm

from trainer import Trainer, lr_multiplier

# The plan fills this share of the budget: the last epochs can run a little slower than the ones
# that set the pace, and what still runs past the budget is cut off.
FIT_SHARE = 0.97
# The pace is the median of this many latest whole epochs: one slow epoch (a checkpoint, a burst
# of other work) does not shrink the plan, a lasting change of pace moves it within two.
PACE_EPOCHS = 3
# The first estimate waits for this many steps whose batch shape was seen before: the first step
# of each new shape pays for setting up its kernels, which later epochs do not.
WARM_STEPS = 5


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


class Pace:
    """Callbacks: the early estimate, the projection after the first whole epoch and, with
    `budget_seconds`, the budget's cut-off or (with `fit`) its plan. Its state_dict (the plan)
    travels in the trainer's checkpoint."""

    def __init__(self, budget_seconds: float | None = None, fit: bool = False):
        self.budget_seconds, self.fit = budget_seconds, fit and budget_seconds is not None
        self.fitted = False  # whether max_epochs and final_tokens were planned to the budget yet
        self.asked_epochs: int | None = None  # the plan holds at most this many
        self.reported = False  # the projection (or first plan) of this process is printed once
        self.seen_shapes: set[int] = set()
        self.warm: list[tuple[float, int]] = []  # (seconds, positions) of steps on a seen shape
        self.cold: list[tuple[float, int]] = []  # ... and of the others but the first step
        self.estimated = False
        self.replans = 0  # plan changes printed ("the pace changed")
        self.cut_off = False  # the budget stopped the run before its schedule ended
        self.steps, self.positions = 0, 0  # steps this process trained, and their positions
        self.threads: ThreadChooser | None = None  # attach() sets it for a planned run on several CPU threads

    def attach(self, trainer: Trainer) -> Pace:
        self.asked_epochs, self.config = trainer.config.max_epochs, trainer.config
        trainer.add_callback("on_batch_end", self.on_batch_end)
        trainer.add_callback("on_epoch_end", self.on_epoch_end)
        trainer.add_callback("on_train_end", self.on_train_end)
        trainer.saved["pace"] = self
        return self

    def state_dict(self) -> dict:
        plan = {"max_epochs": self.config.max_epochs, "final_tokens": self.config.final_tokens}
        return {"fitted": self.fitted, "asked_epochs": self.asked_epochs, **plan}

    def load_state_dict(self, state: dict) -> None:
        """The plan as it stood, re-planned from the next whole epoch (a run without a plan keeps its own)."""
        if self.fit and state["fitted"]:
            self.fitted, self.asked_epochs = True, state["asked_epochs"]
            self.config.max_epochs, self.config.final_tokens = state["max_epochs"], state["final_tokens"]

    def on_batch_end(self, trainer: Trainer) -> None:
        cfg, spent = trainer.config, self.budget_seconds is not None and trainer.seconds >= self.budget_seconds
        planned_done = self.fitted and cfg.lr_decay and trainer.tokens >= cfg.final_tokens  # maybe inside an epoch
        self.cut_off = spent and not planned_done
        trainer.stop = trainer.stop or spent or planned_done
        if not self.reported:
            self.early_estimate(trainer)

    def early_estimate(self, trainer: Trainer) -> None:
        """Once, early: what an epoch and the run cost at the pace of WARM_STEPS steps on batch shapes seen
        before or, if after twice as many steps too few shapes repeated, of every step but the first."""
        positions = trainer.step_positions  # one batch shape per count of positions
        self.steps, self.positions = self.steps + 1, self.positions + positions
        timed = self.warm if positions in self.seen_shapes else self.cold
        if self.steps > 1:
            timed.append((trainer.step_seconds, positions))
        self.seen_shapes.add(positions)
        warm, n_batches = len(self.warm) >= WARM_STEPS, trainer.batches_per_epoch
        if self.estimated or not (warm or self.steps > 2 * WARM_STEPS) or trainer.batch_in_epoch >= n_batches:
            return  # not yet, or the epoch's own line says it now
        steps = self.warm if warm else self.warm + self.cold
        per_position = sum(s for s, _ in steps) / sum(p for _, p in steps)
        epoch = per_position * self.positions / self.steps * n_batches
        whole, epochs = epoch * trainer.config.max_epochs, trainer.config.max_epochs
        how = f"{len(steps)} steps after set-up" if warm else f"{len(steps)} steps, most on new batch shapes (slower)"
        tqdm.write(
            f"a first guess from {how}: about {epoch:.0f} s per epoch, "
            + (f"{whole / 3600:.1f} hours" if whole >= 3600 else f"{whole / 60:.0f} min")
            + f" for {plural(epochs, 'epoch')}"
            + (" (before the time budget's plan)" if self.fit else "")
        )
        self.estimated = True

    def on_epoch_end(self, trainer: Trainer) -> None:
        if not trainer.ran_whole_epoch:
            return
        plan = None
        if self.fit:
            plan = self.fit_to_budget(trainer, float(np.median(trainer.epoch_seconds[-PACE_EPOCHS:])))
        if not self.reported and (plan or trainer.epoch < trainer.config.max_epochs):
            tqdm.write(plan or self.projection(trainer, trainer.epoch_seconds[-1]))
        elif plan:
            tqdm.write(plan)
        self.reported = True

    def on_train_end(self, trainer: Trainer) -> None:
        if self.cut_off:
            where = f"in epoch {trainer.epoch + 1}" if trainer.batch_in_epoch else f"after epoch {trainer.epoch}"
            tqdm.write(
                f"the {self.budget_seconds / 60:g}-minute budget was spent at step {trainer.step}, {where} of "
                f"{trainer.config.max_epochs}; the learning-rate schedule was cut off there"
            )

    def fit_to_budget(self, trainer: Trainer, epoch_seconds: float) -> str | None:
        """Plan the rest of the run at `epoch_seconds` per epoch: as many steps as FIT_SHARE of the budget
        holds (the last epoch perhaps in part), never more epochs than first asked for, with the cosine's
        final_tokens at the last of them. Returns the line to print: the first plan, or one that moved
        by at least a whole epoch; else None."""
        cfg, n_batches, asked = trainer.config, trainer.batches_per_epoch, self.asked_epochs
        tokens_per_epoch = trainer.tokens / trainer.epoch  # every epoch counts the same tokens
        left = max(0.0, self.budget_seconds * FIT_SHARE - trainer.seconds)
        held_steps = trainer.epoch * n_batches + math.floor(left / epoch_seconds * n_batches)
        planned = max(trainer.epoch * n_batches, min(asked * n_batches, held_steps)) / n_batches
        was = cfg.final_tokens / tokens_per_epoch if self.fitted else None
        cfg.max_epochs = math.ceil(planned)
        cfg.final_tokens = round(tokens_per_epoch * planned)
        self.fitted = True
        if was is not None and abs(was - planned) < 1:
            return None
        budget = f"{FIT_SHARE:.0%} of the {self.budget_seconds / 60:g}-minute budget holds {held_steps / n_batches:.1f}"
        most = " (the most asked for)" if held_steps >= asked * n_batches else f" of {asked}"
        line = (
            f"at {epoch_seconds:.1f} s per epoch {budget} epochs: training {planned:.1f}{most}, with the cosine "
            f"ending at their end (about {(planned - trainer.epoch) * epoch_seconds / 60:.0f} min left)"
        )
        if was is None:
            return line
        self.replans += 1
        return f"the pace changed: {line} (planned {was:.1f} before)"

    def projection(self, trainer: Trainer, epoch_seconds: float) -> str:
        """How long the epochs left take at `epoch_seconds` each and, with a budget they do not fit in,
        how many it holds and where the planned schedule then stands."""
        cfg, budget = trainer.config, self.budget_seconds
        left = cfg.max_epochs - trainer.epoch
        line = (
            f"at {epoch_seconds:.1f} s per epoch the {left} epochs left take about {left * epoch_seconds / 60:.0f} min"
        )
        if budget is None or trainer.seconds + left * epoch_seconds <= budget:
            return line
        held = trainer.epoch + (budget - trainer.seconds) / epoch_seconds
        line += f"; the {budget / 60:g}-minute budget holds about {held:.0f} of {cfg.max_epochs}"
        if not cfg.lr_decay:
            return line
        tokens = trainer.tokens / max(1, trainer.epoch) * held  # every epoch counts the same tokens
        progress = min(1.0, (tokens - cfg.warmup_tokens) / max(1, cfg.final_tokens - cfg.warmup_tokens))
        rate = lr_multiplier(tokens, cfg.warmup_tokens, cfg.final_tokens, cfg.cosine_cap)
        return line + f", where the planned cosine is {progress:.0%} done and the rate {rate:.2f} of its peak"


# Another process that holds a core makes a step spread over every core wait for it at each
# synchronisation, so that half the threads then run faster (bench/RESEARCH.md section 7).
TRY_STEPS = 6  # steps timed on the other count when the two are compared
TRY_EVERY = 30.0  # training seconds between tries of the other count; doubled after each try it loses, up to
TRY_EVERY_MAX = 120.0  # ... this, and back to TRY_EVERY as soon as steps take SLOWDOWN times as long as before
SLOWDOWN = 1.3
SWITCH_MARGIN = 1.1  # the other count must be this much faster to be kept: noise does not flip the choice


class ThreadChooser:
    """Keeps torch's CPU thread count at the faster of `threads` and half of it, as measured.

    after_step(seconds, tokens, now) takes each step's duration, its size in tokens and the training
    time so far. Every TRY_EVERY seconds (at once when steps slow down) it trains TRY_STEPS steps on
    the other count and compares each with the latest step of the same size on the current one (batches
    differ in length, so only steps of one size compare); it keeps the other count when the median of
    those ratios says it is faster. Returns the line to print when the choice changes, else None.
    """

    def __init__(self, threads: int):
        self.counts = (threads, max(1, threads // 2))
        self.home = threads  # the count in use between tries
        self.latest: dict[int, float] = {}  # seconds of the latest home step of each size
        self.confirmed: dict[int, float] = {}  # the same when the home count last won a comparison
        self.try_ratios: list[float] = []  # the running try's steps against `latest`
        self.pace_ratios: list[float] = []  # the latest home steps against `confirmed`
        self.tried_steps = 0
        self.interval = TRY_EVERY
        self.next_try = TRY_EVERY
        self.warming = False  # the first step after a change starts the threads: not timed
        self.switches = 0

    def attach(self, trainer: Trainer) -> ThreadChooser:
        """Choose threads after every step of `trainer`; its training ends on the count it started with."""
        started = torch.get_num_threads()

        def after_step(t: Trainer) -> None:
            line = self.after_step(t.step_seconds, t.step_positions, t.seconds)
            t.log("train/threads", torch.get_num_threads(), t.step)
            if line:
                tqdm.write(line)

        trainer.add_callback("on_batch_end", after_step)
        trainer.add_callback("on_train_end", lambda t: torch.set_num_threads(started))
        return self

    def after_step(self, seconds: float, tokens: int, now: float) -> str | None:
        if self.warming:
            self.warming = False
            return None
        if torch.get_num_threads() != self.home:  # a try
            self.tried_steps += 1
            if tokens in self.latest:
                self.try_ratios.append(seconds / self.latest[tokens])
            if len(self.try_ratios) >= TRY_STEPS or self.tried_steps >= 4 * TRY_STEPS:
                return self.decide(float(np.median(self.try_ratios)) if self.try_ratios else 1.0, now)
            return None
        if tokens in self.confirmed:
            self.pace_ratios = [*self.pace_ratios[1 - TRY_STEPS :], seconds / self.confirmed[tokens]]
            if len(self.pace_ratios) == TRY_STEPS and np.median(self.pace_ratios) > SLOWDOWN:
                self.interval, self.next_try = TRY_EVERY, now
        self.latest[tokens] = seconds
        if now >= self.next_try:
            self.try_ratios, self.tried_steps = [], 0
            torch.set_num_threads(self.counts[1] if self.home == self.counts[0] else self.counts[0])
            self.warming = True
        return None

    def decide(self, ratio: float, now: float) -> str | None:
        """After a try whose steps took `ratio` times as long as the home count's: keep the faster count."""
        tried, line = torch.get_num_threads(), None
        if ratio * SWITCH_MARGIN < 1.0:
            line = f"training on {plural(tried, 'thread')} instead of {self.home}: {1 / ratio:.1f}x as fast now"
            self.home, self.latest, self.interval = tried, {}, TRY_EVERY
            self.switches += 1
        else:
            torch.set_num_threads(self.home)
            self.warming, self.interval = True, min(2 * self.interval, TRY_EVERY_MAX)
        self.confirmed, self.pace_ratios = dict(self.latest), []
        self.next_try = now + self.interval
        return line


def attach(trainer: Trainer, budget_seconds: float | None, fit: bool) -> Pace:
    """The pace report, the budget (planned to with `fit`) and, for a planned run on a CPU of several
    threads, the thread choice; returns the Pace."""
    pace, threads = Pace(budget_seconds, fit).attach(trainer), torch.get_num_threads()
    if pace.fit and trainer.device.type == "cpu" and threads > 1:
        pace.threads = ThreadChooser(threads).attach(trainer)
    return pace
