"""TensorBoard for a run.py command: one folder per run, named after what it did, with its scalars and config.
A failed command removes it."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from config import RunConfig
from params import read_sidecar
from utils import TrainingInterrupted, folders_to_make, no_thread_tracebacks_for_os_errors, write_failure


def run_role(args: RunConfig) -> str:
    """What a run does, for its folder name: pretrain, finetune, finetune-scratch, reader, or
    evaluate-<direct|scratch|recite>-<eval corpus> (scratch: params finetuned without pretraining)."""
    if args.function == "pretrain":
        return "pretrain"
    if args.function == "finetune":
        return "reader" if args.recite else "finetune" if args.reading_params_path else "finetune-scratch"
    side = args.reading_params_path and read_sidecar(args.reading_params_path) or {}
    made_with = side.get("config")
    how = "recite" if side.get("protocol") == "recite" else "direct"
    if how == "direct" and isinstance(made_with, dict) and made_with and not made_with.get("reading_params_path"):
        how = "scratch"
    return f"evaluate-{how}-{Path(args.eval_corpus_path or '').stem[:40]}"


def run_folder(args: RunConfig) -> Path:
    """A new folder named after the run's config, role and start time."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    parent = Path(args.tb_dir) if args.tb_dir else Path("expt") / args.function
    base = parent / f"{args.tb_expt_name}_{args.variant}_{run_role(args)}_seed{args.seed}_{stamp}"
    folder, n = base, 1
    while folder.exists():  # two runs started in the same second
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


@contextlib.contextmanager
def tensorboard_run(args: RunConfig) -> Iterator[tuple[SummaryWriter, dict]]:
    """A writer to the run's folder and a dict of what the command found, logged as hparams at the end. Any failure
    but a resumable interruption removes the folders the run made; an OS error becomes one line."""
    folder, writer, found = run_folder(args), None, {}
    made = folders_to_make(folder)  # the run's folder first
    with no_thread_tracebacks_for_os_errors():
        try:
            writer = SummaryWriter(log_dir=str(folder))
            print(f"TensorBoard logs: {folder} (tensorboard --logdir {folder.parent.parent})")
            writer.add_text("config", json.dumps(asdict(args), indent=1))
            yield writer, found
            hparams = {k: v if isinstance(v, int | float | str) else str(v) for k, v in asdict(args).items()}
            metrics = {f"hparams/{k}": v for k, v in found.items() if isinstance(v, int | float) and math.isfinite(v)}
            writer.add_hparams(hparams, metrics, run_name=".")  # ".": the run's own folder, not a new one
            writer.close()  # writes what is buffered: a full disk shows here
        except TrainingInterrupted:
            writer.close()
            raise
        except BaseException as e:
            if writer is not None:  # first, so that its thread stops writing into the folder
                with contextlib.suppress(Exception):
                    writer.close()
            shutil.rmtree(folder, ignore_errors=True)
            for parent in made[1:]:
                with contextlib.suppress(OSError):  # another run may have started inside it meanwhile
                    parent.rmdir()
            if isinstance(e, OSError):
                raise write_failure(e, folder) from None
            raise
