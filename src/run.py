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
import io
import json
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

import recite
from confidence import (
    beam_search,
    evaluation_summary,
    format_ask,
    format_summary,
    most_confident,
    score_answers,
    scores_tsv,
)
from dataset import (
    ORDERS,
    CharCorruptionDataset,
    NameDataset,
    Question,
    Vocabulary,
    read_questions,
    read_text,
    score_places,
)
from decode import MAX_ANSWER_CHARS, predict
from model import GPT, VARIANTS, GPTConfig
from trainer import Trainer, TrainerConfig, TrainingInterrupted
from utils import (
    UserError,
    check_output_file,
    init_distributed,
    refuse_same_file,
    seed_everything,
    torch_load_safe,
    torch_save_atomic,
    write_json_atomic,
    write_text_atomic,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
BLOCK_SIZE = 128


# ---------------------------------------------------------------------------
# Paths and params files


def find_data_file(name: str | None, what: str) -> Path | None:
    """`name` as given if it exists; a bare name missing here is looked up in data/ (and we say so)."""
    if name is None:
        return None
    path = Path(name)
    if path.exists():
        if path.is_dir():
            raise UserError(f"{name}: {what} is a folder, expected a file")
        if not path.is_file():  # a FIFO without a writer would block the read forever
            raise UserError(f"{name}: {what} is not a regular file (a FIFO, device or socket); give a file")
        return path
    candidate = REPO_ROOT / "data" / path.name
    if path.parent == Path(".") and candidate.is_file():
        print(f"{what}: {name} is not in the current folder; using {candidate}")
        return candidate
    hint = " (run the data step: python data/get_data.py)" if path.parent == Path(".") else ""
    raise UserError(f"{name}: {what} not found{hint}")


def check_output_path(path: str | None, flag: str) -> None:
    """Fail before any work, not after hours of training, if an output cannot be written there
    (a folder, a device or FIFO, a missing or unwritable folder: see utils.check_output_file)."""
    check_output_file(path, flag)


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


def sidecar_path(params_path: str | Path) -> Path:
    return Path(f"{params_path}.json")


def model_description(config: GPTConfig, vocab: Vocabulary) -> dict:
    """What a params file must agree on to be loaded: stored beside it as JSON."""
    return {
        "variant": config.variant,
        "bottleneck_dim": config.bottleneck_dim if config.variant == "perceiver" else None,
        "block_size": config.block_size,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "vocab_size": config.vocab_size,
        "vocab": "".join(vocab.itos),
    }


def save_params(model: GPT, vocab: Vocabulary, path: str, extra: dict) -> None:
    """A plain state_dict (loadable by the handout model) plus a JSON sidecar describing it:
    what loading checks (model_description), the GPTConfig as used under "model", and `extra`."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch_save_atomic(state, path)
    description = {**model_description(model.config, vocab), "model": asdict(model.config)}
    write_json_atomic(sidecar_path(path), {**description, **extra})


def read_sidecar(path: str | Path) -> dict | None:
    """The JSON sidecar of a params file, or None if it has none."""
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        description = json.loads(side.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{side}: unreadable sidecar ({e})") from None
    if not isinstance(description, dict):
        kind = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(
            type(description), "a number"
        )
        raise UserError(f"{side}: not a params sidecar (JSON {kind}, expected an object); delete or fix it")
    return description


def stored_sizes(path: str | None, flag: str) -> dict:
    """The model sizes (n_layer, n_head, n_embd, bottleneck_dim) the sidecar of params file `path`
    records, so that a model is built as it was trained; empty without a path or sidecar."""
    side = read_sidecar(path) if path is not None else None
    if side is None:
        return {}
    sizes = {k: side[k] for k in ("n_layer", "n_head", "n_embd") if k in side}
    for key, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise UserError(f"{flag} {path}: its sidecar gives {key} {value!r}; a model needs at least 1")
    return {**sizes, "bottleneck_dim": side["bottleneck_dim"]} if side.get("bottleneck_dim") else sizes


def load_params(model: GPT, vocab: Vocabulary, path: str) -> None:
    """Load `path` into `model`, refusing a file made for another model with a message naming the mismatch."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: params file not found")
    want = model_description(model.config, vocab)
    have = read_sidecar(p) or {}
    for key in want:
        if key in have and have[key] != want[key]:
            shown = "differs" if key == "vocab" else f"is {have[key]!r}, this run needs {want[key]!r}"
            raise UserError(f"{path}: params do not fit this model: {key} {shown} (from {sidecar_path(p).name})")
    state = torch_load_safe(p)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: not a state_dict of tensors")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        kind = "perceiver" if "down_block.C" in state else "vanilla" if "pos_emb" in state else "rope"
        raise UserError(
            f"{path}: params look like a {kind} model, this run builds a {want['variant']} one "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise UserError(
                f"{path}: {k} has shape {tuple(v.shape)}, this model needs {tuple(expected[k].shape)} "
                "(another bottleneck_dim, vocabulary or model size?)"
            )
    model.load_state_dict(state)


# ---------------------------------------------------------------------------
# Recipes

# Each preset fills the flags the user left unset, per phase: pretraining, finetuning
# from scratch, and finetuning a pretrained model (the handout's "fewer epochs after
# pretraining"). A phase also names its learning-rate schedule (--schedule "handout": the
# cosine fixed by the corpus size, uncapped; "run": a cosine that ends with the run), and
# may name how examples are batched and which parameters decay (--order, --decay: see
# trainer.TrainerConfig); what neither the preset nor the user sets comes from DEFAULTS.
#
# handout: the course's recipe, as its trainer runs it: batches in file order, the same
#   every epoch (its DataLoader does not shuffle), and weight decay on every parameter but
#   the biases. Measured on a GPU, this is what reaches the course's published figures.
# cpu: this repository's recipe for a small CPU: Muon for the blocks' matrices at batch 32
#   and lr 1e-3, no dropout, documents at varied start positions, pretraining epochs planned
#   after every epoch to fill --budget_minutes (at most max_epochs) with the cosine ending
#   there, and a gentle finetune (5 epochs at 1e-4, no dropout) that keeps what was stored.
_HANDOUT_LOOP = {"schedule": "handout", "order": "file", "decay": "all_but_biases"}
_FROM_SCRATCH = {"max_epochs": 75, "batch_size": 256, "finetune_lr": 6e-4, "dropout": 0.1}
PRESETS = {
    "handout": {
        "pretrain": {"max_epochs": 650, "batch_size": 128, "pretrain_lr": 6e-3, "dropout": 0.1, "doc_offset": 0,
                     **_HANDOUT_LOOP},
        "finetune": {**_FROM_SCRATCH, **_HANDOUT_LOOP},
        "finetune_pretrained": {**_FROM_SCRATCH, "max_epochs": 10, **_HANDOUT_LOOP},
    },
    "cpu": {
        "pretrain": {"max_epochs": 150, "batch_size": 32, "pretrain_lr": 1e-3, "dropout": 0.0, "doc_offset": 14,
                     "optimizer": "muon", "budget_minutes": 60, "schedule": "run"},
        "finetune": {**_FROM_SCRATCH, "schedule": "handout"},
        "finetune_pretrained": {"max_epochs": 5, "batch_size": 256, "finetune_lr": 1e-4, "dropout": 0.0,
                                "schedule": "handout"},
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
    else:  # evaluate reads a finetuned model: its phase only names the flags, which it ignores
        phase = "finetune_pretrained" if args.reading_params_path else "finetune"
    stored = stored_sizes(args.reading_params_path, "--reading_params_path")
    typed = {key: value for key, value in vars(args).items() if value is not None}
    vars(args).update({**DEFAULTS, **PRESETS[args.preset][phase], **stored, **typed})


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
        impl=args.impl,
        order=args.order,
        decay=args.decay,
        bf16=not args.fp32,
        optimizer=args.optimizer,
        seed=args.seed,
        ckpt_path=f"{args.writing_params_path}.ckpt",
        ckpt_every=args.ckpt_every,
    )


# ---------------------------------------------------------------------------
# Modes


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
    model = GPT(config)
    model.set_impl(args.impl)
    return model


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


def train(args: argparse.Namespace, corpus: CharCorruptionDataset, model: GPT, device, writer) -> None:
    """pretrain (on the corpus) or finetune (on --finetune_corpus_path); writes --writing_params_path."""
    if args.writing_params_path is None:
        raise UserError(f"{args.function} needs --writing_params_path")
    check_output_path(args.writing_params_path, "--writing_params_path")
    if args.reading_params_path is not None:
        load_params(model, corpus.vocab, args.reading_params_path)  # checked even when resuming
    extra = {}
    if args.function == "pretrain":
        dataset = corpus
    else:
        if args.finetune_corpus_path is None:
            raise UserError("finetune needs --finetune_corpus_path")
        path = find_data_file(args.finetune_corpus_path, "finetune corpus")
        if args.recite:
            dataset = reader_dataset(args, corpus, model, path, device)
            extra = recite.link_to_pretrained(args.writing_params_path, args.reading_params_path, args.recite_chars)
        else:
            dataset = NameDataset(corpus, path)
    cfg = trainer_config(args, len(corpus), len(dataset), dataset.example_length)
    ckpt_path = Path(cfg.ckpt_path)
    ckpt = load_checkpoint_for_resume(args, ckpt_path) if args.resume else None
    if ckpt is None and ckpt_path.exists():
        print(
            f"warning: {ckpt_path} exists; this fresh run replaces it at its first checkpoint (--resume continues it)"
        )
    writer.add_text("config", json.dumps({"args": vars(args), "trainer": asdict(cfg)}, indent=1))
    plan = f"{cfg.max_epochs} epoch{'s' if cfg.max_epochs != 1 else ''}" + (
        f" at most, planned to {args.budget_minutes:g} minutes after every epoch" if cfg.budget_fit else ""
    )
    print(
        f"{args.function} {args.variant}: {len(dataset)} examples, {plan}, batch {cfg.batch_size}, "
        f"lr {cfg.learning_rate:g}, {cfg.optimizer}, impl {cfg.impl}, device {device}"
    )
    if device.type == "cpu" and args.preset == "handout":
        print(
            "note: the handout's recipe is made for a GPU and takes hours on a CPU (the first steps say how "
            "many); --preset cpu is the recipe for a CPU, planned to --budget_minutes (README)"
        )
    trainer = Trainer(
        model, dataset, cfg, device, log=writer.add_scalar,
        extra={"args": vars(args), "vocab": "".join(corpus.vocab.itos)},
    )  # fmt: skip
    if ckpt is not None:
        trainer.resume(ckpt)
        print(f"resuming from {ckpt_path}: step {trainer.step}, epoch {trainer.epoch + 1}")

    def request_stop(signum: int, frame: object) -> None:
        trainer.stop_requested = True  # the loop checkpoints and stops after the current step

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    n_batches = math.ceil(len(dataset) / cfg.batch_size)
    t0 = time.time()
    try:
        losses = trainer.train()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    seconds = time.time() - t0
    if trainer.rank == 0:
        save_params(
            model,
            corpus.vocab,
            args.writing_params_path,
            {
                "trainer": asdict(cfg),
                "preset": args.preset,
                "dropout": args.dropout,
                "doc_offset": args.doc_offset,
                "steps": trainer.step,
                "epochs_done": round(trainer.epoch + trainer.batch_in_epoch / max(1, n_batches), 3),
                "train_seconds": trainer.seconds,
                "final_loss": losses[-1] if losses else None,
                **extra,
            },
        )
    budget_spent = cfg.budget_seconds is not None and trainer.seconds >= cfg.budget_seconds
    if budget_spent:
        print(
            f"--budget_minutes {args.budget_minutes:g} spent at step {trainer.step}, in epoch "
            f"{trainer.epoch + 1} of {cfg.max_epochs}; the learning-rate schedule was cut off there"
        )
    if trainer.rank == 0 and (budget_spent or trainer.epoch >= cfg.max_epochs):
        ckpt_path.unlink(missing_ok=True)  # finished: nothing left to resume (a --max_steps stop keeps it)
    print(f"trained {trainer.step} steps in {seconds:.1f} s; params written to {args.writing_params_path}")


def reader_dataset(args: argparse.Namespace, corpus: CharCorruptionDataset, model: GPT, path: Path, device):
    """finetune --recite: the training questions with the pretrained model's recitations in place of
    their text (`model` holds the pretrained params now; it becomes the reader)."""
    questions = [q for q in read_questions(path, require_place=True) if q is not None]
    if args.recite_chars is None:
        args.recite_chars = recite.default_recite_chars(model)
    recite.check_recite_chars(args.recite_chars, model, [q.place for q in questions])
    t0 = time.time()
    recitations = recite.recite(model, corpus.vocab, questions, args.recite_chars, device, str(path))
    share = recite.place_in_recitation(questions, recitations)
    print(
        f"recited {len(questions)} training people in {time.time() - t0:.1f} s ({args.recite_chars} characters "
        f"each); the place is in {share:.1%} of the recitations"
    )
    return NameDataset(corpus, recite.reader_questions(questions, recitations))


def model_for_params(args: argparse.Namespace, vocab: Vocabulary, path: str) -> GPT:
    """A model built as the sidecar of params file `path` describes it (its variant and sizes)."""
    side = read_sidecar(path)
    if not Path(path).is_file():
        raise UserError(f"--ensemble_params {path}: params file not found")
    if side is None or side.get("variant") not in VARIANTS:
        raise UserError(f"--ensemble_params {path}: needs its sidecar {sidecar_path(path).name} to know its variant")
    sizes = stored_sizes(path, "--ensemble_params")
    return build_model(argparse.Namespace(**{**vars(args), **sizes}), len(vocab), side["variant"])


def evaluate(args: argparse.Namespace, corpus: CharCorruptionDataset, model: GPT, device, writer) -> None:
    """Greedy answers to --eval_corpus_path, one line each in --outputs_path; the accuracy where places are given.

    With --ensemble_params, every model answers and each question takes the answer
    its own model scored highest (mean log-probability per character).
    """
    for flag in ("reading_params_path", "eval_corpus_path", "outputs_path"):
        if getattr(args, flag) is None:
            raise UserError(f"evaluate needs --{flag}")
    check_output_path(args.outputs_path, "--outputs_path")
    check_output_path(args.scores_path, "--scores_path")
    path = find_data_file(args.eval_corpus_path, "eval corpus")
    entries = read_questions(path, require_place=False)
    vocab = corpus.vocab
    for q in entries:
        if q is None:
            continue
        vocab.encode(q.text, where=f"{path}:{q.line}")
        if len(q.text) + 2 > BLOCK_SIZE:
            raise UserError(f"{path}:{q.line}: question is {len(q.text)} characters; at most {BLOCK_SIZE - 2} fit")
    members = [(args.reading_params_path, model)]
    members += [(p, model_for_params(args, vocab, p)) for p in args.ensemble_params or []]
    for params, member in members:
        load_params(member, vocab, params)
    questions = [q for q in entries if q is not None]
    t0 = time.time()
    texts = [q.text for q in questions]
    reader = reader_link(args.reading_params_path)
    if reader is not None:
        if args.ensemble_params:
            raise UserError("--ensemble_params combines direct answers; a recite reader cannot join an ensemble")
        texts = recitations(args, vocab, questions, reader, device, str(path))
        share = recite.place_in_recitation(questions, texts)
        if not math.isnan(share):
            print(f"the gold place is in {share:.1%} of the recitations (the reader's ceiling)")
            writer.add_scalar("eval/place_in_recitation", share, 0)
    answers = []
    for params, member in members:
        member.to(device)
        predictions = predict(member, vocab, texts, args.impl, device)
        answers.append(score_answers(member, vocab, texts, predictions, device, MAX_ANSWER_CHARS))
        if len(members) > 1:
            report_accuracy(f"{params}: ", questions, [a.answer for a in answers[-1]])
    scores = most_confident(answers) if len(members) > 1 else answers[0]
    predictions = [s.answer for s in scores]
    seconds = time.time() - t0
    it = iter(predictions)
    write_text_atomic(args.outputs_path, "".join((next(it) if q is not None else "") + "\n" for q in entries))
    if args.scores_path is not None:
        write_text_atomic(args.scores_path, scores_tsv(entries, scores))
    writer.add_scalar("eval/seconds", seconds, 0)
    if len(members) > 1:
        print(f"ensemble of {len(members)} models, {seconds:.1f} s: each question takes the most confident answer")
    if report_accuracy("", questions, predictions):
        summary = evaluation_summary(questions, predictions, scores, corpus.data)
        print(format_summary(summary))
        for key, value in summary.items():
            if not math.isnan(value):  # nan: an empty group
                writer.add_scalar(f"eval/{key}", value, 0)
    else:
        print(f"Predictions written to {args.outputs_path}; no targets provided")


def reader_link(params_path: str) -> tuple[Path, int] | None:
    """(the pretrained params, the recitation length) when `params_path` is a recite reader, else None."""
    side = read_sidecar(params_path) or {}
    if side.get("protocol") != "recite":
        return None
    return recite.linked_pretrained(params_path, side), int(side["recite_chars"])


def recitations(
    args: argparse.Namespace,
    vocab: Vocabulary,
    questions: list[Question],
    reader: tuple[Path, int],
    device,
    source: str,
) -> list[str]:
    """The recollections of the questions' people by the pretrained params a reader recites with."""
    pretrained, chars = reader
    reciter = build_model(args, len(vocab))
    load_params(reciter, vocab, str(pretrained))
    t0 = time.time()
    texts = recite.recite(reciter, vocab, questions, chars, device, source)
    print(f"recited {len(questions)} people with {pretrained} in {time.time() - t0:.1f} s ({chars} characters each)")
    return texts


def report_accuracy(label: str, questions: list[Question], predictions: list[str]) -> bool:
    """Print the handout's accuracy line; False when the questions carry no places."""
    total, correct = score_places(questions, predictions)
    if total:
        print(f"{label}Correct: {float(correct)} out of {float(total)}: {correct / total * 100}%")
    return total > 0


def ask(args: argparse.Namespace, corpus: CharCorruptionDataset, model: GPT, device) -> None:
    """Answer one question: the greedy answer, its confidence, and the top 3 answers of a beam search."""
    if args.reading_params_path is None:
        raise UserError("ask needs --reading_params_path")
    question = (args.question or "").strip()
    if not question:
        raise UserError('ask needs a question after the corpus, e.g. "Where was Ada Lovelace born?"')
    vocab = corpus.vocab
    vocab.encode(question, where=f"question {question!r}")
    if len(question) + 2 > BLOCK_SIZE:
        raise UserError(f"question is {len(question)} characters; at most {BLOCK_SIZE - 2} fit")
    load_params(model, vocab, args.reading_params_path)
    model.to(device)
    reader = reader_link(args.reading_params_path)
    prompt = question
    if reader is not None:
        with contextlib.redirect_stdout(io.StringIO()):  # ask prints only its answer
            (prompt,) = recitations(args, vocab, [Question(question, None, 1)], reader, device, "question")
    answer = predict(model, vocab, [prompt], args.impl, device)[0]
    (score,) = score_answers(model, vocab, [prompt], [answer], device, MAX_ANSWER_CHARS)
    if reader is not None:
        print(f"I recall: {prompt!r} -> {answer!r} (confidence: probability {score.confidence:.3g} per character)")
    print(format_ask(question, score, beam_search(model, vocab, prompt, device, 3, MAX_ANSWER_CHARS)))


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
    p = Parser(prog="run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    g.add_argument("--impl", choices=["fast", "reference"], default="fast",
                   help="fast: bucketed batches, bf16, cached batched decoding; reference: the handout's plain loops")  # fmt: skip
    g.add_argument("--fp32", action="store_true", help="train in fp32 even where bf16 autocast is available")
    return p


RUN_DEFINING_ARGS = tuple(
    k for k in vars(make_parser().parse_args(["pretrain", "vanilla", "-"])) if k not in RESUME_MAY_CHANGE
)


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


def run(args: argparse.Namespace) -> None:
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


class NullWriter:
    """Stands in for SummaryWriter on ranks other than 0."""

    def add_scalar(self, *args: object, **kwargs: object) -> None: ...
    def add_text(self, *args: object, **kwargs: object) -> None: ...
    def close(self) -> None: ...


def main(argv: list[str] | None = None) -> int:
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
