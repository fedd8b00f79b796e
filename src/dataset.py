"""Data: the vocabulary, the span-corruption pretraining set and the birth-place questions, with the handout's
`ds[i] -> (x, y)` (bench/course.py); our trainer batches an epoch at once (`epoch_batches`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from utils import UserError, check_input, crop_width

PAD_CHAR = "\u25a1"  # □, id 0; ignored by the loss
MASK_CHAR = "\u2047"  # ⁇, id 1; opens a masked span and an answer


def reserved_problem(text: str) -> str | None:
    """Why a user's corpus, question or place cannot be read (it holds the reserved PAD or MASK); else None."""
    found = [c for c in (PAD_CHAR, MASK_CHAR) if c in text]
    return f"holds the reserved character {found[0]!r} (U+{ord(found[0]):04X})" if found else None


def question_problem(text: str, block_size: int) -> str | None:
    """Why `text` (not empty) cannot be a question: a line break, a reserved character, or no room for a MASK and an
    answer; else None."""
    if "\n" in text or "\r" in text:
        return "holds a line break; give one line"
    if len(text) + 2 > block_size:
        return f"is {len(text)} characters; at most {block_size - 2} fit"
    return reserved_problem(text)


class Vocabulary:
    """Character <-> id map: PAD = 0, MASK = 1, then the sorted characters of a corpus."""

    def __init__(self, chars: Iterable[str]):
        self.itos = [PAD_CHAR, MASK_CHAR] + sorted(set(chars))
        if reserved := reserved_problem("".join(self.itos[2:])):
            raise UserError(f"the corpus {reserved}")
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, where: str = "input") -> list[int]:
        """Ids of `text`; a character outside the vocabulary is a UserError naming `where`."""
        missing = next((c for c in text if c not in self.stoi), None)
        if missing is not None:
            raise UserError(
                f"{where}: character {missing!r} (U+{ord(missing):04X}) is not in the vocabulary of "
                "the pretraining corpus"
            )
        return [self.stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids)


def read_text(path: str | Path, flag: str = "") -> str:
    """A whole UTF-8 file (utils.check_input), or a UserError saying why not."""
    try:
        text = check_input(path, flag).read_text(encoding="utf-8")
        why = "starts with a UTF-8 byte-order mark; save it as UTF-8 without one" if text.startswith("\ufeff") else ""
    except UnicodeDecodeError as e:
        why = f"not valid UTF-8 (byte {e.start})"
    except OSError as e:
        why = f"cannot be read ({e.strerror})"
    if why:
        raise UserError(f"{flag} {path}: {why}".lstrip())
    return text


# Pretraining: span corruption


def max_truncated_len(block_size: int) -> int:
    """Documents are cut to at most 7/8 of the block, leaving room for 2 MASKs."""
    return int(block_size * 7 / 8)


