"""Short probes of pretraining settings: equal wall-clock, then the loss on fixed batches.

    python bench/probe_recipe.py 210 32,2e-3 128,2e-3 64,3e-3   # seconds per probe, then batch,lr pairs
    python bench/probe_recipe.py 240 128,2e-3 128,6e-3 --perceiver --doc_offset 14
    python bench/probe_recipe.py 300 128,5e-4 --perceiver --perceiver_init aligned --doc_offset 14
    python bench/probe_recipe.py 240 32,1e-3 --optimizer muon --doc_offset 14

Each probe trains a fresh vanilla model (--perceiver: the perceiver with m=64) (dropout 0, bf16, fast path) for the
given number of seconds at a constant learning rate (a long run's peak), then
reports the loss on 10 fixed batches of 128 corrupted wiki.txt examples (fresh
corruptions of the training documents: storing the corpus is the point, so a
training-set loss is what matters). A probe says which settings learn fastest
in the first minutes, and which do not learn at all; it does not predict the
accuracy of a long run. Run one probe at a time on a quiet machine. Results
are printed and appended to bench/results/probes.jsonl.
"""

from __future__ import annotations

import dataclasses
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
from utils import autocast, cpu_name  # noqa: E402

CPU = torch.device("cpu")


def probe(
    ds: CharCorruptionDataset,
    held_out: list,
    batch: int,
    lr: float,
    seconds: float,
    perceiver: bool = False,
    perceiver_init: str = "handout",
    optimizer: str = "adamw",
) -> tuple[int, float]:
    """Train for `seconds`; returns (steps, mean loss on held_out)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=ds.vocab_size, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0)
    if perceiver:
        config = dataclasses.replace(config, perceiver=True, bottleneck_dim=64, perceiver_init=perceiver_init)
    model = GPT(config)
    model.set_impl("fast")
    train_config = TrainerConfig(batch_size=batch, learning_rate=lr, optimizer=optimizer)
    trainer = Trainer(model, ds, train_config, CPU)  # for its batches and its optimizer
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
    argv = sys.argv[1:]
    perceiver = "--perceiver" in argv
    argv = [a for a in argv if a != "--perceiver"]
    offset, init, optimizer = 0, "handout", "adamw"
    if "--doc_offset" in argv:
        at = argv.index("--doc_offset")
        offset = int(argv[at + 1])
        del argv[at : at + 2]
    if "--perceiver_init" in argv:
        at = argv.index("--perceiver_init")
        init = argv[at + 1]
        del argv[at : at + 2]
    if "--optimizer" in argv:
        at = argv.index("--optimizer")
        optimizer = argv[at + 1]
        del argv[at : at + 2]
    if len(argv) < 2:
        sys.exit(__doc__)
    seconds = float(argv[0])
    wiki = read_text(ROOT / "data" / "wiki.txt")
    # The held-out batches are the handout's corruption (no offset) whatever the probes train on.
    plain = CharCorruptionDataset(wiki, 128)
    scratch = Trainer(GPT(GPTConfig(vocab_size=plain.vocab_size)), plain, TrainerConfig(batch_size=128, seed=999), CPU)
    held_out = list(scratch.batches(0))[:10]
    ds = CharCorruptionDataset(wiki, 128, max_offset=offset)
    for spec in argv[1:]:
        batch, lr = int(spec.split(",")[0]), float(spec.split(",")[1])
        steps, loss = probe(ds, held_out, batch, lr, seconds, perceiver, init, optimizer)
        epochs = steps * batch / len(ds)
        print(f"batch {batch}, lr {lr:g}: {steps} steps ({epochs:.1f} epochs) in {seconds:g} s -> loss {loss:.3f}")
        record = {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": seconds, "batch_size": batch, "lr": lr}
        record |= {"variant": "perceiver" if perceiver else "vanilla", "doc_offset": offset, "cpu": cpu_name()}
        if perceiver:
            record["perceiver_init"] = init
        if optimizer != "adamw":
            record["optimizer"] = optimizer
        with open(ROOT / "bench" / "results" / "probes.jsonl", "a") as f:
            f.write(json.dumps({**record, "steps": steps, "epochs": round(epochs, 1), "loss": round(loss, 3)}) + "\n")


if __name__ == "__main__":
    main()
