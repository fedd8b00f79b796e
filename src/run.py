"""Command line: pretrain, finetune or evaluate a character GPT on the birth-place task.

    python src/run.py pretrain vanilla wiki.txt --writing_params_path vanilla.pretrain.params
    python src/run.py finetune vanilla wiki.txt --reading_params_path vanilla.pretrain.params \\
        --writing_params_path vanilla.finetune.params --finetune_corpus_path birth_places_train.tsv
    python src/run.py evaluate vanilla wiki.txt --reading_params_path vanilla.finetune.params \\
        --eval_corpus_path birth_dev.tsv --outputs_path vanilla.pretrain.dev.predictions
    python src/run.py ask vanilla wiki.txt --reading_params_path vanilla.finetune.params "Where was Ada Lovelace born?"

The pretraining corpus (third argument) defines the vocabulary in every mode.
A bare data file name that is not in the current folder is looked up in data/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from confidence import beam_search, evaluation_summary, format_ask, format_summary, score_answers, scores_tsv
from dataset import MASK_CHAR, CharCorruptionDataset, MixedDataset, NameDataset, Vocabulary, read_questions, read_text
from model import GPT, GPTConfig
from trainer import Trainer, TrainerConfig, TrainingInterrupted
from utils import (
    UserError,
    evaluate_places,
    greedy_decode_batch,
    init_distributed,
    sample,
    seed_everything,
    torch_load_safe,
    torch_save_atomic,
    write_json_atomic,
    write_text_atomic,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
BLOCK_SIZE = 128
MAX_ANSWER_CHARS = 32  # greedy decoding stops after this many characters, as in the handout


# ---------------------------------------------------------------------------
# Paths and params files


def find_data_file(name: str | None, what: str) -> Path | None:
    """`name` as given if it exists; a bare name missing here is looked up in data/ (and we say so)."""
    if name is None:
        return None
    path = Path(name)
    if path.exists():
        return path
    candidate = REPO_ROOT / "data" / path.name
    if path.parent == Path(".") and candidate.exists():
        print(f"{what}: {name} is not in the current folder; using {candidate}")
        return candidate
    hint = " (run the data step: python data/get_data.py)" if path.parent == Path(".") else ""
    raise UserError(f"{name}: {what} not found{hint}")


def check_output_folder(path: str | None, flag: str) -> None:
    """Fail before any work, not after hours of training, if an output cannot be written."""
    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: folder {parent} does not exist")


def sidecar_path(params_path: str | Path) -> Path:
    return Path(f"{params_path}.json")


VARIANTS = ("vanilla", "perceiver", "rope")


def variant_name(config: GPTConfig) -> str:
    """Which of VARIANTS a model config builds."""
    return "perceiver" if config.perceiver else "rope" if config.rope else "vanilla"


def model_description(config: GPTConfig, vocab: Vocabulary) -> dict:
    """What a params file must agree on to be loaded: stored beside it as JSON."""
    return {
        "variant": variant_name(config),
        "bottleneck_dim": config.bottleneck_dim if config.perceiver else None,
        "block_size": config.block_size,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "vocab_size": config.vocab_size,
        "vocab": "".join(vocab.itos),
    }


def save_params(model: GPT, vocab: Vocabulary, path: str, extra: dict) -> None:
    """A plain state_dict (loadable by the handout model) plus a JSON sidecar describing it."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch_save_atomic(state, path)
    write_json_atomic(sidecar_path(path), {**model_description(model.config, vocab), **extra})


