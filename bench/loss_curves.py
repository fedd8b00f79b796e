"""Training-loss curves of runs side by side, from their TensorBoard logs.

    python bench/loss_curves.py vanilla_zen1_b32_lr1e-3_46ep_seed0 vanilla_zen1_b32_lr1e-3_46ep_muon_seed0
    python bench/loss_curves.py RUN_A RUN_B --every 10 --function pretrain

Each RUN is a run name as given to --tb_expt_name (bench/time_to_accuracy.py uses
its --name), found as expt/<function>/<RUN>_*. The table gives the mean of the
per-step losses over each block of `--every` epochs. Every step is logged, so
unlike the last-batch loss that run.py prints, the means are not at the mercy
of one batch's length. Two runs with the same seed, batch size and corpus
train on the same batches in the same order, so the difference between two
columns is a paired comparison of what differs between them. The table is
printed and written to bench/results/loss_curves.md, or to --out (so that a new
comparison does not replace a table that RESEARCH.md cites).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[1]


def epoch_losses(function: str, run: str, expt: Path = ROOT / "expt") -> list[np.ndarray]:
    """The per-step losses of each finished epoch of `run` (its newest log under expt/function)."""
    folders = sorted((expt / function).glob(f"{run}_*"), key=lambda f: f.stat().st_mtime)
    if not folders:
        raise SystemExit(f"loss_curves.py: no TensorBoard log expt/{function}/{run}_*")
    events = EventAccumulator(str(folders[-1]), size_guidance={"scalars": 0})
    events.Reload()
    steps = events.Scalars("train/loss")
    times = np.array([e.wall_time for e in steps])
    losses = np.array([e.value for e in steps])
    # An epoch's time is logged right after its last step: the steps logged up to then are its steps.
    ends = [int(np.searchsorted(times, e.wall_time, side="right")) for e in events.Scalars("train/epoch_seconds")]
    return [losses[start:end] for start, end in zip([0, *ends], ends)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run names (--tb_expt_name)")
    p.add_argument("--every", type=int, default=5, help="epochs per row")
    p.add_argument("--function", default="pretrain", help="pretrain or finetune")
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / "loss_curves.md",
        help="where to write the table (default bench/results/loss_curves.md)",
    )
    args = p.parse_args()
    curves = {run: epoch_losses(args.function, run) for run in args.runs}
    rows = max(len(epochs) for epochs in curves.values())
    lines = ["| epochs | " + " | ".join(args.runs) + " |", "|---" * (len(args.runs) + 1) + "|"]
    for first in range(0, rows, args.every):
        last = min(first + args.every, rows)
        cells = []
        for epochs in curves.values():
            block = np.concatenate([np.empty(0), *epochs[first:last]])
            cells.append(f"{block.mean():.3f}" if len(block) else "-")
        label = f"{first + 1}" if last == first + 1 else f"{first + 1}–{last}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
