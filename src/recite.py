"""Recite, then answer: the second protocol for "Where was X born?".

An answer takes two steps, still closed book (facts only from pretraining):

1. recite: the pretrained model greedily continues "X." to `recite_chars` characters, never writing MASK or PAD,
   which would end the recollection;
2. read: a reader, finetuned from the same params on the training people's recitations that hold their place
   ("recitation MASK place MASK", loss on the answer only), answers with a span of the recitation (decode.keep_spans).

No dev place is seen at any step. After Sun et al., "Recitation-Augmented Language Models" (ICLR 2023); evidence in
bench/RESEARCH.md.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import torch

from dataset import MASK_CHAR, PAD_CHAR, CharCorruptionDataset, NameDataset, Question, Vocabulary, read_questions
from decode import continue_text
from model import GPT
from utils import UserError, file_sha256, plural

RECITE_CHARS = 100  # characters recited, the prompt "X." included (vanilla and rope)
ANSWER_ROOM = 16  # room for MASK, the place and its closing MASK (every dev and train place fits)


def default_recite_chars(variant: str, bottleneck_dim: int) -> int:
    """RECITE_CHARS, or the perceiver's bottleneck less ANSWER_ROOM (its outputs read only the first m inputs)."""
    return max(1, bottleneck_dim - ANSWER_ROOM) if variant == "perceiver" else RECITE_CHARS


def recite_chars_problem(
    chars: object, variant: str, bottleneck_dim: int, block_size: int, longest_place: int
) -> str | None:
    """Why recitations of `chars` characters leave no room in the block (or the perceiver's bottleneck) for a place
    of `longest_place` characters and two MASKs, a phrase to follow the value; else None."""
    # The perceiver predicts the closing MASK at the place's last character, which must lie in the bottleneck.
    most, what = block_size - 2 - longest_place, f"the block of {block_size}"
    if variant == "perceiver":
        most = min(most, bottleneck_dim - 1 - longest_place)
        what = f"the perceiver's bottleneck, which reads only the first {bottleneck_dim} characters,"
    if type(chars) is int and 1 <= chars <= most:
        return None
    return (
        f"leaves no room for the answer: {what} holds a recitation of at most {max(most, 0)} characters before a "
        f"place of {plural(longest_place, 'character')} and its MASKs"
    )


def person_name(question: str) -> str | None:
    """'Where was Ada Lovelace born?' -> 'Ada Lovelace'; None for another form."""
    m = re.fullmatch(r"Where was (.+) born\?", question.strip())
    return m.group(1) if m else None


def recitation_prompt(question: str, where: str) -> str:
    """'Where was Ada Lovelace born?' -> 'Ada Lovelace.', how that person's document starts."""
    name = person_name(question)
    if name is None:
        raise UserError(f"{where}: {question!r} names no person; the recite protocol reads 'Where was X born?'")
    return f"{name}."


def recite(
    model: GPT, vocab: Vocabulary, questions: list[Question], chars: int, device: torch.device, source: str
) -> list[str]:
    """The model's recollection of each question's person: `chars` characters without MASK or PAD, tabs and
    newlines made spaces (one TSV field)."""
    prompts = [recitation_prompt(q.text, f"{source}:{q.line}") for q in questions]
    what = f"reciting {len(prompts)} people"
    texts = continue_text(model.to(device), vocab, prompts, chars, [MASK_CHAR, PAD_CHAR], device, what)
    return [t.replace("\t", " ").replace("\n", " ") for t in texts]


def place_in_recitation(questions: list[Question], recitations: list[str]) -> float:
    """Share of recitations holding their gold place: the ceiling of a reader that copies."""
    hits = [q.place in r for q, r in zip(questions, recitations, strict=True) if q.place is not None]
    return sum(hits) / len(hits) if hits else float("nan")


def link_to_pretrained(reader_path: str | Path, pretrained_path: str | Path, chars: int) -> dict:
    """The sidecar fields linking a reader that recites `chars` characters to `pretrained_path`: its SHA-256 and path
    from the reader's folder (the two can move together)."""
    relative = os.path.relpath(Path(pretrained_path).resolve(), Path(reader_path).resolve().parent)
    link = {"path": relative, "sha256": file_sha256(pretrained_path)}
    return {"protocol": "recite", "recite_chars": chars, "recites_with": link}


def linked_pretrained(reader_path: str | Path, sidecar: dict) -> Path:
    """The pretrained params a reader recites with, checked to exist unchanged."""
    link = sidecar.get("recites_with")
    if not isinstance(link, dict) or not isinstance(link.get("path"), str) or not isinstance(link.get("sha256"), str):
        raise UserError(f"{reader_path}: a recite reader whose sidecar does not name its pretrained params")
    path = Path(reader_path).resolve().parent / link["path"]
    if not path.is_file():
        raise UserError(f"{reader_path}: recites with {path}, which is missing (keep it beside the reader)")
    if file_sha256(path) != link["sha256"]:
        raise UserError(f"{reader_path}: recites with {path}, which has changed since the reader was finetuned")
    return path


def reader_dataset(
    corpus: CharCorruptionDataset, model: GPT, path: Path, chars: int, device: torch.device, most: int | None = None
) -> tuple[NameDataset, dict]:
    """finetune --recite: the questions of `path` (the first `most`) with `model`'s recitations of `chars`
    characters as their text, and the record for the reader's sidecar."""
    questions = [q for q in read_questions(path, require_place=True) if q is not None]
    if most is not None and most < len(questions):
        print(f"--max_steps: reciting only the first {most} of {len(questions)} training people, as many as it trains")
        questions = questions[:most]
    c, longest = model.config, max(len(q.place) for q in questions)
    if problem := recite_chars_problem(chars, c.variant, c.bottleneck_dim, c.block_size, longest):
        raise UserError(f"--recite_chars {chars} {problem}")
    t0 = time.time()
    recitations = recite(model, corpus.vocab, questions, chars, device, str(path))
    share, seconds = place_in_recitation(questions, recitations), time.time() - t0
    print(
        f"recited {len(questions)} training people in {seconds:.1f} s ({chars} characters "
        f"each); the place is in {share:.1%} of the recitations"
    )
    # A recitation without its place could only teach answering from memory; trained without them, the reader
    # answered as many and took a fifth less time (bench/RESEARCH.md).
    kept = [(q, r) for q, r in zip(questions, recitations, strict=True) if q.place in r]
    print(
        f"the reader trains on the {len(kept)} recitations that hold their place"
        if kept
        else "no recitation holds its place (pretrain longer); the reader trains on them all"
    )
    record = {"people": len(questions), "kept": len(kept), "place_share": share, "seconds": round(seconds, 1)}
    kept = kept or list(zip(questions, recitations))
    return NameDataset(corpus, [Question(r, q.place, q.line) for q, r in kept]), record
