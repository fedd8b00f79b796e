"""Command line: pretrain, finetune or evaluate a character GPT on the birth-place task.

    python src/run.py pretrain vanilla wiki.txt --writing_params_path vanilla.pretrain.params
    python src/run.py finetune vanilla wiki.txt --reading_params_path vanilla.pretrain.params \\
        --writing_params_path vanilla.finetune.params --finetune_corpus_path birth_places_train.tsv
    python src/run.py evaluate vanilla wiki.txt --reading_params_path vanilla.finetune.params \\
        --eval_corpus_path birth_dev.tsv --outputs_path vanilla.pretrain.dev.predictions
    python src/run.py ask vanilla wiki.txt --reading_params_path vanilla.finetune.params "Where was Ada Lovelace born?"

Variants: vanilla, perceiver (2023; add --bottleneck_dim 64), rope (2024). The corpus (third argument)
defines the vocabulary in every mode; a bare data file name missing here is read from data/. --preset
handout (the default) is the course's recipe, --preset cpu a small CPU's (README).
"""

# ruff: noqa: E402 - the SIGINT handler must come before importing torch

from __future__ import annotations

import os
import signal
import sys

# Ctrl-C while torch loads exits at once and quietly. os._exit, because an exception raised inside an
# import can leave a module half made.
if __name__ == "__main__":
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

import argparse
import contextlib
import dataclasses
import io
import shlex
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

import budget
import machine
import recite
from answers import ask, evaluate
from config import (
    BLOCK_SIZE,
    FUNCTIONS,
    PRESETS,
    RESUME_MUST_MATCH,
    RunConfig,
    build_model,
    check_args,
    preset_value,
    problems,
    resolve,
    time_budget,
)
from dataset import BatchedDataset, CharCorruptionDataset, MixedDataset, NameDataset, read_text
from logs import tensorboard_run
from model import GPT
from params import load_params, read_sidecar, save_params, sidecar_path
from trainer import Trainer, TrainerConfig
from utils import (
    TrainingInterrupted,
    UserError,
    check_free_space,
    check_output_file,
    file_sha256,
    locate_data,
    plural,
    provenance,
    refuse_same_file,
    seed_everything,
    torch_load_safe,
)


def data_files(args: RunConfig) -> dict[str, Path]:
    """The command's data files by flag, as locate_data finds them."""
    names = {"the pretraining corpus": args.pretrain_corpus_path}
    names |= {f"--{k}": getattr(args, k) for k in ("finetune_corpus_path", "eval_corpus_path")}
    return {flag: locate_data(name) for flag, name in names.items() if name is not None}


def refuse_overwriting_inputs(args: RunConfig) -> None:
    """Refuse an output, or a file written beside one (a sidecar, a .ckpt), that is also an input or another output;
    check before any work that those beside can be written (check_args did the outputs)."""
    read, written, outputs_path = args.reading_params_path, args.writing_params_path, args.outputs_path
    inputs = {
        **data_files(args),
        "--reading_params_path": read,
        "--reading_params_path's sidecar": read and sidecar_path(read),
    }
    outputs = {f"--{k}": getattr(args, k) for k in ("outputs_path", "scores_path", "tb_dir", "writing_params_path")}
    beside = {
        "--writing_params_path's sidecar": written and sidecar_path(written),
        "--writing_params_path's checkpoint": written and f"{written}.ckpt",
        "--outputs_path's sidecar": outputs_path and sidecar_path(outputs_path),
    }
    refuse_same_file(outputs | beside, inputs)
    for flag, output in beside.items():
        check_output_file(output, flag)


# TrainerConfig fields copied from the flags of the same name.
TRAINER_SETTINGS = "max_epochs batch_size max_steps order decay optimizer seed ckpt_every compile".split()


