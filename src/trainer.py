"""The training loop. It knows nothing about GPTs: any model whose forward
returns (logits, loss) and any dataset of (x, y) pairs will do."""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from utils import autocast, bf16_supported, torch_save_atomic


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
    # matrices, AdamW for the rest (see make_optimizer), both at the same learning rate and decay.
    optimizer: str = "adamw"
    lr_decay: bool = False
    warmup_tokens: float = 375e6
    final_tokens: float = 260e9
    cosine_cap: bool = False  # False: the handout's uncapped cosine; True: stay at the floor after final_tokens
    num_workers: int = 0
    max_steps: int | None = None  # stop after this many optimizer steps (smoke tests, benchmarks)
    # Wall-clock budget: training stops once it has run this long (summed over resumes). The
    # schedule is not changed: compressing the cosine to end at the budget measured ~9 points worse
    # than cutting the planned cosine off (README, "A time budget").
    budget_seconds: float | None = None
    # With a budget: over the last `budget_cooldown` fraction of it the rate is scaled down linearly
    # to the floor, so a machine too slow for the planned epochs still ends its schedule annealed
    # (0: the planned schedule is simply cut off). A run that finishes its planned schedule before
    # the cool-down would begin is not changed.
    budget_cooldown: float = 0.0
    # With a budget: plan the run to fit it instead of cutting it off. After the first whole epoch,
    # max_epochs becomes the epochs that BUDGET_FIT_SHARE of the budget holds at that epoch's pace,
    # more or fewer than planned, and final_tokens those epochs' tokens: a cosine that spans the
    # run (run.py allows this only with such a schedule) ends annealed inside the budget.
    budget_fit: bool = False
    # With budget_fit: plan again after every whole epoch, at the median pace of the last
    # REPLAN_EPOCHS epochs, into what is left of the budget less one epoch's time, so a machine
    # that slows down (or speeds up) mid-run still ends its cosine annealed inside the budget.
    budget_replan: bool = False
    impl: str = "fast"  # "fast": vectorised, length-bucketed batches + bf16; "reference": the handout's loop
    bf16: bool = True  # bf16 autocast on the fast path where the hardware supports it
    compile: bool = False  # torch.compile the forward pass (fast path; see README for when it pays)
    # Fast path: weight each batch's mean loss by its share of the targets, so a
    # bucketed batch of short examples steps as little as its tokens deserve (as
    # in the handout's mixed-length batches); False gives every batch equal weight.
    token_weighted: bool = False
    # How each epoch's examples are batched: "bucketed" (the fast path's: shuffled and grouped by
    # length), "shuffled" or "file" (the handout's trainer: the corpus order, the same every epoch).
    order: str = "bucketed"
    # Which parameters weight decay shrinks: "matmul" (the weights of nn.Linear layers, see
    # make_optimizer) or "all_but_biases" (the handout's trainer: it exempts biases and any name
    # containing "LayerNorm.weight", which no name here contains, so embeddings, the position
    # table, LayerNorm gains and the perceiver's basis all decay).
    decay: str = "matmul"
    seed: int = 0
    ckpt_path: str | None = None  # full checkpoint for --resume, written atomically
    ckpt_every: int = 100  # optimizer steps between checkpoints (0: only at the end)


# --budget_fit plans the epochs into this share of the budget: a first epoch ran 3-7% faster than
# a whole run's mean on session 26's Zen 3 (61.0-63.4 s against 65.7 s), and what still runs
# past the budget is cut off.
BUDGET_FIT_SHARE = 0.92
# --budget_replan's pace: the median over this many last epochs, so one slow epoch (another
# program on the machine for a minute) does not shorten the plan, but a lasting slowdown does.
REPLAN_EPOCHS = 3


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


def cooldown_multiplier(seconds: float, budget_seconds: float | None, fraction: float) -> float:
    """1 until the last `fraction` of the budget, then falling linearly to 0 when it is spent."""
    if budget_seconds is None or fraction <= 0:
        return 1.0
    return min(1.0, max(0.0, (budget_seconds - seconds) / (fraction * budget_seconds)))


