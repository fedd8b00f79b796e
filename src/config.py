"""From the command line's flags to the model and trainer configs: the presets (recipes),
their resolution, the TrainerConfig of a phase and the GPT a command builds."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataset import ORDERS
from model import GPT, VARIANTS, GPTConfig
from params import stored_sizes
from recite import ANSWER_ROOM, RECITE_CHARS, default_recite_chars
from trainer import TrainerConfig
from utils import UserError, find_data_file, pick_device

BLOCK_SIZE = 128
FUNCTIONS = ("pretrain", "finetune", "evaluate", "ask")

# Each preset fills the flags the user left unset, per phase: pretraining, finetuning
# from scratch, finetuning a pretrained model (the handout's "fewer epochs after
# pretraining"), and finetuning a recite reader from one (finetune --recite). A phase
# also names its learning-rate schedule (--schedule "handout": the cosine fixed by the
# corpus size, uncapped; "run": a cosine that ends with the run), and
# may name how examples are batched and which parameters decay (--order, --decay: see
# trainer.TrainerConfig); what neither the preset nor the user sets comes from RunConfig.
#
# handout: the course's recipe, as its trainer runs it: batches in file order, the same
#   every epoch (its DataLoader does not shuffle), and weight decay on every parameter but
#   the biases. Measured on a GPU, this is what reaches the course's published figures.
# cpu: this repository's recipe for a small CPU: Muon for the blocks' matrices at batch 32
#   and lr 1e-3, no dropout, documents from position 0 as in the handout, pretraining epochs
#   planned after every epoch to fill --budget_minutes (at most max_epochs) with the cosine ending
#   there, and a gentle finetune (5 epochs at 1e-4, no dropout) that keeps what was stored;
#   its recite reader takes the handout's finetune (10 epochs at 6e-4, dropout 0.1), which
#   teaches it to copy the place out of the recitation rather than answer from memory.
_HANDOUT_LOOP = {"schedule": "handout", "order": "file", "decay": "all_but_biases"}
_FROM_SCRATCH = {"max_epochs": 75, "batch_size": 256, "finetune_lr": 6e-4, "dropout": 0.1}
_HANDOUT_AFTER_PRETRAINING = {**_FROM_SCRATCH, "max_epochs": 10}
PRESETS = {
    "handout": {
        "pretrain": {"max_epochs": 650, "batch_size": 128, "pretrain_lr": 6e-3, "dropout": 0.1, "doc_offset": 0,
                     **_HANDOUT_LOOP},
        "finetune": {**_FROM_SCRATCH, **_HANDOUT_LOOP},
        "finetune_pretrained": {**_HANDOUT_AFTER_PRETRAINING, **_HANDOUT_LOOP},
        "reader": {**_HANDOUT_AFTER_PRETRAINING, **_HANDOUT_LOOP},
    },
    "cpu": {
        "pretrain": {"max_epochs": 150, "batch_size": 32, "pretrain_lr": 1e-3, "dropout": 0.0,
                     "optimizer": "muon", "budget_minutes": 60, "schedule": "run"},
        "finetune": {**_FROM_SCRATCH, "schedule": "handout"},
        "finetune_pretrained": {"max_epochs": 5, "batch_size": 256, "finetune_lr": 1e-4, "dropout": 0.0,
                                "schedule": "handout"},
        "reader": {**_HANDOUT_AFTER_PRETRAINING, "schedule": "handout"},
    },
}  # fmt: skip
RETIRED_PRESETS = {"cpu_fp32": "cpu"}  # old name -> the preset that replaced it


def preset_name(name: str) -> str:
    """argparse type for --preset: a retired name is refused in one line naming its replacement."""
    if name in RETIRED_PRESETS:
        raise argparse.ArgumentTypeError(
            f"--preset {name} was retired: use --preset {RETIRED_PRESETS[name]} (precision follows the "
            "hardware: bf16 where it is native, --fp32 forces fp32)"
        )
    if name not in PRESETS:
        raise argparse.ArgumentTypeError(f"--preset must be one of {', '.join(PRESETS)}, got {name!r}")
    return name


def flag(default: Any, help: str | None, group: str, commands: tuple[str, ...] = FUNCTIONS, **options: Any) -> Any:
    """A RunConfig field that is also a flag --<field> (positional=True: an argument) of the run.py `commands`
    that use it (another command refuses it): its default, its --help line (None: hidden) and group, and
    argparse's options (type, choices, nargs, action)."""
    return field(default=default, metadata={"help": help, "group": group, "commands": commands, **options})


