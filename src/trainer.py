"""The training loop. It knows nothing about GPTs: any model whose forward
returns (logits, loss) will do. The dataset batches its (x, y) pairs itself
(`epoch_batches`, see Trainer). The handout's plain loop (a DataLoader, torch's
AdamW, fp32) is in bench/course.py, which the tests and the speed benchmark
compare against."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from tqdm import tqdm

from optim import make_optimizer
from utils import autocast, torch_save_atomic


@dataclass
class TrainerConfig:
    """Optimisation settings; defaults are the handout's TrainerConfig (run.py sets each mode's values)."""

    max_epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    grad_norm_clip: float = 1.0
    weight_decay: float = 0.1
    # "adamw": the handout's AdamW for every parameter; "muon": Muon for the hidden layers' weight
    # matrices, AdamW for the rest (see optim.make_optimizer), both at the same learning rate and decay.
    optimizer: str = "adamw"
    lr_decay: bool = False
    warmup_tokens: float = 375e6
    final_tokens: float = 260e9
    cosine_cap: bool = False  # False: the handout's uncapped cosine; True: stay at the floor after final_tokens
    max_steps: int | None = None  # stop after this many optimizer steps (smoke tests, benchmarks)
    # Wall-clock budget: training stops once it has run this long (summed over resumes).
    budget_seconds: float | None = None
    # With a budget: plan the run to fit it instead of cutting it off. After every whole epoch, the
    # run is planned to as many steps as BUDGET_FIT_SHARE of the budget holds at the pace of the
    # latest epochs (PACE_EPOCHS), its last epoch perhaps in part, at most the max_epochs asked for;
    # final_tokens becomes those steps' tokens and training stops there: a cosine that spans the run
    # (run.py plans only such a schedule) ends annealed as the budget ends, even when other work
    # slows the machine down or stops doing so. On a CPU it also chooses the thread count (ThreadChooser),
    # which changes float rounding: a budgeted run repeats only to rounding, as its plan follows the clock.
    budget_fit: bool = False
    bf16: bool = True  # bf16 autocast where the hardware supports it (and Muon's iteration in bf16 there)
    # How each epoch's examples are batched: "bucketed" (shuffled and grouped by length), "shuffled"
    # or "file" (as the handout's trainer does: the corpus order, the same every epoch).
    order: str = "bucketed"
    # Which parameters weight decay shrinks: "matmul" (the weights of nn.Linear layers, see
    # make_optimizer) or "all_but_biases" (the handout's trainer: it exempts biases and any name
    # containing "LayerNorm.weight", which no name here contains, so embeddings, the position
    # table, LayerNorm gains and the perceiver's basis all decay).
    decay: str = "matmul"
    seed: int = 0
    ckpt_path: str | None = None  # full checkpoint for --resume, written atomically
    ckpt_every: int = 100  # optimizer steps between checkpoints (0: only at the end)


# budget_fit plans the steps into this share of the budget: the last epochs can run a little
# slower than the ones that set the pace, and what still runs past the budget is cut off.
BUDGET_FIT_SHARE = 0.97
EARLY_STEPS = 5  # steps timed for the first estimate of a run's cost (Trainer.early_estimate)
# ... at the pace of the median of this many latest whole epochs: one slow epoch (a checkpoint, a
# burst of other work) does not shrink the plan, a lasting change of pace moves it within two.
PACE_EPOCHS = 3


def lr_multiplier(tokens: float, warmup_tokens: float, final_tokens: float, cap: bool = False) -> float:
    """Linear warm-up, then cosine decay to a floor of 0.1.

    With cap=False this is the handout's schedule: the cosine is not stopped at
    final_tokens, so the rate climbs back to the peak at 2 * final_tokens (around
    epoch 400 of the handout's 650) and falls again. cap=True holds the floor.
    """
    if tokens < warmup_tokens:
        return tokens / max(1, warmup_tokens)
    progress = (tokens - warmup_tokens) / max(1, final_tokens - warmup_tokens)
    if cap:
        progress = min(progress, 1.0)
    return max(0.1, 0.5 * (1.0 + math.cos(math.pi * progress)))


class TrainingInterrupted(Exception):
    """Raised after SIGINT/SIGTERM once a checkpoint has been written; carries its path."""


class Trainer:
    """Trains `model` on `train_dataset` with `config`.

    The dataset yields (x, y) pairs of length `example_length` and batches
    them itself: `epoch_batches(batch_size, rng, order)`. `log(name, value,
    step)` receives scalars (e.g. a TensorBoard writer's add_scalar).

    With `config.ckpt_path` a full checkpoint (model, optimizer, schedule
    position, epoch and batch, RNG states, `extra`) is written atomically every
    `ckpt_every` steps and at the end; `resume(path)` continues from one, so an
    interrupted run ends with the same parameters as an uninterrupted one.
    Under torchrun (torch.distributed initialised) the model is wrapped in
    DistributedDataParallel and each rank trains on its share of every global
    batch (rows rank, rank + world, ...): the effective batch stays batch_size.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        train_dataset: Dataset,
        config: TrainerConfig,
        device: torch.device,
        log: Callable[[str, float, int], None] | None = None,
        extra: dict | None = None,
    ):
        self.model = model.to(device)
        self.train_dataset = train_dataset
        self.config = config
        self.device = device
        self.log = log or (lambda name, value, step: None)
        self.extra = extra or {}  # saved in checkpoints (e.g. the command line and vocabulary)
        self.optimizer = make_optimizer(model, config)
        self.tokens = 0  # counted as the handout does: every position of every example, PAD included
        self.step = 0
        self.epoch = 0  # epoch in progress
        self.batch_in_epoch = 0  # batches of that epoch already trained
        self.losses: list[float] = []
        self.seconds = 0.0  # time spent training, summed over resumed runs (what budget_seconds limits)
        self.clock = time.monotonic  # tests replace it
        self.stop_requested = False  # set by a signal handler; checked after every step
        self.fitted = False  # budget_fit: whether max_epochs and final_tokens were planned to the budget yet
        self.asked_epochs = config.max_epochs  # budget_fit plans at most this many
        self.first_step_seconds: float | None = None  # training time after step 1 (early_estimate)
        self.epoch_seconds: list[float] = []  # training time of each epoch run whole
        self.rank, self.world_size = 0, 1
        self.forward_model = self.model
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            ids = [device.index] if device.type == "cuda" else None
            self.forward_model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        threads = torch.get_num_threads()
        fit = config.budget_fit and device.type == "cpu" and threads > 1 and self.world_size == 1
        self.threads = ThreadChooser(threads) if fit else None

    # -- data ---------------------------------------------------------------

    def batches(self, epoch: int, skip: int = 0) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """The global batches of `epoch`, after the first `skip`; the same for every rank and on every run."""
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, epoch])
        return itertools.islice(self.train_dataset.epoch_batches(cfg.batch_size, rng, cfg.order), skip, None)

    # -- checkpoints ----------------------------------------------------------

    def checkpoint(self) -> dict:
        """Everything needed to continue this run exactly (tensors and plain types only)."""
        np_state = np.random.get_state()
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "losses": self.losses,
            "rng": {
                "python": random.getstate(),
                "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
            "config": asdict(self.config),
            "fitted": self.fitted,
            "asked_epochs": self.asked_epochs,
            "epoch_seconds": self.epoch_seconds,
            "extra": self.extra,
        }

    def save_checkpoint(self) -> float:
        """Write the checkpoint (rank 0 only); returns the seconds it took."""
        if self.config.ckpt_path is None or self.rank != 0:
            return 0.0
        t0 = time.time()
        torch_save_atomic(self.checkpoint(), self.config.ckpt_path)
        seconds = time.time() - t0
        self.log("train/checkpoint_seconds", seconds, self.step)
        return seconds

    def resume(self, ckpt: dict) -> None:
        """Continue from a checkpoint dict (see `checkpoint`), e.g. from utils.torch_load_safe."""
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.step, self.epoch, self.batch_in_epoch = ckpt["step"], ckpt["epoch"], ckpt["batch_in_epoch"]
        self.tokens, self.losses = ckpt["tokens"], list(ckpt["losses"])
        self.seconds = ckpt.get("seconds", 0.0)  # absent from checkpoints written before budgets existed
        if self.config.budget_fit and ckpt.get("fitted"):  # the plan as it stood, re-planned from the next epoch
            self.asked_epochs = ckpt.get("asked_epochs", self.config.max_epochs)
            self.config.max_epochs = ckpt["config"]["max_epochs"]
            self.config.final_tokens = ckpt["config"]["final_tokens"]
            self.fitted = True
        self.epoch_seconds = list(ckpt.get("epoch_seconds", []))
        rng = ckpt["rng"]
        random.setstate((rng["python"][0], tuple(rng["python"][1]), rng["python"][2]))
        np.random.set_state((rng["numpy"][0], rng["numpy"][1].numpy().astype(np.uint32), *rng["numpy"][2:]))
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    # -- the loop -------------------------------------------------------------

    def train(self) -> list[float]:
        """Run the configured epochs (or max_steps); returns the loss of every step.

        Raises TrainingInterrupted, after writing a checkpoint, if stop_requested is set.
        """
        self.forward_model.train()
        n_batches = math.ceil(len(self.train_dataset) / self.config.batch_size)
        self.last_tick = self.clock()
        projected = False  # the time projection is printed once, after this process's first whole epoch
        threads = torch.get_num_threads()
        try:
            while self.epoch < self.config.max_epochs and not self.finished():
                t0, seconds_at_start, whole_epoch = time.time(), self.seconds, self.batch_in_epoch == 0
                desc = f"epoch {self.epoch + 1}/{self.config.max_epochs}"
                self.train_epoch(desc, n_batches)
                ran_whole = whole_epoch and self.batch_in_epoch == 0
                trained = self.seconds - seconds_at_start
                projected = self.end_epoch(desc, time.time() - t0, trained, ran_whole, projected)
        finally:
            torch.set_num_threads(threads)  # the ThreadChooser's choice ends with the training
        self.save_checkpoint()
        return self.losses

    def train_epoch(self, desc: str, n_batches: int) -> None:
        """Train the current epoch from batch `batch_in_epoch` to its end, or until finished()."""
        batches = self.batches(self.epoch, skip=self.batch_in_epoch)
        quiet = self.rank != 0
        bar = tqdm(batches, total=n_batches, initial=self.batch_in_epoch, desc=desc, leave=False, disable=quiet)
        for x, y in bar:
            if x.size(0) < self.world_size:
                continue  # a last batch too small to give every rank a row: skipped by all ranks alike
            loss = self.optimize(x, y)
            self.step += 1
            self.batch_in_epoch += 1
            step_seconds = self.tick()
            if self.threads is not None:
                line = self.threads.after_step(step_seconds, x.numel(), self.seconds)
                self.log("train/threads", torch.get_num_threads(), self.step)
                if line and not quiet:
                    tqdm.write(line)
            lr = self.schedule(x.size(0) * (getattr(self.train_dataset, "example_length", None) or y.size(1)))
            self.losses.append(self.mean_over_ranks(loss))
            if not quiet:
                self.log("train/loss", self.losses[-1], self.step)
                self.log("train/lr", lr, self.step)
                self.log("train/tokens_seen", self.tokens, self.step)
                bar.set_postfix(loss=f"{self.losses[-1]:.4f}", lr=f"{lr:.2e}")
                self.early_estimate(n_batches)
            self.checkpoint_if_due()
            if self.finished() and self.batch_in_epoch < n_batches:
                return  # stopped inside the epoch; one finished by its last step counts whole
        self.epoch += 1
        self.batch_in_epoch = 0

    def optimize(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step on this rank's rows of the global batch x, y (B, T); returns the loss."""
        x = x[self.rank :: self.world_size].to(self.device)
        y = y[self.rank :: self.world_size].to(self.device)
        with autocast(self.device, self.config.bf16):
            _, loss = self.forward_model(x, y)
        self.forward_model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.forward_model.parameters(), self.config.grad_norm_clip)
        self.optimizer.step()
        return loss

    def tick(self) -> float:
        """Add the time since the last tick to `seconds` (on every rank the slowest rank's, under a budget);
        returns this rank's time since the last tick."""
        now = self.clock()
        elapsed, self.last_tick = now - self.last_tick, now
        self.seconds += elapsed
        if self.config.budget_seconds is not None and self.world_size > 1:
            self.seconds = self.slowest_rank_seconds()  # every rank must stop at the same step
        return elapsed

    def schedule(self, tokens: int) -> float:
        """Count the step's `tokens` and set the learning rate they lead to; returns it."""
        cfg = self.config
        if not cfg.lr_decay:
            return cfg.learning_rate
        # As in the handout, the rate is updated after the step from the tokens seen so far.
        self.tokens += tokens
        lr = cfg.learning_rate * lr_multiplier(self.tokens, cfg.warmup_tokens, cfg.final_tokens, cfg.cosine_cap)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def mean_over_ranks(self, loss: torch.Tensor) -> float:
        """The loss of the whole global batch: the mean of every rank's."""
        if self.world_size > 1:
            loss = loss.detach().clone()
            dist.all_reduce(loss)  # a sum (gloo has no average)
            loss /= self.world_size
        return loss.item()

    def checkpoint_if_due(self) -> None:
        """Write a checkpoint every ckpt_every steps; after a stop request, write one and raise TrainingInterrupted."""
        if self.stop_requested:
            self.save_checkpoint()
            raise TrainingInterrupted(self.config.ckpt_path)
        if self.config.ckpt_every and self.step % self.config.ckpt_every == 0:
            self.save_checkpoint()

    def end_epoch(self, desc: str, seconds: float, trained: float, ran_whole: bool, projected: bool) -> bool:
        """After an epoch (or its part) that took `seconds`, `trained` of them training: re-plan to the
        budget after a whole one and report; returns whether the time projection has been printed."""
        cfg = self.config
        plan = None
        if ran_whole:
            self.epoch_seconds.append(trained)  # the same on every rank: shared seconds
        if ran_whole and cfg.budget_fit and cfg.budget_seconds is not None:
            n_batches = math.ceil(len(self.train_dataset) / cfg.batch_size)
            plan = self.fit_to_budget(float(np.median(self.epoch_seconds[-PACE_EPOCHS:])), n_batches)
        if self.rank != 0 or not self.losses:
            return projected
        self.log("train/epoch_seconds", seconds, self.epoch)
        tqdm.write(f"{desc}: loss {self.losses[-1]:.4f}, {seconds:.1f} s")
        if ran_whole and not projected:
            if plan or self.epoch < cfg.max_epochs:  # nothing to project after the last epoch
                tqdm.write(plan or self.projection(trained))
            return True
        if plan:
            tqdm.write(plan)
        return projected

    def fit_to_budget(self, epoch_seconds: float, n_batches: int) -> str | None:
        """Plan the rest of the run at `epoch_seconds` per epoch of `n_batches` steps: as many steps as
        BUDGET_FIT_SHARE of the budget holds (the last epoch perhaps in part), never more epochs than
        first asked for (see TrainerConfig.budget_fit), with the cosine's final_tokens at the last of them
        (finished() stops there). Returns the line that says so when the planned epochs change, else None."""
        cfg = self.config
        asked = self.asked_epochs
        tokens_per_epoch = self.tokens / self.epoch  # every epoch counts the same tokens
        left = max(0.0, cfg.budget_seconds * BUDGET_FIT_SHARE - self.seconds)
        held_steps = self.epoch * n_batches + math.floor(left / epoch_seconds * n_batches)
        planned = max(self.epoch * n_batches, min(asked * n_batches, held_steps)) / n_batches
        was = cfg.final_tokens / tokens_per_epoch if self.fitted else None
        cfg.max_epochs = math.ceil(planned)
        cfg.final_tokens = round(tokens_per_epoch * planned)
        self.fitted = True
        if was is not None and round(was, 1) == round(planned, 1):
            return None
        held = f"{held_steps / n_batches:.1f}"
        budget = f"{BUDGET_FIT_SHARE:.0%} of the {cfg.budget_seconds / 60:g}-minute budget holds {held} epochs"
        plan = f"training {planned:.1f}" + (
            " (the most asked for)" if held_steps >= asked * n_batches else f" of {asked}"
        )
        line = (
            f"at {epoch_seconds:.1f} s per epoch {budget}: {plan}, with the cosine ending at their end "
            f"(about {(planned - self.epoch) * epoch_seconds / 60:.0f} min left)"
        )
        return line if was is None else f"the pace changed: {line} (planned {was:.1f} before)"

    def early_estimate(self, n_batches: int) -> None:
        """After the first EARLY_STEPS steps of a fresh run, say what the whole run will cost at their pace,
        long before a long first epoch ends (the first step, which warms up, is not counted)."""
        if self.step == 1:
            self.first_step_seconds = self.seconds
        if self.step != 1 + EARLY_STEPS or n_batches <= 1 + EARLY_STEPS or self.first_step_seconds is None:
            return
        step_seconds = (self.seconds - self.first_step_seconds) / EARLY_STEPS
        total = step_seconds * n_batches * self.config.max_epochs
        whole = f"{total / 3600:.1f} hours" if total >= 3600 else f"{total / 60:.0f} min"
        tqdm.write(
            f"the first steps take {step_seconds:.2f} s each: about {step_seconds * n_batches:.0f} s per epoch, "
            f"{whole} for {self.config.max_epochs} epoch{'s' if self.config.max_epochs != 1 else ''}"
            + (" (before the time budget's plan)" if self.config.budget_fit else "")
        )

    def projection(self, epoch_seconds: float) -> str:
        """One line on how long the planned epochs will take at `epoch_seconds` per epoch and, with a
        time budget they do not fit in, how many it holds and where the planned schedule then stands."""
        cfg = self.config
        left = cfg.max_epochs - self.epoch
        line = (
            f"at {epoch_seconds:.1f} s per epoch the {left} epochs left take about {left * epoch_seconds / 60:.0f} min"
        )
        if cfg.budget_seconds is None or self.seconds + left * epoch_seconds <= cfg.budget_seconds:
            return line
        held = self.epoch + (cfg.budget_seconds - self.seconds) / epoch_seconds
        line += f"; the {cfg.budget_seconds / 60:g}-minute budget holds about {held:.0f} of {cfg.max_epochs}"
        if not cfg.lr_decay:
            return line
        tokens = self.tokens / max(1, self.epoch) * held  # every epoch counts the same tokens
        progress = min(1.0, (tokens - cfg.warmup_tokens) / max(1, cfg.final_tokens - cfg.warmup_tokens))
        rate = lr_multiplier(tokens, cfg.warmup_tokens, cfg.final_tokens, cfg.cosine_cap)
        line += f", where the planned cosine is {progress:.0%} done and the rate {rate:.2f} of its peak"
        return line

    def slowest_rank_seconds(self) -> float:
        """The largest training time over all ranks (torch.distributed)."""
        seconds = torch.tensor([self.seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return float(seconds.item())

    def finished(self) -> bool:
        """True once max_steps steps are done or the time budget is spent."""
        cfg = self.config
        if cfg.budget_seconds is not None and self.seconds >= cfg.budget_seconds:
            return True
        if cfg.budget_fit and self.fitted and cfg.lr_decay and self.tokens >= cfg.final_tokens:
            return True  # the planned steps are done (the last epoch may end early)
        return cfg.max_steps is not None and self.step >= cfg.max_steps


# Under a time budget on a CPU the trainer also chooses torch's thread count, by measuring. Another
# process that holds a core makes a step spread over every core wait for it at each synchronisation,
# so that half the threads then run faster (bench/RESEARCH.md section 7).
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
            threads = f"{tried} thread{'s' if tried > 1 else ''}"
            line = f"training on {threads} instead of {self.home}: {1 / ratio:.1f}x as fast now"
            self.home, self.latest, self.interval = tried, {}, TRY_EVERY
        else:
            torch.set_num_threads(self.home)
            self.warming, self.interval = True, min(2 * self.interval, TRY_EVERY_MAX)
        self.confirmed, self.pace_ratios = dict(self.latest), []
        self.next_try = now + self.interval
        return line
