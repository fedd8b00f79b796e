"""The training loop. It knows nothing about GPTs: any model whose forward
returns (logits, loss) and any dataset of (x, y) pairs will do."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from utils import autocast


@dataclass
class TrainerConfig:
    """Optimisation settings; defaults are the handout's TrainerConfig (run.py sets each mode's values)."""

    max_epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    grad_norm_clip: float = 1.0
    weight_decay: float = 0.1
    lr_decay: bool = False
    warmup_tokens: float = 375e6
    final_tokens: float = 260e9
    cosine_cap: bool = False  # False: the handout's uncapped cosine; True: stay at the floor after final_tokens
    num_workers: int = 0
    max_steps: int | None = None  # stop after this many optimizer steps (smoke tests, benchmarks)
    impl: str = "fast"  # "fast": vectorised, length-bucketed batches + bf16; "reference": the handout's loop
    bf16: bool = True  # bf16 autocast on the fast path where the hardware supports it
    seed: int = 0


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


def make_optimizer(model: torch.nn.Module, config: TrainerConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matmul weights only.

    The rule: the weight of every nn.Linear decays; biases, LayerNorm parameters,
    the token embedding table, the position table and the perceiver's learned
    basis do not (they are looked up or added, not multiplied, so shrinking them
    towards zero is not a useful prior).
    """
    decay = {f"{mn}.weight" if mn else "weight" for mn, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    params = dict(model.named_parameters())
    groups = [
        {"params": [p for n, p in params.items() if n in decay], "weight_decay": config.weight_decay},
        {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=config.betas)


class Trainer:
    """Trains `model` on `train_dataset` with `config`.

    The dataset yields (x, y) pairs of length `example_length`; on the fast
    path it also provides `epoch_batches(batch_size, rng)`. `log(name, value,
    step)` receives scalars (e.g. a TensorBoard writer's add_scalar).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        train_dataset: Dataset,
        config: TrainerConfig,
        device: torch.device,
        log: Callable[[str, float, int], None] | None = None,
    ):
        self.model = model.to(device)
        self.train_dataset = train_dataset
        self.config = config
        self.device = device
        self.log = log or (lambda name, value, step: None)
        self.optimizer = make_optimizer(model, config)
        self.tokens = 0  # counted as the handout does: every position of every example, PAD included
        self.step = 0
        self.losses: list[float] = []

    def batches(self, epoch: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.config
        if cfg.impl == "reference":
            g = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
            return DataLoader(
                self.train_dataset,
                batch_size=cfg.batch_size,
                shuffle=True,
                generator=g,
                num_workers=cfg.num_workers,
            )
        rng = np.random.default_rng([cfg.seed, epoch])
        return self.train_dataset.epoch_batches(cfg.batch_size, rng)

    def train(self) -> list[float]:
        """Run the configured epochs (or max_steps); returns the loss of every step."""
        model, cfg = self.model, self.config
        model.train()
        use_bf16 = cfg.impl == "fast" and cfg.bf16
        example_length = getattr(self.train_dataset, "example_length", None)
        n_batches = math.ceil(len(self.train_dataset) / cfg.batch_size)
        for epoch in range(cfg.max_epochs):
            t0 = time.time()
            bar = tqdm(self.batches(epoch), total=n_batches, desc=f"epoch {epoch + 1}/{cfg.max_epochs}", leave=False)
            for x, y in bar:
                x, y = x.to(self.device), y.to(self.device)
                with autocast(self.device, use_bf16):
                    _, loss = model(x, y)
                model.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_norm_clip)
                self.optimizer.step()
                self.step += 1
                lr = cfg.learning_rate
                if cfg.lr_decay:
                    # As in the handout, the rate is updated after the step from the tokens seen so far.
                    self.tokens += x.size(0) * (example_length or y.size(1))
                    lr = cfg.learning_rate * lr_multiplier(
                        self.tokens, cfg.warmup_tokens, cfg.final_tokens, cfg.cosine_cap
                    )
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                self.losses.append(loss.item())
                self.log("train/loss", self.losses[-1], self.step)
                self.log("train/lr", lr, self.step)
                self.log("train/tokens_seen", self.tokens, self.step)
                bar.set_postfix(loss=f"{self.losses[-1]:.4f}", lr=f"{lr:.2e}")
                if cfg.max_steps is not None and self.step >= cfg.max_steps:
                    break
            seconds = time.time() - t0
            self.log("train/epoch_seconds", seconds, epoch + 1)
            if self.losses:
                tqdm.write(f"epoch {epoch + 1}/{cfg.max_epochs}: loss {self.losses[-1]:.4f}, {seconds:.1f} s")
            if cfg.max_steps is not None and self.step >= cfg.max_steps:
                break
        return self.losses
