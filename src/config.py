"""A command's settings: its flags, the presets, their resolution and checks, run.sh's plan and the model."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from dataset import ORDERS, question_problem
from model import GPT, VARIANTS, GPTConfig
from params import MODEL_SIZES, stored_sizes
from recite import ANSWER_ROOM, RECITE_CHARS, default_recite_chars, recite_chars_problem
from utils import (
    UserError,
    check_input,
    check_output_dir,
    check_output_file,
    check_path_given,
    find_data_file,
    plural,
    setting,
    setting_problems,
    training_memory_problem,
)

BLOCK_SIZE = 128
FUNCTIONS = ("pretrain", "finetune", "evaluate", "ask")

# A preset fills the flags the user left unset, research settings included, per phase: pretraining, finetuning from
# scratch, finetuning a pretrained model, and finetuning a recite reader.
#
# handout: the course's recipe: batches in file order (its DataLoader does not shuffle), decay on all but the
#   biases. On a GPU it reaches the course's published figures.
# cpu: Muon for the blocks' matrices and pretraining planned to fill --budget_minutes. Its reader takes the
#   handout's finetune, which teaches it to copy the place rather than answer from memory.
_HANDOUT_LOOP = {"schedule": "handout", "order": "file", "decay": "all_but_biases"}
PRESETS = {
    "handout": {
        "pretrain": {"max_epochs": 650, "batch_size": 128, **_HANDOUT_LOOP},
        "finetune": _HANDOUT_LOOP,
        "finetune_pretrained": {"max_epochs": 10, **_HANDOUT_LOOP},
        "reader": {"max_epochs": 10, **_HANDOUT_LOOP},
    },
    "cpu": {
        "pretrain": {
            "max_epochs": 150,
            "batch_size": 32,
            "pretrain_lr": 1e-3,
            "dropout": 0.0,
            "optimizer": "muon",
            "budget_minutes": 60,
            "schedule": "run",
        },
        "finetune": {"schedule": "run"},
        "finetune_pretrained": {"max_epochs": 5, "finetune_lr": 1e-4, "dropout": 0.0},
        "reader": {"max_epochs": 10},
    },
}


def flag(
    default: Any,
    help: str | None,
    group: str,
    commands: tuple[str, ...] = FUNCTIONS,
    *,
    kind: str = "",
    required_by: tuple[str, ...] = (),
    **rule_and_options: Any,
) -> Any:
    """A RunConfig field, the flag --<field> (positional=True: an argument) of `commands`; `help` None hides it.
    `kind`: a file ("input", "data": also looked for in data/, "output", "output_dir") or free text ("text"). The
    rest is utils.setting's rule and argparse's options."""
    return setting(
        default, help, group=group, commands=commands, kind=kind, required_by=required_by, **rule_and_options
    )


HANDOUT, OUTPUTS, TRAINING, RECIPE, RUN, SPEED = (
    "the handout's",
    "outputs",
    "training",
    "recipe",
    "budget and checkpoints",
    "speed",
)
TRAIN, PRETRAIN, FINETUNE, EVALUATE = ("pretrain", "finetune"), ("pretrain",), ("finetune",), ("evaluate",)
LOGGED = FUNCTIONS[:3]  # not ask


@dataclass
class RunConfig:
    """Every setting of a run.py command, resolved (see resolve): a field per flag. The sidecar and the
    checkpoint store it whole; these defaults are the only ones."""

    function: str = flag("", "what to do", HANDOUT, commands=())  # run.py's first argument
    variant: str = flag(
        "", "vanilla, perceiver (2023 handout) or rope (2024 handout)", HANDOUT, positional=True, choices=VARIANTS
    )
    pretrain_corpus_path: str = flag(
        "",
        "pretraining corpus (wiki.txt); defines the vocabulary in every command",
        HANDOUT,
        positional=True,
        kind="data",
    )
    reading_params_path: str | None = flag(
        None, "params to load before training or evaluating", HANDOUT, kind="input", required_by=("evaluate", "ask")
    )
    finetune_corpus_path: str | None = flag(
        None,
        "question<TAB>place file to finetune on (pretrain: with --mix_share)",
        HANDOUT,
        TRAIN,
        kind="data",
        required_by=FINETUNE,
    )
    pretrain_lr: float = flag(6e-3, "peak learning rate", HANDOUT, PRETRAIN, type=float, above=0)
    finetune_lr: float = flag(6e-4, "peak learning rate", HANDOUT, FINETUNE, type=float, above=0)
    bottleneck_dim: int = flag(
        32,
        "perceiver bottleneck length m (the 2023 handout's figures used 64; read from the params' sidecar)",
        HANDOUT,
        type=int,
        at_least=1,
        at_most=BLOCK_SIZE,
    )
    question: str | None = flag(
        None,
        'e.g. "Where was Ada Lovelace born?"',
        OUTPUTS,
        ("ask",),
        kind="text",
        positional=True,
        nargs="?",
        required_by=("ask",),
    )
    writing_params_path: str | None = flag(
        None, "where to save the trained params", OUTPUTS, TRAIN, kind="output", required_by=TRAIN
    )
    eval_corpus_path: str | None = flag(
        None, "questions (with or without places) to answer", OUTPUTS, EVALUATE, kind="data", required_by=EVALUATE
    )
    outputs_path: str | None = flag(
        None, "where to write one prediction per input line", OUTPUTS, EVALUATE, kind="output", required_by=EVALUATE
    )
    scores_path: str | None = flag(
        None, "also write answer<TAB>logprob<TAB>mean_logprob", OUTPUTS, EVALUATE, kind="output"
    )
    tb_expt_name: str = flag(
        "run", "TensorBoard run name prefix (logs go to expt/<command>/)", OUTPUTS, LOGGED, kind="text"
    )
    tb_dir: str | None = flag(
        None,
        "TensorBoard folder of this run's folder (expt/<command>; run.sh gives all its runs one)",
        OUTPUTS,
        LOGGED,
        kind="output_dir",
    )
    max_epochs: int = flag(75, "epochs", TRAINING, TRAIN, type=int, at_least=1)
    batch_size: int = flag(256, "batch size", TRAINING, TRAIN, type=int, at_least=1)
    dropout: float = flag(
        0.1, "dropout of embeddings, attention and residuals", TRAINING, TRAIN, type=float, at_least=0, at_most=0.99
    )
    optimizer: str = flag(
        "adamw",
        "adamw (the handout's) or muon for the blocks' matrices (cpu pretraining)",
        TRAINING,
        TRAIN,
        choices=["adamw", "muon"],
    )
    seed: int = flag(
        0, "seed for init, data order, corruption and dropout", TRAINING, type=int, at_least=0, at_most=2**32 - 1
    )
    n_layer: int = flag(4, "transformer blocks (perceiver: down + n_layer-2 + up)", TRAINING, type=int, at_least=1)
    n_head: int = flag(8, "attention heads", TRAINING, type=int, at_least=1)
    n_embd: int = flag(256, "embedding width", TRAINING, type=int, at_least=1)
    recite: bool = flag(
        False,
        "finetune a recite reader, which learns to read the place from what the --reading_params_path "
        "model recites (see README)",
        TRAINING,
        FINETUNE,
        action="store_true",
    )
    recite_chars: int | None = flag(
        None,
        "with --recite: characters of recollection (100; the perceiver: bottleneck_dim - 16)",
        TRAINING,
        FINETUNE,
        type=int,
    )
    preset: str = flag(
        "handout",
        "recipe for unset flags: handout (the course's, default) or cpu (README)",
        RECIPE,
        choices=list(PRESETS),
    )
    # Research settings, not in --help. schedule: "handout" (the course's cosine) or "run" (one that ends with the
    # run); mix_share and full_names: pretraining's data (dataset.py).
    schedule: str = flag("handout", None, RECIPE, TRAIN, choices=["handout", "run"])
    order: str = flag("bucketed", None, RECIPE, TRAIN, choices=ORDERS)
    decay: str = flag("matmul", None, RECIPE, TRAIN, choices=["matmul", "all_but_biases"])
    mix_share: float = flag(0.0, None, RECIPE, PRETRAIN, type=float, at_least=0, at_most=0.99)
    full_names: bool = flag(False, None, RECIPE, PRETRAIN, action="store_true")
    budget_minutes: float | None = flag(
        None,
        "stop after this many minutes of training; with --preset cpu "
        "(pretraining, finetuning from scratch) the epochs are planned to fill it",
        RUN,
        TRAIN,
        type=float,
        above=0,
    )
    max_steps: int | None = flag(None, "stop after this many optimizer steps", RUN, TRAIN, type=int, at_least=1)
    resume: bool = flag(False, "continue from <writing_params_path>.ckpt", RUN, TRAIN, action="store_true")
    ckpt_every: int = flag(100, "optimizer steps between checkpoints (0: at the end)", RUN, TRAIN, type=int, at_least=0)
    device: str = flag("auto", "where to run (auto: cuda if there is one)", RUN, choices=["auto", "cpu", "cuda"])
    fp32: bool = flag(False, "train in fp32 even where bf16 is measured faster", SPEED, TRAIN, action="store_true")
    micro_batch: int | None = flag(
        None,
        "rows per length-grouped micro-batch of the handout's file order (0: whole batches; unset: measured)",
        SPEED,
        TRAIN,
        type=int,
        at_least=0,
    )
    compile: bool = flag(
        False,
        "compile the model whole, every batch padded to the block (on CUDA: captured in "
        "CUDA graphs, for a launch-bound GPU)",
        SPEED,
        TRAIN,
        action="store_true",
    )
    threads: int | None = flag(
        None,
        "CPU threads (unset: torch's count, chosen as a planned run trains)",
        SPEED,
        type=int,
        at_least=1,
        at_most=os.cpu_count() or 1,
    )


# What --resume checks (and the data's hash): the settings that define a result.
RESUME_MUST_MATCH = tuple(
    f.name
    for f in fields(RunConfig)
    if f.metadata["group"] in (HANDOUT, TRAINING, RECIPE)
    and not f.metadata["kind"]
    and f.name not in ("function", "preset")
)


def preset_value(preset: str, phase: str, name: str) -> Any:
    """`preset`'s `name` in `phase`, else RunConfig's default."""
    return PRESETS[preset][phase].get(name, getattr(RunConfig, name))


def resolve(typed: dict) -> RunConfig:
    """A command's RunConfig: what the user typed (None: not typed), else the sizes stored with
    --reading_params_path, else the preset's phase, else RunConfig's defaults."""
    function, reading = typed["function"], typed.get("reading_params_path")
    # evaluate and ask read a finetuned model; its phase sets nothing they use
    phase = "pretrain" if function == "pretrain" else "finetune_pretrained" if reading else "finetune"
    if function == "finetune" and typed.get("recite") and reading:
        phase = "reader"
    preset_values = PRESETS[typed.get("preset") or RunConfig.preset][phase]
    stored = stored_sizes(reading, "--reading_params_path")
    given = {key: value for key, value in typed.items() if value is not None}
    if isinstance(given.get("question"), str):
        given["question"] = given["question"].strip()
    config = RunConfig(**{**preset_values, **stored, **given})
    if config.recite and config.recite_chars is None:
        config.recite_chars = default_recite_chars(config.variant, config.bottleneck_dim)
    return config


# In run.sh's cpu plan, the pretrainings (which make the answers) get at least this share of the run, and the
# control that skips pretraining at most this one.
PRETRAIN_SHARE, CONTROL_SHARE = 0.6, 0.05
STEP_MARGIN = 5  # seconds a run.py step spends starting up
VARIANT_STEPS = ("pretrain", "finetune", "pretrain_dev", "pretrain_test", "reader", "recite_dev", "recite_test")


@dataclass
class RunPlan:
    """run.sh's plan: each step's minutes (a pretraining's --budget_minutes), and the planned steps' epochs."""

    minutes: dict[str, float]
    epochs: dict[str, int]

    def lines(self, total_minutes: float) -> list[str]:
        """The plan as printed: a line per step, then the pretrainings' share."""
        pretraining = sum(m for step, m in self.minutes.items() if step.endswith("_pretrain"))
        steps = [
            f"  {step:30} {m:6.1f} min" + (f" ({plural(self.epochs[step], 'epoch')})" if step in self.epochs else "")
            for step, m in self.minutes.items()
        ]
        share = f"{pretraining:.0f} of {sum(self.minutes.values()):.0f} min, {pretraining / total_minutes:.0%}"
        return [*steps, f"  pretraining: {share} of TOTAL_MINUTES"]


def plan_run(
    total_minutes: float,
    epoch: float,
    dev: float,
    variants: list[str],
    bottleneck_dim: int,
    control_seconds: float | None = None,
    nopretrain_epochs: int | None = None,
    finetune_epochs: int | None = None,
) -> RunPlan:
    """run.sh's cpu plan, from the seconds of an epoch of finetune questions and of a dev evaluation here. The
    control takes at most CONTROL_SHARE (control_seconds once it has run), the readers fill what is left above
    PRETRAIN_SHARE, and the pretrainings share the rest. Epochs of None: the preset's."""
    total, epochs = total_minutes * 60, {}
    if control_seconds is None:  # else it ran, and said its epochs
        control_epochs = nopretrain_epochs or preset_value("cpu", "finetune", "max_epochs")
        epochs["vanilla_nopretrain_finetune"] = max(1, min(control_epochs, math.floor(CONTROL_SHARE * total / epoch)))
        control_seconds = epochs["vanilla_nopretrain_finetune"] * epoch + STEP_MARGIN
    seconds = {"london": STEP_MARGIN, "vanilla_nopretrain_finetune": control_seconds, "vanilla_nopretrain_dev": dev}
    finetune = (finetune_epochs or preset_value("cpu", "finetune_pretrained", "max_epochs")) * epoch + STEP_MARGIN
    reader_epoch = {}
    for v in variants:
        chars = default_recite_chars(v, bottleneck_dim)
        # Measured: a reader's epoch took about 2.7 question epochs at 100 characters; reciting the dev or test
        # people, four times their direct answers; reciting the training people, eight dev evaluations.
        reader_epoch[v] = 2.7 * epoch * (chars + ANSWER_ROOM) / (RECITE_CHARS + ANSWER_ROOM)
        recite = dev * (1 + 4 * chars / RECITE_CHARS)
        reading = 8 * dev * chars / RECITE_CHARS + STEP_MARGIN  # before its epochs
        steps = zip(VARIANT_STEPS, (0, finetune, dev, dev, reading, recite, recite), strict=True)
        seconds |= {f"{v}_{step}": s for step, s in steps}
    room = (1 - PRETRAIN_SHARE) * total - sum(seconds.values())
    reader_epochs = finetune_epochs or preset_value("cpu", "reader", "max_epochs")
    reader_epochs = max(1, min(reader_epochs, math.floor(room / sum(reader_epoch.values()))))
    for v in variants:
        seconds[f"{v}_reader"] += reader_epochs * reader_epoch[v]
    pretrain = max(60, (total - sum(seconds.values())) / len(variants))
    minutes = {step: (pretrain if step.endswith("_pretrain") else s) / 60 for step, s in seconds.items()}
    return RunPlan(minutes, epochs | {f"{v}_reader": reader_epochs for v in variants})


def time_budget(args: RunConfig) -> tuple[float | None, bool]:
    """(seconds, fit): fit plans the run to fill the budget, else it cuts the run off."""
    if args.budget_minutes is None:
        return None, False
    return args.budget_minutes * 60, args.schedule == "run"


def build_model(args: RunConfig, vocab_size: int) -> GPT:
    """The GPT the checked settings describe."""
    sizes = {k: getattr(args, k) for k in MODEL_SIZES}
    dropout = dict.fromkeys(("embd_pdrop", "resid_pdrop", "attn_pdrop"), args.dropout)
    return GPT(GPTConfig(vocab_size, BLOCK_SIZE, variant=args.variant, **sizes, **dropout))


def size_problem(
    variant: str, n_layer: int, n_head: int, n_embd: int, vocab_size: int = 256, block_size: int = BLOCK_SIZE
) -> str | None:
    """Why no GPT of these sizes can be built or trained here, else None."""
    if n_embd % n_head:
        return f"--n_embd {n_embd} must be divisible by --n_head {n_head}"
    if variant == "rope" and (n_embd // n_head) % 2:
        return f"rope needs an even head size; --n_embd {n_embd} / --n_head {n_head} is odd"
    if variant == "perceiver" and n_layer < 2:
        return "the perceiver needs --n_layer of at least 2 (down and up blocks)"
    parameters = n_layer * 12 * n_embd**2 + (2 * vocab_size + block_size) * n_embd
    return training_memory_problem(parameters, f"--n_layer {n_layer} --n_embd {n_embd}")


def problems(a: RunConfig) -> Iterator[str]:
    """What is wrong with a command's settings, one line each."""
    yield from setting_problems(a)
    for f in fields(a):
        if a.function in f.metadata["required_by"] and getattr(a, f.name) in (None, ""):
            what = f"a question after the corpus, {f.metadata['help']}" if f.name == "question" else f"--{f.name}"
            yield f"{a.function} needs {what}"
    if size := size_problem(a.variant, a.n_layer, a.n_head, a.n_embd):
        yield size
    if a.micro_batch is not None and a.order != "file":
        yield f"--micro_batch splits the handout's file order only; --preset {a.preset} batches by length"
    name = a.tb_expt_name
    if not name or name in (".", "..") or "/" in name or len(name) > 100:
        yield f"--tb_expt_name must be a plain name of at most 100 characters (no folders, not '.'), got {name!r}"
    if a.function == "pretrain" and bool(a.mix_share) != bool(a.finetune_corpus_path):
        yield "--mix_share mixes in --finetune_corpus_path's questions: give both or neither"
    if a.recite and a.reading_params_path is None:
        yield "--recite recites with the pretrained --reading_params_path; give it"
    if a.recite_chars is not None and not a.recite:
        yield "--recite_chars is for finetune --recite"
    elif a.recite_chars is not None and (
        room := recite_chars_problem(a.recite_chars, a.variant, a.bottleneck_dim, BLOCK_SIZE, 1)
    ):
        yield f"--recite_chars {a.recite_chars} {room}"
    if a.question and (question := question_problem(a.question, BLOCK_SIZE)):
        yield f"the question {question}"


def check_args(args: RunConfig) -> None:
    """A one-line UserError, before any work, at the first problem in a command's settings or paths."""
    problem = next(problems(args), None)
    if problem is not None:
        raise UserError(problem)
    rules = {"input": check_input, "data": find_data_file, "output": check_output_file, "output_dir": check_output_dir}
    for f in fields(args):
        path, rule = getattr(args, f.name), rules.get(f.metadata["kind"])
        flag = f.name if f.metadata.get("positional") else f"--{f.name}"
        if rule and path is not None:
            check_path_given(path, flag)
            rule(path, flag)
