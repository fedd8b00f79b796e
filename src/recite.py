"""Recite, then answer: the second protocol for "Where was X born?".

The handout's protocol (direct) asks the finetuned model the question and reads the place after a MASK. Here an answer
takes two steps, and the facts still come only from the pretrained parameters, closed book:

1. recite: the pretrained model continues "X." (how X's biography starts in the pretraining corpus) greedily, for
   `recite_chars` characters in all, never writing MASK or PAD (span corruption taught it to close a document with a
   MASK at any point, which would end the recollection);
2. read: a reader, finetuned from the same pretrained params on the training people's own recitations that hold their
   place ("recitation MASK place MASK", loss on the answer only), reads the place out of the recitation: its greedy
   answer is held to a span of the recitation (decode.keep_spans), which leaves every answer that already is a span
   unchanged.

No dev place is seen at any step. After "Recitation-Augmented Language Models" (Sun et al., ICLR 2023); the evidence is
in bench/RESEARCH.md.
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
from utils import UserError, file_sha256

RECITE_CHARS = 100  # characters of recollection (the prompt "X." included) on vanilla and rope
ANSWER_ROOM = 16  # characters kept free for MASK, the place and its closing MASK (dev and train places fit)


def default_recite_chars(variant: str, bottleneck_dim: int) -> int:
    """RECITE_CHARS, or what the perceiver's bottleneck leaves: its outputs read only the first m inputs,
    so recitation and answer must both end within them."""
    return max(1, bottleneck_dim - ANSWER_ROOM) if variant == "perceiver" else RECITE_CHARS


def check_recite_chars(chars: int, model: GPT, places: list[str]) -> None:
    """A UserError unless recitations of `chars` characters leave room for every place in `places`
    (with its two MASKs) in the window the model reads: the block, or the perceiver's bottleneck."""
    longest = max((len(p) for p in places), default=ANSWER_ROOM - 2)
    config = model.config
    # The block holds the whole example; the perceiver's last prediction (the closing MASK, made at
    # the place's last character) must still read every input before it through the bottleneck.
    most, what = config.block_size - 2 - longest, f"the block of {config.block_size}"
    if config.variant == "perceiver":
        most = min(most, config.bottleneck_dim - 1 - longest)
        what = f"the perceiver's bottleneck, which reads only the first {config.bottleneck_dim} characters,"
    if not 1 <= chars <= most:
        raise UserError(
            f"--recite_chars {chars} leaves no room for the answer: {what} holds a recitation of at most "
            f"{max(most, 0)} characters before the longest place ({longest} characters) and its MASKs"
        )


def person_name(question: str) -> str | None:
    """'Where was Ada Lovelace born?' -> 'Ada Lovelace'; None for a question of another form."""
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
    """The pretrained model's recollection of each question's person: strings of `chars` characters with
    no MASK or PAD; tabs and newlines become spaces, so each fits one field of a TSV line. `source`
    names the questions' file in errors."""
    prompts = [recitation_prompt(q.text, f"{source}:{q.line}") for q in questions]
    what = f"reciting {len(prompts)} people"
    texts = continue_text(model.to(device), vocab, prompts, chars, [MASK_CHAR, PAD_CHAR], device, what)
    return [t.replace("\t", " ").replace("\n", " ") for t in texts]


def place_in_recitation(questions: list[Question], recitations: list[str]) -> float:
    """Share of recitations that contain their question's gold place: the ceiling of a reader that copies."""
    hits = [q.place in r for q, r in zip(questions, recitations, strict=True) if q.place is not None]
    return sum(hits) / len(hits) if hits else float("nan")


def link_to_pretrained(reader_path: str | Path, pretrained_path: str | Path, chars: int) -> dict:
    """The sidecar fields of a reader that recites `chars` characters with `pretrained_path`, named relative to the
    reader's folder (so the two move together) and by its SHA-256."""
    relative = os.path.relpath(Path(pretrained_path).resolve(), Path(reader_path).resolve().parent)
    link = {"path": relative, "sha256": file_sha256(pretrained_path)}
    return {"protocol": "recite", "recite_chars": chars, "recites_with": link}


def linked_pretrained(reader_path: str | Path, sidecar: dict) -> Path:
    """The pretrained params a reader recites with, after checking they exist and are unchanged."""
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
    """finetune --recite: the training questions of `path` (the first `most` of them, when given) with the recitations
    (`chars` characters) of `model`, which holds the pretrained params now and becomes the reader, in place of their
    text; and what the reader's sidecar records of them (people, recitations kept, share holding the place, seconds)."""
    questions = [q for q in read_questions(path, require_place=True) if q is not None]
    if most is not None and most < len(questions):
        print(f"--max_steps: reciting only the first {most} of {len(questions)} training people, as many as it trains")
        questions = questions[:most]
    check_recite_chars(chars, model, [q.place for q in questions])
    t0 = time.time()
    recitations = recite(model, corpus.vocab, questions, chars, device, str(path))
    share, seconds = place_in_recitation(questions, recitations), time.time() - t0
    print(
        f"recited {len(questions)} training people in {seconds:.1f} s ({chars} characters "
        f"each); the place is in {share:.1%} of the recitations"
    )
    # A recitation without the place could only teach the reader to answer from memory, as the direct
    # protocol does; trained on the others alone it answered as many and took a fifth less time (bench/RESEARCH.md).
    # A model pretrained too briefly to recite any place trains on them all.
    kept = [(q, r) for q, r in zip(questions, recitations, strict=True) if q.place in r]
    print(f"the reader trains on the {len(kept)} recitations that hold their place" if kept else
          "no recitation holds its place (pretrain longer); the reader trains on them all")  # fmt: skip
    record = {"people": len(questions), "kept": len(kept), "place_share": share, "seconds": round(seconds, 1)}
    kept = kept or list(zip(questions, recitations))
    return NameDataset(corpus, [Question(r, q.place, q.line) for q, r in kept]), record
