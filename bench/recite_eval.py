"""Recite, then answer, on a pretrained model of bench/time_to_accuracy.py: the reader's finetune, dev
and test answers, and where the errors come from.

    python bench/recite_eval.py vanilla_cpu_seed0                       # the cpu preset's reader
    python bench/recite_eval.py vanilla_cpu_seed0 --tag handout -- --finetune_lr 6e-4 --dropout 0.1 --max_epochs 10
    python bench/recite_eval.py vanilla_cpu_seed0 --tag c60 -- --recite_chars 60

Reads bench/runs/NAME/pretrain.params (and, for the direct answer of the same pretrained model,
the sidecar of NAME's dev.predictions), runs the user's commands (run.py finetune --recite, then
run.py evaluate on dev and test), and appends one line with "protocol": "recite" to
bench/results/recite.jsonl: the dev accuracy, the share of dev recitations holding the gold place
(the ceiling of a reader that copies), the reader's accuracy on each side of that split, the
accuracy of the 10% most confident answers, the recitations the reader trained on (from its
sidecar), and the minutes recite adds to a run (the reader's finetune and the dev evaluation).
Flags after `--` go to run.py finetune.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from recite_errors import dev_recitations, reader_command  # noqa: E402
from research import (  # noqa: E402
    accuracy,
    cpu_name,
    predictions_sidecar,
    read_scores_tsv,
    reader_copies,
    reader_examples,
)
from time_to_accuracy import common_flags, timed  # noqa: E402

from confidence import evaluation_summary  # noqa: E402
from dataset import read_questions  # noqa: E402
from params import read_sidecar  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "recite.jsonl"


def error_split(work: Path, reader: Path, questions: list, predictions: list[str]) -> dict:
    """The reader's accuracy where the dev recitation holds the gold place and where it does not
    (recitations recomputed with the reader's own pretrained params: decoding is deterministic)."""
    texts = dev_recitations(reader, questions, reader_command(reader))
    (work / "dev.recitations").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    held = [q.place in t for q, t in zip(questions, texts, strict=True)]
    right = [p == q.place for p, q in zip(predictions, questions, strict=True)]
    inside = [r for h, r in zip(held, right, strict=True) if h]
    outside = [r for h, r in zip(held, right, strict=True) if not h]
    return {
        "place_in_recitation_dev": round(sum(held) / len(held), 4),
        "accuracy_place_in_recitation": round(sum(inside) / max(1, len(inside)), 4),
        "accuracy_place_not_in_recitation": round(sum(outside) / max(1, len(outside)), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("name", help="a bench/runs/NAME folder of bench/time_to_accuracy.py")
    p.add_argument("--tag", default="cpu", help="names this reader's files in the run folder")
    p.add_argument("--preset", default="cpu", help="run.py --preset of the reader's finetune")
    args, extra = p.parse_known_args()
    args.finetune_flags = extra[1:] if extra[:1] == ["--"] else extra  # after --: more run.py finetune flags
    work = ROOT / "bench" / "runs" / args.name
    pretrained = work / "pretrain.params"
    side = read_sidecar(pretrained)
    if side is None:
        sys.exit(f"error: {pretrained} (with its sidecar) not found")
    variant, seed = side["variant"], side["config"]["seed"]
    common = common_flags(variant, args.preset, seed, f"recite_{args.name}", side.get("bottleneck_dim") or 64)
    reader = work / f"reader_{args.tag}.params"
    run = [sys.executable, "src/run.py"]
    finetune = ["finetune", *common, "--reading_params_path", str(pretrained), "--writing_params_path", str(reader),
                "--finetune_corpus_path", "birth_places_train.tsv", "--recite", *args.finetune_flags]  # fmt: skip
    outputs = {split: work / f"recite_{args.tag}.{split}.predictions" for split in ("dev", "test")}
    evaluate = {
        split: ["evaluate", *common, "--reading_params_path", str(reader), "--eval_corpus_path", tsv,
                "--outputs_path", str(outputs[split])] + (["--scores_path", str(work / f"recite_{args.tag}.dev.scores.tsv")] if split == "dev" else [])
        for split, tsv in (("dev", "birth_dev.tsv"), ("test", "birth_test_inputs.tsv"))
    }  # fmt: skip
    record = {"name": args.name, "variant": variant, "seed": seed, "protocol": "recite"}
    record["machine"] = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    record["threads"] = torch.get_num_threads()
    record |= {
        "preset": args.preset,
        "finetune_flags": args.finetune_flags,
        "pretrain_preset": side["config"]["preset"],
    }
    record["started"] = time.strftime("%Y-%m-%d %H:%M")
    record["command"] = shlex.join(["python", "bench/recite_eval.py", *sys.argv[1:]])
    record["reader_seconds"] = round(timed(run + finetune, work / f"reader_{args.tag}.log")[0], 1)
    reader_side = read_sidecar(reader)
    record["reader_examples"] = reader_examples(reader_side)
    record["recite_dev_seconds"] = timed(run + evaluate["dev"], work / f"recite_{args.tag}.dev.log")[0]
    record["reader_copies"] = reader_copies(predictions_sidecar(outputs["dev"]))
    record["recite_test_seconds"] = round(timed(run + evaluate["test"], work / f"recite_{args.tag}.test.log")[0], 1)
    record["recite_chars"] = reader_side["recite_chars"]
    c = reader_side["config"]
    record["reader_config"] = {"learning_rate": c["finetune_lr"], "max_epochs": c["max_epochs"],
                               "dropout": c["dropout"], "batch_size": c["batch_size"]}  # fmt: skip
    record["pretrain_seconds"], record["pretrain_epochs"] = side["train_seconds"], side["epochs_done"]
    record["pretrain_doc_offset"] = side["config"]["doc_offset"]
    record["direct_dev_accuracy"] = accuracy(predictions_sidecar(work / "dev.predictions"))
    entries = read_questions(ROOT / "data" / "birth_dev.tsv", require_place=True)
    questions = [q for q in entries if q is not None]
    predictions = outputs["dev"].read_text(encoding="utf-8").split("\n")[: len(questions)]
    scores = [s for s in read_scores_tsv(work / f"recite_{args.tag}.dev.scores.tsv") if s is not None]
    summary = evaluation_summary(questions, predictions, scores)
    record["dev_accuracy"] = summary["accuracy"]
    record["accuracy_at_coverage_10"] = summary["accuracy_at_coverage_10"]
    record |= error_split(work, reader, questions, predictions)
    record["recite_dev_seconds"] = round(record["recite_dev_seconds"], 1)
    record["extra_minutes"] = round((record["reader_seconds"] + record["recite_dev_seconds"]) / 60, 1)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(
        f"{args.name} ({args.tag} reader): direct {record['direct_dev_accuracy']}, recite {record['dev_accuracy']:.1%} "
        f"(place in {record['place_in_recitation_dev']:.1%} of the recitations; right on "
        f"{record['accuracy_place_in_recitation']:.1%} of those, {record['accuracy_place_not_in_recitation']:.1%} of "
        f"the others), +{record['extra_minutes']} min; appended to {RESULTS}"
    )


if __name__ == "__main__":
    main()
