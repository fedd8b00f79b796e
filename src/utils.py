"""Small shared helpers: user errors, device and precision, atomic file writes,
seeding, sampling and greedy decoding, and the birth-place score."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import platform
import random
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch


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
    except PermissionError:
        raise UserError(f"{path}: cannot be read (permission denied)") from None
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower():
            raise UserError(f"{path}: refused: it holds objects other than tensors, which could run code") from None
        raise UserError(f"{path}: not a params file written by torch.save, or a damaged one") from None
    except Exception:  # noqa: BLE001 - any other failure here is a bad file, not a bug
        raise UserError(f"{path}: not a params file written by torch.save, or a damaged one") from None
