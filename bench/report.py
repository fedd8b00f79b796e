"""Compare the runs of run.sh in one markdown table: accuracy, selective accuracy, calibration, time.

    python bench/report.py                  # reads outputs/, writes bench/results/report.md and report.json
    python bench/report.py --runs outputs --gold data/birth_dev.tsv --corpus data/wiki.txt
    python bench/report.py --record --preset cpu --seed 0   # also append the rows to bench/results/runs.jsonl

Reads, per run in run.sh's OUT_DIR: `<run>.dev.predictions`, their scores `<run>.dev.scores.tsv`, the
predictions' sidecar (a reader's place_in_recitation) and `times.txt`; with --record the params' sidecars
(the pretraining's epochs, the reader's finetune). Without predictions a run is "not run"; without scores
it gets accuracy only. Metrics: src/confidence.py.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "bench"))  # research.py (which puts src/ on the path)

import research  # noqa: E402

from dataset import Question, read_questions, read_text  # noqa: E402
from params import read_sidecar  # noqa: E402
from utils import UserError, write_json_atomic, write_text_atomic  # noqa: E402

RUNS_JSONL = REPO_ROOT / "bench" / "results" / "runs.jsonl"


@dataclass
class Run:
    """One row: its label, the file prefix in the run folder, and the run.sh steps timed for it."""

    label: str
    prefix: str  # <prefix>.dev.predictions, <prefix>.dev.scores.tsv
    train_steps: tuple[str, ...]  # times.txt entries summed as training time
    eval_step: str  # times.txt entry (and <eval_step>.log) of the dev evaluation
    protocol: str = "direct"  # or "recite": recite, then answer (src/recite.py)


RUNS = [
    Run("London baseline", "london", (), "london"),
    Run("vanilla, no pretraining", "vanilla.nopretrain", ("vanilla_nopretrain_finetune",), "vanilla_nopretrain_dev"),
    *[
        Run(f"{v}, pretrain + finetune", f"{v}.pretrain", (f"{v}_pretrain", f"{v}_finetune"), f"{v}_pretrain_dev")
        for v in research.VARIANTS
    ],
    *[
        Run(f"{v}, recite then answer", f"{v}.recite", (f"{v}_pretrain", f"{v}_reader"), f"{v}_recite_dev", "recite")
        for v in research.VARIANTS
    ],
]

COLUMNS = [
    ("accuracy", "dev accuracy"),
    ("place_in_recitation", "place in recitation"),
    ("accuracy_at_coverage_50", "accuracy at 50% coverage"),
    ("coverage_auc", "coverage AUC"),
    ("ece", "ECE"),
    ("place_in_document_accuracy", "accuracy, place in document"),
    ("place_not_in_document_accuracy", "accuracy, place not in document"),
    ("train_seconds", "train s"),
    ("eval_seconds", "eval s"),
]


def read_times(path: Path) -> dict[str, float]:
    """times.txt as {step: seconds}; empty when the file is missing."""
    if not path.is_file():
        return {}
    return {name: float(sec) for name, sec in (line.split() for line in read_text(path).splitlines() if line.strip())}


def found_number(found: dict, key: str) -> float:
    """A number of a predictions' sidecar (research.predictions_sidecar); nan where it has none."""
    value = found.get(key)
    return math.nan if value is None else float(value)


def aligned(path: Path, entries: list[Question | None], read: Callable[[Path], list]) -> list:
    """The entries of a per-input-line file at the non-blank questions; its line count must match."""
    values = read(path)
    if len(values) != len(entries):
        raise UserError(f"{path}: {len(values)} lines, but the gold file has {len(entries)}")
    return [v for v, q in zip(values, entries, strict=True) if q is not None]


