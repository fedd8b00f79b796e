"""From the command line's flags to a command's settings: the presets (recipes), their resolution and checks, run.sh's
plan and the GPT a command builds."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from dataset import ORDERS, question_problem
from model import GPT, VARIANTS, GPTConfig
from params import MODEL_SIZES, stored_sizes
from recite import ANSWER_ROOM, RECITE_CHARS, default_recite_chars
from utils import (
    UserError,
    check_input,
    check_output_dir,
    check_output_file,
    check_path_given,
    find_data_file,
    physical_memory,
    plural,
    setting,
    setting_problems,
)

BLOCK_SIZE = 128
FUNCTIONS = ("pretrain", "finetune", "evaluate", "ask")

# Each preset fills the flags the user left unset, per phase: pretraining, finetuning from scratch, finetuning a
# pretrained model (the handout's "fewer epochs after pretraining"), and finetuning a recite reader from one
# (finetune --recite). A phase also names its learning-rate schedule (--schedule "handout": the cosine fixed by
# the corpus size, uncapped; "run": a cosine that ends with the run), and may name how examples are batched and
# which parameters decay (--order, --decay: see trainer.TrainerConfig); what neither the preset nor the user
# sets comes from RunConfig.
#
# handout: the course's recipe, as its trainer runs it: batches in file order, the same every epoch (its
#   DataLoader does not shuffle), and weight decay on every parameter but the biases. Measured on a GPU, this
#   is what reaches the course's published figures.
# cpu: this repository's recipe for a small CPU: Muon for the blocks' matrices, pretraining planned after every
#   epoch to fill --budget_minutes (at most max_epochs) with the cosine ending there, and a gentle finetune that
#   keeps what was stored; its recite reader takes the handout's finetune, which teaches it to copy the place
#   out of the recitation rather than answer from memory.
_HANDOUT_LOOP = {"schedule": "handout", "order": "file", "decay": "all_but_biases"}
PRESETS = {
    "handout": {
        "pretrain": {"max_epochs": 650, "batch_size": 128, **_HANDOUT_LOOP},
        "finetune": _HANDOUT_LOOP,
        "finetune_pretrained": {"max_epochs": 10, **_HANDOUT_LOOP},
        "reader": {"max_epochs": 10, **_HANDOUT_LOOP},
    },
    "cpu": {
        "pretrain": {"max_epochs": 150, "batch_size": 32, "pretrain_lr": 1e-3, "dropout": 0.0, "optimizer": "muon",
                     "budget_minutes": 60, "schedule": "run"},
        "finetune": {"schedule": "run"},
        "finetune_pretrained": {"max_epochs": 5, "finetune_lr": 1e-4, "dropout": 0.0},
        "reader": {"max_epochs": 10},
    },
}  # fmt: skip


def flag(default: Any, help: str | None, group: str, commands: tuple[str, ...] = FUNCTIONS, *, kind: str = "",
         required_by: tuple[str, ...] = (), **rule_and_options: Any) -> Any:  # fmt: skip
    """A RunConfig field that is also a flag --<field> (positional=True: an argument) of the run.py `commands`
    that use it (another command refuses it) and required by `required_by`: its default, its --help line
    (None: hidden) and group, its rule (utils.setting: at_least, above, at_most), and its kind where it names a
    file ("input", "data": an input also looked up in data/, "output", "output_dir") or is free text ("text");
    the rest are argparse's options (type, choices, nargs, action)."""
    return setting(default, help, group=group, commands=commands, kind=kind, required_by=required_by,
                   **rule_and_options)  # fmt: skip


HANDOUT, OUTPUTS, TRAINING, RECIPE, RUN, SPEED = (
    "the handout's", "outputs", "training", "recipe", "budget and checkpoints", "speed"
)  # fmt: skip
TRAIN, PRETRAIN, FINETUNE, EVALUATE = ("pretrain", "finetune"), ("pretrain",), ("finetune",), ("evaluate",)
LOGGED = ("pretrain", "finetune", "evaluate")