def resume(args: RunConfig, trainer: Trainer) -> None:
    """With --resume, continue `trainer` from its checkpoint, refusing one of other RESUME_MUST_MATCH settings, data
    or starting params; without, warn if a checkpoint will be replaced."""
    path = trainer.config.ckpt_path
    if not args.resume:
        if os.path.exists(path):
            print(f"warning: {path} exists; this fresh run replaces it at its first checkpoint (--resume continues it)")
        return
    ckpt, made_with = torch_load_safe(path, "--resume: the checkpoint"), trainer.extra
    extra = ckpt.get("extra") if isinstance(ckpt, dict) else None
    if not (isinstance(extra, dict) and isinstance(extra.get("config"), dict)):
        raise UserError(f"{path}: not a checkpoint written by this version of run.py")
    saved, hashes = extra["config"], extra.get("data_sha256")
    hashes = hashes if isinstance(hashes, dict) else {}
    changed = [
        f"with --{k} {saved.get(k)!r}, this command has {getattr(args, k)!r}"
        for k in RESUME_MUST_MATCH
        if saved.get(k) != getattr(args, k)
    ]
    changed += [
        f"on another {p}: its contents have changed since"
        for p, sha in made_with["data_sha256"].items()
        if hashes.get(p) != sha
    ]
    if extra.get("parent_sha256") != made_with["parent_sha256"]:
        changed.append(f"from other params than {args.reading_params_path} holds now")
    if changed:
        raise UserError(f"--resume: {path} was made {changed[0]}")
    try:
        trainer.resume(ckpt)
    except ValueError as e:
        raise UserError(f"{path}: not a checkpoint of this run ({e}); delete it to start afresh") from None
    print(f"resuming from {path}: step {trainer.state.step}, epoch {trainer.state.epoch + 1}")


def train(
    args: RunConfig,
    corpus: CharCorruptionDataset,
    model: GPT,
    device: torch.device,
    writer: SummaryWriter,
    command: str,
) -> dict:
    """Pretrain or finetune, write --writing_params_path, and return the run's record (run_record)."""
    start = args.reading_params_path
    parent = start and load_params(model, corpus.vocab, start)  # the SHA-256 of the params it starts from
    ckpt_path = f"{args.writing_params_path}.ckpt"
    check_room(ckpt_path, args.writing_params_path, model)
    dataset, extra = training_data(args, corpus, model, device)
    # the file order in micro-batches where measured cheap; a bucketed batch is cropped whole
    chosen = machine.choose(device, args.fp32, args.micro_batch if args.order == "file" else 0)
    cfg = TrainerConfig(
        **{name: getattr(args, name) for name in TRAINER_SETTINGS},
        learning_rate=args.pretrain_lr if args.function == "pretrain" else args.finetune_lr,
        # "run": the cosine spans this run's epochs. "handout": it spans 200 passes over the corpus, then goes on
        final_tokens=args.max_epochs * len(dataset) * dataset.example_length
        if args.schedule == "run"
        else 200 * len(corpus) * BLOCK_SIZE,
        cosine_cap=args.schedule == "run",
        micro_batch=chosen["micro_batch"],
        precision=chosen["precision"],
        ckpt_path=ckpt_path,
    )
    data = {str(path): file_sha256(path) for path in data_files(args).values()}
    made_with = dict(config=asdict(args), vocab="".join(corpus.vocab.itos), data_sha256=data, parent_sha256=parent)
    budget_seconds, fit = time_budget(args)
    announce(args, cfg, len(dataset), device, fit)
    trainer = Trainer(model, dataset, cfg, device, log=writer.add_scalar, extra=made_with)
    pace = budget.attach(trainer, budget_seconds, fit, args.threads)
    resume(args, trainer)
    t0 = time.time()
    with stop_on_signals(trainer):
        trainer.train()
    seconds = time.time() - t0
    made = {"command": command, **made_with, **provenance(device), "speed": chosen}
    done = run_record(trainer, pace)
    save_params(model, corpus.vocab, args.writing_params_path, {**made, **done, **extra})
    print(
        f"trained {trainer.state.step} steps in {seconds:.1f} s; params written to {args.writing_params_path}"
        + end_of_run(trainer, Path(ckpt_path))
    )
    return done


def check_room(ckpt_path: str, params_path: str, model: GPT) -> None:
    """A UserError unless the disk holds two checkpoints (each under 3x the weights) and the params."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    replaced = sum(os.path.getsize(p) for p in (ckpt_path, params_path) if os.path.isfile(p))
    check_free_space(ckpt_path, 7 * weights - replaced, "two checkpoints (one replacing the other), params")


def end_of_run(trainer: Trainer, ckpt_path: Path) -> str:
    """Remove a finished run's checkpoint; what the last line adds about a resumable one."""
    s = trainer.state
    if not s.stop and s.epoch < s.max_epochs and ckpt_path.is_file():  # --max_steps
        return f"; kept {ckpt_path} ({ckpt_path.stat().st_size / 1e6:.0f} MB) for --resume"
    ckpt_path.unlink(missing_ok=True)
    return ""