def run_metrics(
    run: Run, folder: Path, entries: list[Question | None] | None, documents: list[str], times: dict[str, float]
) -> dict[str, float] | None:
    """The row's numbers (nan where unknown), or None when the run has no predictions."""
    predictions_path = folder / f"{run.prefix}.dev.predictions"
    if not predictions_path.is_file():
        return None
    row = {key: math.nan for key, _ in COLUMNS}
    found = research.predictions_sidecar(predictions_path)  # what evaluate found (none for the London baseline)
    questions = [q for q in entries if q is not None] if entries else []
    if questions and questions[0].place is not None:
        predictions = aligned(predictions_path, entries, research.read_lines)
        row["accuracy"] = sum(p == q.place for p, q in zip(predictions, questions, strict=True)) / len(questions)
        scores_path = folder / f"{run.prefix}.dev.scores.tsv"
        if scores_path.is_file():
            scores = aligned(scores_path, entries, research.read_scores_tsv)
            summary = research.research_summary(questions, predictions, scores, documents)
            row |= {k: v for k, v in summary.items() if k in row}
            if not documents:  # without the corpus every question falls in "no document"
                row["place_in_document_accuracy"] = row["place_not_in_document_accuracy"] = math.nan
    else:
        row["accuracy"] = found_number(found, "accuracy")
    if run.train_steps and all(s in times for s in run.train_steps):
        row["train_seconds"] = sum(times[s] for s in run.train_steps)
    row["eval_seconds"] = times.get(run.eval_step, math.nan)
    if run.protocol == "recite":
        row["place_in_recitation"] = found_number(found, "place_in_recitation")
        extra = (run.train_steps[-1], run.eval_step)  # what recite adds to the direct run: the reader, its dev
        if all(s in times for s in extra):
            row["extra_seconds"] = sum(times[s] for s in extra)
    return row


def cell(key: str, value: float) -> str:
    """A number as its column shows it."""
    if math.isnan(value):
        return "-"
    if key.endswith("seconds"):
        return f"{value:.0f}"
    if key in ("coverage_auc", "ece"):
        return f"{value:.3f}"
    return f"{value * 100:.1f}%"


