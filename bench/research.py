"""Helpers of the research scripts in bench/: the machine's description for benchmark records,
what run.py recorded of a run (the predictions' and the params' JSON sidecars, the TensorBoard log),
reading the answer scores `evaluate --scores_path` writes, and the recall split (is the gold
place in the person's pretraining document, and how often are those answers right?)."""

from __future__ import annotations

import bisect
import math
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from confidence import AnswerScore, evaluation_summary, person_name  # noqa: E402
from dataset import Question, read_text  # noqa: E402
from params import read_sidecar  # noqa: E402
from utils import UserError, cpu_info  # noqa: E402


def cpu_name() -> str:
    """The CPU's model name, family and model numbers, its vector capability and whether it has bf16
    matmuls, for benchmark records: speeds differ by CPU, and CPUs of one name may differ in all of
    these (three machines here called themselves "AMD EPYC": one with AVX512-BF16, one with AVX2 only,
    and "AMD EPYC [family 23, model 1] (AVX2, no bf16)", a first-generation Zen, half as fast again)."""
    info = cpu_info()
    name = info.get("model name", platform.processor() or platform.machine())
    if "cpu family" in info and "model" in info:
        name = f"{name} [family {info['cpu family']}, model {info['model']}]"
    bf16 = "bf16" if {"avx512_bf16", "amx_bf16"} & set(info.get("flags", "").split()) else "no bf16"
    return f"{name} ({torch.backends.cpu.get_cpu_capability()}, {bf16})"


def predictions_sidecar(predictions: str | Path) -> dict:
    """What `run.py evaluate --outputs_path P` found, from the predictions' sidecar P.json: the counts
    ("questions", "with_places", "correct"), "accuracy" and the selective metrics where places were
    given, "place_in_recitation" for a recite reader, "seconds" and the resolved "config"; {} when
    there is no sidecar (evaluations before it was written, the London baseline)."""
    return read_sidecar(predictions) or {}


def accuracy(found: dict) -> float | None:
    """correct / with_places of a predictions' sidecar (predictions_sidecar); None without places."""
    return found["correct"] / found["with_places"] if found.get("with_places") else None


def reader_examples(reader: dict) -> int | None:
    """How many recitations a recite reader trained on, from its params' sidecar: those that held their
    place (every one when none did); None for readers trained before the sidecar recorded them."""
    recitations = reader.get("recitations")
    return None if recitations is None else recitations["kept"] or recitations["people"]


def reader_copies(found: dict) -> bool:
    """Whether a recite reader's answers were spans of their recitations, from its dev evaluation's
    predictions sidecar: evaluate has written that sidecar only since a reader's answers are held to
    spans, and records "place_in_recitation" in it for a reader alone (readers evaluated before decoded
    freely, or left no sidecar to tell)."""
    return "place_in_recitation" in found


class LoggedEpochs:
    """Epochs a run.py training has finished so far, from its TensorBoard log: the step of the last
    train/epoch_seconds scalar (the trainer logs one per epoch, at the number of epochs done). The log is
    the newest folder `<logs>/<prefix>_*` written since `since` (a time), read on from where the last call
    left off; 0 until there is one."""

    def __init__(self, logs: Path, prefix: str, since: float):
        self.logs, self.prefix, self.since = logs, prefix, since
        self.events = None

    def __call__(self) -> int:
        if self.events is None:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            folders = [f for f in self.logs.glob(f"{self.prefix}_*") if f.stat().st_mtime >= self.since]
            if not folders:
                return 0
            newest = max(folders, key=lambda f: f.stat().st_mtime)
            self.events = EventAccumulator(str(newest), size_guidance={"scalars": 0})
        self.events.Reload()
        if "train/epoch_seconds" not in self.events.Tags()["scalars"]:
            return 0
        return self.events.Scalars("train/epoch_seconds")[-1].step


def tensorboard_prefix(argv: list[str]) -> str:
    """The name before the time stamp of the TensorBoard folders that `run.py ARGV` writes under
    expt/<function>/ (logs.run_folder): <tb_expt_name>_<variant>_<role>_seed<seed>."""
    from logs import run_role
    from run import resolved_config  # the command's settings, resolved as run.py resolves them

    config = resolved_config(argv)
    return f"{config.tb_expt_name}_{config.variant}_{run_role(config)}_seed{config.seed}"


def read_scores_tsv(path: str | Path) -> list[AnswerScore | None]:
    """Read a file written by `scores_tsv`: one entry per line, None for a blank line."""
    lines = read_text(path).split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line
    out: list[AnswerScore | None] = []
    for n, line in enumerate(lines, start=1):
        if not line:
            out.append(None)
            continue
        fields = line.split("\t")
        try:
            out.append(AnswerScore(fields[0], float(fields[1]), float(fields[2]), 0))
        except (IndexError, ValueError):
            raise UserError(f"{path}:{n}: expected 'prediction<TAB>logprob<TAB>mean_logprob', got {line!r}") from None
    return out


def person_documents(question: Question, documents: Sequence[str]) -> list[str]:
    """The corpus lines of the question's person: those starting with their name and a full stop
    ("Ada Lovelace. ..."). `documents` must be sorted; [] when the question names no one."""
    name = person_name(question.text)
    if name is None:
        return []
    prefix = name + "."
    i = bisect.bisect_left(documents, prefix)
    mine = []
    while i < len(documents) and documents[i].startswith(prefix):
        mine.append(documents[i])
        i += 1
    return mine


def place_in_document(questions: Sequence[Question], documents: Sequence[str]) -> list[bool | None]:
    """For each question: whether its gold place occurs in any of the person's pretraining documents
    (person_documents); None when no document is found (or the question names no one)."""
    docs = sorted(documents)
    out: list[bool | None] = []
    for q in questions:
        mine = person_documents(q, docs) if q.place is not None else []
        out.append(any(q.place in d for d in mine) if mine else None)
    return out


RECALL_GROUPS = {True: "place_in_document", False: "place_not_in_document", None: "no_document"}


def recall_split(in_document: Sequence[bool | None], correct: Sequence[bool]) -> dict[str, float]:
    """Count and accuracy of the questions whose place is / is not in the person's document / have none.

    Keys `<group>_count` and `<group>_accuracy` (nan for an empty group).
    """
    metrics: dict[str, float] = {}
    for key, group in RECALL_GROUPS.items():
        hits = [ok for d, ok in zip(in_document, correct, strict=True) if d is key]
        metrics[f"{group}_count"] = float(len(hits))
        metrics[f"{group}_accuracy"] = sum(hits) / len(hits) if hits else math.nan
    return metrics


def research_summary(
    questions: Sequence[Question], predictions: Sequence[str], scores: Sequence[AnswerScore], documents: Sequence[str]
) -> dict[str, float]:
    """evaluation_summary's metrics and the recall split by the people's pretraining `documents`."""
    correct = [p == q.place for p, q in zip(predictions, questions, strict=True)]
    summary = evaluation_summary(questions, predictions, scores)
    return summary | recall_split(place_in_document(questions, documents), correct)