def load_params(model: GPT, vocab: Vocabulary, path: str) -> None:
    """Load `path` into `model`, refusing a file made for another model with a message naming the mismatch."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--reading_params_path {path}: file not found")
    want = model_description(model.config, vocab)
    side = sidecar_path(p)
    if side.is_file():
        try:
            have = json.loads(side.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{side}: unreadable sidecar ({e})") from None
        for key in want:
            if key in have and have[key] != want[key]:
                shown = "differs" if key == "vocab" else f"is {have[key]!r}, this run needs {want[key]!r}"
                raise UserError(f"{path}: params do not fit this model: {key} {shown} (from {side.name})")
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
# Modes


def build_model(args: argparse.Namespace, vocab_size: int) -> GPT:
    config = GPTConfig(
        vocab_size=vocab_size,
        block_size=BLOCK_SIZE,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        perceiver=args.variant == "perceiver",
        rope=args.variant == "rope",
        bottleneck_dim=args.bottleneck_dim,
        perceiver_init=args.perceiver_init,
        embd_pdrop=args.dropout,
        resid_pdrop=args.dropout,
        attn_pdrop=args.dropout,
    )
    if config.n_embd % config.n_head:
        raise UserError(f"--n_embd {config.n_embd} must be divisible by --n_head {config.n_head}")
    if config.rope and (config.n_embd // config.n_head) % 2:
        raise UserError(f"rope needs an even head size; --n_embd {config.n_embd} / --n_head {config.n_head} is odd")
    if config.perceiver and config.n_layer < 2:
        raise UserError("the perceiver needs --n_layer of at least 2 (down and up blocks)")
    if config.perceiver and not 1 <= config.bottleneck_dim <= BLOCK_SIZE:
        raise UserError(f"--bottleneck_dim must be between 1 and {BLOCK_SIZE}, got {config.bottleneck_dim}")
    model = GPT(config)
    model.set_impl(args.impl)
    return model


# Each preset fills the flags the user left unset, per phase: pretraining,
# finetuning from scratch, and finetuning a pretrained model (the handout's
# "fewer epochs after pretraining"). "handout" is the course's recipe (the
# default: comparable with published numbers); "cpu" is this repository's
# recipe for a 2-core CPU (about 80 minutes of pretraining, measured in README,
# "A CPU recipe"): a lower rate, no dropout while memorising the corpus,
# documents at varied start positions, a cosine that ends exactly when training
# does, and a gentle finetune (5e-5, no dropout) that keeps what was memorised.
# "cpu_fp32" is the same recipe for a CPU without native bf16, where the fast path
# runs in fp32 and two hours hold under a hundred of cpu's epochs: Muon for the
# blocks' matrices at batch 32 over a 60-epoch cosine (Muon stored thirteen times
# as many facts as AdamW in 46 epochs), and a finetune half as long (5 epochs at
# 1e-4), which answered as well on two pretraining seeds in half the time
# (README, "A CPU recipe").
_CPU_FINETUNE = {"max_epochs": 75, "batch_size": 256, "finetune_lr": 6e-4, "dropout": 0.1, "schedule": "handout"}
_CPU_FINETUNE_PRETRAINED = {"max_epochs": 10, "batch_size": 256, "finetune_lr": 5e-5, "dropout": 0.0,
                            "schedule": "handout"}  # fmt: skip
# The handout's trainer also batches the examples in file order, the same batches every epoch (its
# DataLoader does not shuffle), and decays every parameter but the biases: "order" and "decay".
_HANDOUT_LOOP = {"schedule": "handout", "order": "file", "decay": "all_but_biases"}
PRESETS = {
    "handout": {
        "pretrain": {"max_epochs": 650, "batch_size": 128, "pretrain_lr": 6e-3, "dropout": 0.1, "doc_offset": 0,
                     **_HANDOUT_LOOP},
        "finetune": {"max_epochs": 75, "batch_size": 256, "finetune_lr": 6e-4, "dropout": 0.1, **_HANDOUT_LOOP},
        "finetune_pretrained": {"max_epochs": 10, "batch_size": 256, "finetune_lr": 6e-4, "dropout": 0.1,
                                **_HANDOUT_LOOP},
    },
    "cpu": {
        "pretrain": {"max_epochs": 480, "batch_size": 128, "pretrain_lr": 2e-3, "dropout": 0.0, "doc_offset": 14,
                     "schedule": "run"},
        "finetune": _CPU_FINETUNE,
        "finetune_pretrained": _CPU_FINETUNE_PRETRAINED,
    },
    "cpu_fp32": {
        "pretrain": {"max_epochs": 60, "batch_size": 32, "pretrain_lr": 1e-3, "dropout": 0.0, "doc_offset": 14,
                     "optimizer": "muon", "schedule": "run"},
        "finetune": _CPU_FINETUNE,
        "finetune_pretrained": {**_CPU_FINETUNE_PRETRAINED, "max_epochs": 5, "finetune_lr": 1e-4},
    },
}  # fmt: skip


def apply_preset(args: argparse.Namespace) -> None:
    """Fill every unset (None) flag from the preset's phase; explicit flags win."""
    if args.function == "pretrain":
        phase = "pretrain"
    else:  # evaluate reads a finetuned model: its phase only names the flags, which it ignores
        phase = "finetune_pretrained" if args.reading_params_path else "finetune"
    preset = dict(PRESETS[args.preset][phase])
    args.schedule = preset.pop("schedule")
    args.order = preset.pop("order", "bucketed")
    args.decay = preset.pop("decay", "matmul")
    defaults = {"pretrain_lr": 6e-3, "finetune_lr": 6e-4, "doc_offset": 0, "optimizer": "adamw"}
    for key, value in {**defaults, **preset}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def trainer_config(
    args: argparse.Namespace, pretrain_len: int, train_len: int | None = None, example_length: int = BLOCK_SIZE - 1
) -> TrainerConfig:
    """TrainerConfig from the resolved flags (see apply_preset).

    pretrain_len: documents in the pretraining corpus; train_len: examples per
    epoch of the data trained on now (default pretrain_len); example_length:
    positions per example of that data, as the trainer counts tokens.
    """
    if args.function == "pretrain":
        lr = args.pretrain_lr
    else:
        lr = args.finetune_lr
    if args.schedule == "run":  # the cosine spans exactly this run's epochs
        final_tokens = args.max_epochs * (train_len or pretrain_len) * example_length
        cap = True
    else:  # the handout's: final_tokens fixed by the pretraining corpus, cosine uncapped unless asked
        final_tokens = 200 * pretrain_len * BLOCK_SIZE
        cap = args.cosine_cap
    return TrainerConfig(
        max_epochs=args.max_epochs,
        batch_size=args.batch_size,
        learning_rate=lr,
        lr_decay=True,
        warmup_tokens=512 * 20,
        final_tokens=final_tokens,
        cosine_cap=cap,
        num_workers=args.num_workers,
        max_steps=args.max_steps,
        budget_seconds=None if args.budget_minutes is None else args.budget_minutes * 60,
        budget_cooldown=args.budget_cooldown,
        budget_fit=args.budget_fit,
        budget_replan=args.budget_replan,
        impl=args.impl,
        order=args.order,
        decay=args.decay,
        bf16=not args.fp32,
        compile=args.compile,
        token_weighted=args.token_weighted,
        optimizer=args.optimizer,
        seed=args.seed,
        ckpt_path=f"{args.writing_params_path}.ckpt",
        ckpt_every=args.ckpt_every,
    )


