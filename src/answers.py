"""evaluate and ask: greedy answers to questions, scored by the model's confidence; a recite reader reads the
recitation of its pretrained params."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import time
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

import recite
from confidence import (
    AnswerScore,
    beam_search,
    evaluation_summary,
    format_ask,
    format_summary,
    score_answers,
    scores_tsv,
)
from config import BLOCK_SIZE, RunConfig, build_model
from dataset import CharCorruptionDataset, Question, Vocabulary, question_problem, read_questions, score_places
from decode import MAX_ANSWER_CHARS, predict
from model import GPT
from params import load_params, read_sidecar, sidecar_path
from utils import UserError, locate_data, write_json_atomic, write_text_atomic


def evaluate(
    args: RunConfig, corpus: CharCorruptionDataset, model: GPT, device: torch.device, writer: SummaryWriter
) -> dict:
    """Greedy answers to --eval_corpus_path, one line each in --outputs_path; the accuracy where places are
    given. What evaluate found (accuracy, selective metrics, the recitations' ceiling, seconds) and the
    resolved config go to the predictions' JSON sidecar, <outputs_path>.json; `found` is returned."""
    vocab, path = corpus.vocab, locate_data(args.eval_corpus_path)
    entries = read_questions(path, require_place=False)
    check_questions(entries, vocab, path)
    load_params(model, vocab, args.reading_params_path)
    questions = [q for q in entries if q is not None]
    t0, texts, found = time.time(), [q.text for q in questions], {}
    reader = reader_link(args.reading_params_path)
    if reader is not None:
        texts = recitations(args, vocab, questions, reader, device, str(path))
        share = recite.place_in_recitation(questions, texts)
        if not math.isnan(share):
            print(f"the gold place is in {share:.1%} of the recitations (the reader's ceiling); its answers are spans")
            found["place_in_recitation"] = share
    model.to(device)
    predictions = predict(model, vocab, texts, device, copy=reader is not None)
    scores = score_answers(model, vocab, texts, predictions, device, MAX_ANSWER_CHARS)
    found["seconds"] = time.time() - t0
    total, correct = score_places(questions, predictions)
    if total:  # the handout's line, then the selective metrics
        print(f"Correct: {float(correct)} out of {float(total)}: {correct / total * 100}%")
        found |= evaluation_summary(questions, predictions, scores)
        print(format_summary(found))
    for key, value in found.items():
        writer.add_scalar(f"eval/{key}", value, 0)
    counts = {"questions": len(questions), "with_places": total, "correct": correct}
    write_answers(args, entries, scores, counts | found)
    targets = "" if "accuracy" in found else "; no targets provided"
    print(
        f"Predictions written to {args.outputs_path}, what evaluate found to {sidecar_path(args.outputs_path)}{targets}"
    )
    return found


def write_answers(args: RunConfig, entries: list[Question | None], scores: list[AnswerScore], found: dict) -> None:
    """One answer per input line in --outputs_path (a blank line for a blank one); the scores in --scores_path;
    `found` (what evaluate counted and measured) and the resolved config in the predictions' sidecar."""
    it = iter(s.answer for s in scores)
    write_text_atomic(args.outputs_path, "".join((next(it) if q is not None else "") + "\n" for q in entries))
    if args.scores_path is not None:
        write_text_atomic(args.scores_path, scores_tsv(entries, scores))
    write_json_atomic(sidecar_path(args.outputs_path), {**found, "config": dataclasses.asdict(args)})


def check_questions(entries: list[Question | None], vocab: Vocabulary, path: Path) -> None:
    """A UserError naming file and line for a question that cannot be asked (dataset.question_problem) or
    has a character outside the vocabulary (None entries are blank lines)."""
    for q in (q for q in entries if q is not None):
        if problem := question_problem(q.text, BLOCK_SIZE):
            raise UserError(f"{path}:{q.line}: the question {problem}")
        vocab.encode(q.text, where=f"{path}:{q.line}")


def reader_link(params_path: str) -> tuple[Path, int] | None:
    """(the pretrained params, the recitation length) when `params_path` is a recite reader, else None."""
    side = read_sidecar(params_path) or {}
    if side.get("protocol") != "recite":
        return None
    chars = side.get("recite_chars")
    most = BLOCK_SIZE - recite.ANSWER_ROOM  # as the flag's rule: room for the answer after the recitation
    if not isinstance(chars, int) or isinstance(chars, bool) or not 1 <= chars <= most:
        raise UserError(f"{params_path}: its sidecar gives recite_chars {chars!r}; a reader recites 1 to {most} "
                        "characters")  # fmt: skip
    return recite.linked_pretrained(params_path, side), chars


def recitations(
    args: RunConfig,
    vocab: Vocabulary,
    questions: list[Question],
    reader: tuple[Path, int],
    device: torch.device,
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


def ask(args: RunConfig, corpus: CharCorruptionDataset, model: GPT, device: torch.device) -> None:
    """Answer one question (checked by config.check_args): the greedy answer, its confidence, and the top 3
    answers of a beam search."""
    question, vocab = args.question, corpus.vocab
    vocab.encode(question, where=f"question {question!r}")
    load_params(model, vocab, args.reading_params_path)
    model.to(device)
    reader = reader_link(args.reading_params_path)
    prompt = question
    if reader is not None:
        with contextlib.redirect_stdout(io.StringIO()):  # ask prints only its answer
            (prompt,) = recitations(args, vocab, [Question(question, None, 1)], reader, device, "question")
    answer = predict(model, vocab, [prompt], device, copy=reader is not None)[0]
    (score,) = score_answers(model, vocab, [prompt], [answer], device, MAX_ANSWER_CHARS)
    if reader is not None:
        per_character = math.exp(score.mean_logprob)
        print(f"I recall: {prompt!r} -> {answer!r} (confidence: probability {per_character:.3g} per character)")
    alternatives = beam_search(model, vocab, prompt, device, 3, MAX_ANSWER_CHARS, copy=reader is not None)
    print(format_ask(question, score, alternatives))