def orthogonalize(matrix: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A cheap approximation of U Vᵀ for a 2-D matrix = U S Vᵀ: the same singular vectors, every
    singular value pushed into roughly 0.7–1.2 by a quintic Newton–Schulz iteration computed in
    `dtype`. Returns a tensor of matrix's shape and dtype."""
    # Jordan's coefficients (2024): the steepest slope at zero for which five steps still land near 1.
    a, b, c = 3.4445, -4.7750, 2.0315
    x = matrix.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:  # iterate on the short side's Gram matrix, the cheaper one
        x = x.T
    x = x / (x.norm() + 1e-7)  # the Frobenius norm bounds the largest singular value: all now <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(matrix.dtype)


def orthogonalize_spectral(matrix: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """`orthogonalize(matrix, steps)` computed from one eigendecomposition instead of `steps` rounds
    of matmuls (fp32; for CPUs without native bf16). Returns a tensor of matrix's shape and dtype.

    Each Newton–Schulz step maps every singular value s to s·(a + b·s² + c·s⁴) and keeps the singular
    vectors. So with X Xᵀ = U diag(λ) Uᵀ for the normalised short-side X (λ = s²), the whole iteration
    is U diag(r) Uᵀ X, where r is the product of those factors over the steps, computed per eigenvalue.
    On the Zen 1 EPYC a Muon step for this model takes 0.20 s instead of 0.33 s, and the result is
    within 3e-4 (relative) of the iteration for its 256-wide matrices, 2e-3 for small badly
    conditioned ones (RESEARCH.md, session 22); tests compare the two.
    """
    a, b, c = 3.4445, -4.7750, 2.0315
    x = matrix.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    try:
        eigenvalues, eigenvectors = torch.linalg.eigh(x @ x.T)
    except torch.linalg.LinAlgError:  # no convergence (e.g. a non-finite gradient): the iteration decides
        return orthogonalize(matrix, steps)
    squared = eigenvalues.clamp_min(0)  # rounding can leave tiny negative eigenvalues
    ratio = torch.ones_like(squared)  # the iteration's output singular value over its input one
    for _ in range(steps):
        s2 = ratio * ratio * squared
        ratio = ratio * (a + b * s2 + c * s2 * s2)
    x = (eigenvectors * ratio) @ (eigenvectors.T @ x)
    return (x.T if tall else x).to(matrix.dtype)


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al., 2024) for 2-D weight matrices: Nesterov momentum whose update is
    orthogonalised (see `orthogonalize`), so that every direction of the matrix moves by the same
    amount, rare ones included. The update is scaled by 0.2·sqrt(max(rows, cols)), which gives it the
    RMS of a typical AdamW step (Liu et al., 2025, "Muon is Scalable for LLM Training"), so AdamW's
    learning rate and decoupled weight decay carry over unchanged.

    torch.optim.Muon computes the iteration in bf16 whatever the hardware; on a CPU without native
    bf16 one of its steps took 11.7 s for this model, against 0.4 s here in fp32 (README).
    spectral=True computes the same iteration with `orthogonalize_spectral` (the CPU fast path).
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float, weight_decay: float = 0.0,
                 momentum: float = 0.95, ns_dtype: torch.dtype = torch.float32, spectral: bool = False):  # fmt: skip
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum})
        self.ns_dtype = ns_dtype
        self.spectral = spectral

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        """One update of every parameter that has a gradient."""
        for group in self.param_groups:
            lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buffer = state["momentum_buffer"].mul_(momentum).add_(p.grad)
                update = p.grad.add(buffer, alpha=momentum)  # Nesterov
                if self.spectral:
                    direction = orthogonalize_spectral(update)
                else:
                    direction = orthogonalize(update, dtype=self.ns_dtype)
                p.mul_(1 - lr * decay)
                p.add_(direction, alpha=-lr * 0.2 * math.sqrt(max(p.shape)))


