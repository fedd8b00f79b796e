"""Overhead of multi-process training: 1 process vs torchrun with N gloo processes, same global batch.

    python bench/bench_ddp.py                # 12 steps of vanilla pretraining, batch 128, 1 vs 2 processes

Reads the "trained N steps in S s" line that run.py prints (training only, no
start-up), writes bench/results/ddp.json and prints a markdown table. On a
machine with fewer cores than processes x threads this measures contention,
not scaling: that is the point on a 2-core laptop.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from utils import write_json_atomic  # noqa: E402


def seconds_per_step(cmd: list[str], cwd: Path) -> float:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    m = re.search(r"trained (\d+) steps in ([\d.]+) s", proc.stdout)
    if proc.returncode != 0 or not m:
        sys.exit(f"error: {' '.join(cmd[:4])} failed:\n{proc.stderr[-1500:]}")
    return float(m.group(2)) / int(m.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    p.add_argument("--batch_size", type=int, default=128, help="global batch size")
    p.add_argument("--nproc", type=int, default=2, help="torchrun processes")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ddp.json", help="JSON output")
    args = p.parse_args()
    run = [str(ROOT / "src" / "run.py"), "pretrain", "vanilla", str(ROOT / "data" / "wiki.txt")]
    flags = ["--writing_params_path", "p.params", "--max_steps", str(args.steps), "--batch_size", str(args.batch_size)]
    with tempfile.TemporaryDirectory() as tmp:
        one = seconds_per_step([sys.executable, *run, *flags], Path(tmp))
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}"]
        many = seconds_per_step([*torchrun, *run, *flags], Path(tmp))
    result = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "one_process_s_per_step": one,
        f"{args.nproc}_process_s_per_step": many,
        "slowdown": many / one,
    }
    write_json_atomic(args.out, result)
    print(
        f"| processes | s/step (global batch {args.batch_size}) |\n|---|---|\n| 1 | {one:.2f} |\n"
        f"| {args.nproc} (torchrun, gloo) | {many:.2f} ({many / one:.1f}x) |\n\nwritten to {args.out}"
    )


if __name__ == "__main__":
    main()