@dataclass
class RunConfig:
    """Every setting of a run.py command, resolved (see resolve). Each field is the flag of the same name,
    from the command line to the params' sidecar and the checkpoint, which store it whole, and carries its
    rule (check_args applies them all); the defaults here are the only ones: the preset's phase overrides
    them (PRESETS), then the read params' sidecar (model sizes), then what the user typed."""

    function: str = flag("", "what to do", HANDOUT, commands=())  # the command word, run.py's first argument
    variant: str = flag("", "vanilla, perceiver (2023 handout) or rope (2024 handout)", HANDOUT,
                        positional=True, choices=VARIANTS)  # fmt: skip
    pretrain_corpus_path: str = flag("", "pretraining corpus (wiki.txt); defines the vocabulary in every command",
                                     HANDOUT, positional=True, kind="data")  # fmt: skip
    reading_params_path: str | None = flag(None, "params to load before training or evaluating", HANDOUT,
                                           kind="input", required_by=("evaluate", "ask"))  # fmt: skip
    finetune_corpus_path: str | None = flag(None, "question<TAB>place file to finetune on", HANDOUT, FINETUNE,
                                            kind="data", required_by=FINETUNE)  # fmt: skip
    pretrain_lr: float = flag(6e-3, "peak learning rate", HANDOUT, PRETRAIN, type=float, above=0)
    finetune_lr: float = flag(6e-4, "peak learning rate", HANDOUT, FINETUNE, type=float, above=0)
    bottleneck_dim: int = flag(32, "perceiver bottleneck length m (the 2023 handout's figures used 64; read "
                               "from the params' sidecar)", HANDOUT, type=int, at_least=1, at_most=BLOCK_SIZE)  # fmt: skip
    question: str | None = flag(None, 'e.g. "Where was Ada Lovelace born?"', OUTPUTS, ("ask",), kind="text",
                                positional=True, nargs="?", required_by=("ask",))  # fmt: skip
    writing_params_path: str | None = flag(None, "where to save the trained params", OUTPUTS, TRAIN, kind="output",
                                           required_by=TRAIN)  # fmt: skip
    eval_corpus_path: str | None = flag(None, "questions (with or without places) to answer", OUTPUTS, EVALUATE,
                                        kind="data", required_by=EVALUATE)  # fmt: skip
    outputs_path: str | None = flag(None, "where to write one prediction per input line", OUTPUTS, EVALUATE,
                                    kind="output", required_by=EVALUATE)  # fmt: skip
    scores_path: str | None = flag(None, "also write answer<TAB>logprob<TAB>mean_logprob", OUTPUTS, EVALUATE,
                                   kind="output")  # fmt: skip
    tb_expt_name: str = flag("run", "TensorBoard run name prefix (logs go to expt/<command>/)", OUTPUTS, LOGGED,
                             kind="text")  # fmt: skip
    tb_dir: str | None = flag(None, "TensorBoard folder of this run's folder (expt/<command>; run.sh gives all its "
                              "runs one)", OUTPUTS, LOGGED, kind="output_dir")  # fmt: skip
    max_epochs: int = flag(75, "epochs", TRAINING, TRAIN, type=int, at_least=1)
    batch_size: int = flag(256, "batch size", TRAINING, TRAIN, type=int, at_least=1)
    dropout: float = flag(0.1, "dropout of embeddings, attention and residuals", TRAINING, TRAIN, type=float,
                          at_least=0, at_most=0.99)  # fmt: skip
    optimizer: str = flag("adamw", "adamw (the handout's) or muon for the blocks' matrices (cpu pretraining)",
                          TRAINING, TRAIN, choices=["adamw", "muon"])  # fmt: skip
    seed: int = flag(0, "seed for init, data order, corruption and dropout", TRAINING, type=int, at_least=0,
                     at_most=2**32 - 1)  # fmt: skip
    n_layer: int = flag(4, "transformer blocks (perceiver: down + n_layer-2 + up)", TRAINING, type=int, at_least=1)
    n_head: int = flag(8, "attention heads", TRAINING, type=int, at_least=1)
    n_embd: int = flag(256, "embedding width", TRAINING, type=int, at_least=1)
    recite: bool = flag(False, "finetune a recite reader: the --reading_params_path model recites each training "
                        "person and the reader learns to read the place from that (evaluate and ask then recite "
                        "first: see README)", TRAINING, FINETUNE, action="store_true")  # fmt: skip
    recite_chars: int | None = flag(None, "with --recite: characters of recollection (100; the perceiver: "
                                    "bottleneck_dim - 16)", TRAINING, FINETUNE, type=int, at_least=1,
                                    at_most=BLOCK_SIZE - ANSWER_ROOM)  # fmt: skip
    preset: str = flag("handout", "recipe for unset flags: handout (the course's, default) or cpu (README)", RECIPE,
                       choices=list(PRESETS))  # fmt: skip
    # Research settings that the presets set: not in --help.
    schedule: str = flag("handout", None, RECIPE, TRAIN, choices=["handout", "run"])
    order: str = flag("bucketed", None, RECIPE, TRAIN, choices=ORDERS)
    decay: str = flag("matmul", None, RECIPE, TRAIN, choices=["matmul", "all_but_biases"])
    budget_minutes: float | None = flag(None, "stop after this many minutes of training; with --preset cpu "
                                        "(pretraining, finetuning from scratch) the epochs are planned after every "
                                        "epoch to fill it at the pace measured, the cosine ending with them", RUN,
                                        TRAIN, type=float, above=0)  # fmt: skip
    max_steps: int | None = flag(None, "stop after this many optimizer steps", RUN, TRAIN, type=int, at_least=1)
    resume: bool = flag(False, "continue from <writing_params_path>.ckpt", RUN, TRAIN, action="store_true")
    ckpt_every: int = flag(100, "optimizer steps between checkpoints (0: at the end)", RUN, TRAIN, type=int,
                           at_least=0)  # fmt: skip
    device: str = flag("auto", "where to run (auto: cuda if there is one)", RUN, choices=["auto", "cpu", "cuda"])
    fp32: bool = flag(False, "train in fp32 even where bf16 is measured faster", SPEED, TRAIN, action="store_true")
    micro_batch: int | None = flag(None, "rows per length-grouped micro-batch of the handout's file order (0: whole "
                                   "batches; unset: measured)", SPEED, TRAIN, type=int, at_least=0)  # fmt: skip
    compile: bool = flag(False, "compile the model whole, every batch padded to the block (on CUDA: captured in "
                         "CUDA graphs, for a launch-bound GPU)", SPEED, TRAIN, action="store_true")  # fmt: skip
    threads: int | None = flag(None, "CPU threads (unset: torch's count, chosen as a planned run trains)", SPEED,
                               type=int, at_least=1, at_most=os.cpu_count() or 1)  # fmt: skip


