"""A confidence-selected ensemble on dev, timed, with the whole cost of its members.

    python bench/ensemble.py --label "rope, seeds 0 and 1" \
        --finetuned A/finetune.params B/finetune.params --pretrained A/pretrain.params B/pretrain.params

Runs `src/run.py evaluate` with the first finetuned model and `--ensemble_params` the
others: each question takes the answer its model is most confident of (highest mean
log-probability per character). Appends one line to bench/results/ensembles.jsonl with
the dev accuracy (from the predictions' sidecar, `<outputs_path>.json`) and the minutes
the ensemble cost: every member's pretraining and finetuning (the `train_seconds` in the
sidecars of its params files) plus the ensemble's evaluation, timed here. The README's
results table shows these lines beside the single models.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "src"))
sys.path.insert(0, str(REPO_ROOT / "bench"))  # research.py

from research import accuracy, cpu_name, predictions_sidecar  # noqa: E402

from params import read_sidecar, sidecar_path  # noqa: E402

ENSEMBLES_JSONL = REPO_ROOT / "bench" / "results" / "ensembles.jsonl"


def sidecar(params: str) -> dict:
    """The JSON sidecar run.py writes beside a params file (params.read_sidecar); exits if there is none."""
    side = read_sidecar(params)
    if side is None:
        sys.exit(f"error: {params} has no sidecar {sidecar_path(params).name}")
    return side


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", required=True, help="what the ensemble is, e.g. 'rope, seeds 0 and 1'")
    p.add_argument("--finetuned", nargs="+", required=True, help="the members' finetuned params files")
    p.add_argument("--pretrained", nargs="+", required=True, help="the params each member was finetuned from")
    p.add_argument("--outputs_path", required=True, help="where the ensemble's dev predictions go")
    p.add_argument("--gold", default="birth_dev.tsv", help="dev questions with places")
    p.add_argument("--corpus", default="wiki.txt", help="the pretraining corpus (defines the vocabulary)")
    args = p.parse_args(argv)
    if len(args.finetuned) != len(args.pretrained):
        sys.exit("error: --finetuned and --pretrained must name the same number of files")
    members = [sidecar(f) for f in args.finetuned]
    first = members[0]
    cmd = [sys.executable, str(REPO_ROOT / "src" / "run.py"), "evaluate", first["variant"], args.corpus]
    cmd += [f"--{size}={first[size]}" for size in ("n_layer", "n_head", "n_embd")]  # the first member's shape
    if first["variant"] == "perceiver":
        cmd += ["--bottleneck_dim", str(first["bottleneck_dim"])]
    cmd += ["--reading_params_path", args.finetuned[0], "--eval_corpus_path", args.gold,
            "--outputs_path", args.outputs_path]  # fmt: skip
    if len(args.finetuned) > 1:
        cmd += ["--ensemble_params", *args.finetuned[1:]]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.time() - t0
    if done.returncode != 0:
        sys.exit(f"error: evaluate failed: {done.stderr.strip().splitlines()[-1]}")
    dev_accuracy = accuracy(predictions_sidecar(args.outputs_path))
    if dev_accuracy is None:
        sys.exit(f"error: {args.gold} gives no places to score, or evaluate wrote no {args.outputs_path}.json")
    training = sum(sidecar(pre)["train_seconds"] for pre in args.pretrained) + sum(m["train_seconds"] for m in members)
    line = {
        "label": args.label,
        "variants": sorted({m["variant"] for m in members}),
        "members": len(members),
        "finetuned": args.finetuned,
        "machine": cpu_name(),
        "date": datetime.date.today().isoformat(),
        "dev_accuracy": dev_accuracy,
        "training_minutes": round(training / 60, 1),
        "evaluate_seconds": round(seconds, 1),
        "minutes": round((training + seconds) / 60, 1),
    }
    with open(ENSEMBLES_JSONL, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    print(
        f"{args.label}: {line['dev_accuracy']:.1%} dev, {line['minutes']:.0f} minutes in all; appended to {ENSEMBLES_JSONL}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