class BatchedDataset(Dataset):
    """A dataset batched a whole epoch at a time: `epoch_examples(order (N,), rng)` gives ids and targets
    (N, block_size), targets 0 where not trained, and real_len (N,)."""

    def __len__(self) -> int:
        return len(self.data)

    def epoch_batches(
        self, batch_size: int, rng: np.random.Generator, order: str = "bucketed", crop: bool = True
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of shifted (x, y) batches (B, T) in an ORDERS `order`, each cropped to its longest example
        (utils.crop_width), as PAD targets add no loss; crop=False: all of the full width."""
        if order not in ORDERS:
            raise ValueError(f"unknown order {order!r}")
        examples = np.arange(len(self)) if order == "file" else rng.permutation(len(self))
        ids, targets, real_len = self.epoch_examples(examples, rng)
        bucket = order == "bucketed"
        # A stable sort keeps the shuffled ties random.
        rows = np.argsort(real_len, kind="stable") if bucket else np.arange(len(ids))
        starts = list(range(0, len(ids), batch_size))
        if bucket:
            rng.shuffle(starts)
        for s in starts:
            idx = rows[s : s + batch_size]
            # Only x positions up to real_len - 2 have targets that are not PAD.
            width = crop_width(int(real_len[idx].max()) - 1, ids.shape[1] - 1) if crop else ids.shape[1] - 1
            yield torch.from_numpy(ids[idx, :width]), torch.from_numpy(targets[idx, 1 : width + 1])


NAME = re.compile(r"(.+?)(?<!\b[A-Z])(?<!\b[JS]r)\. ")  # a line's name: to the first ". " after no initial, Jr or Sr


def full_name(line: str) -> str:
    """--full_names: in a line `Full Name. biography`, the surname (the name's last word) alone becomes the full name,
    but not after a capitalised word or one of the name (Toulmin Smith, William Smith, de Majo), nor in names of one
    word, with a comma (titles, Jr.) or `of Place`."""
    m = NAME.match(line)
    words = m[1].split() if m else []
    if len(words) < 2 or "," in m[1] or words[-2] in ("of", "the", "and"):
        return line
    bio = line[m.end() :]

    def name_or_word(found: re.Match) -> str:
        before = (bio[: found.start()].split() or [","])[-1]
        return found[0] if before in words or before[0].isupper() and before[-1].isalpha() else m[1]

    return line[: m.end()] + re.sub(rf"(?<!\w){re.escape(words[-1])}(?!\w)", name_or_word, bio)


class CharCorruptionDataset(BatchedDataset):
    """Span-corruption examples, one per document (corpus line) per epoch: ds[i] -> (x, y) of length block_size - 1,
    y = x shifted by one. The corpus defines the vocabulary, which `full_names` (full_name) leaves as it is."""

    def __init__(self, data: str, block_size: int, source: str = "corpus", full_names: bool = False) -> None:
        self.vocab = Vocabulary(data)
        self.vocab_size = len(self.vocab)
        self.block_size = block_size
        self.example_length = block_size - 1
        self.data = [full_name(d) if full_names else d for d in data.split("\n") if d]
        if not any(line.strip() for line in self.data):
            raise UserError(f"{source}: contains no documents (no line with anything but spaces)")
        # Documents as padded ids, cut to the block_size characters an example can read.
        self.doc_lengths = np.array([len(d) for d in self.data], dtype=np.int64)
        self.doc_ids = np.zeros((len(self.data), block_size), dtype=np.int64)
        for i, d in enumerate(self.data):
            self.doc_ids[i, : min(len(d), block_size)] = self.vocab.encode(d[:block_size])

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The handout's interface: one corrupted example of document idx, seeded from Python's `random`."""
        rng = np.random.default_rng(random.getrandbits(64))
        ids = torch.from_numpy(self.corrupted_ids(np.array([idx]), rng)[0][0])
        return ids[:-1], ids[1:]

    def corrupted_ids(self, doc_index: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The handout's span corruption of documents doc_index (N,): each is cut to a random length L in
        4..7/8 of the block, and a random span (length m in 1..L/2-1, start a) moves to the end:
        `prefix MASK suffix MASK span`, then PAD. Returns ids (N, block_size) and real_len (N,), the non-PAD count."""
        n = len(doc_index)
        L = np.minimum(self.doc_lengths[doc_index], rng.integers(4, max_truncated_len(self.block_size) + 1, n))
        m = rng.integers(1, np.maximum(1, L // 2 - 1) + 1)
        a = rng.integers(0, np.maximum(0, L - m) + 1)
        L, m, a = L[:, None], m[:, None], a[:, None]
        p = np.arange(self.block_size)[None, :]
        # Output position p takes document character src[p] (or a marker):
        # prefix [0, a) -> p; suffix (a, L-m] -> p-1+m; span [L-m+2, L+2) -> a+p-(L-m+2).
        src = np.where(p < a, p, np.where(p <= L - m, p - 1 + m, a + p - (L - m + 2)))
        src = np.clip(src, 0, self.block_size - 1)
        ids = self.doc_ids[doc_index[:, None], src]
        ids = np.where((p == a) | (p == L - m + 1), 1, ids)  # the two MASKs
        ids = np.where(p >= L + 2, 0, ids)  # PAD
        return ids, (L + 2)[:, 0]

    def epoch_examples(self, order: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        ids, real_len = self.corrupted_ids(order, rng)
        return ids, ids, real_len


# Finetuning and evaluation: "Where was X born?<TAB>Place"


@dataclass
class Question:
    """One line of a birth-place file: the question, its gold place (or None) and its 1-based line."""

    text: str
    place: str | None
    line: int


def read_questions(path: str | Path, require_place: bool) -> list[Question | None]:
    """A birth-place TSV, an entry per line (None: blank): `question<TAB>place`, or `question` if not require_place,
    all or none with a place. A bad line is a UserError naming file and line."""
    lines = read_text(path).removesuffix("\n").split("\n")  # a final newline ends the last line, starts none
    out: list[Question | None] = []
    for n, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r")
        fields = line.split("\t")
        if not line.strip():
            out.append(None)
            continue
        problem = reserved_problem(line)
        if len(fields) > 2 or (len(fields) == 2 and not (fields[0].strip() and fields[1].strip())):
            problem = f"expected 'question<TAB>place' with both fields non-empty, got {line!r}"
        elif len(fields) == 2 and fields[1] != fields[1].strip():
            problem = f"the place {fields[1]!r} has spaces around it; remove them"
        elif len(fields) == 1 and require_place:
            problem = f"no tab; expected 'question<TAB>place', got {line!r}"
        if problem:
            raise UserError(f"{path}:{n}: {problem}")
        out.append(Question(fields[0], fields[1] if len(fields) == 2 else None, n))
    questions = [q for q in out if q is not None]
    without = [q.line for q in questions if q.place is None]
    problem = "contains no questions" if not questions else ""
    if 0 < len(without) < len(questions):
        problem = f"line {without[0]} has no place, although other lines have one"
    if problem:
        raise UserError(f"{path}: {problem}")
    return out


def score_places(questions: list[Question], predictions: list[str]) -> tuple[int, int]:
    """(total, correct) of predictions (one per question) against the gold places given, as the handout counts."""
    pairs = [(p, q.place) for p, q in zip(predictions, questions, strict=True) if q.place is not None]
    return len(pairs), sum(p == gold for p, gold in pairs)


class NameDataset(BatchedDataset):
    """Finetuning examples `question MASK place MASK`, padded: ds[i] -> (x, y) as in CharCorruptionDataset, y PAD
    over the question: only the answer (the place and its MASKs) is trained."""

    def __init__(self, pretraining_dataset: CharCorruptionDataset, source: str | Path | list[Question]):
        """source: a question<TAB>place file, or a list of questions (for a recite reader, recitations)."""
        self.vocab = pretraining_dataset.vocab
        self.block_size = pretraining_dataset.block_size
        self.example_length = self.block_size - 1
        if isinstance(source, list):
            path, questions = "finetuning examples", source
        else:
            path, questions = source, [q for q in read_questions(source, require_place=True) if q is not None]
        self.data = questions
        texts = [q.text + MASK_CHAR + q.place + MASK_CHAR for q in questions]
        self.ids = np.zeros((len(texts), self.block_size), dtype=np.int64)
        for i, (q, s) in enumerate(zip(questions, texts)):
            if len(s) > self.block_size:
                raise UserError(
                    f"{path}:{q.line}: question and place take {len(s)} characters with their 2 MASKs; "
                    f"block_size is {self.block_size}"
                )
            self.ids[i, : len(s)] = self.vocab.encode(s, where=f"{path}:{q.line}")
        self.real_len = np.array([len(s) for s in texts], dtype=np.int64)
        question_len = np.array([len(q.text) for q in questions], dtype=np.int64)
        self.targets = np.where(np.arange(self.block_size) >= question_len[:, None], self.ids, 0)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.ids[idx, :-1]), torch.from_numpy(self.targets[idx, 1:])

    def epoch_examples(self, order: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        return self.ids[order], self.targets[order], self.real_len[order]


class MixedDataset(BatchedDataset):
    """--mix_share F: each epoch, every document's corrupted example and n = round(F / (1 - F) * documents) finetuning
    examples (the answer trained) of the `questions` file, F of all: shuffled by the epoch's generator, cycled to n,
    in the file order spread evenly among the documents."""

    def __init__(self, corpus: CharCorruptionDataset, questions: Path, share: float):
        self.corpus, self.questions, docs = corpus, NameDataset(corpus, questions), len(corpus)
        self.example_length = corpus.example_length
        n = round(share / (1 - share) * docs)
        # example i: document data[i], or a question (>= docs)
        self.data = np.argsort(np.r_[np.arange(docs) / docs, (np.arange(n) + 0.5) / n], kind="stable")

    def epoch_examples(self, order: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        slot = self.data[order]
        asked = slot >= len(self.corpus)
        picks = np.resize(rng.permutation(len(self.questions)), asked.sum())
        parts = zip(self.corpus.epoch_examples(slot[~asked], rng), self.questions.epoch_examples(picks, rng))
        where = np.argsort(np.argsort(asked, kind="stable"))
        return tuple(np.concatenate(part)[where] for part in parts)


def micro_batches(x: torch.Tensor, y: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor, Any]]:
    """Parts (x, y, share of the targets) of a batch x, y (B, T): all of it (size 0 or >= B), or rows in groups of
    `size` by where their targets end, cropped there."""
    if not size or size >= len(x):
        return [(x, y, 1.0)]
    targets = y != 0  # (B, T)
    ends = torch.where(targets.any(1), y.size(1) - targets.flip(1).int().argmax(1), 0)  # (B,) last target + 1
    parts, total = [], targets.sum()
    for rows in torch.argsort(ends, stable=True).split(size):
        width = crop_width(int(ends[rows].max()), y.size(1))
        count = targets[rows, :width].sum()
        if count:  # a part without targets adds nothing (its mean loss would be NaN)
            parts.append((x[rows, :width], y[rows, :width], count / total))
    return parts


# Batch orders (a third, plain random batches, lost to bucketing: bench/RESEARCH.md 2):
#   "bucketed": shuffled, then grouped by length for the least padding (the default);
#   "file":     the corpus's order, as the handout's unshuffled DataLoader.
ORDERS = ("bucketed", "file")
