"""Command line: pretrain, finetune or evaluate a character GPT on the birth-place task.

    python src/run.py pretrain vanilla wiki.txt --writing_params_path vanilla.pretrain.params
    python src/run.py finetune vanilla wiki.txt --reading_params_path vanilla.pretrain.params \\
        --writing_params_path vanilla.finetune.params --finetune_corpus_path birth_places_train.tsv
    python src/run.py evaluate vanilla wiki.txt --reading_params_path vanilla.finetune.params \\
        --eval_corpus_path birth_dev.tsv --outputs_path vanilla.pretrain.dev.predictions
    python src/run.py ask vanilla wiki.txt --reading_params_path vanilla.finetune.params "Where was Ada Lovelace born?"

Variants: vanilla, perceiver (2023; add --bottleneck_dim 64), rope (2024). The corpus (third argument)
defines the vocabulary in every mode; a bare data file name missing here is read from data/. --preset
handout (the default) is the course's recipe; --preset cpu is the recipe for a small CPU (README).
"""

# ruff: noqa: E402 - the SIGINT handler below must come before torch is imported

from __future__ import annotations

import os
import signal
import sys

# Ctrl-C while torch loads: exit at once, quietly (nothing has started). os._exit, because an exception
# raised inside an import can be swallowed there and leave a module half made.
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
    resolve,
    time_budget,
    trainer_config,
)
from dataset import CharCorruptionDataset, NameDataset, read_text
from logs import tensorboard_run
from model import GPT
from params import load_params, read_sidecar, save_params, sidecar_path
from trainer import Trainer, TrainerConfig, TrainingInterrupted
from utils import (
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

# ---------------------------------------------------------------------------
# Checks and training


def data_files(args: RunConfig) -> dict[str, Path]:
    """The data files a command names, by flag, where it reads them (utils.locate_data)."""
    names = {"the pretraining corpus": args.pretrain_corpus_path, "--finetune_corpus_path": args.finetune_corpus_path,
             "--eval_corpus_path": args.eval_corpus_path}  # fmt: skip
    return {flag: locate_data(name) for flag, name in names.items() if name is not None}


def refuse_overwriting_inputs(args: RunConfig) -> None:
    """No output of a command, nor a file written beside one (its .json sidecar, a params' .ckpt), may be
    one of its inputs (its data files, params with their sidecars), another output or the TensorBoard
    folder; the files written beside the outputs must be writable too (check_args checked the outputs)."""
    read, written, outputs_path = args.reading_params_path, args.writing_params_path, args.outputs_path
    inputs = {**data_files(args), "--reading_params_path": read}
    inputs["--reading_params_path's sidecar"] = read and sidecar_path(read)
    outputs = {"--outputs_path": outputs_path, "--scores_path": args.scores_path, "--tb_dir": args.tb_dir,
               "--writing_params_path": written}  # fmt: skip
    beside = {"--writing_params_path's sidecar": written and sidecar_path(written),
              "--writing_params_path's checkpoint": written and f"{written}.ckpt",
              "--outputs_path's sidecar": outputs_path and sidecar_path(outputs_path)}  # fmt: skip
    refuse_same_file(outputs | beside, inputs)
    for flag, output in beside.items():  # before any work, not after hours of training
        check_output_file(output, flag)


# ---------------------------------------------------------------------------
# Modes


def load_checkpoint_for_resume(config: RunConfig, ckpt_path: Path, data_sha256: dict[str, str]) -> dict:
    """The checkpoint to resume (its SHA-256 checked by torch_load_safe), after checking that it was made
    with this config's RESUME_MUST_MATCH settings on these data files (path -> SHA-256)."""
    ckpt = torch_load_safe(ckpt_path, "--resume: the checkpoint")
    saved = ckpt.get("extra", {}).get("config") if isinstance(ckpt, dict) and "state" in ckpt else None
    if not isinstance(saved, dict):
        raise UserError(f"{ckpt_path}: not a checkpoint written by this version of run.py")
    changed = [f"with --{k} {saved.get(k)!r}, this command has {getattr(config, k)!r}" for k in RESUME_MUST_MATCH
               if saved.get(k) != getattr(config, k)]  # fmt: skip
    changed += [f"on another {path}: its contents have changed since" for path, sha in data_sha256.items()
                if ckpt["extra"].get("data_sha256", {}).get(path) != sha]  # fmt: skip
    if changed:
        raise UserError(f"--resume: {ckpt_path} was made {changed[0]}")
    return ckpt


def train(
    args: RunConfig, corpus: CharCorruptionDataset, model: GPT, device: torch.device, writer: SummaryWriter,
    command: str,
) -> dict:  # fmt: skip
    """pretrain (on the corpus) or finetune (on --finetune_corpus_path); writes --writing_params_path.
    Returns the run's record (steps, epochs, seconds, final loss) as its sidecar holds it."""
    parent = {}  # the params it starts from, checked even when resuming
    if args.reading_params_path is not None:
        parent["parent_sha256"] = load_params(model, corpus.vocab, args.reading_params_path)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # a checkpoint is under 3x this
    ckpt_path = Path(f"{args.writing_params_path}.ckpt")
    replaced = sum(os.path.getsize(p) for p in (ckpt_path, args.writing_params_path) if os.path.isfile(p))
    check_free_space(ckpt_path, 7 * weights - replaced, "two checkpoints (one replacing the other), params")
    chosen = machine.choose(device, args.fp32, args.micro_batch)
    dataset, extra = training_data(args, corpus, model, device)
    cfg = trainer_config(args, len(corpus), len(dataset), dataset.example_length, chosen)
    chosen["micro_batch"] = cfg.micro_batch  # the sidecar records what the order uses
    data = {str(path): file_sha256(path) for path in data_files(args).values()}
    ckpt = load_checkpoint_for_resume(args, ckpt_path, data) if args.resume else None
    if ckpt is None and ckpt_path.exists():
        print(
            f"warning: {ckpt_path} exists; this fresh run replaces it at its first checkpoint (--resume continues it)"
        )
    budget_seconds, fit = time_budget(args)
    announce(args, cfg, len(dataset), device, fit)
    saved_with = {"config": asdict(args), "vocab": "".join(corpus.vocab.itos), "data_sha256": data}
    trainer = Trainer(model, dataset, cfg, device, log=writer.add_scalar, extra=saved_with)
    pace = budget.attach(trainer, budget_seconds, fit, args.threads)
    if ckpt is not None:
        trainer.resume(ckpt)
        print(f"resuming from {ckpt_path}: step {trainer.state.step}, epoch {trainer.state.epoch + 1}")
    t0 = time.time()
    with stop_on_signals(trainer):
        trainer.train()
    seconds = time.time() - t0
    made = {"command": command, "data_sha256": data, **parent, **provenance(device), "speed": chosen}
    done = run_record(trainer, pace)
    record = {"config": asdict(args), **made, **done, **extra}
    save_params(model, corpus.vocab, args.writing_params_path, record)
    print(f"trained {trainer.state.step} steps in {seconds:.1f} s; params written to {args.writing_params_path}" +
          end_of_run(trainer, ckpt_path))  # fmt: skip
    return done


def end_of_run(trainer: Trainer, ckpt_path: Path) -> str:
    """Remove the checkpoint of a finished run; returns what the last line adds about a resumable one."""
    s = trainer.state
    if not s.stop and s.epoch < s.max_epochs and ckpt_path.is_file():  # --max_steps
        return f"; kept {ckpt_path} ({ckpt_path.stat().st_size / 1e6:.0f} MB) for --resume"
    ckpt_path.unlink(missing_ok=True)  # finished: nothing left to resume
    return ""


def training_data(
    args: RunConfig, corpus: CharCorruptionDataset, model: GPT, device: torch.device
) -> tuple[CharCorruptionDataset | NameDataset, dict]:
    """What this command trains on (the corpus, the finetune questions, or a recite reader's
    recitations) and what its sidecar adds (a reader's link to its pretrained params)."""
    start = args.reading_params_path
    if start is not None and (read_sidecar(start) or {}).get("protocol") == "recite":
        if args.recite:
            raise UserError(
                f"--reading_params_path {start} is a recite reader; --recite recites with pretrained params"
            )
        print(f"note: {start} is a recite reader: training starts from its weights and answers directly")
    if args.function == "pretrain":
        return corpus, {}
    path = locate_data(args.finetune_corpus_path)
    if not args.recite:
        return NameDataset(corpus, path), {}
    most = args.max_steps * args.batch_size if args.max_steps else None
    dataset, recitations = recite.reader_dataset(corpus, model, path, args.recite_chars, device, most)
    link = recite.link_to_pretrained(args.writing_params_path, args.reading_params_path, args.recite_chars)
    return dataset, {**link, "recitations": recitations}


def announce(args: RunConfig, cfg: TrainerConfig, examples: int, device: torch.device, fit: bool) -> None:
    """Say what this run trains and how long (the settings line said how); warn if the handout's recipe meets a CPU."""
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
    """Inside, SIGINT, SIGTERM and SIGHUP ask `trainer` to checkpoint and stop after its current step."""

    def request_stop(signum: int, frame: object) -> None:
        trainer.stop_requested = True

    previous = {sig: signal.signal(sig, request_stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_record(trainer: Trainer, pace: budget.Pace) -> dict:
    """What the params sidecar records of the training run: how far it got and how long it took."""
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


# ---------------------------------------------------------------------------
# CLI


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line and exit code 2, naming the commands of a misplaced flag."""

    def error(self, message: str) -> None:  # type: ignore[override]
        uses = {f"--{f.name}": f.metadata["commands"] for f in dataclasses.fields(RunConfig)}
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
    """run.py COMMAND's parser: the RunConfig fields that `command` uses, in their help groups, every
    default None so that config.resolve knows what was typed. Without a command: the overview."""
    if command is None:
        p = Parser(prog="run.py", description=__doc__, epilog=COMMANDS_HELP,
                   formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        p.add_argument("command", choices=FUNCTIONS, help="what to do (see below)")
        return p
    p = Parser(prog=f"run.py {command}", description=COMMANDS_HELP.splitlines()[FUNCTIONS.index(command) + 1].strip())
    used = [f for f in dataclasses.fields(RunConfig) if command in f.metadata["commands"]]
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


PHASES = {"pretrain": {"pretrain": ""}, "finetune": {"finetune": " from scratch", "finetune_pretrained":
          " after pretraining", "reader": " recite reader"}}  # fmt: skip


def preset_defaults(field: dataclasses.Field, command: str) -> str:
    """What an unset flag resolves to under each preset for `command`'s phases, as --help says it:
    " (default 4)", or " (handout: 75 from scratch, 10 after pretraining, 10 recite reader; cpu: ...)"."""
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


def extra_flags_problem(words: list[str]) -> str | None:
    """What is wrong with run.sh's EXTRA_FLAGS, which it gives to each of its run.py commands: a flag one of them
    refuses, or one that sets the seed or the preset (run.sh's SEED and PRESET do), however abbreviated."""
    for command in ("pretrain", "finetune", "evaluate"):
        with contextlib.redirect_stderr(said := io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            try:
                typed = vars(make_parser(command).parse_intermixed_args(["vanilla", "wiki.txt", *words]))
            except SystemExit:  # a usage mistake, said on stderr, or --help, printed on stdout
                why = said.getvalue().strip().removesuffix(" (see --help)") or "-h or --help would print help instead"
                return f"EXTRA_FLAGS goes to every step, and {why}"
        if name := next((n for n in ("seed", "preset") if typed[n] is not None), None):
            return f"EXTRA_FLAGS must not set the {name} ({shlex.join(words)}); set {name.upper()} instead"
    return None


def resolved_config(argv: list[str]) -> RunConfig:
    """The resolved settings of a command line, unchecked (a usage mistake exits 2)."""
    if not argv or argv[0] not in FUNCTIONS:
        make_parser().parse_args(argv[:1])  # the overview's --help, or its one-line error
    typed = make_parser(argv[0]).parse_intermixed_args(argv[1:])  # intermixed: ask's question may follow flags
    return resolve({"function": argv[0], **vars(typed)})


def run(args: RunConfig, command: str = "") -> None:
    """Do what the resolved command says (UserError for a mistake, TrainingInterrupted after a signal);
    `command` is the command line, as the params' sidecar records it."""
    refuse_overwriting_inputs(args)
    seed_everything(args.seed)
    device = machine.pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus_path = locate_data(args.pretrain_corpus_path)
    corpus = CharCorruptionDataset(read_text(corpus_path), BLOCK_SIZE, source=str(corpus_path))
    model = build_model(args, corpus.vocab_size)
    if args.function == "ask":
        return ask(args, corpus, model, device)  # prints only: no TensorBoard run
    used = [f.name for f in dataclasses.fields(args) if args.function in f.metadata["commands"]]
    shown = [f"{k} {getattr(args, k)}" for k in used if getattr(args, k) not in (None, False, "")]
    print("settings: " + ", ".join(shown))
    with tensorboard_run(args) as (writer, found):
        if args.function == "evaluate":
            found |= evaluate(args, corpus, model, device, writer)
        else:
            found |= train(args, corpus, model, device, writer, command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0, 2 after a one-line error, 130 after an interruption (with the command that resumes)."""
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "src/run.py", *argv])
    for stop in STOP_SIGNALS:  # from here Ctrl-C, a kill and a closed terminal are each a KeyboardInterrupt
        signal.signal(stop, signal.default_int_handler)
    try:
        config = resolved_config(argv)
        check_args(config)  # a bad value is a UserError
        run(config, command)
    except SystemExit as e:  # --help, or a usage mistake argparse has said in one line
        return int(e.code or 0)
    except (UserError, FloatingPointError) as e:  # the trainer's FloatingPointError: every later step would diverge too
        advice = ": lower the learning rate" if isinstance(e, FloatingPointError) else ""  # nothing was saved
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
