"""One params file that recites and answers in one decoding, against the two-file recite protocol.

    python bench/recite_onefile.py vanilla_cpu_seed0                 # loss on the place only
    python bench/recite_onefile.py vanilla_cpu_seed0 --loss all      # loss on the recitation and the place

The product's recite protocol keeps two files: the pretrained params recite "X." and a reader reads
the place out of the recitation. Here one model, finetuned from the same pretrained params (the
reader's finetune: 10 epochs at 6e-4, dropout 0.1), is trained on

    Where was X born?<MASK>X. <the pretrained model's recitation><MASK>place<MASK>

with the loss on the place (--loss place), or on the recitation as well (--loss all, which also
teaches it to recite after the question). It answers a dev question by continuing
"Where was X born?<MASK>X." itself (never MASK or PAD) to TOTAL_CHARS characters, then the place
after a MASK. The question takes room in the block, so its recitation is shorter than the
two-file protocol's 100 characters: TOTAL_CHARS in all, question included.

Reads bench/runs/NAME/pretrain.params (bench/time_to_accuracy.py), writes its files beside them, and
appends one line to bench/results/recite_onefile.jsonl: dev accuracy, the share of its own dev
recitations holding the gold place, and the minutes taken.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from research import cpu_name  # noqa: E402
from time_to_accuracy import common_flags, timed  # noqa: E402

import recite  # noqa: E402
import run  # noqa: E402
from config import BLOCK_SIZE, build_model  # noqa: E402
from dataset import MASK_CHAR, PAD_CHAR, CharCorruptionDataset, read_questions, read_text  # noqa: E402
from decode import continue_text  # noqa: E402
from params import load_params, read_sidecar  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "recite_onefile.jsonl"
TOTAL_CHARS = BLOCK_SIZE - recite.ANSWER_ROOM  # question, MASK and recitation; the place and 2 MASKs after


def load(params: Path, device: torch.device):
    """(model in eval mode on device, vocabulary) for a params file with its sidecar."""
    side = read_sidecar(params)
    args = run.make_parser().parse_args(["evaluate", side["variant"], "wiki.txt", "--reading_params_path", str(params)])
    run.apply_preset(args)
    args.dropout = 0.0
    vocab = CharCorruptionDataset(read_text(ROOT / "data" / "wiki.txt"), BLOCK_SIZE).vocab
    model = build_model(args, len(vocab))
    load_params(model, vocab, str(params))
    return model.to(device).eval(), vocab


def prompt(question: str) -> str:
    """'Where was X born?' -> 'Where was X born?<MASK>X.': what the one-file model continues."""
    return question + MASK_CHAR + recite.recitation_prompt(question, "question")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("name", help="a bench/runs/NAME folder of bench/time_to_accuracy.py")
    p.add_argument("--loss", choices=["place", "all"], default="place", help="what the finetune's loss covers")
    p.add_argument("--max_epochs", default="10", help="the finetune's epochs (the reader's 10)")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = ROOT / "bench" / "runs" / args.name
    pretrained = work / "pretrain.params"
    side = read_sidecar(pretrained)
    if side is None:
        sys.exit(f"error: {pretrained} (with its sidecar) not found")
    variant, seed = side["variant"], side["trainer"]["seed"]
    tag = f"onefile_{args.loss}"
    t0 = time.time()

    # The training examples: each person's question, then the pretrained model's recitation, cut to fit.
    train = [q for q in read_questions(ROOT / "data" / "birth_places_train.tsv", require_place=True) if q]
    model, vocab = load(pretrained, device)
    recitations = recite.recite(model, vocab, train, recite.RECITE_CHARS, device, "train")
    lines = []
    for q, r in zip(train, recitations, strict=True):
        r = r[: min(TOTAL_CHARS, BLOCK_SIZE - 2 - len(q.place)) - len(q.text) - 1]  # a long place takes more room
        if args.loss == "place":  # question<MASK>recitation TAB place: the loss starts at the second MASK
            lines.append(f"{q.text}{MASK_CHAR}{r}\t{q.place}\n")
        else:  # question TAB recitation<MASK>place: the loss covers the recitation too
            lines.append(f"{q.text}\t{r}{MASK_CHAR}{q.place}\n")
    train_tsv = work / f"{tag}.train.tsv"
    train_tsv.write_text("".join(lines), encoding="utf-8")

    params = work / f"{tag}.params"
    common = common_flags(variant, "cpu", seed, f"{tag}_{args.name}", side.get("bottleneck_dim") or 64)
    finetune = [sys.executable, "src/run.py", "finetune", *common, "--reading_params_path", str(pretrained),
                "--writing_params_path", str(params), "--finetune_corpus_path", str(train_tsv),
                "--finetune_lr", "6e-4", "--dropout", "0.1", "--max_epochs", args.max_epochs]  # fmt: skip
    finetune_seconds, _ = timed(finetune, work / f"{tag}.finetune.log")

    # One decoding per dev question: the finetuned model recites after the question, then answers.
    t1 = time.time()
    dev = [q for q in read_questions(ROOT / "data" / "birth_dev.tsv", require_place=True) if q]
    model, vocab = load(params, device)
    contexts = continue_text(model, vocab, [prompt(q.text) for q in dev], TOTAL_CHARS, [MASK_CHAR, PAD_CHAR], device)
    contexts = [c.replace("\t", " ").replace("\n", " ") for c in contexts]
    held = [q.place in c[len(q.text) + 1 :] for q, c in zip(dev, contexts, strict=True)]
    dev_tsv = work / f"{tag}.dev.tsv"
    dev_tsv.write_text("".join(f"{c}\t{q.place}\n" for q, c in zip(dev, contexts, strict=True)), encoding="utf-8")
    evaluate = [sys.executable, "src/run.py", "evaluate", *common, "--reading_params_path", str(params),
                "--eval_corpus_path", str(dev_tsv), "--outputs_path", str(work / f"{tag}.dev.predictions")]  # fmt: skip
    _, output = timed(evaluate, work / f"{tag}.dev.log")
    dev_seconds = time.time() - t1
    m = re.search(r"Correct: ([\d.]+) out of ([\d.]+)", output)
    accuracy = float(m.group(1)) / float(m.group(2))
    record = {
        "name": args.name, "variant": variant, "seed": seed, "protocol": "recite, one file", "loss": args.loss,
        "machine": torch.cuda.get_device_name() if device.type == "cuda" else cpu_name(),
        "started": time.strftime("%Y-%m-%d %H:%M"), "command": shlex.join(["python", *sys.argv]),
        "pretrain_epochs": side["epochs_done"], "pretrain_doc_offset": side["doc_offset"],
        "total_chars": TOTAL_CHARS, "dev_accuracy": round(accuracy, 4),
        "place_in_recitation_dev": round(sum(held) / len(held), 4),
        "finetune_seconds": round(finetune_seconds, 1), "dev_seconds": round(dev_seconds, 1),
        "minutes": round((time.time() - t0) / 60, 2),
    }  # fmt: skip
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    print(f"{args.name} one file, loss on {args.loss}: {accuracy:.1%} dev (place in {record['place_in_recitation_dev']:.1%}"
          f" of its recitations), {record['minutes']} min; appended to {RESULTS}")  # fmt: skip


if __name__ == "__main__":
    main()
