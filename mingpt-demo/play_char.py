"""Train a character-level GPT on Tiny Shakespeare and sample from it.

    python data/get_data.py                              # once: places data/tinyshakespeare/input.txt
    python mingpt-demo/play_char.py                      # the CPU default: under 4 minutes on 2 shared cores
    python mingpt-demo/play_char.py --max_iters 300      # a quick look (babble with line breaks)
    python mingpt-demo/play_char.py --input my.txt       # any UTF-8 text
    python mingpt-demo/play_char.py --writing_params_path demo.params   # keep the trained weights
    python mingpt-demo/play_char.py --reading_params_path demo.params --max_iters 0 --prompt "ROMEO:"   # sample only

The model, its sampler (`GPT.generate`) and the training loop are the repository's
(`src/model.py`, `src/trainer.py`). This file adds
the character dataset and the few steps that tie them together; `play_char.ipynb`
imports these functions and runs the same steps cell by cell.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "src"))
from config import size_problem  # noqa: E402
from dataset import Vocabulary, read_text  # noqa: E402
from machine import choose, pick_device  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from params import load_verified, save_with_sidecar, warn_unverified  # noqa: E402
from trainer import Trainer, TrainerConfig  # noqa: E402
from utils import (  # noqa: E402
    UserError,
    check_input,
    check_output_file,
    check_path_given,
    refuse_same_file,
    run_cli,
    seed_everything,
)

DEFAULT_INPUT = REPO_ROOT / "data" / "tinyshakespeare" / "input.txt"
MAX_SEED = 2**32 - 1  # numpy's seeds are 0..2**32-1
MAX_SAMPLE = 1_000_000  # characters a sample may ask for
SHAPE = ("block_size", "n_layer", "n_head", "n_embd")  # the settings a params file fixes
# The first estimate times this many steps after the first, which also pays for setting up the kernels.
ESTIMATE_STEPS = 5


@dataclass
class DemoConfig:
    """Everything the demo needs; the defaults are the CPU setting measured in README.md."""

    input: str = str(DEFAULT_INPUT)
    writing_params_path: str | None = None  # where to save the trained model
    reading_params_path: str | None = None  # a saved model to start from (max_iters 0: only sample)
    # model
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    # training
    max_iters: int = 1200
    batch_size: int = 32
    learning_rate: float = 2e-3
    warmup_iters: int = 100
    val_fraction: float = 0.1
    print_every: int = 100
    seed: int = 0
    device: str = "auto"
    threads: int = 1  # CPU threads; 1 is the fastest on a busy shared machine (see README.md), 0: torch's default
    fp32: bool = False
    # sampling
    prompt: str = "O God, O God!"
    sample_chars: int = 500
    temperature: float = 0.8
    top_k: int | None = 10
    greedy: bool = False


# ---------------------------------------------------------------------------
# Data


def load_text(path: str | Path) -> str:
    """The whole training text; a file that cannot be read is a UserError that names the data step."""
    check_input(path, "--input", "; run `python data/get_data.py` first, or pass --input FILE")
    return read_text(path, "--input")


class CharDataset(Dataset):
    """A text cut into windows of block_size + 1 characters; one epoch is one pass over the text.

    ds[i] -> (x, y), LongTensors (block_size,): the first and the last block_size
    characters of the i-th window, so y[t] is the character that follows x[t].
    `epoch_batches` (how the Trainer batches it) shifts the cut by a random offset
    every epoch, so over epochs the model sees windows starting anywhere.
    Ids come from the repository's Vocabulary: 0 is PAD (ignored by the loss)
    and 1 is MASK, both unused here, so no real character has id 0.
    """

    def __init__(self, text: str, block_size: int, vocab: Vocabulary):
        if len(text) <= block_size:
            raise UserError(f"the text has {len(text)} characters; block_size {block_size} needs more")
        self.vocab = vocab
        self.vocab_size = len(vocab)
        self.block_size = block_size
        self.example_length = block_size  # tokens per example, for the Trainer's LR schedule
        self.ids = np.array(vocab.encode(text, where="text"), dtype=np.int64)  # (N,)

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = torch.from_numpy(self.ids[i * self.block_size : (i + 1) * self.block_size + 1])
        return window[:-1], window[1:]

    def epoch_batches(
        self, batch_size: int, rng: np.random.Generator, order: str = "", crop: bool = True
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """len(self) windows (B, block_size) per epoch: the cut shifted by a random offset, in random order.

        Every window has the same length, so there is nothing to order or crop: `order` and `crop` are ignored.
        """
        last = len(self.ids) - 1 - self.block_size  # the last possible start
        starts = rng.integers(self.block_size) + self.block_size * rng.permutation(len(self))
        starts = np.minimum(starts, last)  # the final window of a shifted cut may overlap its neighbour
        offsets = np.arange(self.block_size + 1)
        for s in range(0, len(starts), batch_size):
            windows = torch.from_numpy(self.ids[starts[s : s + batch_size, None] + offsets])  # (B, block_size + 1)
            yield windows[:, :-1], windows[:, 1:]


def make_datasets(
    text: str, block_size: int, val_fraction: float, vocab: Vocabulary | None = None
) -> tuple[CharDataset, CharDataset | None]:
    """Train on the first (1 - val_fraction) of the text, validate on the rest (None if too short).
    The vocabulary is the text's characters unless given (a saved model's)."""
    vocab = vocab or Vocabulary(text)
    n_val = int(len(text) * val_fraction)
    train_set = CharDataset(text[: len(text) - n_val], block_size, vocab)
    val_set = CharDataset(text[len(text) - n_val :], block_size, vocab) if n_val > block_size else None
    return train_set, val_set


# ---------------------------------------------------------------------------
# Model, training, sampling


def setup(cfg: DemoConfig) -> torch.device:
    """Decide the device once, and the number of CPU threads."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return pick_device(cfg.device)


