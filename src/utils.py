"""Small shared helpers: user errors, device and precision, atomic file writes,
seeding, sampling and greedy decoding, and the birth-place score."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit code 2, no traceback."""


# ---------------------------------------------------------------------------
# Device and precision, decided once


def pick_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda if available, else cpu; 'cuda' without a GPU is a UserError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but no CUDA GPU is available")
    return torch.device(name)


def init_distributed(device_name: str = "auto") -> tuple[torch.device, int]:
    """Join the torchrun process group if launched by torchrun; returns (device, rank).

    gloo on CPU, nccl on GPU (each rank on cuda:LOCAL_RANK). A plain
    `python src/run.py` is rank 0 of 1 and starts no process group.
    """
    device = pick_device(device_name)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device, 0
    import torch.distributed as dist

    if device.type == "cuda":
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local_rank >= gpus:
            raise UserError(
                f"torchrun started process {local_rank} on this machine, which has {gpus} CUDA GPU(s): "
                f"use --nproc_per_node={gpus}, or --device cpu"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device, dist.get_rank()


def bf16_supported(device: torch.device) -> bool:
    """True where bf16 matmuls are native: recent CUDA GPUs, CPUs with AVX512-BF16/AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast (fp32 master weights) when enabled and supported, else a no-op."""
    if enabled and bf16_supported(device):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


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


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------
# Files: never half written


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is renamed onto `path`.

    A crash or error before the rename leaves any previous file at `path` intact.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{path}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def torch_save_atomic(obj: object, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def torch_load_safe(path: str | Path) -> object:
    """torch.load with weights_only=True: tensors and plain containers only, never code."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickles; the error below says it once
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure here is a bad file, not a bug
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: not a loadable params file ({first[:200]})") from None


# ---------------------------------------------------------------------------
# Sampling and greedy decoding


def top_k_logits(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (B, V), set the rest to -inf."""
    v, _ = torch.topk(logits, k)
    return logits.masked_fill(logits < v[:, [-1]], float("-inf"))


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    x: torch.Tensor,
    steps: int,
    temperature: float = 1.0,
    sample: bool = False,
    top_k: int | None = None,
) -> torch.Tensor:
    """Extend each row of x (B, T) by `steps` tokens -> (B, T + steps).

    sample=False is greedy (argmax); otherwise draw from softmax(logits / temperature),
    optionally restricted to the top_k tokens. The context is cropped to the
    model's block_size, as in the handout. Full recompute each step: the plain
    reference decoder; `greedy_decode_batch` is the fast one.
    """
    block_size = model.get_block_size()
    model.eval()
    for _ in range(steps):
        x_cond = x if x.size(1) <= block_size else x[:, -block_size:]
        logits, _ = model(x_cond)
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            logits = top_k_logits(logits, top_k)
        if sample:
            ix = torch.multinomial(F.softmax(logits.float(), dim=-1), num_samples=1)
        else:
            _, ix = torch.topk(logits, k=1, dim=-1)
        x = torch.cat((x, ix), dim=1)
    return x


@torch.no_grad()
def greedy_decode_batch(
    next_logits: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
    prompts: list[list[int]],
    max_new: int,
    stop_id: int,
    block_size: int,
    device: torch.device,
) -> list[list[int]]:
    """Greedy continuation of many prompts of different lengths at once.

    next_logits(tokens (b, W), lengths (b,), kept) -> logits (b, V): the
    prediction for position lengths[i] of each row, whose first lengths[i]
    tokens are tokens[i, :lengths[i]] (right-padded); `kept` is None on the
    first call, afterwards the indices of the previous call's rows that are
    still decoding (so a cache can drop the finished ones). Each row stops
    after `stop_id` is produced, after max_new tokens, or at block_size.
    Returns the generated ids of each row.
    """
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    limit = torch.clamp(lengths + max_new, max=block_size)
    tokens = torch.zeros(len(prompts), max(int(limit.max()), 1), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    rows = torch.nonzero(lengths < limit).squeeze(1)  # the rows still decoding
    kept = None
    while rows.numel() > 0:
        row_lengths = lengths[rows]
        width = int(row_lengths.max())
        pred = next_logits(tokens[rows, :width], row_lengths, kept).argmax(dim=-1)  # (b,)
        tokens[rows, row_lengths] = pred
        lengths[rows] += 1
        going = (pred != stop_id) & (lengths[rows] < limit[rows])
        kept = torch.nonzero(going).squeeze(1)
        rows = rows[kept]
    return [tokens[i, len(p) : int(lengths[i])].tolist() for i, p in enumerate(prompts)]


# ---------------------------------------------------------------------------
# Scoring


def evaluate_places(filepath: str | Path, predicted_places: list[str]) -> tuple[int, int]:
    """(total, correct) of predictions against the gold places of a birth-place TSV.

    Lines without a place count as zero, as in the handout (a test-inputs file
    scores (0, 0)). Blank lines are skipped; predictions align with the other lines.
    """
    from dataset import read_questions  # local import: dataset imports utils

    questions = [q for q in read_questions(filepath, require_place=False) if q is not None]
    if len(questions) != len(predicted_places):
        raise UserError(f"{filepath}: {len(questions)} questions but {len(predicted_places)} predictions")
    gold = [q.place for q in questions if q.place is not None]
    if not gold:
        return 0, 0
    correct = sum(p == g for p, g in zip(predicted_places, gold))
    return len(gold), correct
