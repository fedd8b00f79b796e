"""Command line: pretrain, finetune or evaluate a character GPT on the birth-place task.

    python src/run.py pretrain vanilla wiki.txt --writing_params_path vanilla.pretrain.params
    python src/run.py finetune vanilla wiki.txt --reading_params_path vanilla.pretrain.params \\
        --writing_params_path vanilla.finetune.params --finetune_corpus_path birth_places_train.tsv
    python src/run.py evaluate vanilla wiki.txt --reading_params_path vanilla.finetune.params \\
        --eval_corpus_path birth_dev.tsv --outputs_path vanilla.pretrain.dev.predictions
    python src/run.py ask vanilla wiki.txt --reading_params_path vanilla.finetune.params "Where was Ada Lovelace born?"

Variants: vanilla, perceiver (the 2023 handout; add --bottleneck_dim 64) and rope
(the 2024 handout). The pretraining corpus (third argument) defines the
vocabulary in every mode. A bare data file name that is not in the current
folder is looked up in data/. --preset handout (the default) is the course's
recipe; --preset cpu is this repository's recipe for a small CPU (README).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

import recite
from answers import ask, evaluate
from config import BLOCK_SIZE, apply_preset, build_model, check_args, preset_name, trainer_config
from dataset import ORDERS, CharCorruptionDataset, NameDataset, read_text
from model import GPT, VARIANTS
from params import load_params, save_params
from trainer import Trainer, TrainerConfig, TrainingInterrupted
from utils import (
    REPO_ROOT,
    NullWriter,
    ScalarWriter,
    UserError,
    check_output_file,
    find_data_file,
    init_distributed,
    refuse_same_file,
    seed_everything,
    torch_load_safe,
)

# ---------------------------------------------------------------------------
# Checks and training


def refuse_overwriting_inputs(args: argparse.Namespace) -> None:
    """No output of a command may be one of its inputs (where find_data_file reads them) or another output."""

    def located(name: str | None) -> Path | None:
        if name is None:
            return None
        path, candidate = Path(name), REPO_ROOT / "data" / Path(name).name
        return candidate if not path.exists() and path.parent == Path(".") and candidate.is_file() else path

    inputs = {
        "the pretraining corpus": located(args.pretrain_corpus_path),
        "--reading_params_path": args.reading_params_path,
        "--finetune_corpus_path": located(args.finetune_corpus_path),
        "--eval_corpus_path": located(args.eval_corpus_path),
        **{f"--ensemble_params {p}": p for p in args.ensemble_params or []},
    }
    outputs = {
        flag: getattr(args, flag.lstrip("-")) for flag in ("--writing_params_path", "--outputs_path", "--scores_path")
    }
    refuse_same_file(outputs, inputs)


# ---------------------------------------------------------------------------
# Modes


def load_checkpoint_for_resume(args: argparse.Namespace, ckpt_path: Path) -> dict:
    """The checkpoint to resume, after checking that it belongs to this command line."""
    if not ckpt_path.is_file():
        raise UserError(f"--resume: no checkpoint at {ckpt_path} (it is written next to --writing_params_path)")
    ckpt = torch_load_safe(ckpt_path)
    if not isinstance(ckpt, dict) or "extra" not in ckpt or "args" not in ckpt["extra"]:
        raise UserError(f"{ckpt_path}: not a checkpoint written by this program")
    saved = ckpt["extra"]["args"]
    for key in RUN_DEFINING_ARGS:
        if key in saved and saved[key] != getattr(args, key):
            raise UserError(
                f"--resume: {ckpt_path} was written with --{key} {saved[key]!r}, this command has {getattr(args, key)!r}"
            )
    return ckpt


def train(
    args: argparse.Namespace, corpus: CharCorruptionDataset, model: GPT, device: torch.device, writer: ScalarWriter
) -> None:
    """pretrain (on the corpus) or finetune (on --finetune_corpus_path); writes --writing_params_path."""
    if args.writing_params_path is None:
        raise UserError(f"{args.function} needs --writing_params_path")
    check_output_file(args.writing_params_path, "--writing_params_path")
    if args.reading_params_path is not None:
        load_params(model, corpus.vocab, args.reading_params_path)  # checked even when resuming
    dataset, extra = training_data(args, corpus, model, device)
    cfg = trainer_config(args, len(corpus), len(dataset), dataset.example_length)
    ckpt_path = Path(cfg.ckpt_path)
    ckpt = load_checkpoint_for_resume(args, ckpt_path) if args.resume else None
    if ckpt is None and ckpt_path.exists():
        print(
            f"warning: {ckpt_path} exists; this fresh run replaces it at its first checkpoint (--resume continues it)"
        )
    writer.add_text("config", json.dumps({"args": vars(args), "trainer": asdict(cfg)}, indent=1))
    announce(args, cfg, len(dataset), device)
    trainer = Trainer(
        model, dataset, cfg, device, log=writer.add_scalar,
        extra={"args": vars(args), "vocab": "".join(corpus.vocab.itos)},
    )  # fmt: skip
    if ckpt is not None:
        trainer.resume(ckpt)
        print(f"resuming from {ckpt_path}: step {trainer.step}, epoch {trainer.epoch + 1}")
    t0 = time.time()
    with stop_on_signals(trainer):
        losses = trainer.train()
    seconds = time.time() - t0
    if trainer.rank == 0:
        save_params(model, corpus.vocab, args.writing_params_path, {**run_record(args, trainer, losses), **extra})
    budget_spent = cfg.budget_seconds is not None and trainer.seconds >= cfg.budget_seconds
    if budget_spent:
        print(
            f"--budget_minutes {args.budget_minutes:g} spent at step {trainer.step}, "
            + (f"in epoch {trainer.epoch + 1}" if trainer.batch_in_epoch else f"after epoch {trainer.epoch}")
            + f" of {cfg.max_epochs}; the learning-rate schedule was cut off there"
        )
    if trainer.rank == 0 and (budget_spent or trainer.epoch >= cfg.max_epochs):
        ckpt_path.unlink(missing_ok=True)  # finished: nothing left to resume (a --max_steps stop keeps it)
    print(f"trained {trainer.step} steps in {seconds:.1f} s; params written to {args.writing_params_path}")


def training_data(
    args: argparse.Namespace, corpus: CharCorruptionDataset, model: GPT, device: torch.device
) -> tuple[CharCorruptionDataset | NameDataset, dict]:
    """What this command trains on (the corpus, the finetune questions, or a recite reader's
    recitations) and what its sidecar adds (a reader's link to its pretrained params)."""
    if args.function == "pretrain":
        return corpus, {}
    if args.finetune_corpus_path is None:
        raise UserError("finetune needs --finetune_corpus_path")
    path = find_data_file(args.finetune_corpus_path, "finetune corpus")
    if not args.recite:
        return NameDataset(corpus, path), {}
    if args.recite_chars is None:
        args.recite_chars = recite.default_recite_chars(model)
    dataset = recite.reader_dataset(corpus, model, path, args.recite_chars, device)
    return dataset, recite.link_to_pretrained(args.writing_params_path, args.reading_params_path, args.recite_chars)


def announce(args: argparse.Namespace, cfg: TrainerConfig, examples: int, device: torch.device) -> None:
    """Say what this run trains, how long, and how; warn when the handout's recipe meets a CPU."""
    plan = f"{cfg.max_epochs} epoch{'s' if cfg.max_epochs != 1 else ''}" + (
        f" at most, planned to {args.budget_minutes:g} minutes after every epoch" if cfg.budget_fit else ""
    )
    print(
        f"{args.function} {args.variant}: {examples} examples, {plan}, batch {cfg.batch_size}, "
        f"lr {cfg.learning_rate:g}, {cfg.optimizer}, device {device}"
    )
    if device.type == "cpu" and args.preset == "handout":
        print(
            "note: the handout's recipe is made for a GPU and takes hours on a CPU (the first steps say how "
            "many); --preset cpu is the recipe for a CPU, planned to --budget_minutes (README)"
        )


@contextlib.contextmanager
def stop_on_signals(trainer: Trainer) -> Iterator[None]:
    """Inside, SIGINT and SIGTERM ask `trainer` to checkpoint and stop after its current step."""

    def request_stop(signum: int, frame: object) -> None:
        trainer.stop_requested = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_record(args: argparse.Namespace, trainer: Trainer, losses: list[float]) -> dict:
    """What the params sidecar records of the training run: its configs as used, how far it got, how long."""
    n_batches = math.ceil(len(trainer.train_dataset) / trainer.config.batch_size)
    return {
        "trainer": asdict(trainer.config),
        "preset": args.preset,
        "dropout": args.dropout,
        "doc_offset": args.doc_offset,
        "steps": trainer.step,
        "epochs_done": round(trainer.epoch + trainer.batch_in_epoch / max(1, n_batches), 3),
        "train_seconds": trainer.seconds,
        "final_loss": losses[-1] if losses else None,
    }


# ---------------------------------------------------------------------------
# CLI


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# What a resumed run may change: where its outputs go, its budget, checkpoints and device.
# Every other flag defines what the run computes: --resume refuses a checkpoint written with
# another value.
RESUME_MAY_CHANGE = frozenset(
    {"question", "writing_params_path", "eval_corpus_path", "outputs_path", "scores_path", "ensemble_params",
     "tb_expt_name", "budget_minutes", "max_steps", "resume", "ckpt_every", "device"}
)  # fmt: skip


def make_parser() -> Parser:
    """The command line: the handout's arguments and ours, in groups (see --help)."""
    p = Parser(prog="run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_handout_and_output_flags(p)
    add_training_flags(p)
    add_recipe_and_run_flags(p)
    return p


def add_handout_and_output_flags(p: Parser) -> None:
    """The handout's arguments (its spelling), and where a command writes."""
    g = p.add_argument_group("the handout's")
    g.add_argument("function", choices=["pretrain", "finetune", "evaluate", "ask"], help="what to do")
    g.add_argument("variant", choices=VARIANTS, help="vanilla, perceiver (2023 handout) or rope (2024 handout)")
    g.add_argument("pretrain_corpus_path", help="pretraining corpus (wiki.txt); defines the vocabulary in every mode")
    g.add_argument("--reading_params_path", default=None, help="params to load before training or evaluating")
    g.add_argument("--finetune_corpus_path", default=None, help="question<TAB>place file to finetune on")
    g.add_argument("--pretrain_lr", type=float, default=None, help="peak learning rate for pretraining (6e-3)")
    g.add_argument("--finetune_lr", type=float, default=None, help="peak learning rate for finetuning (6e-4)")
    g.add_argument("--bottleneck_dim", type=int, default=None,
                   help="perceiver bottleneck length m (32; handout: 64; read from the params' sidecar)")  # fmt: skip

    g = p.add_argument_group("outputs")
    g.add_argument("question", nargs="?", default=None, help='ask only: e.g. "Where was Ada Lovelace born?"')
    g.add_argument("--writing_params_path", default=None, help="where to save the trained params")
    g.add_argument("--eval_corpus_path", default=None, help="questions (with or without places) to answer")
    g.add_argument("--outputs_path", default=None, help="where to write one prediction per input line")
    g.add_argument("--scores_path", default=None, help="evaluate: also write answer<TAB>logprob<TAB>mean_logprob")
    g.add_argument(
        "--ensemble_params", nargs="+", default=None, metavar="PARAMS",
        help="evaluate: more finetuned params (any variant, read from their sidecars); each question takes "
        "the answer its model is most confident of",
    )  # fmt: skip
    g.add_argument("--tb_expt_name", default="run", help="TensorBoard run name prefix (logs go to expt/<function>/)")


def add_training_flags(p: Parser) -> None:
    """What is trained and how: a flag left unset (None) comes from the preset (config.apply_preset)."""
    g = p.add_argument_group("training")
    g.add_argument(
        "--max_epochs", type=int, default=None, help="epochs (handout: 650 pretraining; 75 or 10 finetuning)"
    )
    g.add_argument("--batch_size", type=int, default=None, help="batch size (handout: pretrain 128, finetune 256)")
    g.add_argument("--dropout", type=float, default=None, help="dropout of embeddings, attention and residuals (0.1)")
    g.add_argument("--optimizer", choices=["adamw", "muon"], default=None,
                   help="adamw (the handout's) or muon for the blocks' matrices (--preset cpu)")  # fmt: skip
    g.add_argument("--seed", type=int, default=0, help="seed for init, data order, corruption and dropout")
    g.add_argument("--n_layer", type=int, default=None, help="transformer blocks (4; perceiver: down + n_layer-2 + up)")
    g.add_argument("--n_head", type=int, default=None, help="attention heads (8)")
    g.add_argument("--n_embd", type=int, default=None, help="embedding width (256)")
    g.add_argument(
        "--recite", action="store_true",
        help="finetune a recite reader: the --reading_params_path model recites each training person and the "
        "reader learns to read the place from that (evaluate and ask then recite first: see README)",
    )  # fmt: skip
    g.add_argument("--recite_chars", type=int, default=None,
                   help="with --recite: characters of recollection (100; the perceiver: bottleneck_dim - 16)")  # fmt: skip


def add_recipe_and_run_flags(p: Parser) -> None:
    """The recipe, the time budget and checkpoints, the device and the speed switches."""
    g = p.add_argument_group("recipe")
    g.add_argument("--preset", type=preset_name, default="handout",
                   help="recipe for unset flags: handout (the course's, default) or cpu (README)")  # fmt: skip
    g.add_argument(
        "--doc_offset", type=int, default=None,
        help="pretrain: start each example at a random position 0..N after another document's end (cpu: 14)",
    )  # fmt: skip
    # Research settings, set by the presets (bench/trainer_variant.py varies them): not in --help.
    g.add_argument("--schedule", choices=["handout", "run"], default=None, help=argparse.SUPPRESS)
    g.add_argument("--order", choices=ORDERS, default=None, help=argparse.SUPPRESS)
    g.add_argument("--decay", choices=["matmul", "all_but_biases"], default=None, help=argparse.SUPPRESS)

    g = p.add_argument_group("budget and checkpoints")
    g.add_argument(
        "--budget_minutes", type=float, default=None,
        help="pretrain: stop after this many minutes of training; with --preset cpu the epochs are planned "
        "after every epoch to fill it at the pace measured, the cosine ending with them (cpu: 60)",
    )  # fmt: skip
    g.add_argument("--max_steps", type=int, default=None, help="stop after this many optimizer steps")
    g.add_argument("--resume", action="store_true", help="continue from <writing_params_path>.ckpt")
    g.add_argument("--ckpt_every", type=int, default=100, help="optimizer steps between checkpoints (0: at the end)")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where to run")

    g = p.add_argument_group("speed")
    g.add_argument("--fp32", action="store_true", help="train in fp32 even where bf16 autocast is available")


RUN_DEFINING_ARGS = tuple(
    k for k in vars(make_parser().parse_args(["pretrain", "vanilla", "-"])) if k not in RESUME_MAY_CHANGE
)


def run(args: argparse.Namespace) -> None:
    """Do what the parsed command line says (UserError for a mistake, TrainingInterrupted after a signal)."""
    check_args(args)
    refuse_overwriting_inputs(args)
    apply_preset(args)
    seed_everything(args.seed)
    device, rank = init_distributed(args.device)
    if rank != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - under torchrun only rank 0 reports progress
    corpus_path = find_data_file(args.pretrain_corpus_path, "pretraining corpus")
    corpus = CharCorruptionDataset(
        read_text(corpus_path), BLOCK_SIZE, source=str(corpus_path), max_offset=args.doc_offset
    )
    model = build_model(args, corpus.vocab_size)
    if args.function == "ask":
        return ask(args, corpus, model, device)  # prints only: no TensorBoard run
    if args.question is not None:
        raise UserError(f"unexpected argument {args.question!r}: a question is only for ask")
    log_dir = tensorboard_folder(args)
    writer = SummaryWriter(log_dir=str(log_dir)) if rank == 0 else NullWriter()
    if rank == 0:
        print(f"TensorBoard logs: {log_dir} (tensorboard --logdir expt)")
    try:
        if args.function == "evaluate":
            evaluate(args, corpus, model, device, writer)
        else:
            train(args, corpus, model, device, writer)
    except TrainingInterrupted:
        raise  # resumable: its logs stay
    except BaseException:
        writer.close()
        shutil.rmtree(log_dir, ignore_errors=True)  # a failed command leaves no logs behind
        raise
    finally:
        writer.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def tensorboard_folder(args: argparse.Namespace) -> Path:
    """expt/<function>/<name>_<variant>_seed<seed>_<start time>: one folder per run, never shared."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("expt") / args.function / f"{args.tb_expt_name}_{args.variant}_seed{args.seed}_{stamp}"
    folder, n = base, 1
    while folder.exists():  # two runs started in the same second
        n += 1
        folder = base.with_name(f"{base.name}-{n}")
    return folder


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0, 2 after a one-line error, 130 after an interruption (with the command that resumes)."""
    args = make_parser().parse_intermixed_args(argv)  # intermixed: ask's question may follow the flags
    try:
        run(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingInterrupted as e:
        command = " ".join(["python", "src/run.py", *(argv if argv is not None else sys.argv[1:])])
        resume = command if "--resume" in command else f"{command} --resume"
        print(f"interrupted: checkpoint written to {e}; to continue: {resume}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted before training started; nothing to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