HANDOUT, OUTPUTS, TRAINING, RECIPE, RUN, SPEED = (
    "the handout's", "outputs", "training", "recipe", "budget and checkpoints", "speed"
)  # fmt: skip
TRAIN, PRETRAIN, FINETUNE, EVALUATE = ("pretrain", "finetune"), ("pretrain",), ("finetune",), ("evaluate",)


@dataclass
class RunConfig:
    """Every setting of a run.py command, resolved (see resolve). Each field is the flag of the same name,
    from the command line to the params' sidecar and the checkpoint, which store it whole; the defaults
    here are the only ones (what neither the user, the read params' sidecar nor the preset sets)."""

    function: str = flag("", "what to do", HANDOUT, commands=())  # the command word, run.py's first argument
    variant: str = flag("", "vanilla, perceiver (2023 handout) or rope (2024 handout)", HANDOUT,
                        positional=True, choices=VARIANTS)  # fmt: skip
    pretrain_corpus_path: str = flag("", "pretraining corpus (wiki.txt); defines the vocabulary in every command",
                                     HANDOUT, positional=True)  # fmt: skip
    reading_params_path: str | None = flag(None, "params to load before training or evaluating", HANDOUT)
    finetune_corpus_path: str | None = flag(None, "question<TAB>place file to finetune on", HANDOUT, FINETUNE)
    pretrain_lr: float = flag(6e-3, "peak learning rate", HANDOUT, PRETRAIN, type=float)
    finetune_lr: float = flag(6e-4, "peak learning rate", HANDOUT, FINETUNE, type=float)
    bottleneck_dim: int = flag(32, "perceiver bottleneck length m (the 2023 handout's figures used 64; read "
                               "from the params' sidecar)", HANDOUT, type=int)  # fmt: skip
    question: str | None = flag(None, 'e.g. "Where was Ada Lovelace born?"', OUTPUTS, ("ask",),
                                positional=True, nargs="?")  # fmt: skip
    writing_params_path: str | None = flag(None, "where to save the trained params", OUTPUTS, TRAIN)
    eval_corpus_path: str | None = flag(None, "questions (with or without places) to answer", OUTPUTS, EVALUATE)
    outputs_path: str | None = flag(None, "where to write one prediction per input line", OUTPUTS, EVALUATE)
    scores_path: str | None = flag(None, "also write answer<TAB>logprob<TAB>mean_logprob", OUTPUTS, EVALUATE)
    ensemble_params: list[str] | None = flag(
        None, "more finetuned params (any variant, read from their sidecars); each question takes the answer "
        "its model is most confident of", OUTPUTS, EVALUATE, nargs="+", metavar="PARAMS", action="extend")  # fmt: skip
    tb_expt_name: str = flag("run", "TensorBoard run name prefix (logs go to expt/<command>/)", OUTPUTS,
                             ("pretrain", "finetune", "evaluate"))  # fmt: skip
    tb_dir: str | None = flag(None, "TensorBoard folder of this run's folder (expt/<command>; run.sh gives all its "
                              "runs one)", OUTPUTS, ("pretrain", "finetune", "evaluate"))  # fmt: skip
    max_epochs: int = flag(0, "epochs", TRAINING, TRAIN, type=int)
    batch_size: int = flag(0, "batch size", TRAINING, TRAIN, type=int)
    dropout: float = flag(0.1, "dropout of embeddings, attention and residuals", TRAINING, TRAIN, type=float)
    optimizer: str = flag("adamw", "adamw (the handout's) or muon for the blocks' matrices (cpu pretraining)",
                          TRAINING, TRAIN, choices=["adamw", "muon"])  # fmt: skip
    seed: int = flag(0, "seed for init, data order, corruption and dropout", TRAINING, type=int)
    n_layer: int = flag(4, "transformer blocks (perceiver: down + n_layer-2 + up)", TRAINING, type=int)
    n_head: int = flag(8, "attention heads", TRAINING, type=int)
    n_embd: int = flag(256, "embedding width", TRAINING, type=int)
    recite: bool = flag(False, "finetune a recite reader: the --reading_params_path model recites each training "
                        "person and the reader learns to read the place from that (evaluate and ask then recite "
                        "first: see README)", TRAINING, FINETUNE, action="store_true")  # fmt: skip
    recite_chars: int | None = flag(None, "with --recite: characters of recollection (100; the perceiver: "
                                    "bottleneck_dim - 16)", TRAINING, FINETUNE, type=int)  # fmt: skip
    preset: str = flag("handout", "recipe for unset flags: handout (the course's, default) or cpu (README)", RECIPE,
                       type=preset_name)  # fmt: skip
    doc_offset: int = flag(0, "start each example at a random position 0..N after another document's end",
                           RECIPE, PRETRAIN, type=int)  # fmt: skip
    # Research settings that the presets set: not in --help.
    schedule: str = flag("handout", None, RECIPE, TRAIN, choices=["handout", "run"])
    order: str = flag("bucketed", None, RECIPE, TRAIN, choices=ORDERS)
    decay: str = flag("matmul", None, RECIPE, TRAIN, choices=["matmul", "all_but_biases"])
    budget_minutes: float | None = flag(None, "stop after this many minutes of training; with --preset cpu the "
                                        "epochs are planned after every epoch to fill it at the pace measured, "
                                        "the cosine ending with them", RUN, PRETRAIN, type=float)  # fmt: skip
    max_steps: int | None = flag(None, "stop after this many optimizer steps", RUN, TRAIN, type=int)
    resume: bool = flag(False, "continue from <writing_params_path>.ckpt", RUN, TRAIN, action="store_true")
    ckpt_every: int = flag(100, "optimizer steps between checkpoints (0: at the end)", RUN, TRAIN, type=int)
    device: str = flag("auto", "where to run (auto: cuda if there is one)", RUN, choices=["auto", "cpu", "cuda"])
    fp32: bool = flag(False, "train in fp32 even where bf16 autocast is available (all commands take it, so "
                      "that run.sh's EXTRA_FLAGS may)", SPEED, action="store_true")  # fmt: skip


