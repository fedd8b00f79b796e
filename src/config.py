"""From the command line's flags to the model and trainer configs: the presets (recipes),
their resolution, the TrainerConfig of a phase and the GPT a command builds."""

from __future__ import annotations

import argparse
import math
import os

from model import GPT, GPTConfig
from params import stored_sizes
from recite import ANSWER_ROOM, RECITE_CHARS
from trainer import TrainerConfig
from utils import UserError

BLOCK_SIZE = 128

# Each preset fills the flags the user left unset, per phase: pretraining, finetuning
# from scratch, finetuning a pretrained model (the handout's "fewer epochs after
# pretraining"), and finetuning a recite reader from one (finetune --recite). A phase
# also names its learning-rate schedule (--schedule "handout": the cosine fixed by the
# corpus size, uncapped; "run": a cosine that ends with the run), and
# may name how examples are batched and which parameters decay (--order, --decay: see
# trainer.TrainerConfig); what neither the preset nor the user sets comes from DEFAULTS.
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
DEFAULTS = {"pretrain_lr": 6e-3, "finetune_lr": 6e-4, "doc_offset": 0, "optimizer": "adamw", "order": "bucketed",
            "decay": "matmul", "n_layer": 4, "n_head": 8, "n_embd": 256, "bottleneck_dim": 32}  # fmt: skip
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


def apply_preset(args: argparse.Namespace) -> None:
    """Resolve every flag: DEFAULTS, then the preset's phase, then the model sizes stored with
    --reading_params_path (see stored_sizes), then what the user typed (not None)."""
    if args.function == "pretrain":
        phase = "pretrain"
    elif args.function == "finetune" and args.recite and args.reading_params_path:
        phase = "reader"
    else:  # evaluate reads a finetuned model: its phase only names the flags, which it ignores
        phase = "finetune_pretrained" if args.reading_params_path else "finetune"
    stored = stored_sizes(args.reading_params_path, "--reading_params_path")
    typed = {key: value for key, value in vars(args).items() if value is not None}
    vars(args).update({**DEFAULTS, **PRESETS[args.preset][phase], **stored, **typed})


def pretrain_budget_minutes(
    total_minutes: float,
    used_seconds: float,
    nopretrain_seconds: float,
    dev_seconds: float,
    variants: list[str],
    bottleneck_dim: int,
) -> float:
    """run.sh with the cpu preset: the minutes each of `variants` may pretrain, in equal shares of what is
    left of total_minutes after used_seconds once every variant's other steps are set aside. Those are
    estimated from two steps just timed on this machine: the finetune from scratch (nopretrain_seconds,
    the preset's epochs of question examples) and one dev evaluation (dev_seconds)."""
    cpu = PRESETS["cpu"]
    epoch = nopretrain_seconds / cpu["finetune"]["max_epochs"]
    others = 2 * dev_seconds  # the ensemble's evaluation at the end
    for variant in variants:
        chars = bottleneck_dim - ANSWER_ROOM if variant == "perceiver" else RECITE_CHARS
        # A recite reader's epoch took about 2.7 epochs of questions: its examples (the recitations that
        # hold their place, about 85%) are three times as long at 100 characters of recitation.
        reader_epoch = 2.7 * epoch * (chars + ANSWER_ROOM) / (RECITE_CHARS + ANSWER_ROOM)
        finetunes = epoch * cpu["finetune_pretrained"]["max_epochs"] + reader_epoch * cpu["reader"]["max_epochs"]
        # six evaluations' worth: direct and recite answers to dev and test, reciting the training people
        others += finetunes + 6 * dev_seconds + 30  # and half a minute of margin
    return max(1.0, (total_minutes * 60 - used_seconds - others) / len(variants) / 60)


def trainer_config(
    args: argparse.Namespace, pretrain_len: int, train_len: int | None = None, example_length: int = BLOCK_SIZE - 1
) -> TrainerConfig:
    """TrainerConfig from the resolved flags (see apply_preset).

    pretrain_len: documents in the pretraining corpus; train_len: examples per
    epoch of the data trained on now (default pretrain_len); example_length:
    positions per example of that data, as the trainer counts tokens.
    """
    if args.schedule == "run":  # the cosine spans exactly this run's epochs (planned to the budget)
        final_tokens = args.max_epochs * (train_len or pretrain_len) * example_length
    else:  # the handout's: final_tokens fixed by the pretraining corpus, the cosine uncapped
        final_tokens = 200 * pretrain_len * BLOCK_SIZE
    budget = args.budget_minutes if args.function == "pretrain" else None
    return TrainerConfig(
        max_epochs=args.max_epochs,
        batch_size=args.batch_size,
        learning_rate=args.pretrain_lr if args.function == "pretrain" else args.finetune_lr,
        lr_decay=True,
        warmup_tokens=512 * 20,
        final_tokens=final_tokens,
        cosine_cap=args.schedule == "run",
        max_steps=args.max_steps,
        budget_seconds=None if budget is None else budget * 60,
        budget_fit=budget is not None and args.schedule == "run",
        order=args.order,
        decay=args.decay,
        bf16=not args.fp32,
        optimizer=args.optimizer,
        seed=args.seed,
        ckpt_path=f"{args.writing_params_path}.ckpt",
        ckpt_every=args.ckpt_every,
    )


def build_model(args: argparse.Namespace, vocab_size: int, variant: str | None = None) -> GPT:
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
    return GPT(config)


def check_args(args: argparse.Namespace) -> None:
    """One-line errors for values no run can use (before any work is done)."""
    for flag in ("max_epochs", "max_steps", "batch_size", "n_layer", "n_head", "n_embd"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UserError(f"--{flag} must be at least 1, got {value}")
    for flag in ("pretrain_lr", "finetune_lr", "budget_minutes"):
        value = getattr(args, flag)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UserError(f"--{flag} must be a positive number, got {value}")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise UserError(f"--dropout must be at least 0 and below 1, got {args.dropout}")
    if args.ckpt_every < 0:
        raise UserError(f"--ckpt_every must be 0 or more, got {args.ckpt_every}")
    if not 0 <= args.seed < 2**32:  # numpy's seeds are 32-bit
        raise UserError(f"--seed must be between 0 and {2**32 - 1}, got {args.seed}")
    name = args.tb_expt_name
    if not name or name in (".", "..") or "/" in name or (os.sep != "/" and os.sep in name):
        raise UserError(f"--tb_expt_name must be a plain name (no folders, not '.' or '..'), got {name!r}")
    if args.doc_offset and args.function != "pretrain":
        raise UserError("--doc_offset is for pretrain only")
    if args.budget_minutes is not None and args.function != "pretrain":
        raise UserError("--budget_minutes is for pretrain only")
    if args.recite and (args.function != "finetune" or args.reading_params_path is None):
        raise UserError("--recite is for finetune, and recites with the pretrained --reading_params_path")
    if args.recite_chars is not None and not args.recite:
        raise UserError("--recite_chars is for finetune --recite")
    if args.ensemble_params and args.function != "evaluate":
        raise UserError("--ensemble_params is for evaluate only")
