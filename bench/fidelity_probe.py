"""Does the fast path train like the reference? Equal steps at the handout's settings, then a held-out loss.

    python bench/fidelity_probe.py 230 fast fast-fp32 fast-unbucketed reference
    python bench/fidelity_probe.py 230 --lr 2e-3 --dropout 0 fast fast-unbucketed

Each probe trains a fresh vanilla model (seed 0) for the given number of
optimizer steps with run.py's pretraining schedule (the handout's: warm-up,
then an uncapped cosine over 200 epochs' worth of tokens; batch 128; default
lr 6e-3 and dropout 0.1), then reports the loss on 10 fixed batches of 128
corrupted wiki.txt examples (random, unbucketed, full length; fp32, eval mode).
Paths:

- fast: what run.py does, through its Trainer (bucketed and cropped batches, bf16, fast dropout)
- fast-fp32: the same without bf16 autocast
- fast-unbucketed: random batches (cropped to their longest example)
- reference: the handout's model and loop from the same starting point (bench/course.py: fp32,
  per-example __getitem__ in the corpus's order, full length, torch's AdamW with the handout's decay rule)

The unit tests prove that one batch's loss and gradients agree between paths;
this probe checks what they cannot: that a training run as a whole (batch
composition, rounding over hundreds of steps) learns the same. Results are
printed and appended to bench/results/fidelity.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import course  # noqa: E402

from dataset import CharCorruptionDataset, read_text  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from trainer import Trainer, TrainerConfig  # noqa: E402

CPU = torch.device("cpu")
PATHS = {
    "fast": {},
    "fast-fp32": {"bf16": False},
    "fast-unbucketed": {"order": "shuffled"},
    "reference": {},  # bench/course.py's loop
}


def probe(ds: CharCorruptionDataset, held_out: list, path: str, steps: int, lr: float, dropout: float) -> float:
    """Train a fresh model for `steps` on `path`; returns its mean loss on held_out."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=ds.vocab_size, embd_pdrop=dropout, resid_pdrop=dropout, attn_pdrop=dropout)
    model = GPT(config)
    trainer_config = TrainerConfig(
        max_epochs=10_000,
        max_steps=steps,
        batch_size=128,
        learning_rate=lr,
        lr_decay=True,
        warmup_tokens=512 * 20,
        final_tokens=200 * len(ds) * 128,
        **PATHS[path],
    )
    if path == "reference":
        model = course.course_copy(model)
        course.train(model, ds, trainer_config, CPU, steps)
    else:
        Trainer(model, ds, trainer_config, CPU).train()
    model.eval()
    with torch.no_grad():
        return float(np.mean([model(x, y)[1].item() for x, y in held_out]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps", type=int, help="optimizer steps per probe")
    p.add_argument("paths", nargs="+", choices=list(PATHS), help="training paths to compare")
    p.add_argument("--lr", type=float, default=6e-3, help="peak learning rate (the handout's 6e-3)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout (the handout's 0.1)")
    args = p.parse_args()
    ds = CharCorruptionDataset(read_text(ROOT / "data" / "wiki.txt"), 128)
    held_out = list(ds.epoch_batches(128, np.random.default_rng(999), order="shuffled"))[:10]
    for path in args.paths:
        t0 = time.time()
        loss = probe(ds, held_out, path, args.steps, args.lr, args.dropout)
        seconds = time.time() - t0
        print(
            f"{path}: {args.steps} steps, lr {args.lr:g}, dropout {args.dropout:g} -> loss {loss:.3f} ({seconds:.0f} s)"
        )
        record = {"date": time.strftime("%Y-%m-%d %H:%M"), "path": path, "steps": args.steps, "lr": args.lr}
        record |= {"dropout": args.dropout, "held_out_loss": round(loss, 4), "seconds": round(seconds, 1)}
        with open(ROOT / "bench" / "results" / "fidelity.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