# What a resumed run may change: where its outputs go, its budget, checkpoints and device. Every
# other setting defines what the run computes: --resume refuses a checkpoint made with another value.
RESUME_MAY_CHANGE = frozenset(
    {"question", "writing_params_path", "eval_corpus_path", "outputs_path", "scores_path", "ensemble_params",
     "tb_expt_name", "tb_dir", "budget_minutes", "max_steps", "resume", "ckpt_every", "device"}
)  # fmt: skip


def phase(function: str, recite: bool, reading_params_path: str | None) -> str:
    """The preset phase a command runs: pretrain, finetune (from scratch), finetune_pretrained or reader."""
    if function == "pretrain":
        return "pretrain"
    if function == "finetune" and recite and reading_params_path:
        return "reader"
    # evaluate and ask read a finetuned model: their phase only names settings they do not use
    return "finetune_pretrained" if reading_params_path else "finetune"


def resolve(typed: dict) -> RunConfig:
    """The RunConfig of a command from the values the user typed (None: not typed): RunConfig's
    defaults, then the preset's phase, then the model sizes stored with --reading_params_path (see
    stored_sizes), then what the user typed."""
    preset = typed.get("preset") or RunConfig.preset
    recite = bool(typed.get("recite"))
    preset_values = PRESETS[preset][phase(typed["function"], recite, typed.get("reading_params_path"))]
    stored = stored_sizes(typed.get("reading_params_path"), "--reading_params_path")
    given = {key: value for key, value in typed.items() if value is not None}
    config = RunConfig(**{**preset_values, **stored, **given})
    if config.recite and config.recite_chars is None:
        config.recite_chars = default_recite_chars(config.variant, config.bottleneck_dim)
    return config