# What defines a run's result: --resume refuses a checkpoint made with another value of these (the data's
# contents are compared by hash; where outputs go, budgets, checkpoints, device, precision and threads may change).
RESUME_MUST_MATCH = ("variant", "pretrain_lr", "finetune_lr", "bottleneck_dim", "max_epochs", "batch_size",
                     "dropout", "optimizer", "seed", "n_layer", "n_head", "n_embd", "recite", "recite_chars",
                     "schedule", "order", "decay")  # fmt: skip


def preset_value(preset: str, phase: str, name: str) -> Any:
    """What `preset` gives setting `name` in `phase`: its own value, else RunConfig's default."""
    return PRESETS[preset][phase].get(name, getattr(RunConfig, name))


def resolve(typed: dict) -> RunConfig:
    """The RunConfig of a command from the values the user typed (None: not typed): RunConfig's
    defaults, then the preset's phase, then the model sizes stored with --reading_params_path (see
    stored_sizes), then what the user typed."""
    function, reading = typed["function"], typed.get("reading_params_path")
    # the preset's phase; evaluate and ask read a finetuned model, whose phase only names settings they do not use
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


# run.sh's plan with the cpu preset: the answers come from the pretrainings, which get at least this share of the
# run; the finetune without pretraining (a control that scores near zero) at most this one, its epochs planned to it.
PRETRAIN_SHARE, CONTROL_SHARE = 0.6, 0.05
STEP_MARGIN = 5  # seconds a run.py step spends starting (torch, the data) beside its work
VARIANT_STEPS = ("pretrain", "finetune", "pretrain_dev", "pretrain_test", "reader", "recite_dev", "recite_test")


