"""The training loop, in minGPT's shape: the model's forward returns (logits, loss) and the dataset batches itself.
Time budgets attach as callbacks (budget.py) that steer the TrainState. The handout's loop is in bench/course.py."""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from dataset import micro_batches
from machine import autocast, compiled, on_device
from optim import make_optimizer
from utils import TrainingInterrupted, epoch_line_due, rng_states, set_rng_states, torch_save_atomic

LOSS_EVERY = 16  # steps between reads of the losses from the device: a read waits for the step to finish


@dataclass
class TrainerConfig:
    """Optimisation settings, filled in by run.py's train; the defaults are the handout's."""

    max_epochs: int
    batch_size: int
    learning_rate: float
    betas: tuple[float, float] = (0.9, 0.95)
    grad_norm_clip: float = 1.0
    weight_decay: float = 0.1
    optimizer: str = "adamw"  # or "muon" (optim.make_optimizer)
    decay: str = "matmul"  # nn.Linear weights, or the handout's "all_but_biases"
    warmup_tokens: float = 512 * 20
    final_tokens: float = 260e9  # where the cosine ends
    cosine_cap: bool = False  # see learning_rate
    max_steps: int | None = None  # for smoke tests and benchmarks
    precision: str = "fp32"  # or "bf16" (machine.choose decides)
    order: str = "bucketed"  # one of dataset.ORDERS
    seed: int = 0
    ckpt_path: str | None = None  # the checkpoint that --resume reads
    ckpt_every: int = 100  # steps between checkpoints (0: only at the end)
    micro_batch: int = 0  # rows per micro-batch (0: the whole batch)
    compile: bool = False  # see batches and machine.compiled


@dataclass
class TrainState:
    """Where a run stands: a callback may set `stop` (after this step); a time budget's plan moves `max_epochs` and
    `final_tokens` and sets `planned`."""

    max_epochs: int
    final_tokens: float
    batches_per_epoch: int
    lr: float
    step: int = 0
    epoch: int = 0  # epochs done
    batch_in_epoch: int = 0  # batches of the current epoch done
    tokens: int = 0  # as the handout counts them: PAD included
    seconds: float = 0.0  # training time, summed over resumed runs
    step_seconds: float = 0.0  # the latest step's time ...
    step_positions: int = 0  # ... and positions computed
    epoch_seconds: list[float] = field(default_factory=list)  # training time of each epoch run whole
    losses: list[float] = field(default_factory=list)
    whole_epoch: bool = False  # the epoch that just ended ran whole in this process
    planned: bool = False
    stop: bool = False


def learning_rate(config: TrainerConfig, s: TrainState) -> float:
    """The rate after s.tokens tokens (nanoGPT's get_lr in the handout's units): a linear warm-up, then a cosine down
    to a tenth of the peak at s.final_tokens, where config.cosine_cap holds it; the handout's goes on, back to the
    peak at twice final_tokens (about epoch 400 of its 650)."""
    if s.tokens < config.warmup_tokens:
        return config.learning_rate * s.tokens / max(1, config.warmup_tokens)
    progress = (s.tokens - config.warmup_tokens) / max(1, s.final_tokens - config.warmup_tokens)
    progress = min(progress, 1.0) if config.cosine_cap else progress
    return config.learning_rate * max(0.1, 0.5 * (1.0 + math.cos(math.pi * progress)))