def pretrain_budget_minutes(
    total_minutes: float,
    used_seconds: float,
    nopretrain_seconds: float,
    dev_seconds: float,
    variants: list[str],
    bottleneck_dim: int,
    nopretrain_epochs: int | None = None,
    finetune_epochs: int | None = None,
) -> tuple[float, float]:
    """run.sh with the cpu preset: (the minutes each of `variants` may pretrain, the minutes of every other
    step). Each pretraining gets an equal share, at least a minute, of what is left of total_minutes once
    the other steps are set aside: those done (used_seconds) and those to come, estimated from two steps
    just timed on this machine: the finetune from scratch (nopretrain_seconds for nopretrain_epochs of
    question examples) and one dev evaluation (dev_seconds). finetune_epochs: the finetunes' after
    pretraining; None: the preset's."""
    cpu = PRESETS["cpu"]
    epoch = nopretrain_seconds / (nopretrain_epochs or cpu["finetune"]["max_epochs"])
    finetune_pretrained, reader = (finetune_epochs or cpu[p]["max_epochs"] for p in ("finetune_pretrained", "reader"))
    others = used_seconds + 2 * dev_seconds  # the ensemble's evaluation at the end
    for variant in variants:
        chars = bottleneck_dim - ANSWER_ROOM if variant == "perceiver" else RECITE_CHARS
        # A recite reader's epoch took about 2.7 epochs of questions: its examples (the recitations that
        # hold their place, about 85%) are three times as long at 100 characters of recitation.
        reader_epoch = 2.7 * epoch * (chars + ANSWER_ROOM) / (RECITE_CHARS + ANSWER_ROOM)
        # six evaluations' worth: direct and recite answers to dev and test, reciting the training people
        others += epoch * finetune_pretrained + reader_epoch * reader + 6 * dev_seconds + 30  # and a margin
    return max(1.0, (total_minutes * 60 - others) / len(variants) / 60), others / 60


def trainer_config(
    args: RunConfig, pretrain_len: int, train_len: int | None = None, example_length: int = BLOCK_SIZE - 1
) -> TrainerConfig:
    """The loop's settings for this command (see resolve).

    pretrain_len: documents in the pretraining corpus; train_len: examples per
    epoch of the data trained on now (default pretrain_len); example_length:
    positions per example of that data, as the trainer counts tokens.
    """
    if args.schedule == "run":  # the cosine spans exactly this run's epochs (planned to the budget)
        final_tokens = args.max_epochs * (train_len or pretrain_len) * example_length
    else:  # the handout's: final_tokens fixed by the pretraining corpus, the cosine uncapped
        final_tokens = 200 * pretrain_len * BLOCK_SIZE
    return TrainerConfig(
        max_epochs=args.max_epochs,
        batch_size=args.batch_size,
        learning_rate=args.pretrain_lr if args.function == "pretrain" else args.finetune_lr,
        final_tokens=final_tokens,
        cosine_cap=args.schedule == "run",
        max_steps=args.max_steps,
        order=args.order,
        # The file order pads each batch to its longest: on a CPU, micro-batches of the same step leave that out
        # (Trainer.micro_batches); not on a GPU, whose step is bound by kernel launches, which they multiply.
        micro_batch=32 if args.order == "file" and pick_device(args.device).type == "cpu" else 0,
        decay=args.decay,
        bf16=not args.fp32,
        optimizer=args.optimizer,
        seed=args.seed,
        ckpt_path=f"{args.writing_params_path}.ckpt",
        ckpt_every=args.ckpt_every,
    )


def time_budget(args: RunConfig) -> tuple[float | None, bool]:
    """(seconds, fit) of a pretraining's time budget: fit plans the run to it (the "run" schedule,
    whose cosine spans the run), else the budget cuts the run off."""
    if args.function != "pretrain" or args.budget_minutes is None:
        return None, False
    return args.budget_minutes * 60, args.schedule == "run"


