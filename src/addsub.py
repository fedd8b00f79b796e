"""AddSub: an encoder-decoder Transformer that learns signed two-digit addition
and subtraction, e.g.

    BOS NEGATIVE 30 subtract NEGATIVE 34 EOS  ->  BOS POSITIVE 04 EOS

The file reads top to bottom: the language (vocabulary, expressions, the split
files), the model (as in "Attention Is All You Need", post-LayerNorm, built on
`attention.MultiHeadAttention`), training with teacher forcing, greedy batched
decoding and its scores, and the command line:

    python src/addsub.py data                                   # write data/addsub/{train,val,test}.txt
    python src/addsub.py train --outputs_path addsub.params     # TensorBoard logs in expt/addsub/
    python src/addsub.py evaluate --reading_params_path addsub.params --split test
    python src/addsub.py ask "12 + -30"                         # or "BOS POSITIVE 12 add NEGATIVE 30 EOS"

Every sequence has the same length (9 input tokens, 5 output tokens), so no
PAD token is needed and the vocabulary is exactly the 16 tokens of the task.
After a row of a batch has emitted EOS, greedy decoding keeps writing EOS in
that row: EOS is the filler where other models would write PAD.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import NoReturn

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from attention import MultiHeadAttention
from machine import pick_device
from params import load_verified, save_with_sidecar, warn_unverified
from utils import (
    UserError,
    check_input,
    check_output_dir,
    check_output_file,
    check_path_given,
    folders_to_make,
    no_thread_tracebacks_for_os_errors,
    refuse_same_file,
    run_cli,
    setting,
    setting_problems,
    training_memory_problem,
    write_failure,
    write_text_atomic,
)

# ---------------------------------------------------------------------------
# The language

DIGITS = [str(d) for d in range(10)]
WORDS = ["POSITIVE", "NEGATIVE", "add", "subtract", "BOS", "EOS"]
TOKENS = DIGITS + WORDS  # 16 tokens; a token's id is its index here
STOI = {t: i for i, t in enumerate(TOKENS)}
BOS, EOS = STOI["BOS"], STOI["EOS"]
MAX_OPERAND = 39  # |a|, |b| <= 39 keeps every result in -78..78: two digits
IN_LEN = 9  # BOS sign d d op sign d d EOS
OUT_LEN = 5  # BOS sign d d EOS
SPLITS = ("train", "val", "test")
SPLIT_SEED = 0
DATA_DIR = "data/addsub"  # --data_dir's default: written where it says, read from REPO_DATA_DIR when missing here
REPO_DATA_DIR = Path(__file__).resolve().parents[1] / DATA_DIR
MAX_SEED = 2**32 - 1  # the seeds run.sh and the demo take (numpy's range)
DEVICES = ("auto", "cpu", "cuda")


def number_text(n: int) -> str:
    """-4 -> 'NEGATIVE 04'; zero is 'POSITIVE 00'."""
    return f"{'NEGATIVE' if n < 0 else 'POSITIVE'} {abs(n):02d}"


def expression_text(a: int, op: str, b: int) -> tuple[str, str]:
    """(a, 'add' | 'subtract', b) -> (input text, output text) of one example."""
    result = a + b if op == "add" else a - b
    return f"BOS {number_text(a)} {op} {number_text(b)} EOS", f"BOS {number_text(result)} EOS"


def all_expressions() -> list[tuple[str, str]]:
    """All 79 * 2 * 79 = 12,482 (input, output) pairs, in a fixed order."""
    r = range(-MAX_OPERAND, MAX_OPERAND + 1)
    return [expression_text(a, op, b) for a in r for op in ("add", "subtract") for b in r]


def split_expressions(seed: int = SPLIT_SEED) -> dict[str, list[tuple[str, str]]]:
    """Shuffle all expressions with a fixed seed and cut them 80/10/10 into train/val/test."""
    pairs = all_expressions()
    # random.Random's shuffle is specified to be stable across Python versions
    # for a given seed, which is what makes the split files reproducible.
    random.Random(seed).shuffle(pairs)
    n_train, n_val = int(0.8 * len(pairs)), int(0.1 * len(pairs))
    return {
        "train": pairs[:n_train],
        "val": pairs[n_train : n_train + n_val],
        "test": pairs[n_train + n_val :],
    }


def write_splits(data_dir: str | Path, seed: int = SPLIT_SEED) -> dict[str, int]:
    """Write data_dir/{train,val,test}.txt, one 'input<TAB>output' line each; returns the counts.

    Every file is checked before any is written: a UserError leaves nothing behind.
    """
    check_output_dir(data_dir, "--data_dir")
    for name in SPLITS:
        target = Path(data_dir) / f"{name}.txt"
        if os.path.lexists(target) and not target.is_file():  # renaming onto it would replace it
            raise UserError(
                f"--data_dir {data_dir}: {name}.txt is a folder, FIFO, device or broken link, not a regular file; "
                "remove it or choose another --data_dir"
            )
    counts, made = {}, folders_to_make(data_dir)
    try:
        for name, pairs in split_expressions(seed).items():
            text = "".join(f"{x}\t{y}\n" for x, y in pairs)
            Path(data_dir).mkdir(parents=True, exist_ok=True)
            write_text_atomic(Path(data_dir) / f"{name}.txt", text)
            counts[name] = len(pairs)
    except UserError:  # a full disk: the folder this call made goes again, with any split written in it
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)
        raise
    return counts


def encode(text: str) -> list[int]:
    """'BOS POSITIVE 04 EOS' -> token ids; a number is one token per digit."""
    ids = []
    for word in text.split():
        if word.isdigit():
            ids.extend(STOI[c] for c in word)
        else:
            ids.append(STOI[word])
    return ids


def decode(ids: list[int]) -> str:
    """Token ids -> text with each number's digits written together: [14, 10, 0, 4, 15] -> 'BOS POSITIVE 04 EOS'."""
    words: list[str] = []
    for i in ids:
        t = TOKENS[i]
        if t in DIGITS and words and words[-1].isdigit():
            words[-1] += t
        else:
            words.append(t)
    return " ".join(words)


