"""Does a time budget hold on a busy machine? The same pretraining, alone and with a competitor.

    python bench/bench_budget.py                       # 10 minutes, a competitor for the first 3
    python bench/bench_budget.py --budget_minutes 1 --busy_minutes 0.3 --out /tmp/budget.jsonl   # a rehearsal

Runs `run.py pretrain vanilla wiki.txt --preset cpu --budget_minutes B` twice, as a user would:
undisturbed, then with a CPU-bound process (one busy Python loop) started beside it and stopped
after --busy_minutes. For each run it reads the params sidecar: epochs trained and planned, training
seconds, the last step's learning rate, how often the plan moved by a whole epoch, and the changes of
thread count (under a budget on a CPU the trainer keeps the faster of all threads and half of them). It appends one line
to bench/results/budget.jsonl: whether each run ended inside the budget (within 5%), annealed (the
last step at the schedule's floor, 0.1 of the peak), and the disturbed run's epochs as a share of the
undisturbed run's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from research import cpu_name  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "budget.jsonl"
BUSY_LOOP = "while True: pass"


def pretrain(work: Path, name: str, budget_minutes: float, busy_minutes: float) -> dict:
    """One budgeted pretraining, with a competitor for its first busy_minutes (0: none); its figures."""
    params = work / f"{name}.params"
    cmd = [sys.executable, "src/run.py", "pretrain", "vanilla", "wiki.txt", "--preset", "cpu",
           "--budget_minutes", str(budget_minutes), "--writing_params_path", str(params),
           "--tb_expt_name", f"budget_{name}"]  # fmt: skip
    log = work / f"{name}.log"
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy_minutes > 0 else None
        while proc.poll() is None:
            if busy is not None and time.time() - t0 >= busy_minutes * 60:
                busy.kill()
                busy.wait()
                busy = None
            time.sleep(0.5)
        if busy is not None:
            busy.kill()
    if proc.returncode != 0:
        sys.exit(f"error: the {name} pretraining failed; see {log}")
    return run_figures(json.loads(Path(f"{params}.json").read_text(encoding="utf-8")), time.time() - t0)


def run_figures(side: dict, wall_seconds: float) -> dict:
    """A budgeted pretraining's figures, from its params sidecar (run.py's run record and resolved config)."""
    return {
        "epochs": side["epochs_done"],
        "planned_epochs": side["planned_epochs"],
        "train_seconds": round(side["train_seconds"], 1),
        "wall_seconds": round(wall_seconds, 1),
        "last_lr_share_of_peak": round(side["final_lr"] / side["config"]["pretrain_lr"], 3) if side["steps"] else None,
        "replans": side["replans"],
        "thread_switches": side["thread_switches"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budget_minutes", type=float, default=10.0, help="the pretraining's --budget_minutes")
    p.add_argument("--busy_minutes", type=float, default=3.0, help="how long the competitor runs")
    p.add_argument("--out", type=Path, default=RESULTS, help="the jsonl file to append the line to")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        alone = pretrain(work, "alone", args.budget_minutes, 0.0)
        busy = pretrain(work, "busy", args.budget_minutes, args.busy_minutes)
    budget = args.budget_minutes * 60
    record = {
        "machine": cpu_name(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["python", "bench/bench_budget.py", *sys.argv[1:]]),
        "budget_minutes": args.budget_minutes,
        "busy_minutes": args.busy_minutes,
        "alone": alone,
        "busy": busy,
        "epochs_share": round(busy["epochs"] / alone["epochs"], 3),
    }
    for run in (alone, busy):
        run["within_5_percent"] = abs(run["train_seconds"] - budget) <= 0.05 * budget
        run["annealed"] = run["last_lr_share_of_peak"] is not None and run["last_lr_share_of_peak"] <= 0.101
    with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=1))
    print(f"appended to {args.out}")


if __name__ == "__main__":
    main()
