"""Benchmark AddSub: train our recipe and the course default, score both on the held-out test split, print a
markdown table and write bench/results/addsub.{json,md}.

    python bench/addsub_bench.py                  # about 5 minutes on an idle 2-core CPU
    python bench/addsub_bench.py --skip_ablation  # only the recipe and the course default

recipe: the course architecture with dropout off, batch 128, AdamW lr 2e-3 (200 warm-up steps, cosine),
clipping at 1.0, 60 epochs, the best validation epoch's weights; course default: every default of
AddSubConfig and TrainConfig; ablation: the recipe with the course's dropout 0.2. Wall-clock seconds are
recorded beside the load average before and after; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from addsub import AddSubConfig, AddSubTransformer, TrainConfig, evaluate, load_split, train  # noqa: E402
from utils import write_json_atomic, write_text_atomic  # noqa: E402

RECIPE_TRAIN = TrainConfig(
    epochs=60, batch_size=128, lr=2e-3, warmup_steps=200, lr_schedule="cosine", grad_clip=1.0, seed=0
)
RUNS = {
    "recipe": (AddSubConfig(dropout=0.0), RECIPE_TRAIN),
    "course_default": (AddSubConfig(), TrainConfig()),
    "ablation_recipe_with_dropout_0.2": (AddSubConfig(), RECIPE_TRAIN),
}


def run_one(cfg: AddSubConfig, tcfg: TrainConfig, data: dict, progress: bool) -> dict:
    """Train from seed, score the best-val weights on test; returns the figures."""
    torch.manual_seed(tcfg.seed)
    model = AddSubTransformer(cfg)
    load_before = os.getloadavg()[0]
    summary = train(model, data["train"], data["val"], tcfg, logdir=None, progress=progress)
    test = evaluate(model, *data["test"])
    return {
        "test_exact_match": test["exact_match"],
        "test_token_accuracy": test["token_accuracy"],
        "test_n": test["n"],
        "val_exact_match": summary["val_exact_match"],
        "best_epoch": summary["epoch"],
        "train_seconds": round(summary["train_seconds"], 1),
        "train_cpu_seconds": round(summary["cpu_seconds"], 1),
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "n_params": sum(p.numel() for p in model.parameters()),
        "config": {"model": asdict(cfg), "train": asdict(tcfg)},
    }


def describe(cfg: AddSubConfig, tcfg: TrainConfig) -> str:
    """The differences from the course defaults, in a few words."""
    changes = [f"{k}={v}" for k, v in asdict(cfg).items() if getattr(AddSubConfig(), k) != v]
    changes += [f"{k}={v}" for k, v in asdict(tcfg).items() if getattr(TrainConfig(), k) != v]
    return ", ".join(changes) or "none (course defaults)"


def markdown(results: dict) -> str:
    lines = [
        "| run | changes from the course defaults | test exact-match | test token acc. | best val EM (epoch) | train s, wall | train s, CPU | load avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        m, t = r["config"]["model"], r["config"]["train"]
        lines.append(
            f"| {name} | {describe(AddSubConfig(**m), TrainConfig(**t))} | {r['test_exact_match']:.2%} "
            f"| {r['test_token_accuracy']:.2%} | {r['val_exact_match']:.2%} ({r['best_epoch']}/{t['epochs']}) "
            f"| {r['train_seconds']:.0f} | {r['train_cpu_seconds']:.0f} "
            f"| {r['load_average_1min'][0]:.1f} → {r['load_average_1min'][1]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data_dir", default=str(REPO / "data" / "addsub"), help="folder with the split files")
    p.add_argument("--out_dir", default=str(REPO / "bench" / "results"), help="where addsub.json and addsub.md go")
    p.add_argument("--skip_ablation", action="store_true", help="do not run the recipe with dropout 0.2")
    p.add_argument("--no_progress", action="store_true", help="hide tqdm bars and per-epoch lines")
    args = p.parse_args()

    data = {s: load_split(args.data_dir, s) for s in ("train", "val", "test")}
    results = {}
    for name, (cfg, tcfg) in RUNS.items():
        if args.skip_ablation and name.startswith("ablation"):
            continue
        print(f"== {name}: {describe(cfg, tcfg)}", flush=True)
        results[name] = run_one(cfg, tcfg, data, progress=not args.no_progress)
        print(f"   test exact-match {results[name]['test_exact_match']:.4f}, {results[name]['train_seconds']:.0f}s")

    recipe = results["recipe"]
    report = {
        "test_exact_match": recipe["test_exact_match"],
        "test_token_accuracy": recipe["test_token_accuracy"],
        "train_seconds": recipe["train_seconds"],
        "config": recipe["config"],
        "course_default": results["course_default"],
        "runs": results,
        "machine": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "device": "cpu",
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    table = markdown(results)
    print("\n" + table)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "addsub.json", report)
    header = (
        f"# AddSub benchmark\n\n{report['date']}, torch {torch.__version__}, CPU, {torch.get_num_threads()} threads. "
        "Test split: 1249 held-out expressions; greedy decoding; one seed (0). "
        "Wall seconds include the per-epoch validation decoding and grow when other jobs share the CPU "
        "(1-minute load average before → after each run); CPU seconds are this process's, over its threads.\n\n"
    )
    write_text_atomic(out / "addsub.md", header + table)
    print(f"wrote {out / 'addsub.json'} and {out / 'addsub.md'}")


if __name__ == "__main__":
    main()
