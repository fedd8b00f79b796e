"""Memory and step time over a sustained pretraining run, by how bucketed batches are cropped.

    python bench/bench_memory.py            # 276 steps per setting (12 epochs of batch 128)
    python bench/bench_memory.py 460 1 8    # steps, then the crop multiples to compare

Each setting runs in a fresh process: the vanilla model, the fast path (bf16,
bucketed batches, dropout 0), batch 128 at lr 2e-3, and reports the resident
memory and the time per step every 46 steps. Crop multiple 1 crops every batch
to exactly its longest example (about 110 different tensor shapes); 8 rounds
the width up to a multiple of 8 (16 shapes). Results are printed as a markdown
table and written to bench/results/memory.json.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT_EVERY = 46


def rss_mb() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) // 1024


def worker(steps: int, multiple: int) -> None:
    """Train and print one JSON line per REPORT_EVERY steps (runs in its own process)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from dataset import CharCorruptionDataset, read_text
    from model import GPT, GPTConfig
    from optim import make_optimizer
    from trainer import TrainerConfig
    from utils import autocast

    ds = CharCorruptionDataset(read_text(ROOT / "data" / "wiki.txt"), 128)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0))
    optimizer = make_optimizer(model, TrainerConfig(learning_rate=2e-3))
    cpu, step, epoch, last = torch.device("cpu"), 0, 0, time.time()
    while step < steps:
        for x, y in ds.epoch_batches(128, np.random.default_rng(epoch), crop_multiple=multiple):
            with autocast(cpu, True):
                _, loss = model(x, y)
            model.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            if step % REPORT_EVERY == 0:
                now = time.time()
                print(json.dumps({"step": step, "rss_mb": rss_mb(), "ms_per_step": 1000 * (now - last) / REPORT_EVERY}))
                last = now
            if step >= steps:
                break
        epoch += 1


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(int(sys.argv[2]), int(sys.argv[3]))
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 276
    multiples = [int(m) for m in sys.argv[2:]] or [1, 8]
    results = {}
    for m in multiples:
        out = subprocess.run(
            [sys.executable, __file__, "--worker", str(steps), str(m)],
            capture_output=True, text=True, check=True, env=os.environ,
        )  # fmt: skip
        results[m] = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    header = " | ".join(f"step {r['step']}" for r in results[multiples[0]])
    print(f"| crop multiple | {header} |")
    print(f"|---|{'---|' * len(results[multiples[0]])}")
    for m, rows in results.items():
        cells = " | ".join(f"{r['rss_mb']:,} MB, {r['ms_per_step']:.0f} ms" for r in rows)
        print(f"| {m} | {cells} |")
    record = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} cpus"}
    (ROOT / "bench" / "results" / "memory.json").write_text(json.dumps({**record, "results": results}, indent=1))


if __name__ == "__main__":
    main()