def find_data_dir(data_dir: str | Path) -> str | Path:
    """The folder to read the splits from: `data_dir` as given, or for the default DATA_DIR missing from
    the current folder the repository's (and we say so), as run.py finds its data files."""
    if str(data_dir) == DATA_DIR and not Path(data_dir).exists() and REPO_DATA_DIR.is_dir():
        print(f"--data_dir {data_dir} is not in the current folder; using {REPO_DATA_DIR}")
        return REPO_DATA_DIR
    return data_dir


def load_split(data_dir: str | Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Read data_dir/<split>.txt -> (src (N, 9), tgt (N, 5)) long tensors."""
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    path = Path(data_dir) / f"{split}.txt"
    write_them = f"; write the splits with `python src/addsub.py data --data_dir {data_dir}`"
    try:
        text = check_input(path, "--data_dir's", write_them).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid UTF-8 (byte {e.start}){write_them}") from None
    src, tgt = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        try:
            x, y = line.split("\t")
            x_ids, y_ids = encode(x), encode(y)
        except (ValueError, KeyError):
            raise UserError(f"{path}:{lineno}: expected 'input<TAB>output' in AddSub tokens, got {line!r}") from None
        if len(x_ids) != IN_LEN or len(y_ids) != OUT_LEN:
            raise UserError(f"{path}:{lineno}: expected {IN_LEN} input and {OUT_LEN} output tokens, got {line!r}")
        src.append(x_ids)
        tgt.append(y_ids)
    return torch.tensor(src, dtype=torch.long), torch.tensor(tgt, dtype=torch.long)


def _parse_operand(words: list[str], i: int) -> int:
    """words[i:i+2] = sign, two-digit number -> the signed value."""
    if i >= len(words):
        raise UserError("expression ends early: expected POSITIVE or NEGATIVE and a two-digit number")
    sign = words[i]
    if sign not in ("POSITIVE", "NEGATIVE"):
        if sign.isdigit():
            raise UserError(f"missing sign before {sign!r}: write POSITIVE {sign} or NEGATIVE {sign}")
        raise UserError(f"expected POSITIVE or NEGATIVE, got {sign!r}")
    if i + 1 >= len(words) or not words[i + 1].isdigit():
        raise UserError(f"expected a two-digit number after {sign}")
    digits = words[i + 1]
    if len(digits) != 2:
        raise UserError(f"{digits!r} has {len(digits)} digits; numbers have exactly two (zero-padded, e.g. 04)")
    return int(digits) * (-1 if sign == "NEGATIVE" else 1)


def parse_expression(text: str) -> tuple[int, str, int]:
    """'BOS POSITIVE 12 add NEGATIVE 30 EOS' or '12 + -30' -> (12, 'add', -30).

    In the token form BOS and EOS may be left out, signs may not. Raises
    UserError, with a one-line reason, on anything else or on operands outside
    -39..39 (the range the model was trained on).
    """
    if re.search(r"[A-Za-z]", text):
        words = text.split()
        for w in words:
            if w not in WORDS and not re.fullmatch(r"[0-9]+", w):
                raise UserError(f"unknown token {w!r}; the tokens are {' '.join(WORDS)} and two-digit numbers")
        words = words[1:] if words[:1] == ["BOS"] else words
        words = words[:-1] if words[-1:] == ["EOS"] else words
        a = _parse_operand(words, 0)
        if len(words) < 3 or words[2] not in ("add", "subtract"):
            raise UserError("expected 'add' or 'subtract' after the first number")
        op = words[2]
        b = _parse_operand(words, 3)
        if len(words) > 5:
            raise UserError(f"unexpected tokens after the second number: {' '.join(words[5:])!r}")
    else:
        bad = re.search(r"[^0-9+\-\s]", text)
        if bad:
            raise UserError(f"unknown symbol {bad.group()!r}; write e.g. '12 + -30' or '12 - 30'")
        m = re.fullmatch(r"\s*([+-]?)\s*([0-9]+)\s*([+-])\s*([+-]?)\s*([0-9]+)\s*", text)
        if m is None:
            raise UserError(f"cannot parse {text!r}; write e.g. '12 + -30' or 'BOS POSITIVE 12 add NEGATIVE 30 EOS'")
        for digits in (m.group(2), m.group(5)):
            if len(digits) > 2:
                raise UserError(f"{digits!r} has {len(digits)} digits; numbers have at most two")
        a = int(m.group(1) + m.group(2))
        op = "add" if m.group(3) == "+" else "subtract"
        b = int(m.group(4) + m.group(5))
    for n in (a, b):
        if abs(n) > MAX_OPERAND:
            raise UserError(f"operand {n} is outside -{MAX_OPERAND}..{MAX_OPERAND}, the range the model knows")
    return a, op, b


# ---------------------------------------------------------------------------
# The model


@dataclass
class AddSubConfig:
    """Model hyperparameters; the defaults are the course's."""

    num_heads: int = setting(4, "attention heads per layer", at_least=1)
    emb_dim: int = setting(32, "embedding (model) width", at_least=1)
    dim_feedforward: int = setting(32, "hidden width of the feed-forward layers", at_least=1)
    dropout: float = setting(
        0.2, "dropout on attention weights, sublayer outputs, embeddings", at_least=0, at_most=0.99
    )
    num_encoder_layers: int = setting(4, "encoder blocks", at_least=1)
    num_decoder_layers: int = setting(4, "decoder blocks", at_least=1)
    pos_encoding: str = field(
        default="sinusoidal",
        metadata={"help": "positional encoding", "choices": ("sinusoidal", "linear")},
    )
    vocab_size: int = setting(len(TOKENS), "vocabulary size (16: no PAD needed)", at_least=len(TOKENS))
    max_len: int = setting(16, "longest sequence the positional encoding covers", at_least=IN_LEN)


class PositionalEncoding(nn.Module):
    """Adds a fixed position signal: x (B, T, C) -> (B, T, C).

    'sinusoidal': sin/cos of position at geometric frequencies (Vaswani et al.).
    'linear': the simple n/K encoding, position n of K adds n/K to every channel.
    """

    def __init__(self, emb_dim: int, max_len: int, kind: str = "sinusoidal"):
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (K, 1)
        if kind == "sinusoidal":
            freq = torch.exp(torch.arange(0, emb_dim, 2, dtype=torch.float32) * (-math.log(10000.0) / emb_dim))
            pe = torch.zeros(max_len, emb_dim)
            pe[:, 0::2] = torch.sin(pos * freq)
            pe[:, 1::2] = torch.cos(pos * freq[: emb_dim // 2])
        elif kind == "linear":
            pe = (pos / max_len).expand(max_len, emb_dim).clone()
        else:
            raise ValueError(f"unknown positional encoding {kind!r}")
        # Not persistent: it is a function of the config, so params files stay small.
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pe[: x.size(1)]


class FeedForward(nn.Module):
    """Position-wise Linear -> ReLU -> Linear, with dropout: (B, T, C) -> (B, T, C)."""

    def __init__(self, emb_dim: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(emb_dim, dim_feedforward)
        self.fc2 = nn.Linear(dim_feedforward, emb_dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(F.relu(self.fc1(x)))))


class AddNorm(nn.Module):
    """Residual then LayerNorm (post-LN, as in the paper): (x, sublayer(x)), both (B, T, C) -> (B, T, C)."""

    def __init__(self, emb_dim: int):
        super().__init__()
        self.ln = nn.LayerNorm(emb_dim)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.ln(x + y)


class EncoderBlock(nn.Module):
    """Self-attention and feed-forward, each followed by add & norm: (B, Ts, C) -> (B, Ts, C)."""

    def __init__(self, cfg: AddSubConfig):
        super().__init__()
        self.attn = MultiHeadAttention(cfg.emb_dim, cfg.num_heads, cfg.dropout, cfg.dropout)
        self.norm1 = AddNorm(cfg.emb_dim)
        self.ff = FeedForward(cfg.emb_dim, cfg.dim_feedforward, cfg.dropout)
        self.norm2 = AddNorm(cfg.emb_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # No mask: every input token may look at every other (no padding exists).
        x = self.norm1(x, self.attn(x, x))
        return self.norm2(x, self.ff(x))


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward.

    forward(x (B, Tt, C), memory (B, Ts, C), causal bool (1, 1, Tt, Tt)) -> (B, Tt, C).
    """

    def __init__(self, cfg: AddSubConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.emb_dim, cfg.num_heads, cfg.dropout, cfg.dropout)
        self.norm1 = AddNorm(cfg.emb_dim)
        self.cross_attn = MultiHeadAttention(cfg.emb_dim, cfg.num_heads, cfg.dropout, cfg.dropout)
        self.norm2 = AddNorm(cfg.emb_dim)
        self.ff = FeedForward(cfg.emb_dim, cfg.dim_feedforward, cfg.dropout)
        self.norm3 = AddNorm(cfg.emb_dim)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x, self.self_attn(x, x, causal))
        x = self.norm2(x, self.cross_attn(x, memory))
        return self.norm3(x, self.ff(x))


class AddSubTransformer(nn.Module):
    """Encoder-decoder Transformer.

    forward(src (B, Ts), tgt_in (B, Tt)) -> logits (B, Tt, vocab): the logits at
    target position t predict target token t+1 from src and tgt_in[:, :t+1].
    """

    def __init__(self, cfg: AddSubConfig):
        super().__init__()
        self.cfg = cfg
        # One embedding for both sides: source and target share the vocabulary.
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.emb_dim)
        # std C**-0.5 times the sqrt(C) scale in embed() gives unit-size
        # embeddings, the same size as the sinusoidal position signal.
        nn.init.normal_(self.tok_emb.weight, std=cfg.emb_dim**-0.5)
        self.pos = PositionalEncoding(cfg.emb_dim, cfg.max_len, cfg.pos_encoding)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.num_encoder_layers))
        self.decoder = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.num_decoder_layers))
        self.head = nn.Linear(cfg.emb_dim, cfg.vocab_size)
        self.register_buffer(
            "causal", torch.tril(torch.ones(cfg.max_len, cfg.max_len, dtype=torch.bool)), persistent=False
        )
        # Attention outputs keep torch's dropout, as every recorded AddSub run was trained (only the
        # attention weights took attention.dropout): the same seed still trains the same model.
        for m in self.modules():
            if isinstance(m, MultiHeadAttention):
                m.resid_drop = nn.Dropout(cfg.dropout)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, C)"""
        return self.drop(self.pos(self.tok_emb(idx) * math.sqrt(self.cfg.emb_dim)))

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """(B, Ts) -> memory (B, Ts, C)"""
        x = self.embed(src)
        for block in self.encoder:
            x = block(x)
        return x

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """(B, Tt) target prefix, (B, Ts, C) memory -> logits (B, Tt, vocab)"""
        T = tgt_in.size(1)
        causal = self.causal[:T, :T].view(1, 1, T, T)
        x = self.embed(tgt_in)
        for block in self.decoder:
            x = block(x, memory, causal)
        return self.head(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.decode(tgt_in, self.encode(src))

    @torch.no_grad()
    def generate(self, src: torch.Tensor, max_len: int = OUT_LEN) -> torch.Tensor:
        """Greedy decoding of a batch: src (B, Ts) -> (B, max_len), starting with BOS.

        Stops when every row has emitted EOS; rows that finished earlier, and
        the columns after an early stop, are filled with EOS.
        """
        memory = self.encode(src)
        out = torch.full((src.size(0), 1), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
        while out.size(1) < max_len and not done.all():
            # Re-running the short prefix is cheaper here than keeping a KV cache.
            nxt = self.decode(out, memory)[:, -1].argmax(-1)  # (B,)
            nxt = nxt.masked_fill(done, EOS)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == EOS
        return F.pad(out, (0, max_len - out.size(1)), value=EOS)


# ---------------------------------------------------------------------------
# Training and evaluation


@dataclass
class TrainConfig:
    """Optimisation settings; the defaults are the course's (Adam, lr 1e-3, 10 epochs)."""

    epochs: int = setting(10, "passes over the training split", at_least=1)
    batch_size: int = setting(64, "examples per step (the course fixes none; ours)", at_least=1)
    lr: float = setting(1e-3, "peak learning rate (Adam/AdamW)", above=0)
    weight_decay: float = setting(0.0, "AdamW decoupled weight decay (0: plain Adam)", at_least=0)
    lr_schedule: str = field(
        default="constant",
        metadata={"help": "learning-rate schedule after warmup", "choices": ("constant", "cosine")},
    )
    warmup_steps: int = setting(0, "steps of linear learning-rate warmup", at_least=0)
    grad_clip: float = setting(0.0, "clip the gradient norm to this (0: off)", at_least=0)
    label_smoothing: float = setting(0.0, "label smoothing of the cross-entropy", at_least=0, at_most=0.99)
    seed: int = setting(0, "seed for initialisation, shuffling and dropout", at_least=0, at_most=MAX_SEED)


def sequence_loss(
    model: AddSubTransformer, src: torch.Tensor, tgt: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Teacher forcing: feed tgt[:, :-1], predict tgt[:, 1:]. src (B, Ts), tgt (B, Tt) -> scalar loss."""
    logits = model(src, tgt[:, :-1])  # (B, Tt-1, vocab)
    return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), label_smoothing=label_smoothing)


@torch.no_grad()
def evaluate(model: AddSubTransformer, src: torch.Tensor, tgt: torch.Tensor, batch_size: int = 2048) -> dict:
    """Greedy-decode src (N, Ts) and compare with tgt (N, Tt).

    Returns {'exact_match': fraction of rows decoded exactly, 'token_accuracy':
    fraction of the Tt-1 generated positions (sign, digits, EOS) that are right,
    'n': N}.
    """
    was_training = model.training
    model.eval()
    exact, correct = 0, 0
    for i in range(0, src.size(0), batch_size):
        pred = model.generate(src[i : i + batch_size], max_len=tgt.size(1))
        ok = pred[:, 1:] == tgt[i : i + batch_size, 1:]  # (b, Tt-1); BOS is given, not predicted
        exact += ok.all(dim=1).sum().item()
        correct += ok.sum().item()
    model.train(was_training)
    n = src.size(0)
    return {"exact_match": exact / n, "token_accuracy": correct / (n * (tgt.size(1) - 1)), "n": n}


def check_settings(cfg: AddSubConfig, tcfg: TrainConfig) -> None:
    """One-line UserErrors for settings no training can use, before any work is done: each field's rule
    (utils.setting), then the rules that tie fields together."""
    problems = [*setting_problems(cfg), *setting_problems(tcfg)]
    if cfg.emb_dim % max(1, cfg.num_heads):
        problems.append(f"--emb_dim {cfg.emb_dim} must be divisible by --num_heads {cfg.num_heads}")
    layer = 4 * cfg.emb_dim**2 + 2 * cfg.emb_dim * cfg.dim_feedforward  # attention and feed-forward
    layers = cfg.num_encoder_layers + 2 * cfg.num_decoder_layers  # a decoder layer attends twice
    sizes = f"--emb_dim {cfg.emb_dim}, --dim_feedforward {cfg.dim_feedforward}, --max_len {cfg.max_len}, --vocab_size"
    parameters = layers * layer + (2 * cfg.vocab_size + cfg.max_len) * cfg.emb_dim
    if memory := training_memory_problem(parameters, f"{sizes} {cfg.vocab_size} and the layers", cfg.max_len**2):
        problems.append(memory)  # the max_len x max_len causal mask beside the parameters
    if problems:
        raise UserError(problems[0])


def check_seed(seed: int) -> None:
    """A one-line UserError for a seed outside 0..2**32-1 (addsub.py data's, which has no TrainConfig)."""
    check_settings(AddSubConfig(), TrainConfig(seed=seed))


def lr_lambda(tcfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """step -> multiplier of the peak lr: linear warmup, then constant or cosine decay to 0."""

    def f(step: int) -> float:
        if step < tcfg.warmup_steps:
            return (step + 1) / tcfg.warmup_steps
        if tcfg.lr_schedule == "constant":
            return 1.0
        progress = (step - tcfg.warmup_steps) / max(1, total_steps - tcfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def train(
    model: AddSubTransformer,
    train_data: tuple[torch.Tensor, torch.Tensor],
    val_data: tuple[torch.Tensor, torch.Tensor],
    tcfg: TrainConfig,
    logdir: str | Path | None = None,
    on_best: Callable[[AddSubTransformer, dict], None] | None = None,
    progress: bool = True,
) -> dict:
    """Train with teacher forcing; after every epoch greedy-decode val and keep the best weights.

    train_data, val_data: (src (N, 9), tgt (N, 5)) on the model's device. The
    model ends up holding the weights of the epoch with the best val exact-match
    (ties: the later epoch); on_best(model, summary) is called each time val
    improves (the CLI saves params there). Returns a summary dict.

    Not trainer.Trainer: that loop trains a model(x, y) -> (logits, loss) by a token-counted
    cosine; this one trains an encoder-decoder on (src, tgt) by steps and keeps its best val epoch.
    """
    (src, tgt), device, gen = train_data, train_data[0].device, torch.Generator().manual_seed(tcfg.seed)
    optimizer, scheduler = optimizer_and_schedule(model, tcfg, src.size(0))
    writer = open_writer(logdir, model, tcfg)
    best, best_state, step = {"val_exact_match": -1.0}, None, 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    bar = tqdm(range(tcfg.epochs), desc="epochs", disable=not progress)
    try:
        for epoch in bar:
            perm = torch.randperm(src.size(0), generator=gen).to(device)
            train_loss, step = train_epoch(model, (src, tgt), perm, optimizer, scheduler, tcfg, writer, step)
            val_loss, scores = validate(model, val_data, writer, step, train_loss)
            bar.set_postfix(loss=f"{train_loss:.4f}", val_em=f"{scores['exact_match']:.4f}")
            if progress:
                tqdm.write(epoch_line(epoch, train_loss, val_loss, scores, time.perf_counter() - t0))
            if scores["exact_match"] >= best["val_exact_match"]:
                best = {"val_exact_match": scores["exact_match"], "val_token_accuracy": scores["token_accuracy"]}
                best["epoch"] = epoch + 1
                best_state = copy.deepcopy(model.state_dict())
                if on_best is not None:
                    on_best(model, best)
    finally:  # closed even after a failed write, so that its thread writes nothing into a folder removed after
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()
    seconds = {"train_seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - cpu0}  # cpu: all
    if best_state is not None:  # threads', which unlike wall time other jobs do not grow
        model.load_state_dict(best_state)
    return {**best, "epochs": tcfg.epochs, "steps": step, **seconds}


def open_writer(logdir: str | Path | None, model: AddSubTransformer, tcfg: TrainConfig):
    """A TensorBoard SummaryWriter at `logdir` holding both configs, or None without a logdir."""
    if logdir is None:
        return None
    from torch.utils.tensorboard import SummaryWriter  # slow import, only when logging

    writer = SummaryWriter(log_dir=str(logdir))
    writer.add_text(
        "config", "```\n" + json.dumps({"model": asdict(model.cfg), "train": asdict(tcfg)}, indent=2) + "\n```"
    )
    return writer


def epoch_line(epoch: int, train_loss: float, val_loss: float, scores: dict, seconds: float) -> str:
    """What train prints after epoch `epoch` (counted from 0), `seconds` into training."""
    return (
        f"epoch {epoch + 1}: train loss {train_loss:.4f}, val loss {val_loss:.4f}, "
        f"val exact-match {scores['exact_match']:.4f}, {seconds:.0f}s"
    )


def optimizer_and_schedule(
    model: AddSubTransformer, tcfg: TrainConfig, n_examples: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its per-step schedule (lr_lambda) over tcfg.epochs epochs of n_examples examples."""
    # The last partial batch is dropped (a fresh permutation each epoch covers
    # it next time): a batch of a handful of examples would be a noisy step.
    steps_per_epoch = max(1, n_examples // tcfg.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tcfg.lr, weight_decay=tcfg.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tcfg, steps_per_epoch * tcfg.epochs))


def validate(
    model: AddSubTransformer, val_data: tuple[torch.Tensor, torch.Tensor], writer, step: int, train_loss: float
) -> tuple[float, dict]:
    """The val loss and evaluate's scores on val_data (src (N, 9), tgt (N, 5)), logged with the epoch's train loss."""
    model.eval()
    with torch.no_grad():
        val_loss = sequence_loss(model, *val_data).item()
    scores = evaluate(model, *val_data)
    if writer is not None:
        writer.add_scalar("train/epoch_loss", train_loss, step)
        writer.add_scalar("val/loss", val_loss, step)
        writer.add_scalar("val/exact_match", scores["exact_match"], step)
        writer.add_scalar("val/token_accuracy", scores["token_accuracy"], step)
    return val_loss, scores


def train_epoch(
    model: AddSubTransformer,
    data: tuple[torch.Tensor, torch.Tensor],
    perm: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    tcfg: TrainConfig,
    writer,
    step: int,
) -> tuple[float, int]:
    """One epoch over data (src (N, 9), tgt (N, 5)) in the order `perm` (N,), whole batches only;
    returns the epoch's mean loss and the step count after it."""
    src, tgt = data
    steps_per_epoch = max(1, src.size(0) // tcfg.batch_size)
    model.train()
    loss_sum = torch.zeros((), device=src.device)  # summed on-device: no sync per step
    for i in range(steps_per_epoch):
        idx = perm[i * tcfg.batch_size : (i + 1) * tcfg.batch_size]
        loss = sequence_loss(model, src[idx], tgt[idx], tcfg.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        loss_sum += loss.detach()
        if tcfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        if writer is not None and step % 10 == 0:
            writer.add_scalar("train/loss", loss.item(), step)
            writer.add_scalar("train/lr", scheduler.get_last_lr()[0], step)
    return loss_sum.item() / steps_per_epoch, step


# ---------------------------------------------------------------------------
# Params files


def save_params(path: str | Path, model: AddSubTransformer, extra: dict | None = None) -> None:
    """Atomically write {'config', 'model'} to path (loadable with weights_only) and a JSON sidecar beside it
    with the config, `extra` and the params' SHA-256 (params.save_with_sidecar)."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    save_with_sidecar(
        {"config": asdict(model.cfg), "model": state}, path, {"config": asdict(model.cfg), **(extra or {})}
    )


def config_from(saved: dict) -> AddSubConfig:
    """The AddSubConfig a saved dict describes (params files, results); keys of settings since removed are ignored."""
    known = {f.name for f in fields(AddSubConfig)}
    return AddSubConfig(**{k: v for k, v in saved.items() if k in known})


def load_params(path: str | Path, device: torch.device | str = "cpu") -> AddSubTransformer:
    """Rebuild the model from a params file written by save_params (checked against its sidecar's SHA-256),
    in eval mode."""
    hint = f" (train one with `python src/addsub.py train --outputs_path {path}`)"
    blob, side, _ = load_verified(check_input(path, "--reading_params_path", hint), "--reading_params_path")
    try:
        model = AddSubTransformer(config_from(blob["config"]))
        model.load_state_dict(blob["model"])
        warn_unverified(path, side)
    except Exception as e:  # any unreadable or foreign file is the user's input, not our bug
        raise UserError(
            f"{path} is not an AddSub params file ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        ) from None
    return model.to(device).eval()


# ---------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, instead of usage + message
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls) -> None:
    """One --flag per dataclass field, typed by its default, help from its metadata."""
    for f in fields(cls):
        parser.add_argument(
            f"--{f.name}",
            type=type(f.default),
            default=f.default,
            choices=f.metadata.get("choices"),
            help=f"{f.metadata['help']} (default: {f.default})",
        )


def _pick(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


DATA_DIR_HELP = f"folder with the split files (default: {DATA_DIR} here, else the repository's)"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="addsub.py", description="AddSub: an encoder-decoder Transformer for signed two-digit + and -.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("data", help="write the train/val/test split files")
    d.add_argument(
        "--data_dir", default=DATA_DIR, help=f"folder for train.txt, val.txt, test.txt (default: {DATA_DIR})"
    )
    d.add_argument("--seed", type=int, default=SPLIT_SEED, help="seed of the shuffle that makes the split")

    t = sub.add_parser("train", help="train a model and write its params file")
    t.add_argument("--outputs_path", default="addsub.params", help="params file to write (config + weights)")
    t.add_argument("--data_dir", default=DATA_DIR, help=DATA_DIR_HELP)
    t.add_argument("--logdir", default="expt/addsub", help="TensorBoard root; each run gets a subfolder")
    t.add_argument("--device", default="auto", choices=DEVICES, help="where to train")
    t.add_argument("--no_progress", action="store_true", help="hide the tqdm bar")
    _add_dataclass_flags(t, AddSubConfig)
    _add_dataclass_flags(t, TrainConfig)

    e = sub.add_parser("evaluate", help="greedy-decode a split and print exact-match and token accuracy")
    e.add_argument("--reading_params_path", default="addsub.params", help="params file to load")
    e.add_argument("--split", default="test", help=f"one of {', '.join(SPLITS)}")
    e.add_argument("--data_dir", default=DATA_DIR, help=DATA_DIR_HELP)
    e.add_argument("--device", default="auto", choices=DEVICES, help="where to evaluate")

    a = sub.add_parser("ask", help="answer one expression")
    a.add_argument("expression", help="e.g. '12 + -30' or 'BOS POSITIVE 12 add NEGATIVE 30 EOS'")
    a.add_argument("--reading_params_path", default="addsub.params", help="params file to load")
    return p


def run(args: argparse.Namespace) -> None:
    """Do what args.command says: data, train, evaluate or ask."""
    for flag in ("data_dir", "outputs_path", "logdir", "reading_params_path"):
        check_path_given(getattr(args, flag, None), f"--{flag}")
    if args.command == "data":
        check_seed(args.seed)
        counts = write_splits(args.data_dir, args.seed)
        print(f"wrote {args.data_dir}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    elif args.command == "train":
        run_train(args)
    elif args.command == "evaluate":
        run_evaluate(args)
    elif args.command == "ask":
        run_ask(args)


def run_train(args: argparse.Namespace) -> None:
    """addsub.py train: train a model on the train split, keep its best val epoch in --outputs_path."""
    cfg, tcfg = _pick(AddSubConfig, args), _pick(TrainConfig, args)
    check_settings(cfg, tcfg)
    check_output_file(args.outputs_path, "--outputs_path")
    check_output_file(f"{args.outputs_path}.json", "--outputs_path's sidecar")
    check_output_dir(args.logdir, "--logdir")
    args.data_dir = find_data_dir(args.data_dir)
    splits = {f"--data_dir's {s}.txt": Path(args.data_dir) / f"{s}.txt" for s in ("train", "val")}
    refuse_same_file(
        {"--outputs_path": args.outputs_path, "--outputs_path's sidecar": f"{args.outputs_path}.json"}, splits
    )
    device = pick_device(args.device)
    data = {s: tuple(t.to(device) for t in load_split(args.data_dir, s)) for s in ("train", "val")}
    torch.manual_seed(tcfg.seed)
    model = AddSubTransformer(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params:,} parameters on {device}; train {len(data['train'][0])}, val {len(data['val'][0])}")
    run_dir = Path(args.logdir) / time.strftime("%Y%m%d-%H%M%S")
    extra = {"train": asdict(tcfg)}

    def on_best(m, best):
        save_params(args.outputs_path, m, {**extra, "best": best})

    made = folders_to_make(run_dir)  # this run's folder and the parents it makes: all it may remove
    try:
        with no_thread_tracebacks_for_os_errors():
            summary = train(model, data["train"], data["val"], tcfg, run_dir, on_best, progress=not args.no_progress)
    except OSError as e:  # the TensorBoard logs on a full disk; the params of the best epoch so far are kept
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)
        raise write_failure(e, run_dir) from None
    save_params(args.outputs_path, model, {**extra, "best": summary})
    print(
        f"best val exact-match {summary['val_exact_match']:.4f} (epoch {summary['epoch']}), "
        f"{summary['train_seconds']:.0f}s; wrote {args.outputs_path}, logs in {run_dir}"
    )


def run_evaluate(args: argparse.Namespace) -> None:
    """addsub.py evaluate: exact-match and token accuracy of greedy answers on one split."""
    device = pick_device(args.device)
    split = load_split(find_data_dir(args.data_dir), args.split)  # its checks before the model is loaded
    model = load_params(args.reading_params_path, device)
    src, tgt = (t.to(device) for t in split)
    s = evaluate(model, src, tgt)
    print(
        f"{args.split}: exact-match {s['exact_match']:.4f} "
        f"({round(s['exact_match'] * s['n'])}/{s['n']}), token accuracy {s['token_accuracy']:.4f}"
    )


def run_ask(args: argparse.Namespace) -> None:
    """addsub.py ask: the model's answer to one expression, its value where it is well formed, and whether
    it is right (the true value beside a wrong one)."""
    a, op, b = parse_expression(args.expression)
    model = load_params(args.reading_params_path)
    src = torch.tensor([encode(expression_text(a, op, b)[0])])
    answer = decode(model.generate(src)[0].tolist())
    m = re.fullmatch(r"BOS (POSITIVE|NEGATIVE) ([0-9]{2}) EOS", answer)
    truth = a + b if op == "add" else a - b
    if m is None:
        print(f"{answer}  (not a well-formed answer; the true value is {truth})")
        return
    value = int(m.group(2)) * (-1 if m.group(1) == "NEGATIVE" else 1)
    verdict = "right" if value == truth else f"wrong: the true value is {truth}"
    print(f"{answer}  (the model says {a} {'+' if op == 'add' else '-'} {b} is {value}; {verdict})")


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns 0, or 2 after a one-line 'error: ...' on bad input."""
    return run_cli(lambda: build_parser().parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