def make_model(cfg: DemoConfig, vocab_size: int) -> GPT:
    """The repository's GPT (vanilla) at the demo's size."""
    seed_everything(cfg.seed)
    p = cfg.dropout
    return GPT(GPTConfig(vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, p, p, p))


def train(model: GPT, train_set: CharDataset, cfg: DemoConfig, device: torch.device) -> list[float]:
    """max_iters steps of the repository's Trainer (AdamW, warm-up then cosine decay); returns every step's loss."""
    tokens_per_iter = cfg.batch_size * cfg.block_size
    iters_per_epoch = math.ceil(len(train_set) / cfg.batch_size)
    config = TrainerConfig(
        max_epochs=math.ceil(cfg.max_iters / iters_per_epoch),
        max_steps=cfg.max_iters,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        warmup_tokens=cfg.warmup_iters * tokens_per_iter,
        final_tokens=cfg.max_iters * tokens_per_iter,
        cosine_cap=True,
        precision=choose(device, cfg.fp32, say=False)["precision"],
        seed=cfg.seed,
    )

    def log(name: str, value: float, step: int) -> None:
        if name == "train/loss" and (step % cfg.print_every == 0 or step == cfg.max_iters):
            tqdm.write(f"iter {step}: loss {value:.4f}")

    trainer = Trainer(model, train_set, config, device, log)
    trainer.add_callback("on_batch_end", early_estimate(cfg.max_iters))
    return trainer.train()


def duration(seconds: float) -> str:
    """'40 s', '12 min' or '1.5 hours'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} hours"


def early_estimate(max_iters: int) -> Callable[[Trainer], None]:
    """A Trainer callback (on_batch_end) that prints once what the run's max_iters iterations take at the
    pace of the ESTIMATE_STEPS steps after the first, which warms up; a shorter run gets no estimate."""
    first_step_seconds = 0.0

    def on_batch_end(trainer: Trainer) -> None:
        nonlocal first_step_seconds
        if trainer.step == 1:
            first_step_seconds = trainer.seconds
        if trainer.step == 1 + ESTIMATE_STEPS and max_iters > trainer.step:
            pace = (trainer.seconds - first_step_seconds) / ESTIMATE_STEPS
            total = trainer.seconds + (max_iters - trainer.step) * pace
            tqdm.write(
                f"{pace:.2f} s per iteration after the first: about {duration(total)} for {max_iters} iterations"
            )

    return on_batch_end


@torch.no_grad()
def estimate_loss(model: GPT, dataset: CharDataset, device: torch.device, windows: int = 1024) -> float:
    """Mean loss over a fixed random set of `windows` windows of `dataset` (fp32, no dropout)."""
    model.eval()
    batches = islice(dataset.epoch_batches(64, np.random.default_rng(0)), math.ceil(windows / 64))
    losses = [model(x.to(device), y.to(device))[1].item() for x, y in batches]
    model.train()
    return sum(losses) / len(losses)


def generate(
    model: GPT,
    vocab: Vocabulary,
    prompt: str,
    chars: int,
    device: torch.device,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
) -> str:
    """The prompt (not empty) and `chars` more characters, drawn by GPT.generate."""
    top_k = min(top_k, len(vocab)) if top_k else None
    x = torch.tensor([vocab.encode(prompt, where="--prompt")], dtype=torch.long, device=device)  # (1, T)
    y = model.generate(x, chars, temperature=temperature, do_sample=not greedy, top_k=top_k)  # (1, T + chars)
    return vocab.decode(y[0].tolist())


def save_params(path: str | Path, model: GPT, vocab: Vocabulary, cfg: DemoConfig) -> None:
    """Write the model's state_dict, its shape (SHAPE) and its characters to `path`, with a JSON sidecar holding
    the shape and the file's SHA-256 (params.save_with_sidecar: both atomically)."""
    shape = {name: getattr(cfg, name) for name in SHAPE}
    save_with_sidecar({"state_dict": model.state_dict(), "shape": shape, "chars": vocab.itos[2:]}, path, shape)


