"""Helpers of the research scripts in bench/: the machine's description for benchmark records,
reading the answer scores `evaluate --scores_path` writes, and the recall split (is the gold
place in the person's pretraining document, and how often are those answers right?)."""

from __future__ import annotations

import bisect
import contextlib
import math
import platform
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from answers import COPYING_NOTE  # noqa: E402
from confidence import AnswerScore, evaluation_summary, person_name  # noqa: E402
from dataset import Question, read_text  # noqa: E402
from utils import UserError, bf16_supported  # noqa: E402


def cpu_info(path: str | Path = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "cpu family", "model", "flags", ...);
    empty where there is no such file."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name() -> str:
    """The CPU's model name, family and model numbers, its vector capability and whether it has bf16
    matmuls, for benchmark records: speeds differ by CPU, and CPUs of one name may differ in all of
    these (three machines here called themselves "AMD EPYC": one with AVX512-BF16, one with AVX2 only,
    and "AMD EPYC [family 23, model 1] (AVX2, no bf16)", a first-generation Zen, half as fast again)."""
    info = cpu_info()
    name = info.get("model name", platform.processor() or platform.machine())
    if "cpu family" in info and "model" in info:
        name = f"{name} [family {info['cpu family']}, model {info['model']}]"
    bf16 = "bf16" if bf16_supported(torch.device("cpu")) else "no bf16"
    return f"{name} ({torch.backends.cpu.get_cpu_capability()}, {bf16})"


def reader_examples(log: str | Path) -> int | None:
    """How many recitations a recite reader trained on, from its finetune's log (None: no such line, as
    in the logs of readers that trained on every recitation)."""
    path = Path(log)
    found = re.search(r"the reader trains on the (\d+) recitations", path.read_text()) if path.is_file() else None
    return int(found.group(1)) if found else None


def reader_copies(log: str | Path) -> bool:
    """Whether a recite reader's answers were spans of their recitations, from its dev evaluation's log
    (readers evaluated before answers were constrained so decoded freely)."""
    path = Path(log)
    return path.is_file() and f"of the recitations {COPYING_NOTE}" in path.read_text()


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