class Trainer:
    """Trains `model` on a dataset.BatchedDataset (epoch_batches, example_length). `log(name, value, step)` takes
    scalars. Callbacks get the TrainState at "on_batch_end", "on_epoch_end" (also after a partial last epoch) and
    "on_train_end"."""

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
        self.train_dataset, self.config, self.device = train_dataset, config, device
        self.log = log or (lambda name, value, step: None)
        self.extra = extra or {}  # e.g. the resolved settings and vocabulary
        settings = ("optimizer", "decay", "learning_rate", "weight_decay", "betas", "precision")
        self.optimizer = make_optimizer(model, **{name: getattr(config, name) for name in settings})
        self.callbacks: dict[str, list[Callable[[TrainState], None]]] = defaultdict(list)
        batches = math.ceil(len(train_dataset) / config.batch_size)
        self.state = TrainState(config.max_epochs, config.final_tokens, batches, config.learning_rate)
        self.clock = time.monotonic  # tests replace it
        self.stop_requested = False  # set by a signal handler
        self.pending: list[torch.Tensor] = []  # losses not yet read from the device
        self.step_model = compiled(self.model, device) if config.compile else self.model

    def add_callback(self, event: str, callback: Callable[[TrainState], None]) -> None:
        """Run callback(state) at `event`."""
        self.callbacks[event].append(callback)

    def trigger_callbacks(self, event: str) -> None:
        for callback in self.callbacks[event]:
            callback(self.state)

    def train(self) -> list[float]:
        """Every step's loss; raises TrainingInterrupted once stop_requested is set."""
        s = self.state
        self.model.train()
        bar = tqdm(total=self.planned_steps(), initial=s.step, desc="training", unit="step", leave=False)
        tick = self.clock()
        try:
            while s.epoch < s.max_epochs and not self.finished():
                started, whole, n = s.seconds, s.batch_in_epoch == 0, s.batches_per_epoch
                for x, y in self.batches(s.epoch, skip=s.batch_in_epoch):
                    self.pending.append(self.optimize(x, y))
                    now = self.clock()
                    s.step, s.batch_in_epoch, s.step_seconds, tick = s.step + 1, s.batch_in_epoch + 1, now - tick, now
                    s.seconds += s.step_seconds
                    s.tokens += x.size(0) * self.train_dataset.example_length
                    s.lr = learning_rate(self.config, s)  # after the step, as the handout sets it
                    for group in self.optimizer.param_groups:
                        group["lr"] = s.lr
                    self.log("train/lr", s.lr, s.step)
                    self.log("train/tokens_seen", s.tokens, s.step)
                    if s.step % LOSS_EVERY == 0:
                        self.read_losses()
                    self.trigger_callbacks("on_batch_end")
                    bar.total = self.planned_steps()
                    bar.update()
                    self.checkpoint_if_due()
                    if self.finished() and s.batch_in_epoch < n:
                        break  # stopped inside the epoch; one finished by its last step counts whole
                else:
                    s.epoch, s.batch_in_epoch = s.epoch + 1, 0
                self.read_losses()
                s.whole_epoch, took = whole and s.batch_in_epoch == 0, s.seconds - started
                if s.whole_epoch:
                    s.epoch_seconds.append(took)
                bar.set_postfix(loss=f"{s.losses[-1]:.4f}" if s.losses else "-", lr=f"{s.lr:.2e}")
                epoch = s.epoch + (s.batch_in_epoch > 0)
                if s.losses and (self.finished() or epoch_line_due(epoch, s.max_epochs)):
                    tqdm.write(
                        f"epoch {epoch}/{s.max_epochs}: loss {s.losses[-1]:.4f}, {took:.1f} s, {s.seconds:.0f} s in all"
                    )
                self.log("train/epoch_seconds", took, s.epoch)
                self.trigger_callbacks("on_epoch_end")
        finally:
            bar.close()
            self.trigger_callbacks("on_train_end")
        self.save_checkpoint()
        return s.losses

    def planned_steps(self) -> int:
        """The run's steps as planned now."""
        return min(self.state.max_epochs * self.state.batches_per_epoch, self.config.max_steps or math.inf)

    def read_losses(self) -> None:
        """Move the unread losses to the state and the log; a non-finite one raises FloatingPointError."""
        values = torch.stack(self.pending).float().tolist() if self.pending else []
        self.pending.clear()
        for step, value in enumerate(values, start=self.state.step - len(values) + 1):
            if not math.isfinite(value):  # later steps would be NaN too: stop before saving
                raise FloatingPointError(f"the loss became {value} at step {step}")
            self.state.losses.append(value)
            self.log("train/loss", value, step)

    def batches(self, epoch: int, skip: int = 0) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of `epoch` after the first `skip`, the same on every run (compiled: all full width)."""
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, epoch])
        epoch_batches = self.train_dataset.epoch_batches(cfg.batch_size, rng, cfg.order, crop=not cfg.compile)
        batches = itertools.islice(epoch_batches, skip, None)
        return batches if self.device.type == "cpu" else on_device(list(batches), self.device)

    def optimize(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimizer step on x, y (B, T); returns the loss, still on the device. Weighted by their shares of the
        targets, the micro-batches' gradients sum to the whole batch's."""
        x, y = x.to(self.device), y.to(self.device)
        self.model.zero_grad(set_to_none=True)
        losses, self.state.step_positions = [], 0
        size = 0 if self.config.compile else self.config.micro_batch  # compiled: one shape, the whole batch
        for xs, ys, share in micro_batches(x, y, size):
            with autocast(self.device, self.config.precision):
                _, part = self.step_model(xs, ys)
            (part * share).backward()
            losses.append(part.detach() * share)
            self.state.step_positions += xs.numel()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
        self.optimizer.step()
        return torch.stack(losses).sum()

    def finished(self) -> bool:
        """True once a callback has stopped the run or max_steps steps are done."""
        return self.state.stop or (self.config.max_steps is not None and self.state.step >= self.config.max_steps)

    def checkpoint(self) -> dict:
        """All that continues this run exactly, as tensors and plain types."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "state": asdict(self.state),
            "rng": rng_states(),
            "extra": self.extra,
        }

    def save_checkpoint(self) -> None:
        """Write the checkpoint atomically."""
        self.read_losses()
        if self.config.ckpt_path is not None:
            torch_save_atomic(self.checkpoint(), self.config.ckpt_path, sealed=True)

    def checkpoint_if_due(self) -> None:
        """A checkpoint every ckpt_every steps; after a stop request, one, then TrainingInterrupted."""
        if self.stop_requested:
            self.save_checkpoint()
            raise TrainingInterrupted(self.config.ckpt_path)
        if self.config.ckpt_every and self.state.step % self.config.ckpt_every == 0:
            self.save_checkpoint()

    def resume(self, ckpt: dict) -> None:
        """Continue from a `checkpoint` dict; a ValueError if it does not fit this run (data from outside)."""
        try:
            state = TrainState(**{**ckpt["state"], "stop": False, "whole_epoch": False})
            batches = self.state.batches_per_epoch
            where = (type(state.step), state.batches_per_epoch, state.step - state.epoch * batches)
            fits = 0 <= state.batch_in_epoch < batches and 0 <= state.epoch <= state.max_epochs
            if where != (int, batches, state.batch_in_epoch) or not fits:
                raise ValueError(f"step {state.step} is not a step of this run's epochs of {batches} batches")
            self.model.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            set_rng_states(ckpt["rng"])
        except (KeyError, TypeError, IndexError, RuntimeError, AttributeError) as e:
            raise ValueError(f"{type(e).__name__}: {e}".splitlines()[0]) from None
        self.state = state