def load_params(cfg: DemoConfig) -> tuple[DemoConfig, Vocabulary, dict]:
    """What save_params wrote to cfg.reading_params_path: (cfg with the saved shape, the saved vocabulary,
    the state_dict); a file that is not one is a one-line UserError."""
    path = cfg.reading_params_path
    try:
        blob, side, _ = load_verified(path, "--reading_params_path")
        shape = {name: int(blob["shape"][name]) for name in SHAPE}
        warn_unverified(path, side)
        return replace(cfg, **shape), Vocabulary(list(blob["chars"])), dict(blob["state_dict"])
    except (TypeError, KeyError, ValueError, AttributeError):
        raise UserError(
            f"--reading_params_path {path}: not a params file written by play_char.py --writing_params_path"
        ) from None


# ---------------------------------------------------------------------------
# The demo, start to end


def run(cfg: DemoConfig) -> str:
    """Load (the text, and with reading_params_path the model to start from), train max_iters iterations,
    report the loss, write writing_params_path and return a sample: what the notebook does, in one call."""
    for flag in ("input", "reading_params_path", "writing_params_path"):
        check_path_given(getattr(cfg, flag), f"--{flag}")
    check_output_file(cfg.writing_params_path, "--writing_params_path")  # fail now, not after training
    refuse_same_file({"--writing_params_path": cfg.writing_params_path}, {"--input": cfg.input})
    vocab, state = None, None
    if cfg.reading_params_path:
        cfg, vocab, state = load_params(cfg)
    if cfg.max_iters:  # 0: only sample from the model read, which needs no text
        text = load_text(cfg.input)
        if vocab is not None and set(text) - set(vocab.itos):
            unseen = "".join(sorted(set(text) - set(vocab.itos)))
            raise UserError(f"--input {cfg.input}: characters the model read never saw: {unseen[:20]!r}")
        train_set, val_set = make_datasets(text, cfg.block_size, cfg.val_fraction, vocab)
        vocab = train_set.vocab
    if not cfg.prompt:
        raise UserError("--prompt must not be empty")
    vocab.encode(cfg.prompt, where="--prompt")  # fail now, not after training
    device = setup(cfg)
    if cfg.max_iters:
        print(f"data: {cfg.input}: {len(text):,} characters, {len(vocab) - 2} distinct")
    model = make_model(cfg, len(vocab))
    if state is not None:
        try:
            model.load_state_dict(state)
        except RuntimeError:
            raise UserError(f"--reading_params_path {cfg.reading_params_path}: weights of another shape") from None
    n_params = sum(p.numel() for p in model.parameters())
    read = f", read from {cfg.reading_params_path}" if state is not None else ""
    print(
        f"model: {cfg.n_layer} layers, {cfg.n_head} heads, n_embd {cfg.n_embd}, {n_params / 1e6:.2f}M parameters{read}"
    )
    if cfg.max_iters:
        precision = choose(device, cfg.fp32, say=False)["precision"]
        passes = cfg.max_iters * cfg.batch_size / len(train_set)
        print(
            f"training: {cfg.max_iters} iterations of {cfg.batch_size} windows of {cfg.block_size} "
            f"({passes:.2g} passes over the text) on {device}, {precision}"
        )
        t0 = time.time()
        losses = train(model, train_set, cfg, device)
        seconds = time.time() - t0
        tail = losses[-100:]
        line = f"trained {len(losses)} iterations in {seconds:.0f} s: train loss {sum(tail) / len(tail):.3f}"
        if val_set is not None:
            line += f", val loss {estimate_loss(model, val_set, device):.3f}"
        print(line + f" (train: mean of the last {len(tail)} steps)")
    if cfg.writing_params_path:
        save_params(cfg.writing_params_path, model, vocab, cfg)
        print(f"wrote {cfg.writing_params_path}")
    seed_everything(cfg.seed)
    out = generate(model, vocab, cfg.prompt, cfg.sample_chars, device, cfg.temperature, cfg.top_k, cfg.greedy)
    how = "greedy" if cfg.greedy else f"temperature {cfg.temperature}, top_k {cfg.top_k}"
    print(f"\n--- sample ({how}) ---\n{out}")
    return out


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> DemoConfig:
    d = DemoConfig()
    p = Parser(prog="play_char.py", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--input", default=d.input, help="text to train on; the default is the data step's Tiny Shakespeare")
    p.add_argument("--writing_params_path", help="save the trained model here (written whole or not at all)")
    p.add_argument("--reading_params_path", help="start from a saved model, its shape and characters (see --max_iters)")
    p.add_argument("--block_size", type=int, default=d.block_size, help="context length in characters")
    p.add_argument("--n_layer", type=int, default=d.n_layer, help="transformer blocks")
    p.add_argument("--n_head", type=int, default=d.n_head, help="attention heads")
    p.add_argument("--n_embd", type=int, default=d.n_embd, help="embedding width")
    p.add_argument("--dropout", type=float, default=d.dropout, help="dropout on embeddings, attention and residuals")
    p.add_argument(
        "--max_iters",
        type=int,
        default=d.max_iters,
        help="optimizer steps (0: only sample, with --reading_params_path)",
    )
    p.add_argument("--batch_size", type=int, default=d.batch_size, help="windows per step")
    p.add_argument("--learning_rate", type=float, default=d.learning_rate, help="peak learning rate")
    p.add_argument("--warmup_iters", type=int, default=d.warmup_iters, help="steps of linear warm-up before the cosine")
    p.add_argument("--val_fraction", type=float, default=d.val_fraction, help="end of the text held out for val loss")
    p.add_argument("--print_every", type=int, default=d.print_every, help="print the training loss every N steps")
    p.add_argument("--seed", type=int, default=d.seed, help="seed for init, data order and sampling")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=d.device, help="where to run")
    p.add_argument("--threads", type=int, default=d.threads, help="CPU threads (0: torch's default, all cores)")
    p.add_argument("--fp32", action="store_true", help="train in fp32 even where bf16 is measured faster")
    p.add_argument("--prompt", default=d.prompt, help="text the sample starts from")
    p.add_argument("--sample_chars", type=int, default=d.sample_chars, help="characters to generate")
    p.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature (lower: safer)")
    p.add_argument("--top_k", type=int, default=d.top_k, help="sample among the k likeliest characters (0: all)")
    p.add_argument("--greedy", action="store_true", help="take the likeliest character every time instead of sampling")
    args = p.parse_args(argv)
    for flag in ("block_size", "n_layer", "n_head", "n_embd", "batch_size", "print_every"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1")
    if args.max_iters < (0 if args.reading_params_path else 1):
        p.error("--max_iters must be at least 1 (0, only sampling, needs --reading_params_path)")
    for flag in ("warmup_iters", "threads", "sample_chars", "top_k"):
        if getattr(args, flag) < 0:
            p.error(f"--{flag} must not be negative")
    if not 0 <= args.val_fraction < 1:
        p.error(f"--val_fraction must be in [0, 1), got {args.val_fraction}")
    if not 0 <= args.dropout < 1:
        p.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if not (args.learning_rate > 0 and math.isfinite(args.learning_rate)):
        p.error(f"--learning_rate must be a positive finite number, got {args.learning_rate}")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        p.error(
            f"--temperature must be a positive finite number (--greedy: the likeliest character), got {args.temperature}"
        )
    cores = os.cpu_count() or 1
    if args.threads > cores:  # more threads than cores never helps, and torch overflows at 2**31
        p.error(f"--threads must be from 0 (torch's default) to {cores}, this machine's CPU cores, got {args.threads}")
    if not 0 <= args.seed <= MAX_SEED:
        p.error(f"--seed must be an integer from 0 to {MAX_SEED}, got {args.seed}")
    if args.sample_chars > MAX_SAMPLE:  # each character is one more step of generation, kept in memory
        p.error(f"--sample_chars must be at most {MAX_SAMPLE:,}, got {args.sample_chars}")
    if size := size_problem(
        "vanilla", args.n_layer, args.n_head, args.n_embd, 2, args.block_size
    ):  # before the text is read
        p.error(size)
    args.top_k = args.top_k or None
    return DemoConfig(**vars(args))


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns 0, or 2 after a one-line error on bad input."""
    return run_cli(lambda: parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