class MuonAdamW:
    """Muon for some parameters and AdamW for the others, stepped as one optimizer: the trainer sets
    the rate of every group in `param_groups` and saves `state_dict()` in its checkpoints."""

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def make_optimizer(model: torch.nn.Module, config: TrainerConfig) -> torch.optim.AdamW | MuonAdamW:
    """AdamW with weight decay on matmul weights only (config.optimizer "adamw", the handout's), or
    Muon for the hidden layers' matmul weights and that AdamW for the rest ("muon").

    The decay rule (config.decay "matmul"): the weight of every nn.Linear decays; biases,
    LayerNorm parameters, the token embedding table, the position table and the perceiver's
    learned basis do not (they are looked up or added, not multiplied, so shrinking them
    towards zero is not a useful prior). "all_but_biases" is the handout's rule. Muon takes
    every nn.Linear weight except the output layer `head`, which, like the embeddings, stays
    with AdamW as Muon's authors advise.
    Frozen parameters (requires_grad False, see GPT.freeze_lower) are in neither.
    """
    linear = {f"{mn}.weight" if mn else "weight" for mn, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}  # frozen ones stay as they are
    if config.decay == "matmul":
        decay = linear
    elif config.decay == "all_but_biases":
        decay = {n for n in params if not n.endswith("bias")}
    else:
        raise ValueError(f"unknown decay {config.decay!r}")
    hidden = {n for n in linear if not n.startswith("head.")} if config.optimizer == "muon" else set()
    groups = [
        {"params": [p for n, p in params.items() if n in decay - hidden], "weight_decay": config.weight_decay},
        {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0},
    ]
    # The fused kernel does the same update in one pass (1.5 ms against 11 ms per step here); the
    # reference path keeps PyTorch's default implementation.
    fused = config.impl == "fast" and all(p.device.type in ("cpu", "cuda") for p in params.values())
    adamw = torch.optim.AdamW(groups, lr=config.learning_rate, betas=config.betas, fused=fused or None)
    if config.optimizer == "adamw":
        return adamw
    if config.optimizer != "muon":
        raise ValueError(f"unknown optimizer {config.optimizer!r}")
    matrices = [p for n, p in params.items() if n in hidden]
    if not matrices:  # every hidden matrix frozen: AdamW has the rest
        return adamw
    # bf16 only where it is native and the fast path asks for it, as for the forward pass.
    native_bf16 = config.impl == "fast" and config.bf16 and bf16_supported(matrices[0].device)
    ns_dtype = torch.bfloat16 if native_bf16 else torch.float32
    # In fp32 on a CPU one eigendecomposition beats five rounds of matmuls; GPUs keep the iteration.
    spectral = config.impl == "fast" and not native_bf16 and matrices[0].device.type == "cpu"
    muon = Muon(matrices, config.learning_rate, config.weight_decay, ns_dtype=ns_dtype, spectral=spectral)
    return MuonAdamW(muon, adamw)


class TrainingInterrupted(Exception):
    """Raised after SIGINT/SIGTERM once a checkpoint has been written; carries its path."""