# Arguments that must be the same for --resume to continue a run rather than start another.
RUN_DEFINING_ARGS = (
    "function", "variant", "bottleneck_dim", "n_layer", "n_head", "n_embd", "dropout", "pretrain_lr",
    "finetune_lr", "batch_size", "max_epochs", "seed", "impl", "fp32", "cosine_cap", "preset", "finetune_corpus_path",
    "reading_params_path", "mix_questions", "mix_corpus", "token_weighted", "doc_offset", "doc_context",
    "max_example_len", "budget_cooldown", "budget_fit", "budget_replan", "perceiver_init", "optimizer", "freeze_blocks",
)  # fmt: skip


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


def train(args: argparse.Namespace, pretrain_dataset: CharCorruptionDataset, model: GPT, device, writer) -> None:
    if args.writing_params_path is None:
        raise UserError(f"{args.function} needs --writing_params_path")
    check_output_folder(args.writing_params_path, "--writing_params_path")
    if args.function == "pretrain":
        dataset = pretrain_dataset
        if args.mix_questions is not None:
            questions = NameDataset(pretrain_dataset, find_data_file(args.mix_questions, "--mix_questions file"))
            dataset = MixedDataset(pretrain_dataset, questions)
    else:
        if args.finetune_corpus_path is None:
            raise UserError("finetune needs --finetune_corpus_path")
        path = find_data_file(args.finetune_corpus_path, "finetune corpus")
        dataset = NameDataset(pretrain_dataset, path)
        if args.mix_corpus:
            dataset = MixedDataset(pretrain_dataset, dataset)
    cfg = trainer_config(args, len(pretrain_dataset), len(dataset), dataset.example_length)
    ckpt_path = Path(cfg.ckpt_path)
    ckpt = load_checkpoint_for_resume(args, ckpt_path) if args.resume else None
    if args.reading_params_path is not None:
        load_params(model, pretrain_dataset.vocab, args.reading_params_path)  # checked even when resuming
    if args.freeze_blocks:
        frozen = model.freeze_lower(args.freeze_blocks)
        print(
            f"finetuning with the embeddings and the first {args.freeze_blocks} blocks frozen ({frozen:,} parameters)"
        )
    if ckpt is None and ckpt_path.exists():
        print(
            f"warning: {ckpt_path} exists; this fresh run replaces it at its first checkpoint (--resume continues it)"
        )
    writer.add_text("config", json.dumps({"args": vars(args), "trainer": asdict(cfg)}, indent=1))
    print(
        f"{args.function} {args.variant}: {len(dataset)} examples, {cfg.max_epochs} epochs, batch {cfg.batch_size}, "
        f"lr {cfg.learning_rate:g}, impl {cfg.impl}, device {device}"
    )
    trainer = Trainer(
        model, dataset, cfg, device, log=writer.add_scalar,
        extra={"args": vars(args), "vocab": "".join(pretrain_dataset.vocab.itos)},
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
            pretrain_dataset.vocab,
            args.writing_params_path,
            {
                "trainer": asdict(cfg),
                "dropout": args.dropout,
                "doc_offset": args.doc_offset,
                "doc_context": args.doc_context,
                "max_example_len": args.max_example_len,
                "steps": trainer.step,
                "epochs_done": round(trainer.epoch + trainer.batch_in_epoch / max(1, n_batches), 3),
                "train_seconds": trainer.seconds,
                "final_loss": losses[-1] if losses else None,
            },
        )
    if cfg.budget_seconds is not None and trainer.seconds >= cfg.budget_seconds:
        print(
            f"--budget_minutes {args.budget_minutes:g} spent at step {trainer.step}, in epoch "
            f"{trainer.epoch + 1} of {cfg.max_epochs}; the learning-rate schedule was cut off there"
            + (f", annealed over the last {cfg.budget_cooldown:.0%} of the budget" if cfg.budget_cooldown else "")
        )
    print(f"trained {trainer.step} steps in {seconds:.1f} s; params written to {args.writing_params_path}")