def markdown(rows: dict[str, dict[str, float] | None], folder: Path, split: str, about: str) -> str:
    lines = [
        "# Birth-place runs: accuracy, confidence and time",
        "",
        about,
        "",
        f"From `{folder}` (run.sh's outputs) by `python bench/report.py`. Dev set: birth_dev.tsv.",
        "",
        "| run | protocol | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for run in RUNS:
        row = rows[run.label]
        cells = ["not run"] + [""] * (len(COLUMNS) - 1) if row is None else [cell(k, row[k]) for k, _ in COLUMNS]
        lines.append(f"| {run.label} | {run.protocol} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Answers are ranked by their mean log-probability per character (src/confidence.py: coverage, AUC, ECE).",
        "Place in document: whether the gold place occurs in the person's wiki.txt line (recall versus guessing).",
        "Times: wall-clock seconds of the run.sh steps (train: pretrain + finetune, or + the reader's finetune).",
        "Protocol direct is the handout's; recite answers from the model's recollection of the person",
        "(src/recite.py), and place in recitation is the share of dev recitations holding the gold place:",
        "the ceiling of a reader that copies.",
        "",
    ]
    if split:
        lines += [split, ""]
    return "\n".join(lines)


def document_split(entries: list[Question | None] | None, documents: list[str]) -> str:
    """One sentence: how many dev questions have their place in the person's document."""
    questions = [q for q in entries or [] if q is not None and q.place is not None]
    if not questions or not documents:
        return ""
    found = research.place_in_document(questions, documents)
    return (
        f"Of the {len(questions)} dev questions, {sum(f is True for f in found)} have the place in the person's "
        f"document, {sum(f is False for f in found)} do not, and {sum(f is None for f in found)} have no document."
    )


RECORD_KEYS = {"London baseline": "london", "vanilla, no pretraining": "vanilla_nopretrain"}


def recite_fields(row: dict[str, float]) -> dict[str, float]:
    """A recite row's ceiling and the minutes recite adds to the direct protocol's run."""
    fields = {}
    if not math.isnan(row.get("place_in_recitation", math.nan)):
        fields["place_in_recitation"] = row["place_in_recitation"]
    if "extra_seconds" in row:
        fields["extra_minutes"] = round(row["extra_seconds"] / 60, 1)
    return fields


def record_rows(
    rows: dict[str, dict[str, float] | None], machine: str, folder: Path, preset: str, seed: int, command: str
) -> list[dict]:
    """The runs.jsonl lines of a run folder's finished runs (rows: run_metrics by label): the lines that
    `RECORD=1 bash run.sh` and bench/sweep.py append, and the README's table reads."""
    lines = []
    for run in RUNS:
        row = rows[run.label]
        if row is None or math.isnan(row["accuracy"]):
            continue
        seconds = [row[k] for k in ("train_seconds", "eval_seconds") if not math.isnan(row[k])]
        variant = run.prefix.split(".")[0]
        pretrained = run.prefix.endswith((".pretrain", ".recite"))
        sidecar = read_sidecar(folder / f"{variant}.pretrain.params") if pretrained else None
        used = {"pretrain_epochs": sidecar["epochs_done"]} if sidecar else {}  # fewer than planned if cut short
        if sidecar and "config" in sidecar:  # the settings the cpu recipe has changed in, as the run used them
            used["pretrain_doc_offset"] = sidecar["config"].get("doc_offset", 0)  # 0: without --doc_offset
        reader = read_sidecar(folder / f"{variant}.reader.params") if run.protocol == "recite" else None
        if reader and "config" in reader:
            c = reader["config"]
            used["reader"] = {"max_epochs": c["max_epochs"], "learning_rate": c["finetune_lr"], "dropout": c["dropout"]}
            examples = research.reader_examples(reader)
            if examples is not None:  # the recitations that held their place
                used["reader"]["examples"] = examples
            if research.reader_copies(research.predictions_sidecar(folder / f"{run.prefix}.dev.predictions")):
                used["reader"]["copies"] = True
        lines.append({
            "run": RECORD_KEYS.get(run.label, variant),
            "recipe": "handout" if run.prefix == "london" else preset, "machine": machine,
            "date": datetime.date.today().isoformat(), "seed": seed, "dev_accuracy": row["accuracy"],
            "minutes": round(sum(seconds) / 60, 1), "command": command, **used, "protocol": run.protocol,
            **recite_fields(row),
        })  # fmt: skip
    return lines


def gold_and_documents(gold: Path, corpus: Path) -> tuple[list[Question | None] | None, list[str]]:
    """The dev file's entries (None without the file) and the corpus's documents ([] without it)."""
    entries = read_questions(gold, require_place=False) if gold.is_file() else None
    if entries is None:
        print(f"{gold} not found: accuracy from the predictions' sidecars, no confidence metrics")
    return entries, [line for line in read_text(corpus).split("\n") if line] if corpus.is_file() else []


def folder_rows(
    folder: Path, entries: list[Question | None] | None, documents: list[str]
) -> dict[str, dict[str, float] | None]:
    """run_metrics of every run in a run.sh (or sweep cell) folder, by label."""
    times = read_times(folder / "times.txt")
    return {run.label: run_metrics(run, folder, entries, documents, times) for run in RUNS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="outputs", help="run.sh's output folder")
    p.add_argument("--gold", default=str(REPO_ROOT / "data" / "birth_dev.tsv"), help="dev questions with places")
    p.add_argument("--corpus", default=str(REPO_ROOT / "data" / "wiki.txt"), help="pretraining corpus")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "report.md"), help="markdown table")
    p.add_argument("--preset", default="cpu", help="the recipe run.sh used (for the record)")
    p.add_argument("--seed", type=int, default=0, help="the seed run.sh used (for the record)")
    p.add_argument("--command", default="bash run.sh", help="how the runs were made (for the record)")
    p.add_argument("--record", action="store_true", help="append one line per run to bench/results/runs.jsonl")
    args = p.parse_args(argv)
    machine = research.machine_name(torch.device("cuda:0" if torch.cuda.is_available() else "cpu"))
    about = f"Machine: {machine}. Date: {datetime.date.today().isoformat()}. Command: `{args.command}` (preset {args.preset}, seed {args.seed})."
    folder, gold, corpus = Path(args.runs), Path(args.gold), Path(args.corpus)
    try:
        entries, documents = gold_and_documents(gold, corpus)
        rows = folder_rows(folder, entries, documents)
        text = markdown(rows, folder, document_split(entries, documents), about)
        write_text_atomic(args.out, text)
        numbers = {
            label: row and {k: None if math.isnan(v) else v for k, v in row.items()} for label, row in rows.items()
        }
        write_json_atomic(Path(args.out).with_suffix(".json"), numbers)
        if args.record:
            lines = record_rows(rows, machine, folder, args.preset, args.seed, args.command)
            research.append_jsonl(RUNS_JSONL, lines)
            print(f"{len(lines)} rows appended to {RUNS_JSONL}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
