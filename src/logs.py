"""TensorBoard for a run.py command: one folder per run, named after what it did, holding its scalars and its
resolved config (as text, and as hparams beside what it found); removed again when the command fails."""

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
from trainer import TrainingInterrupted
from utils import UserError, folders_to_make, no_thread_tracebacks_for_os_errors


def run_role(args: RunConfig) -> str:
    """What a run does, as its folder says: pretrain, finetune-scratch, finetune, reader, or
    evaluate-<how>-<eval corpus>, how being direct, scratch (params finetuned without pretraining) or recite
    (a reader)."""
    if args.function == "pretrain":
        return "pretrain"
    if args.function == "finetune":
        return "reader" if args.recite else "finetune" if args.reading_params_path else "finetune-scratch"
    side = (read_sidecar(args.reading_params_path) if args.reading_params_path else None) or {}
    made_with = side.get("config") if isinstance(side.get("config"), dict) else {}
    how = "recite" if side.get("protocol") == "recite" else "direct"
    if how == "direct" and made_with and not made_with.get("reading_params_path"):
        how = "scratch"
    return f"evaluate-{how}-{Path(args.eval_corpus_path or '').stem[:40]}"


def run_folder(args: RunConfig) -> Path:
    """<tb_dir>/<name>_<variant>_<role>_seed<seed>_<start time> (tb_dir: expt/<function> unless given; role:
    run_role), never shared."""
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
    """Inside: (a writer to the run's folder, a dict the command fills with what it found), logged as hparams beside the
    config at the end. A failure (not an interruption, which may resume) removes the folder and those above it that this
    run made (never one that was there before); an OS error (a full disk) becomes one line."""
    folder, writer, found = run_folder(args), None, {}
    made = folders_to_make(folder)  # innermost first: the run's folder, then parents it creates
    with no_thread_tracebacks_for_os_errors():  # the error is said once, in one line, below
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
            raise  # resumable: its logs stay
        except BaseException as e:
            if writer is not None:  # first, so that its thread writes no more into the folder
                with contextlib.suppress(Exception):
                    writer.close()
            shutil.rmtree(folder, ignore_errors=True)
            for parent in made[1:]:
                with contextlib.suppress(OSError):  # another run may have started inside it meanwhile
                    parent.rmdir()
            if isinstance(e, OSError):
                raise UserError(f"{e.filename or folder}: cannot be written ({e.strerror or e})") from None
            raise