DECODE_BATCH = 128  # questions decoded together by the fast path (see README, "Speed")
DECODE_TOKENS = 4096  # and at most this many prompt positions (rows x longest prompt) in one batch


def decode_batches(lengths: list[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Split prompts of these lengths into batches of similar length, shortest first.

    Returns lists of indices into `lengths`: each batch holds at most max_rows
    prompts and, unless it is a single prompt, at most max_tokens positions
    counted as rows x its longest prompt, so a few long questions do not pad
    a whole batch to their length.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches = []
    while order:
        n = min(max_rows, len(order))
        while n > 1 and n * lengths[order[n - 1]] > max_tokens:
            n -= 1
        batches.append(order[:n])
        order = order[n:]
    return batches


def predict(model: GPT, vocab: Vocabulary, questions: list[str], impl: str, device: torch.device) -> list[str]:
    """Greedy answers: each question + MASK is continued until the next MASK (or 32 characters)."""
    model.eval()
    prompts = [q + MASK_CHAR for q in questions]
    block = model.get_block_size()
    mask_id = vocab.stoi[MASK_CHAR]
    encoded = [vocab.encode(p) for p in prompts]
    answers: list[list[int]] = []
    if impl == "reference":
        for ids in tqdm(encoded, desc="decoding", leave=False):
            x = torch.tensor([ids], dtype=torch.long, device=device)
            steps = min(MAX_ANSWER_CHARS, block - len(ids))
            out = sample(model, x, steps, sample=False)[0, len(ids) :].tolist()
            answers.append(out)
    else:  # in batches of questions of similar length, so little of each batch is padding
        answers = [[] for _ in encoded]
        batches = decode_batches([len(e) for e in encoded], DECODE_BATCH, DECODE_TOKENS)
        for rows in tqdm(batches, desc="decoding", leave=False):
            batch = greedy_decode_batch(
                next_logits_fn(model), [encoded[i] for i in rows], MAX_ANSWER_CHARS, mask_id, block, device
            )
            for i, answer in zip(rows, batch, strict=True):
                answers[i] = answer
    # A newline inside an answer would break the one-line-per-input predictions file.
    return [vocab.decode(a).split(MASK_CHAR)[0].replace("\n", " ") for a in answers]


def shared_prefix_length(tokens: torch.Tensor, lengths: torch.Tensor) -> int:
    """How many leading tokens every row of tokens (B, W) has in common, leaving each row one of its own."""
    limit = int(lengths.min()) - 1
    if limit <= 0:
        return 0
    same = (tokens[:, :limit] == tokens[:1, :limit]).all(dim=0)  # (limit,)
    return int(same.long().cumprod(dim=0).sum())


def next_logits_fn(model: GPT):
    """next_logits for greedy_decode_batch, with KV caches (both variants: see GPT.new_caches).

    Dropping a finished row from the caches copies every other row's keys and
    values, so rows stay in the caches after they finish, decoding a PAD at
    position 0 (one cheap position, never read), until half the cached rows
    have finished: the caches are then copied once, keeping the rows still going.
    """
    caches = model.new_caches()
    slots = torch.empty(0, dtype=torch.long)  # the cache row of each row still decoding

    def cached(tokens: torch.Tensor, lengths: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
        nonlocal slots
        if kept is None:  # first call: one pass over every prompt, then forget the padding
            shared = shared_prefix_length(tokens, lengths)
            if shared:  # "Where was " once, not once per row
                model(tokens[:1, :shared], caches=caches)
                for cache in caches:
                    cache.keep_rows(torch.zeros(tokens.size(0), dtype=torch.long, device=tokens.device))
            logits = model(tokens[:, shared:], caches=caches)[0]
            for cache in caches:
                cache.truncate(lengths)
            slots = torch.arange(tokens.size(0), device=tokens.device)
            return logits[torch.arange(tokens.size(0)), lengths - 1 - shared]
        slots = slots[kept]
        cached_rows = caches[0].lengths.numel()
        if 2 * slots.numel() <= cached_rows:
            for cache in caches:
                cache.keep_rows(slots)
            slots = torch.arange(slots.numel(), device=tokens.device)
            cached_rows = slots.numel()
        inputs = torch.zeros(cached_rows, dtype=torch.long, device=tokens.device)  # finished rows: PAD
        inputs[slots] = tokens[torch.arange(tokens.size(0)), lengths - 1]  # the tokens produced last call
        if slots.numel() < cached_rows:  # finished rows restart at position 0, so they never outgrow the block
            finished = torch.ones(cached_rows, dtype=torch.bool, device=tokens.device)
            finished[slots] = False
            for cache in caches:
                cache.truncate(cache.lengths.masked_fill(finished, 0))
        return model(inputs[:, None], caches=caches)[0][slots, -1]

    return cached


def evaluate(args: argparse.Namespace, pretrain_dataset: CharCorruptionDataset, model: GPT, device, writer) -> None:
    for flag in ("reading_params_path", "eval_corpus_path", "outputs_path"):
        if getattr(args, flag) is None:
            raise UserError(f"evaluate needs --{flag}")
    check_output_folder(args.outputs_path, "--outputs_path")
    check_output_folder(args.scores_path, "--scores_path")
    path = find_data_file(args.eval_corpus_path, "eval corpus")
    entries = read_questions(path, require_place=False)
    vocab = pretrain_dataset.vocab
    for q in entries:
        if q is None:
            continue
        vocab.encode(q.text, where=f"{path}:{q.line}")
        if len(q.text) + 2 > BLOCK_SIZE:
            raise UserError(f"{path}:{q.line}: question is {len(q.text)} characters; at most {BLOCK_SIZE - 2} fit")
    load_params(model, vocab, args.reading_params_path)
    model.to(device)
    questions = [q for q in entries if q is not None]
    t0 = time.time()
    predictions = predict(model, vocab, [q.text for q in questions], args.impl, device)
    seconds = time.time() - t0
    it = iter(predictions)
    lines = [next(it) if q is not None else "" for q in entries]
    write_text_atomic(args.outputs_path, "".join(line + "\n" for line in lines))
    total, correct = evaluate_places(path, predictions)
    writer.add_scalar("eval/seconds", seconds, 0)
    if args.scores_path is not None or total > 0:  # confidence: one teacher-forced pass over the answers
        scores = score_answers(model, vocab, [q.text for q in questions], predictions, device, MAX_ANSWER_CHARS)
    if args.scores_path is not None:
        write_text_atomic(args.scores_path, scores_tsv(entries, scores))
    if total > 0:
        writer.add_scalar("eval/accuracy", correct / total, 0)
        print(f"Correct: {float(correct)} out of {float(total)}: {correct / total * 100}%")
        summary = evaluation_summary(questions, predictions, scores, pretrain_dataset.data)
        print(format_summary(summary))
        for key, value in summary.items():
            if key != "accuracy" and not math.isnan(value):  # nan: an empty group
                writer.add_scalar(f"eval/{key}", value, 0)
    else:
        print(f"Predictions written to {args.outputs_path}; no targets provided")


def ask(args: argparse.Namespace, pretrain_dataset: CharCorruptionDataset, model: GPT, device) -> None:
    """Answer one question: the greedy answer, its confidence, and the top 3 answers of a beam search."""
    if args.reading_params_path is None:
        raise UserError("ask needs --reading_params_path")
    if args.question is None:
        raise UserError('ask needs a question after the corpus, e.g. "Where was Ada Lovelace born?"')
    question = args.question.strip()
    vocab = pretrain_dataset.vocab
    vocab.encode(question, where=f"question {question!r}")
    if len(question) + 2 > BLOCK_SIZE:
        raise UserError(f"question is {len(question)} characters; at most {BLOCK_SIZE - 2} fit")
    load_params(model, vocab, args.reading_params_path)
    model.to(device)
    answer = predict(model, vocab, [question], args.impl, device)[0]
    (score,) = score_answers(model, vocab, [question], [answer], device, MAX_ANSWER_CHARS)
    print(format_ask(question, score, beam_search(model, vocab, question, device, 3, MAX_ANSWER_CHARS)))


# ---------------------------------------------------------------------------
# CLI


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def make_parser() -> argparse.ArgumentParser:
    p = Parser(prog="run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("function", choices=["pretrain", "finetune", "evaluate", "ask"], help="what to do")
    p.add_argument(
        "variant", choices=VARIANTS, help="which model: vanilla, perceiver (2023 handout) or rope (2024 handout)"
    )
    p.add_argument("pretrain_corpus_path", help="pretraining corpus (wiki.txt); defines the vocabulary in every mode")
    p.add_argument("question", nargs="?", default=None, help='ask only: e.g. "Where was Ada Lovelace born?"')
    p.add_argument("--reading_params_path", default=None, help="params to load before training or evaluating")
    p.add_argument("--writing_params_path", default=None, help="where to save the trained params")
    p.add_argument("--finetune_corpus_path", default=None, help="question<TAB>place file to finetune on")
    p.add_argument(
        "--mix_questions",
        default=None,
        help="pretrain only (experimental): also train on this question<TAB>place file in every epoch",
    )
    p.add_argument(
        "--doc_offset",
        type=int,
        default=None,
        help="pretrain only: start each example at a random position 0..N (N <= 14), after the end of "
        "another document (handout: 0, always at position 0; --preset cpu: 14)",
    )
    p.add_argument(
        "--doc_context",
        default="",
        help="pretrain only (experimental): half of the examples start with this text (at most 14 characters) "
        "instead, e.g. 'Where was ', the words before the name in a question (default: none, as the handout)",
    )
    p.add_argument(
        "--max_example_len",
        type=int,
        default=None,
        help="pretrain only (experimental): corruption examples of at most N characters instead of 128 "
        "(documents cut to 4..7N/8 characters; --doc_offset then at most N/8 - 2), so every target lies "
        "within the first N positions, e.g. a perceiver's bottleneck; the model keeps its 128 positions",
    )
    p.add_argument(
        "--mix_corpus",
        action="store_true",
        help="finetune only (experimental): also train on span-corruption examples of the corpus in every epoch",
    )
    p.add_argument(
        "--freeze_blocks",
        type=int,
        default=0,
        help="finetune only (experimental): keep the embeddings and the first N blocks as pretrained (0: train all)",
    )
    p.add_argument("--eval_corpus_path", default=None, help="questions (with or without places) to answer")
    p.add_argument("--outputs_path", default=None, help="where to write one prediction per input line")
    p.add_argument(
        "--scores_path", default=None, help="evaluate: also write prediction<TAB>logprob<TAB>mean_logprob per line"
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="handout",
        help="recipe for unset flags: handout (the course's, default), cpu (fast on a 2-core CPU with bf16) or "
        "cpu_fp32 (for a CPU without native bf16; run.sh picks it there); see README",
    )
    p.add_argument("--pretrain_lr", type=float, default=None, help="peak learning rate for pretraining (6e-3)")
    p.add_argument("--finetune_lr", type=float, default=None, help="peak learning rate for finetuning (6e-4)")
    p.add_argument("--bottleneck_dim", type=int, default=32, help="perceiver bottleneck length m")
    p.add_argument(
        "--perceiver_init",
        choices=["handout", "aligned"],
        default="handout",
        help="perceiver start: the handout's, or both projections on the diagonal (experimental; README)",
    )
    p.add_argument("--n_layer", type=int, default=4, help="transformer blocks (perceiver: down + n_layer-2 + up)")
    p.add_argument("--n_head", type=int, default=8, help="attention heads")
    p.add_argument("--n_embd", type=int, default=256, help="embedding width")
    p.add_argument("--tb_expt_name", default="run", help="TensorBoard run name prefix (logs go to expt/<function>/)")
    p.add_argument(
        "--max_epochs",
        type=int,
        default=None,
        help="epochs (handout: pretrain 650; finetune 75, or 10 after pretraining)",
    )
    p.add_argument("--max_steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument(
        "--budget_minutes",
        type=float,
        default=None,
        help="stop training after this many minutes of training (summed over resumes); the LR schedule is "
        "the planned one, cut off where the time runs out (see README)",
    )
    p.add_argument(
        "--budget_cooldown",
        type=float,
        default=0.0,
        help="with --budget_minutes: over this last fraction of the budget (e.g. 0.2) scale the rate down "
        "linearly to its floor, so a run cut off by the budget still ends annealed (default 0: plain cut-off)",
    )
    p.add_argument(
        "--budget_fit",
        action="store_true",
        help="with --budget_minutes and a preset whose cosine spans the run (cpu, cpu_fp32): after the first "
        "epoch, train as many epochs as 92%% of the budget holds at that pace, more or fewer than planned, with "
        "the cosine planned over them, so the run ends annealed inside the budget (run.sh: cpu_fp32)",
    )
    p.add_argument(
        "--budget_replan",
        action="store_true",
        help="with --budget_fit: plan again after every epoch, at the median pace of the last three, into what "
        "is left of the budget less one epoch, so a machine that slows down mid-run still ends annealed in time",
    )
    p.add_argument("--batch_size", type=int, default=None, help="batch size (handout: pretrain 128, finetune 256)")
    p.add_argument("--seed", type=int, default=0, help="seed for init, data order, corruption and dropout")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where to run")
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader workers (reference path only)")
    p.add_argument(
        "--impl",
        choices=["fast", "reference"],
        default="fast",
        help="fast: bucketed vectorised batches, bf16, batched KV-cache decoding; reference: the handout's plain loop",
    )
    p.add_argument(
        "--optimizer",
        choices=["adamw", "muon"],
        default=None,
        help="adamw (the handout's) or muon: Muon for the blocks' weight matrices, AdamW for the rest, at the "
        "same rate and decay (--preset cpu_fp32 pretrains with muon; README)",
    )
    p.add_argument("--dropout", type=float, default=None, help="dropout of embeddings, attention and residuals (0.1)")
    p.add_argument("--resume", action="store_true", help="continue from <writing_params_path>.ckpt")
    p.add_argument("--ckpt_every", type=int, default=100, help="optimizer steps between checkpoints (0: at the end)")
    p.add_argument("--fp32", action="store_true", help="train in fp32 even where bf16 autocast is available")
    p.add_argument(
        "--compile", action="store_true", help="torch.compile the training forward pass (fast path; off by default)"
    )
    p.add_argument(
        "--token_weighted",
        action="store_true",
        help="fast path: weight each batch's loss by its number of targets, as unbucketed batches are (see README)",
    )
    p.add_argument(
        "--cosine_cap", action="store_true", help="hold the LR floor after final_tokens (handout: cosine rises again)"
    )
    return p


def run(args: argparse.Namespace) -> None:
    for flag in ("max_epochs", "max_steps", "batch_size", "n_layer", "n_head", "n_embd"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UserError(f"--{flag} must be at least 1, got {value}")
    if args.budget_minutes is not None and not args.budget_minutes > 0:
        raise UserError(f"--budget_minutes must be positive, got {args.budget_minutes}")
    if not 0 <= args.budget_cooldown <= 1:
        raise UserError(f"--budget_cooldown must be between 0 and 1, got {args.budget_cooldown}")
    if args.budget_cooldown and args.budget_minutes is None:
        raise UserError("--budget_cooldown needs --budget_minutes")
    if args.budget_fit and args.budget_minutes is None:
        raise UserError("--budget_fit needs --budget_minutes")
    if args.budget_replan and not args.budget_fit:
        raise UserError("--budget_replan needs --budget_fit")
    if args.mix_questions is not None and args.function != "pretrain":
        raise UserError("--mix_questions is for pretrain only")
    if args.doc_offset and args.function != "pretrain":
        raise UserError("--doc_offset is for pretrain only")
    if args.doc_context and args.function != "pretrain":
        raise UserError("--doc_context is for pretrain only")
    if args.max_example_len is not None and args.function != "pretrain":
        raise UserError("--max_example_len is for pretrain only")
    if args.max_example_len is not None and not 16 <= args.max_example_len <= BLOCK_SIZE:
        raise UserError(f"--max_example_len must be between 16 and {BLOCK_SIZE}, got {args.max_example_len}")
    if args.mix_corpus and args.function != "finetune":
        raise UserError("--mix_corpus is for finetune only")
    if args.freeze_blocks and args.function != "finetune":
        raise UserError("--freeze_blocks is for finetune only")
    if not 0 <= args.freeze_blocks <= args.n_layer:  # the perceiver's n_layer counts down, middle and up
        raise UserError(f"--freeze_blocks must be between 0 and {args.n_layer}, got {args.freeze_blocks}")
    apply_preset(args)
    if args.budget_fit and args.schedule != "run":
        raise UserError(
            f"--budget_fit needs a cosine that spans the run: --preset cpu or cpu_fp32 for pretraining, "
            f"not --preset {args.preset} for {args.function}"
        )
    seed_everything(args.seed)
    device, rank = init_distributed(args.device)
    if rank != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - under torchrun only rank 0 reports progress
    corpus_path = find_data_file(args.pretrain_corpus_path, "pretraining corpus")
    pretrain_dataset = CharCorruptionDataset(
        read_text(corpus_path),
        args.max_example_len or BLOCK_SIZE,  # the model keeps BLOCK_SIZE positions either way
        source=str(corpus_path),
        max_offset=args.doc_offset,
        context=args.doc_context,
    )
    model = build_model(args, pretrain_dataset.vocab_size)
    if args.function == "ask":
        return ask(args, pretrain_dataset, model, device)  # prints only: no TensorBoard run
    if args.question is not None:
        raise UserError(f"unexpected argument {args.question!r}: a question is only for ask")
    # The handout's run naming, so logs line up with theirs.
    run_name = (
        f"{args.tb_expt_name}_{args.variant}_{args.bottleneck_dim}"
        f"_pt_lr_{args.pretrain_lr:f}_ft_lr_{args.finetune_lr:f}"
    )
    log_dir = Path("expt") / args.function / run_name
    writer = SummaryWriter(log_dir=str(log_dir)) if rank == 0 else NullWriter()
    try:
        if args.function == "evaluate":
            evaluate(args, pretrain_dataset, model, device, writer)
        else:
            train(args, pretrain_dataset, model, device, writer)
    finally:
        writer.close()
        if dist.is_initialized():
            dist.destroy_process_group()


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
