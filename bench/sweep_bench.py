"""What Ray costs a sweep: the same tiny cells (the direct protocol) run one by one (their run.py steps, no Ray), then as one sweep
on a local Ray with each cell taking every core (one at a time, as the steps ran), in one process.

    python bench/sweep_bench.py                       # 2 variants x 2 seeds; writes bench/results/sweep_overhead.json
    python bench/sweep_bench.py --seeds 0 --out /tmp/o.json

Figures: Ray's start-up (ray.init to ready, and its shutdown), the sweep's wall-clock time against the cells'
one by one, and the difference per cell (the task's submission, scheduling, the files sent back, the rows).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import sweep  # noqa: E402
from research import cpu_flags, machine_name  # noqa: E402

from utils import UserError, write_json_atomic  # noqa: E402

TINY = ["--preset", "handout", "--protocols", "direct", "--pretrain_epochs", "1", "--finetune_epochs", "1"]
TINY += ["--extra=--n_layer 2 --n_head 2 --n_embd 16"]


def one_by_one(cells: list[sweep.Cell], folder: Path) -> float:
    """Seconds to run every cell's steps in turn, as run.sh would, without Ray."""
    start = time.perf_counter()
    for cell in cells:
        out = folder / cell.name
        out.mkdir(parents=True)
        for step in sweep.cell_steps(cell, str(out)):
            sweep.run_step(step, out, ROOT, os.cpu_count())  # as the sweep's cells, which take every core
    return time.perf_counter() - start


def ray_start_up(args: argparse.Namespace) -> tuple[float, float]:
    """Seconds to start a local Ray and to stop it."""
    start = time.perf_counter()
    ray, _ = sweep.start_ray(args)
    started = time.perf_counter()
    ray.shutdown()
    return started - start, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", default=["0", "1"], help="(default: 0 1)")
    p.add_argument("--variants", nargs="+", default=["vanilla", "rope"], help="(default: vanilla rope)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "sweep_overhead.json"), help="the figures")
    args = p.parse_args(argv)
    words = [*TINY, "--variants", *args.variants, "--seeds", *args.seeds]
    try:
        sweep_args = sweep.parse_args(words)
        if problem := next(sweep.check_args(sweep_args), None):
            raise UserError(problem)
        cells = sweep.make_cells(sweep_args, "handout")
        with tempfile.TemporaryDirectory() as tmp:
            alone = one_by_one(cells, Path(tmp) / "alone")
            start_up, shut_down = ray_start_up(sweep_args)
            start = time.perf_counter()
            status = sweep.main([*words, "--out", str(Path(tmp) / "sweep")])
            swept = time.perf_counter() - start
            shutil.rmtree(tmp, ignore_errors=True)
        if status != 0:
            raise UserError(f"the sweep ended with exit code {status}")
        figures = {
            "machine": machine_name(sweep.torch.device("cpu")),
            "cpu_flags": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
            "cores": os.cpu_count(),
            "date": datetime.date.today().isoformat(),
            "command": "python bench/sweep_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "cells": len(cells),
            "one_by_one_seconds": round(alone, 1),
            "sweep_seconds": round(swept, 1),
            "ray_start_seconds": round(start_up, 1),
            "ray_shutdown_seconds": round(shut_down, 1),
            "overhead_per_cell_seconds": round((swept - alone - start_up - shut_down) / len(cells), 1),
        }
        write_json_atomic(args.out, figures)
    except UserError as e:
        print(f"sweep_bench: {e}", file=sys.stderr)
        return 2
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
