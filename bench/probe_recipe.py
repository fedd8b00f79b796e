"""Short probes of pretraining settings: equal wall-clock, then the loss on fixed batches.

    python bench/probe_recipe.py 210 32,2e-3 128,2e-3 64,3e-3   # seconds per probe, then batch,lr pairs

Each probe trains a fresh vanilla model (dropout 0, bf16, fast path) for the
given number of seconds at a constant learning rate (a long run's peak), then
reports the loss on 10 fixed batches of 128 corrupted wiki.txt examples (fresh
corruptions of the training documents: storing the corpus is the point, so a
training-set loss is what matters). A probe says which settings learn fastest
in the first minutes, and which do not learn at all; it does not predict the
accuracy of a long run. Run one probe at a time on a quiet machine. Results
are printed and appended to bench/results/probes.jsonl.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dataset import CharCorruptionDataset, read_text  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from trainer import Trainer, TrainerConfig  # noqa: E402
from utils import autocast  # noqa: E402

CPU = torch.device("cpu")


def probe(ds: CharCorruptionDataset, held_out: list, batch: int, lr: float, seconds: float) -> tuple[int, float]:
    """Train for `seconds`; returns (steps, mean loss on held_out)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0))
    model.set_impl("fast")
    trainer = Trainer(model, ds, TrainerConfig(batch_size=batch, learning_rate=lr), CPU)  # for its batches and AdamW
    model.train()
    t0, epoch, steps = time.time(), 0, 0
    while time.time() - t0 < seconds:
        for x, y in trainer.batches(epoch):
            with autocast(CPU, True):
                _, loss = model(x, y)
            model.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            trainer.optimizer.step()
            steps += 1
            if time.time() - t0 >= seconds:
                break
        epoch += 1
    model.eval()
    with torch.no_grad():
        return steps, float(np.mean([model(x, y)[1].item() for x, y in held_out]))


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    seconds = float(sys.argv[1])
    ds = CharCorruptionDataset(read_text(ROOT / "data" / "wiki.txt"), 128)
    scratch = Trainer(GPT(GPTConfig(vocab_size=ds.vocab_size)), ds, TrainerConfig(batch_size=128, seed=999), CPU)
    held_out = list(scratch.batches(0))[:10]
    for spec in sys.argv[2:]:
        batch, lr = int(spec.split(",")[0]), float(spec.split(",")[1])
        steps, loss = probe(ds, held_out, batch, lr, seconds)
        epochs = steps * batch / len(ds)
        print(f"batch {batch}, lr {lr:g}: {steps} steps ({epochs:.1f} epochs) in {seconds:g} s -> loss {loss:.3f}")
        record = {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": seconds, "batch_size": batch, "lr": lr}
        with open(ROOT / "bench" / "results" / "probes.jsonl", "a") as f:
            f.write(json.dumps({**record, "steps": steps, "epochs": round(epochs, 1), "loss": round(loss, 3)}) + "\n")


if __name__ == "__main__":
    main()