def training_data(
    args: RunConfig, corpus: CharCorruptionDataset, model: GPT, device: torch.device
) -> tuple[BatchedDataset, dict]:
    """What this command trains on (the corpus, maybe mixed, the questions, or recitations), what its sidecar adds."""
    start = args.reading_params_path
    if start is not None and (read_sidecar(start) or {}).get("protocol") == "recite":
        if args.recite:
            raise UserError(
                f"--reading_params_path {start} is a recite reader; --recite recites with pretrained params"
            )
        print(f"note: {start} is a recite reader: training starts from its weights and answers directly")
    path = args.finetune_corpus_path and locate_data(args.finetune_corpus_path)
    if args.function == "pretrain":
        return (MixedDataset(corpus, path, args.mix_share) if path else corpus), {}
    if not args.recite:
        return NameDataset(corpus, path), {}
    most = args.max_steps * args.batch_size if args.max_steps else None
    dataset, recitations = recite.reader_dataset(corpus, model, path, args.recite_chars, device, most)
    link = recite.link_to_pretrained(args.writing_params_path, args.reading_params_path, args.recite_chars)
    return dataset, {**link, "recitations": recitations}


def announce(args: RunConfig, cfg: TrainerConfig, examples: int, device: torch.device, fit: bool) -> None:
    """Print what this run trains and how long; warn of the handout's recipe on a CPU."""
    planned = f" at most, planned to {args.budget_minutes:g} minutes after every epoch" if fit else ""
    print(f"{args.function} {args.variant}: {examples} examples, {plural(cfg.max_epochs, 'epoch')}{planned}, {device}")
    if device.type == "cpu" and args.preset == "handout":
        print(
            "note: the handout's recipe is made for a GPU and takes hours on a CPU (the first steps say how "
            "many); --preset cpu is the recipe for a CPU, planned to --budget_minutes (README)"
        )


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals(trainer: Trainer) -> Iterator[None]:
    """Inside, STOP_SIGNALS ask `trainer` to checkpoint and stop after its current step."""

    def request_stop(signum: int, frame: object) -> None:
        trainer.stop_requested = True

    previous = {sig: signal.signal(sig, request_stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_record(trainer: Trainer, pace: budget.Pace) -> dict:
    """How far training got and how long it took (for the sidecar)."""
    s = trainer.state
    return {
        "steps": s.step,
        "epochs_done": round(s.epoch + s.batch_in_epoch / max(1, s.batches_per_epoch), 3),
        "planned_epochs": s.max_epochs,  # a budget's plan may have changed the epochs asked for
        "train_seconds": s.seconds,
        "final_loss": s.losses[-1] if s.losses else None,
        "final_lr": s.lr,
        "replans": pace.replans,
        "thread_switches": pace.threads.switches if pace.threads else 0,
    }


# CLI


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line and exit code 2, naming the commands of a misplaced flag."""

    def error(self, message: str) -> None:  # type: ignore[override]
        uses = {f"--{name}": f.metadata["commands"] for name, f in FIELDS.items()}
        extra = message.removeprefix("unrecognized arguments: ") if "unrecognized" in message else ""
        misplaced = [f"{w} is for {' and '.join(uses[w])}" for w in extra.split() if uses.get(w)]
        if misplaced:
            message = f"{', '.join(misplaced)}, not {self.prog.removeprefix('run.py ')}"
        elif extra and not extra.startswith("-"):
            message = f"unexpected argument {extra!r}: a question is only for ask"
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


COMMANDS_HELP = """commands (run.py COMMAND --help lists a command's flags):
  pretrain    span-corruption pretraining on the corpus
  finetune    finetune on question<TAB>place lines (--recite: a recite reader)
  evaluate    answer an eval corpus, one prediction per line, and score it
  ask         answer one question, with its confidence and the beam's top 3"""


def make_parser(command: str | None = None) -> Parser:
    """The parser of `command`'s RunConfig fields, by help group, or without a command the overview's; every default
    None, so that config.resolve can tell what was typed."""
    if command is None:
        p = Parser(
            prog="run.py",
            description=__doc__,
            epilog=COMMANDS_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("command", choices=FUNCTIONS, help="what to do (see below)")
        return p
    p = Parser(prog=f"run.py {command}", description=COMMANDS_HELP.splitlines()[FUNCTIONS.index(command) + 1].strip())
    used = [f for f in FIELDS.values() if command in f.metadata["commands"]]
    groups = {name: p.add_argument_group(name) for name in dict.fromkeys(f.metadata["group"] for f in used)}
    for f in used:
        options = {k: v for k, v in f.metadata.items() if k in ("type", "choices", "nargs", "action")}
        help = f.metadata["help"]
        options["help"] = f"{help}{preset_defaults(f, command)}" if help else argparse.SUPPRESS
        positional = f.metadata.get("positional")
        groups[f.metadata["group"]].add_argument(
            f.name if positional else f"--{f.name}", **(options if positional else {"default": None} | options)
        )
    return p


PHASES = {
    "pretrain": {"pretrain": ""},
    "finetune": {"finetune": " from scratch", "finetune_pretrained": " after pretraining", "reader": " recite reader"},
}


def preset_defaults(field: dataclasses.Field, command: str) -> str:
    """What --help says an unset flag becomes under each preset, such as " (default 4)" or
    " (handout: 75 from scratch, 10 after pretraining, 10 recite reader; cpu: ...)"."""
    if field.metadata.get("action") or field.metadata.get("positional"):
        return ""
    phases = PHASES.get(command, {"finetune_pretrained": ""})  # evaluate and ask read finetuned params
    said = {}
    for preset in PRESETS:
        texts = {p: preset_value(preset, p, field.name) for p in phases}
        texts = {p: "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for p, v in texts.items()}
        same = len(set(texts.values())) == 1
        said[preset] = next(iter(texts.values())) if same else ", ".join(f"{v}{phases[p]}" for p, v in texts.items())
    if len(set(said.values())) == 1:
        return "" if said["handout"] == "none" else f" (default {said['handout']})"
    return " (" + "; ".join(f"{preset}: {text}" for preset, text in said.items()) + ")"


# Flags run.sh sets itself, so EXTRA_FLAGS may not set them (nor any file).
RUN_SH_SETS = {
    "files": "run.sh names the files",
    "seed": "set SEED instead, e.g. SEED=5",
    "preset": "set PRESET instead",
    "max_epochs": "set PRETRAIN_EPOCHS, FINETUNE_EPOCHS or NOPRETRAIN_EPOCHS instead",
    "budget_minutes": "run.sh plans the budgets to TOTAL_MINUTES",
    "recite": "run.sh runs both protocols",
}


def extra_flags(
    words: list[str], preset: str, variants: list[str], name: str = "EXTRA_FLAGS", sets: dict = RUN_SH_SETS
) -> dict[str, list[str]]:
    """run.sh's EXTRA_FLAGS (or bench/sweep.py's `name`) as {command: the flags and values it takes}. A UserError
    names a flag that no command takes, that the caller `sets` (why, by flag), or that a command refuses."""
    groups: list[list[str]] = []  # a flag and its values
    for word in words:
        if groups and not word.startswith("--") and word != "-h":
            groups[-1].append(word)
        else:
            groups.append([word])
    taken: dict[str, list[str]] = {command: [] for command in ("pretrain", "finetune", "evaluate")}  # run.sh's
    for group in groups:
        errors = []
        for command in taken:
            with contextlib.redirect_stderr(said := io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                try:
                    typed = vars(make_parser(command).parse_intermixed_args(["vanilla", "x.txt", *group]))
                except SystemExit:  # a usage mistake, or --help
                    errors.append(
                        said.getvalue().strip().removesuffix(" (see --help)") or "-h or --help would print help instead"
                    )
                    continue
            given = [k for k, v in typed.items() if v is not None and k not in ("variant", "pretrain_corpus_path")]
            files = [k for k in given if FIELDS[k].metadata["kind"] not in ("", "text")]
            if why := next((sets[k] for k in given if k in sets), files and sets["files"]):
                raise UserError(f"{name} must not set --{given[0]} ({shlex.join(group)}): {why}")
            taken[command] += group
        if len(errors) == len(taken):  # prefer the error of a command that knows the flag
            raise UserError(f"{name} {shlex.join(group)}: " + min(errors, key=lambda e: "unrecognized" in e))
    for command, group in taken.items():
        for variant in variants if group else []:
            typed = vars(make_parser(command).parse_intermixed_args([variant, "x.txt", "--preset", preset, *group]))
            files = {k: "/nonexistent/x" for k, f in FIELDS.items() if command in f.metadata["required_by"]}
            if variant == "perceiver" and typed["bottleneck_dim"] is None:
                typed["bottleneck_dim"] = 64  # run.sh's perceiver m
            args = resolve({**typed, **files, "function": command})
            try:
                problem = next(problems(args), None)
                machine.pick_device(args.device)
            except UserError as e:
                problem = str(e)
            if problem:
                raise UserError(f"{name} {shlex.join(group)}: {problem}")
    return taken


def print_extra_flags(argv: list[str]) -> int:
    """run.sh's EXTRA_FLAGS check (argv: PRESET, VARIANTS, the words): prints a line of flags a command and returns
    0, or one error line and 2."""
    try:
        taken = extra_flags(argv[2:], argv[0], argv[1].split())
    except UserError as e:
        print(f"run.sh: {e}", file=sys.stderr)
        return 2
    print(*(" ".join(words) for words in taken.values()), sep="\n")
    return 0


def resolved_config(argv: list[str]) -> RunConfig:
    """The resolved settings of a command line, unchecked (a usage mistake exits 2)."""
    if not argv or argv[0] not in FUNCTIONS:
        make_parser().parse_args(argv[:1])  # the overview's --help, or its one-line error
    typed = make_parser(argv[0]).parse_intermixed_args(argv[1:])  # intermixed: ask's question may follow flags
    return resolve({"function": argv[0], **vars(typed)})


def prepare(args: RunConfig) -> tuple[CharCorruptionDataset, GPT, torch.device]:
    """Check the outputs, seed, set the device and threads; the corpus (the vocabulary), model and device."""
    refuse_overwriting_inputs(args)
    seed_everything(args.seed)
    device = machine.pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus_path = locate_data(args.pretrain_corpus_path)
    corpus = CharCorruptionDataset(read_text(corpus_path), BLOCK_SIZE, str(corpus_path), args.full_names)
    if args.function != "ask":  # ask prints only its answer, not the settings
        used = [k for k, f in FIELDS.items() if args.function in f.metadata["commands"]]
        shown = [f"{k} {getattr(args, k)}" for k in used if getattr(args, k) not in (None, False, "")]
        print("settings: " + ", ".join(shown))
    return corpus, build_model(args, corpus.vocab_size), device


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns 0, 2 after a one-line error, or 130 after an interruption."""
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "src/run.py", *argv])
    for stop in STOP_SIGNALS:  # from here Ctrl-C, a kill and a closed terminal are each a KeyboardInterrupt
        signal.signal(stop, signal.default_int_handler)
    try:
        args = resolved_config(argv)
        check_args(args)
        corpus, model, device = prepare(args)
        if args.function == "ask":
            ask(args, corpus, model, device)  # no TensorBoard run
        else:
            with tensorboard_run(args) as (writer, found):
                if args.function == "evaluate":
                    found |= evaluate(args, corpus, model, device, writer)
                else:
                    found |= train(args, corpus, model, device, writer, command)
    except SystemExit as e:  # --help, or a usage mistake already said
        return int(e.code or 0)
    except (UserError, FloatingPointError) as e:  # the trainer's FloatingPointError: later steps would diverge too
        advice = ": lower the learning rate" if isinstance(e, FloatingPointError) else ""
        print(f"error: {e}{advice}", file=sys.stderr)
        return 2
    except TrainingInterrupted as e:
        resume = command if "--resume" in argv else f"{command} --resume"
        print(f"interrupted: checkpoint written to {e}; to continue: {resume}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted before the command finished; nothing to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