class Trainer:
    """Trains `model` on `train_dataset` with `config`.

    The dataset yields (x, y) pairs of length `example_length`; on the fast
    path it also provides `epoch_batches(batch_size, rng)`. `log(name, value,
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
        self.epoch_seconds: list[float] = []  # training time of each epoch run whole (budget_replan's pace)
        self.rank, self.world_size = 0, 1
        self.forward_model = self.model
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            ids = [device.index] if device.type == "cuda" else None
            self.forward_model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        if config.compile and config.impl == "fast":
            # dynamic=True: the cropped batches have many lengths; one graph serves them all.
            self.forward_model = torch.compile(self.forward_model, dynamic=True)

    # -- data ---------------------------------------------------------------

    def batches(self, epoch: int, skip: int = 0) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """The global batches of `epoch`, after the first `skip`; the same for every rank and on every run."""
        cfg = self.config
        if cfg.impl == "reference":
            g = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
            n = len(self.train_dataset)
            order = torch.arange(n) if cfg.order == "file" else torch.randperm(n, generator=g)
            order = order[skip * cfg.batch_size :].tolist()
            return DataLoader(
                self.train_dataset,
                batch_size=cfg.batch_size,
                sampler=order,
                num_workers=cfg.num_workers,
                generator=g,  # keeps the loader from drawing on the global RNG (exact resume)
            )
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
        if self.config.budget_fit and ckpt.get("fitted"):  # keep the plan made on the first run's pace
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
        model, cfg = self.forward_model, self.config
        model.train()
        use_bf16 = cfg.impl == "fast" and cfg.bf16
        example_length = getattr(self.train_dataset, "example_length", None)
        targets_per_batch = self.mean_targets_per_batch() if cfg.token_weighted and cfg.impl == "fast" else None
        n_batches = math.ceil(len(self.train_dataset) / cfg.batch_size)
        quiet = self.rank != 0
        last_tick = self.clock()
        projected = False  # the time projection is printed once, after this process's first whole epoch
        while self.epoch < cfg.max_epochs and not self.finished():
            t0, seconds_at_start, whole_epoch = time.time(), self.seconds, self.batch_in_epoch == 0
            desc = f"epoch {self.epoch + 1}/{cfg.max_epochs}"
            batches = self.batches(self.epoch, skip=self.batch_in_epoch)
            bar = tqdm(batches, total=n_batches, initial=self.batch_in_epoch, desc=desc, leave=False, disable=quiet)
            for x, y in bar:
                global_rows = x.size(0)
                if global_rows < self.world_size:
                    continue  # a last batch too small to give every rank a row: skipped by all ranks alike
                x = x[self.rank :: self.world_size].to(self.device)
                y = y[self.rank :: self.world_size].to(self.device)
                with autocast(self.device, use_bf16):
                    _, loss = model(x, y)
                model.zero_grad(set_to_none=True)
                self.training_loss(loss, y, targets_per_batch).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_norm_clip)
                self.optimizer.step()
                self.step += 1
                self.batch_in_epoch += 1
                now = self.clock()
                self.seconds, last_tick = self.seconds + now - last_tick, now
                if cfg.budget_seconds is not None and self.world_size > 1:
                    self.seconds = self.slowest_rank_seconds()  # every rank must stop at the same step
                lr = cfg.learning_rate
                if cfg.lr_decay:
                    # As in the handout, the rate is updated after the step from the tokens seen so far.
                    self.tokens += global_rows * (example_length or y.size(1))
                    multiplier = lr_multiplier(self.tokens, cfg.warmup_tokens, cfg.final_tokens, cfg.cosine_cap)
                    cooldown = cooldown_multiplier(self.seconds, cfg.budget_seconds, cfg.budget_cooldown)
                    if cooldown < 1.0:  # towards the floor (never below it) as the budget runs out
                        multiplier = max(0.1, multiplier * cooldown)
                    lr = cfg.learning_rate * multiplier
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                if self.world_size > 1:  # log the mean over ranks: the loss of the whole global batch
                    loss = loss.detach().clone()
                    dist.all_reduce(loss)  # a sum (gloo has no average)
                    loss /= self.world_size
                self.losses.append(loss.item())
                if not quiet:
                    self.log("train/loss", self.losses[-1], self.step)
                    self.log("train/lr", lr, self.step)
                    self.log("train/tokens_seen", self.tokens, self.step)
                    bar.set_postfix(loss=f"{self.losses[-1]:.4f}", lr=f"{lr:.2e}")
                if self.stop_requested:
                    self.save_checkpoint()
                    raise TrainingInterrupted(cfg.ckpt_path)
                if cfg.ckpt_every and self.step % cfg.ckpt_every == 0:
                    self.save_checkpoint()
                if self.finished():
                    break
            else:  # the epoch ran to its end
                self.epoch += 1
                self.batch_in_epoch = 0
            seconds = time.time() - t0
            ran_whole = whole_epoch and self.batch_in_epoch == 0
            first_whole_epoch = ran_whole and not projected
            plan = None
            if ran_whole:
                self.epoch_seconds.append(self.seconds - seconds_at_start)  # the same on every rank: shared seconds
            if ran_whole and cfg.budget_fit and cfg.budget_seconds is not None:
                if cfg.budget_replan and not self.finished():
                    plan = self.replan_to_budget()
                elif not self.fitted:
                    plan = self.fit_to_budget(self.epoch_seconds[-1])
            if not quiet and self.losses:
                self.log("train/epoch_seconds", seconds, self.epoch)
                tqdm.write(f"{desc}: loss {self.losses[-1]:.4f}, {seconds:.1f} s")
                if first_whole_epoch:
                    projected = True
                    tqdm.write(plan or self.projection(self.seconds - seconds_at_start))
                elif plan:
                    tqdm.write(plan)
        self.save_checkpoint()
        return self.losses

    def plan_epochs(self, more: float) -> int:
        """Make the plan this epoch plus floor(more) epochs (none if negative), with the cosine's
        final_tokens at their end; returns the plan it replaces."""
        cfg = self.config
        planned = cfg.max_epochs
        cfg.max_epochs = self.epoch + max(0, math.floor(more))
        cfg.final_tokens = self.tokens / self.epoch * cfg.max_epochs  # every epoch counts the same tokens
        self.fitted = True
        return planned

    def fit_to_budget(self, epoch_seconds: float) -> str:
        """Plan max_epochs and the cosine's final_tokens to the budget at `epoch_seconds` per epoch
        (see TrainerConfig.budget_fit); returns the line that says so."""
        cfg = self.config
        planned = self.plan_epochs((cfg.budget_seconds * BUDGET_FIT_SHARE - self.seconds) / epoch_seconds)
        return (
            f"at {epoch_seconds:.1f} s per epoch, {BUDGET_FIT_SHARE:.0%} of the {cfg.budget_seconds / 60:g}-minute "
            f"budget holds {cfg.max_epochs} epochs: planned {planned}, now {cfg.max_epochs}, with the cosine "
            f"ending at their end (about {(cfg.max_epochs - self.epoch) * epoch_seconds / 60:.0f} min left)"
        )

    def replan_to_budget(self) -> str | None:
        """Plan max_epochs and final_tokens again at the median pace of the last REPLAN_EPOCHS epochs
        (see TrainerConfig.budget_replan); returns the line that says so, or None if nothing changed."""
        cfg = self.config
        first = not self.fitted
        pace = statistics.median(self.epoch_seconds[-REPLAN_EPOCHS:])
        planned = self.plan_epochs((cfg.budget_seconds - self.seconds) / pace - 1)  # one epoch kept in reserve
        if cfg.max_epochs == planned and not first:
            return None
        return (
            f"at {pace:.1f} s per epoch (median of the last {min(REPLAN_EPOCHS, len(self.epoch_seconds))}), the "
            f"{(cfg.budget_seconds - self.seconds) / 60:.1f} minutes left of the budget hold "
            f"{cfg.max_epochs - self.epoch} more epochs and one to spare: planned {planned}, now {cfg.max_epochs}, "
            f"with the cosine ending at their end"
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
        if cfg.budget_cooldown:
            line += f" (the last {cfg.budget_cooldown:.0%} of the budget anneals it to the floor)"
        return line

    def training_loss(self, loss: torch.Tensor, y: torch.Tensor, targets_per_batch: float | None) -> torch.Tensor:
        """The loss to differentiate: the batch's mean loss, or with targets_per_batch the sum of its
        token losses divided by that constant (y: this rank's targets, PAD = 0)."""
        if targets_per_batch is None:
            return loss
        # DDP averages the ranks' gradients, hence world_size: the sum of all ranks' token losses over the constant.
        return loss * ((y != 0).sum() * self.world_size / targets_per_batch)

    def mean_targets_per_batch(self) -> float:
        """Mean number of non-PAD targets in a global batch, counted over one epoch's batches."""
        targets, rows = 0, 0
        for _, y in self.batches(0):
            targets, rows = targets + int((y != 0).sum()), rows + len(y)
        return targets * self.config.batch_size / rows

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
        return cfg.max_steps is not None and self.step >= cfg.max_steps
