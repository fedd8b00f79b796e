"""Helpers of the bench/ scripts: the machine's description, its matmul peak, FLOP counting and JSON-lines
rows for benchmark records; what run.py recorded of a run (the predictions' and params' sidecars, the
TensorBoard log); the answer scores `evaluate --scores_path` writes; the recall split (is the gold place in
the person's pretraining document, and how often are those answers right?)."""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from confidence import AnswerScore, evaluation_summary  # noqa: E402
from dataset import Question, read_text  # noqa: E402
from params import read_sidecar  # noqa: E402
from recite import person_name  # noqa: E402
from utils import UserError, cpu_info  # noqa: E402

VARIANTS = ("vanilla", "perceiver", "rope")
CPU = torch.device("cpu")


def cpu_flags() -> set[str]:
    """The CPU's feature flags, from /proc/cpuinfo."""
    return set(cpu_info().get("flags", "").split())


def cpu_name() -> str:
    """The CPU's name, family and model, vector capability and native bf16 or not: CPUs of one name differ."""
    info = cpu_info()
    name = info.get("model name", platform.processor() or platform.machine())
    if "cpu family" in info and "model" in info:
        name = f"{name} [family {info['cpu family']}, model {info['model']}]"
    bf16 = "bf16" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "no bf16"
    return f"{name} ({torch.backends.cpu.get_cpu_capability()}, {bf16})"


def machine_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else the CPU's description (cpu_name)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(
    m: int, k: int, n: int, dtype: torch.dtype, device: torch.device = CPU, seconds: float = 2.0
) -> float:
    """GFLOP/s of (m, k) @ (k, n) in `dtype` on `device`: the best of runs of about a tenth of `seconds` each, for
    about `seconds` in all after a warm-up (on a shared machine another process only ever slows a run down). Where one
    product takes longer than such a run (a precision the machine only emulates), every side is halved until it does
    not, and the line said on stderr names the shape timed: the bound holds whatever the precision costs."""

    def operands(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)

    # A product an eighth of each side (1/512 of the work, and slower per FLOP), timed once set up, prices the whole
    # one: the sides are halved until one product fits in a run.
    small = [max(1, side // 8) for side in (m, k, n)]
    a, b = operands(*small)
    took = []
    for _ in range(2):  # the first sets up the kernels
        synchronize(device)
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        took.append(time.perf_counter() - t0)
    flop_seconds = took[-1] / math.prod(small)
    while m * k * n * flop_seconds > seconds / 10 and min(m, k, n) >= 128:
        m, k, n = m // 2, k // 2, n // 2
    print(f"timing a ({m}, {k}) @ ({k}, {n}) matmul in {dtype} for about {seconds:g} s", file=sys.stderr)
    a, b = operands(m, k, n)
    a @ b  # a warm-up: the shape's first product sets up its kernels
    best, start = 0.0, time.perf_counter()
    while best == 0.0 or time.perf_counter() - start < seconds:
        synchronize(device)
        reps, t0 = 0, time.perf_counter()
        while reps < 2 or time.perf_counter() - t0 < seconds / 10:
            a @ b
            reps += 1
        synchronize(device)
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9)
    return best


def count_flops(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, autocast: Callable = contextlib.nullcontext
) -> int:
    """FLOPs of one forward (with the loss) and backward of `model` on x, y (B, T), by torch's flop counter."""
    with FlopCounterMode(display=False) as counter:
        with autocast():
            _, loss = model(x, y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def benchmark_parser(doc: str, out: str) -> argparse.ArgumentParser:
    """The flags bench_epoch.py and bench_scaling.py share; --out is bench/results/`out`, appended to."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    for size in ("n_layer", "n_head", "n_embd"):
        p.add_argument(f"--{size}", type=int, default=None, help="the model's size (unset: the script's default)")
    p.add_argument("--fp32", action="store_true", help="fp32 even where training would use bf16 (run.py --fp32)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / out, help="appended to")
    p.add_argument("--no_record", action="store_true", help="print only")
    return p


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file, blank lines skipped; [] when there is no file."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Append each row to `path` as one JSON line."""
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def predictions_sidecar(predictions: str | Path) -> dict:
    """What `run.py evaluate --outputs_path P` found, from P.json (counts, "accuracy", "place_in_recitation"
    for a reader, "seconds", "config"); {} without a sidecar (older evaluations, the London baseline)."""
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
    """Whether a reader's answers were spans of its recitations: its predictions' sidecar has the ceiling."""
    return "place_in_recitation" in found


class LoggedEpochs:
    """Epochs a run.py training has finished: the step of the last train/epoch_seconds in the newest
    TensorBoard folder `<logs>/<prefix>_*` written since `since`; 0 until there is one."""

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
    """<tb_expt_name>_<variant>_<role>_seed<seed>: the TensorBoard folders' name that `run.py ARGV` writes."""
    from logs import run_role
    from run import resolved_config  # the command's settings, resolved as run.py resolves them

    config = resolved_config(argv)
    return f"{config.tb_expt_name}_{config.variant}_{run_role(config)}_seed{config.seed}"


def read_lines(path: str | Path) -> list[str]:
    """A text file's lines, the final newline ending the last one."""
    lines = read_text(path).split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def read_scores_tsv(path: str | Path) -> list[AnswerScore | None]:
    """Read a file written by `scores_tsv`: one entry per line, None for a blank line."""
    out: list[AnswerScore | None] = []
    for n, line in enumerate(read_lines(path), start=1):
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
    """The lines of the sorted `documents` that start with the question's person's name and a full stop."""
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
    """For each question: whether its gold place is in one of the person's documents; None without one."""
    docs = sorted(documents)
    out: list[bool | None] = []
    for q in questions:
        mine = person_documents(q, docs) if q.place is not None else []
        out.append(any(q.place in d for d in mine) if mine else None)
    return out


RECALL_GROUPS = {True: "place_in_document", False: "place_not_in_document", None: "no_document"}


def recall_split(in_document: Sequence[bool | None], correct: Sequence[bool]) -> dict[str, float]:
    """`<group>_count` and `<group>_accuracy` (nan when empty) of each RECALL_GROUPS group of questions."""
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
