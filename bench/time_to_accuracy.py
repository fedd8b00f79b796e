"""Time to accuracy: wall-clock of pretrain -> finetune -> evaluate, and the dev accuracy reached.

    python bench/time_to_accuracy.py vanilla                 # the CPU recipe (--preset cpu)
    python bench/time_to_accuracy.py perceiver --seed 1 --max_epochs 100   # other flags go to run.py pretrain

Runs the three run.py commands as a user would, in a scratch folder
(bench/runs/<name>/), times each one, and appends one JSON line per run to
bench/results/time_to_accuracy.jsonl (config, seconds per step, final pretraining
loss, dev accuracy), the log of the research behind the CPU recipe.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "time_to_accuracy.jsonl"


def timed(cmd: list[str], log: Path) -> tuple[float, str]:
    """Run cmd (output to log); returns (seconds, output). Stops the benchmark if the command fails."""
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    text = log.read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd[1:4])} failed with code {proc.returncode}; see {log}")
    return time.time() - t0, text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variant", choices=["vanilla", "perceiver"], help="which model")
    p.add_argument("--preset", default="cpu", help="run.py --preset for pretraining and finetuning")
    p.add_argument("--seed", type=int, default=0, help="run.py --seed")
    p.add_argument("--name", default=None, help="run folder name (default: variant_preset_seed)")
    args, args.pretrain_flags = p.parse_known_args()  # unknown flags go to run.py pretrain
    name = args.name or f"{args.variant}_{args.preset}_seed{args.seed}"
    out = ROOT / "bench" / "runs" / name
    out.mkdir(parents=True, exist_ok=True)
    run = [sys.executable, "src/run.py"]
    common = [args.variant, "wiki.txt", "--preset", args.preset, "--seed", str(args.seed), "--tb_expt_name", name]
    if args.variant == "perceiver":
        common += ["--bottleneck_dim", "64"]
    pre_params, ft_params = out / "pretrain.params", out / "finetune.params"
    steps = [
        ("pretrain", ["pretrain", *common, "--writing_params_path", str(pre_params), *args.pretrain_flags]),
        ("finetune", ["finetune", *common, "--reading_params_path", str(pre_params),
                      "--writing_params_path", str(ft_params), "--finetune_corpus_path", "birth_places_train.tsv"]),
        ("evaluate", ["evaluate", *common, "--reading_params_path", str(ft_params), "--eval_corpus_path",
                      "birth_dev.tsv", "--outputs_path", str(out / "dev.predictions")]),
    ]  # fmt: skip
    record: dict = {
        "name": name,
        "variant": args.variant,
        "preset": args.preset,
        "seed": args.seed,
        "pretrain_flags": args.pretrain_flags,
        "machine": f"{platform.machine()}, {platform.node()}",
        "started": time.strftime("%Y-%m-%d %H:%M"),
    }
    for step, cmd in steps:
        seconds, text = timed(run + cmd, out / f"{step}.log")
        record[f"{step}_seconds"] = round(seconds, 1)
        print(f"{name}: {step} took {seconds:.0f} s", flush=True)
        if step == "pretrain":
            sidecar = json.loads((out / "pretrain.params.json").read_text())
            record["pretrain_steps"] = sidecar["steps"]
            record["pretrain_final_loss"] = sidecar["final_loss"]
            record["pretrain_config"] = sidecar["trainer"]
        if step == "evaluate":
            m = re.search(r"Correct: ([\d.]+) out of ([\d.]+)", text)
            record["dev_accuracy"] = float(m.group(1)) / float(m.group(2))
    record["total_seconds"] = round(sum(record[f"{s}_seconds"] for s, _ in steps), 1)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(
        f"{name}: dev accuracy {record['dev_accuracy']:.1%} after {record['total_seconds'] / 60:.1f} min "
        f"(pretrain {record['pretrain_seconds'] / 60:.1f} min); appended to {RESULTS}"
    )


if __name__ == "__main__":
    main()
