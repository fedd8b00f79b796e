"""Where a recite reader's dev answers go wrong, question by question.

    python bench/recite_errors.py outputs vanilla          # a run.sh output folder and a variant
    python bench/recite_errors.py outputs vanilla --copy   # answers decoded as spans of the recitation

Reads OUT/VARIANT.reader.params and OUT/VARIANT.recite.dev.predictions, recomputes the dev
recitations with the pretrained params the reader recites with (greedy decoding is deterministic,
so they are the ones the reader read), sorts every dev question into one of ERROR_KINDS, prints the
counts and appends them, with the machine and the command, to bench/results/recite_errors.jsonl.
With --copy the reader answers again, each answer constrained to a span of its recitation
(decode.copying), in place of the predictions file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from research import cpu_name, person_documents  # noqa: E402

from config import BLOCK_SIZE, RunConfig, build_model  # noqa: E402
from dataset import CharCorruptionDataset, Question, Vocabulary, read_questions, read_text  # noqa: E402
from decode import predict  # noqa: E402
from params import load_params, read_sidecar  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "recite_errors.jsonl"

# Every dev question is one of these, in this order of checks.
ERROR_KINDS = {
    "right": "the reader answered the gold place",
    "held_answered_another_place_in_it": "the recitation holds the place; the reader copied another span of it",
    "held_answered_a_place_not_in_it": "the recitation holds the place; the reader answered something it does not hold",
    "place_not_in_document": "the place is in none of the person's pretraining documents",
    "place_past_the_recitation": "the recitation follows a document faithfully but ends before its place",
    "recitation_left_the_document": "the recitation departs from every document of the person before the place",
}


def reader_command(reader: Path) -> tuple[RunConfig, Vocabulary, torch.device]:
    """The settings, vocabulary and device with which `run.py evaluate` would read `reader` (decoding
    puts the model in eval mode: its dropout setting plays no part)."""
    import run

    side = read_sidecar(reader)
    vocab = CharCorruptionDataset(read_text(ROOT / "data" / "wiki.txt"), BLOCK_SIZE).vocab
    argv = ["evaluate", side["variant"], "wiki.txt", "--reading_params_path", str(reader)]
    return run.command_config(argv), vocab, torch.device("cuda" if torch.cuda.is_available() else "cpu")


Command = tuple[RunConfig, Vocabulary, torch.device]


def dev_recitations(reader: Path, questions: list[Question], command: Command) -> list[str]:
    """The recitations the reader at `reader` reads for `questions`, recomputed with its pretrained params
    (`command`: reader_command(reader))."""
    import answers  # the model the command line builds

    args, vocab, device = command
    return answers.recitations(args, vocab, questions, answers.reader_link(str(reader)), device, "dev")


def reader_answers(reader: Path, recitations: list[str], copy: bool, command: Command) -> list[str]:
    """The reader's greedy answers to `recitations`; with `copy`, each a span of its recitation."""
    args, vocab, device = command
    model = build_model(args, len(vocab))
    load_params(model, vocab, str(reader))
    return predict(model.to(device), vocab, recitations, device, copy=copy)


def error_kind(question: Question, recitation: str, prediction: str, documents: Sequence[str]) -> str:
    """Which key of ERROR_KINDS a dev answer is; `documents` sorted, as person_documents needs."""
    place = question.place
    if prediction == place:
        return "right"
    if place in recitation:
        copied = prediction and prediction in recitation
        return "held_answered_another_place_in_it" if copied else "held_answered_a_place_not_in_it"
    mine = [d for d in person_documents(question, documents) if place in d]
    if not mine:
        return "place_not_in_document"
    faithful = any(d.startswith(recitation) or recitation.startswith(d) for d in mine)
    return "place_past_the_recitation" if faithful else "recitation_left_the_document"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir", type=Path, help="a run.sh output folder")
    p.add_argument("variant", help="vanilla, perceiver or rope")
    p.add_argument("--copy", action="store_true", help="decode the answers again, each a span of its recitation")
    args = p.parse_args()
    reader = args.out_dir / f"{args.variant}.reader.params"
    predictions_path = args.out_dir / f"{args.variant}.recite.dev.predictions"
    side = read_sidecar(reader)
    if side is None or not predictions_path.is_file():
        sys.exit(f"error: {reader} (with its sidecar) or {predictions_path} not found")
    questions = [q for q in read_questions(ROOT / "data" / "birth_dev.tsv", require_place=True) if q is not None]
    command = reader_command(reader)
    recitations = dev_recitations(reader, questions, command)
    if args.copy:
        predictions = reader_answers(reader, recitations, copy=True, command=command)
    else:
        predictions = predictions_path.read_text(encoding="utf-8").split("\n")[: len(questions)]
    documents = sorted(read_text(ROOT / "data" / "wiki.txt").splitlines())
    kinds = Counter(
        error_kind(q, r, pred, documents) for q, r, pred in zip(questions, recitations, predictions, strict=True)
    )
    record = {"out_dir": str(args.out_dir), "variant": args.variant, "questions": len(questions), "copy": args.copy}
    record |= {"recite_chars": side.get("recite_chars"), "machine": cpu_name()}
    record |= {"started": time.strftime("%Y-%m-%d %H:%M"), "command": shlex.join(["python", *sys.argv])}
    record["kinds"] = {k: kinds.get(k, 0) for k in ERROR_KINDS}
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    for key, text in ERROR_KINDS.items():
        print(f"{kinds.get(key, 0):4d}  {text}")
    print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