@dataclass
class RunPlan:
    """run.sh's plan: each step's minutes by run.sh's step name (a pretraining's are its --budget_minutes), and the
    epochs of the steps whose epochs are planned (the control and the readers)."""

    minutes: dict[str, float]
    epochs: dict[str, int]

    def lines(self, total_minutes: float) -> list[str]:
        """The plan as said before the work: a line a step, then the pretrainings' share of the run."""
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
    """run.sh's plan with the cpu preset, from the seconds of an epoch of the finetune's questions and of a dev
    evaluation on this machine. The finetunes after pretraining and the evaluations stay whole; the control takes at
    most CONTROL_SHARE (control_seconds, once it ran); the readers' epochs, the same for every variant, fill what is
    left above PRETRAIN_SHARE; the pretrainings share the rest (at least a minute each). nopretrain_epochs and
    finetune_epochs (the finetunes' and readers'): run.sh's; None: the preset's."""
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
        # A reader's examples (the recitations that hold their place, about 85%, and the answer) made an epoch of
        # about 2.7 epochs of questions at 100 characters. Reciting the dev or test people took about four times
        # their direct answers; reciting the 2,000 training people, eight dev evaluations.
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
    """(seconds, fit) of a training's time budget: fit plans the run to it (the "run" schedule,
    whose cosine spans the run), else the budget cuts the run off."""
    if args.budget_minutes is None:
        return None, False
    return args.budget_minutes * 60, args.schedule == "run"


def build_model(args: RunConfig, vocab_size: int, variant: str | None = None) -> GPT:
    """The model the settings describe (variant: the positional one unless given), checked by check_args."""
    sizes = {k: getattr(args, k) for k in MODEL_SIZES}
    dropout = dict.fromkeys(("embd_pdrop", "resid_pdrop", "attn_pdrop"), args.dropout)
    return GPT(GPTConfig(vocab_size, BLOCK_SIZE, variant=variant or args.variant, **sizes, **dropout))


def memory_problem(n_layer: int, n_embd: int, vocab_size: int = 256, block_size: int = BLOCK_SIZE) -> str | None:
    """Why a GPT of these sizes cannot train on this machine: its fp32 weights, gradients and AdamW's two
    moments (16 bytes a parameter) exceed the memory; else None."""
    need, have, gb = 16 * (n_layer * 12 * n_embd**2 + (2 * vocab_size + block_size) * n_embd), physical_memory(), 2**30
    sizes = f"--n_layer {n_layer} --n_embd {n_embd}: {need / gb:,.0f} GiB to train"
    return f"{sizes}; this machine has {have / gb:,.0f} GiB" if need > have else None


def problems(args: RunConfig) -> Iterator[str]:
    """What is wrong with a command's settings, one line each: every field's rule (its range, and the
    commands that require it), then the rules that tie fields together."""
    yield from setting_problems(args)
    for f in fields(args):
        if args.function in f.metadata["required_by"] and getattr(args, f.name) in (None, ""):
            what = f"a question after the corpus, {f.metadata['help']}" if f.name == "question" else f"--{f.name}"
            yield f"{args.function} needs {what}"
    a = args
    if a.n_embd % a.n_head:
        yield f"--n_embd {a.n_embd} must be divisible by --n_head {a.n_head}"
    elif a.variant == "rope" and (a.n_embd // a.n_head) % 2:
        yield f"rope needs an even head size; --n_embd {a.n_embd} / --n_head {a.n_head} is odd"
    if a.micro_batch is not None and a.order != "file":
        yield f"--micro_batch splits the handout's file order only; --preset {a.preset} batches by length"
    if a.variant == "perceiver" and a.n_layer < 2:
        yield "the perceiver needs --n_layer of at least 2 (down and up blocks)"
    if memory := memory_problem(a.n_layer, a.n_embd):
        yield memory
    name = a.tb_expt_name
    if not name or name in (".", "..") or "/" in name or len(name) > 100:
        yield f"--tb_expt_name must be a plain name of at most 100 characters (no folders, not '.'), got {name!r}"
    if a.recite and a.reading_params_path is None:
        yield "--recite recites with the pretrained --reading_params_path; give it"
    if a.recite_chars is not None and not a.recite:
        yield "--recite_chars is for finetune --recite"
    if a.question and (question := question_problem(a.question, BLOCK_SIZE)):
        yield f"the question {question}"


def check_args(args: RunConfig) -> None:
    """One-line error for the first problem of a command's settings, before any work; then the file rules
    of every path it names (inputs readable, outputs writable, tb_dir a folder or makeable)."""
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