def build_model(args: RunConfig, vocab_size: int, variant: str | None = None) -> GPT:
    """The model the flags describe (variant: the positional one unless given)."""
    variant = variant or args.variant
    config = GPTConfig(
        vocab_size=vocab_size,
        block_size=BLOCK_SIZE,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        variant=variant,
        bottleneck_dim=args.bottleneck_dim,
        embd_pdrop=args.dropout,
        resid_pdrop=args.dropout,
        attn_pdrop=args.dropout,
    )
    if config.n_embd % config.n_head:
        raise UserError(f"--n_embd {config.n_embd} must be divisible by --n_head {config.n_head}")
    if config.variant == "rope" and (config.n_embd // config.n_head) % 2:
        raise UserError(f"rope needs an even head size; --n_embd {config.n_embd} / --n_head {config.n_head} is odd")
    if config.variant == "perceiver" and config.n_layer < 2:
        raise UserError("the perceiver needs --n_layer of at least 2 (down and up blocks)")
    if config.variant == "perceiver" and not 1 <= config.bottleneck_dim <= BLOCK_SIZE:
        raise UserError(f"--bottleneck_dim must be between 1 and {BLOCK_SIZE}, got {config.bottleneck_dim}")
    check_memory(config)
    return GPT(config)


def check_memory(config: GPTConfig) -> None:
    """A UserError, before any allocation, for a model whose training (fp32 weights, gradients and AdamW's
    two moments: 16 bytes a parameter) would not fit in this machine's memory."""
    params = config.n_layer * 12 * config.n_embd**2 + (2 * config.vocab_size + config.block_size) * config.n_embd
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no bound
        return
    if 16 * params > memory:
        raise UserError(
            f"--n_layer {config.n_layer} --n_embd {config.n_embd}: about {params / 1e6:,.0f}M parameters, "
            f"{16 * params / 2**30:,.0f} GiB to train; this machine has {memory / 2**30:,.0f} GiB"
        )


def check_args(args: RunConfig) -> None:
    """One-line errors for values no run can use (before any work is done)."""
    for name in ("max_epochs", "max_steps", "batch_size", "n_layer", "n_head", "n_embd"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name} must be at least 1, got {value}")
    for name in ("pretrain_lr", "finetune_lr", "budget_minutes"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UserError(f"--{name} must be a positive number, got {value}")
    if not 1 <= args.bottleneck_dim <= BLOCK_SIZE:
        raise UserError(f"--bottleneck_dim must be between 1 and {BLOCK_SIZE}, got {args.bottleneck_dim}")
    if len(args.tb_expt_name) > 100:
        raise UserError(f"--tb_expt_name is {len(args.tb_expt_name)} characters; at most 100 name a run folder")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise UserError(f"--dropout must be at least 0 and below 1, got {args.dropout}")
    if args.ckpt_every < 0:
        raise UserError(f"--ckpt_every must be 0 or more, got {args.ckpt_every}")
    if not 0 <= args.seed < 2**32:  # numpy's seeds are 32-bit
        raise UserError(f"--seed must be between 0 and {2**32 - 1}, got {args.seed}")
    name = args.tb_expt_name
    if not name or name in (".", "..") or "/" in name or (os.sep != "/" and os.sep in name):
        raise UserError(f"--tb_expt_name must be a plain name (no folders, not '.' or '..'), got {name!r}")
    if args.recite and args.reading_params_path is None:
        raise UserError("--recite recites with the pretrained --reading_params_path; give it")
    if args.recite_chars is not None and not args.recite:
        raise UserError("--recite_chars is for finetune --recite")
    if args.recite_chars is not None and not 1 <= args.recite_chars < BLOCK_SIZE:
        raise UserError(f"--recite_chars must be between 1 and {BLOCK_SIZE - 1}, got {args.recite_chars}")
    # Inputs read after the corpus and the model: checked now, before any work.
    for flag_name, path in [("--reading_params_path", args.reading_params_path)] + [
        ("--ensemble_params", p) for p in args.ensemble_params or []
    ]:
        if path is not None and not Path(path).is_file():
            found = "is not a regular file" if os.path.lexists(path) else "not found"
            raise UserError(f"{flag_name} {path}: {found}; give a params file that training wrote")
    for name, what in (("finetune_corpus_path", "finetune corpus"), ("eval_corpus_path", "eval corpus")):
        with contextlib.redirect_stdout(io.StringIO()):  # the command says where it found the file as it reads it
            find_data_file(getattr(args, name), what)
    folder = Path(args.tb_dir or ".")
    while not os.path.lexists(folder) and folder != folder.parent:  # the part that exists; the rest is made
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"--tb_dir {args.tb_dir}: {folder} is not a folder; give a folder name")
